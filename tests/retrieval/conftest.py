"""Fixtures for recall tests: a real storage Engine (inline executor) in a tmp directory."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import apsw
import pytest

from troupe.retrieval import apply_schema, connection_setup, retrieval_migrations
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.storage import Engine, InlineExecutor


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


def make_env(data_dir) -> Env:
    return Env(
        clock=RealClock(),
        random=SeededRandom(1),
        ids=CountingIds(),
        storage=StorageOpener(str(data_dir)),
        executor=InlineExecutor(),
    )


async def open_test_engine(data_dir) -> Engine:
    return await Engine.open(
        make_env(data_dir), migrations=retrieval_migrations(), connection_setup=connection_setup
    )


@pytest.fixture
async def engine(tmp_path):
    opened = await open_test_engine(tmp_path / "data")
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
def connection():
    """A bare connection with the schema: for the synchronous SQL layer."""
    bare = apsw.Connection(":memory:")
    for setup in connection_setup:
        setup(bare)
    apply_schema(bare)
    return bare
