"""A tiny Env for storage tests: real clock, the simulator's seeded randomness and ids, a tmp
data dir, and either worker threads or the simulator's inline executor."""

from __future__ import annotations

import itertools

import pytest

from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock, ThreadExecutor
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import InlineExecutor

_vfs_names = itertools.count(1)

def make_env(data_dir, executor, vfs_name: str | None = None, seed: int = 1) -> Env:
    return Env(
        clock=RealClock(),
        random=SimRandom(seed),
        ids=SimIds(),
        storage=SimStorageOpener(str(data_dir), vfs_name),
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
