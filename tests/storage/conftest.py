"""A tiny Env for storage tests: real clock, seeded randomness, a tmp data dir, and either
worker threads or the simulator's inline executor."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock, ThreadExecutor
from troupe.storage import InlineExecutor

_vfs_names = itertools.count(1)


class SeededRandom:
    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def random(self) -> float:
        return self._random.random()

    def randrange(self, start: int, stop: int) -> int:
        return self._random.randrange(start, stop)

    def token_bytes(self, count: int) -> bytes:
        return self._random.randbytes(count)


class CountingIds:
    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def new_id(self, prefix: str = "") -> str:
        return f"{prefix}{next(self._counter):016x}"


@dataclass
class StorageOpener:
    data_dir: str
    vfs_name: str | None = None


def make_env(data_dir, executor, vfs_name: str | None = None, seed: int = 1) -> Env:
    return Env(
        clock=RealClock(),
        random=SeededRandom(seed),
        ids=CountingIds(),
        storage=StorageOpener(str(data_dir), vfs_name),
        executor=executor,
    )


def unique_vfs_name(prefix: str = "faulty") -> str:
    return f"{prefix}-{next(_vfs_names)}"


@pytest.fixture(params=["inline", "thread"])
def executor(request):
    return InlineExecutor() if request.param == "inline" else ThreadExecutor()


@pytest.fixture
def env(tmp_path, executor) -> Env:
    return make_env(tmp_path / "data", executor)


@pytest.fixture
def inline_env(tmp_path) -> Env:
    return make_env(tmp_path / "data", InlineExecutor())
