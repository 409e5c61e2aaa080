"""Fixtures for recall tests: a real storage Engine (inline executor) in a tmp directory."""

from __future__ import annotations

import apsw
import pytest

from troupe.retrieval import apply_schema, connection_setup, retrieval_migrations
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor


def make_env(data_dir) -> Env:
    return Env(
        clock=RealClock(),
        random=SimRandom(1),
        ids=SimIds(),
        storage=SimStorageOpener(str(data_dir)),
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
