"""The storage planted bugs do the wrong thing they are named for, and only when planted; the
trace records commits either way."""

from __future__ import annotations

import random

import cbor2
import pytest
import trio

from troupe.runtime import Tracer
from troupe.storage import (
    FaultPlan,
    FaultyVFS,
    InlineExecutor,
    StorageIOError,
    open_engine,
    storage_planted_bugs,
)

from .conftest import make_env, unique_vfs_name


def create_items(connection):
    connection.execute("CREATE TABLE IF NOT EXISTS items (value TEXT PRIMARY KEY)")


def test_the_planted_bug_names():
    assert storage_planted_bugs == ("weak_durability", "ack_failed_commit")


@pytest.mark.parametrize("planted", [frozenset(), frozenset({"weak_durability"})])
async def test_weak_durability_turns_sync_off_whatever_was_asked(inline_env, planted):
    inline_env.planted_bugs = planted
    async with open_engine(inline_env, synchronous="EXTRA") as engine:
        level = await engine.write(lambda c: c.execute("PRAGMA synchronous").get)
    assert level == (0 if planted else 3)


async def failed_commit(tmp_path, planted):
    """Every write and sync fails while one job commits; returns (its outcome, recovered, trace)."""
    plan = FaultPlan(random.Random(1), io_error_probability=1.0, enabled=False)
    tracer = Tracer(keep_in_memory=True)
    with FaultyVFS(unique_vfs_name("bug"), plan) as vfs:
        env = make_env(tmp_path / "data", InlineExecutor(), vfs_name=vfs.name)
        env.planted_bugs = planted
        async with open_engine(env, tracer=tracer) as engine:
            await engine.write(create_items)
            plan.enabled = True
            try:
                result = await engine.write(
                    lambda c: c.execute("INSERT INTO items VALUES ('x')") and "ok")
            except StorageIOError:
                result = "refused"
            plan.enabled = False
            recovered = await engine.read(
                lambda c: [row[0] for row in c.execute("SELECT value FROM items")])
    return result, recovered, [tuple(cbor2.loads(record)[2:]) for record in tracer.records]


async def test_a_failed_commit_is_refused_and_traced(tmp_path):
    result, recovered, trace = await failed_commit(tmp_path, frozenset())
    assert (result, recovered) == ("refused", [])
    assert trace == [("commit", "storage", "", {"batch": 1, "jobs": 1}),
                     ("commit_failed", "storage", "", {"batch": 2, "jobs": 1,
                                                       "error": "IOError"})]


async def test_ack_failed_commit_acknowledges_a_write_that_is_not_there(tmp_path):
    result, recovered, trace = await failed_commit(tmp_path, frozenset({"ack_failed_commit"}))
    assert (result, recovered) == ("ok", [])  # acknowledged, and lost
    assert trace[-1] == ("commit", "storage", "", {"batch": 2, "jobs": 1})


async def test_no_trace_without_a_tracer_and_commit_events_count_jobs(inline_env):
    tracer = Tracer(keep_in_memory=True)
    async with trio.open_nursery() as nursery:
        from troupe.storage import Engine

        engine = await Engine.open(inline_env, nursery=nursery, tracer=tracer)
        await engine.write(create_items)
        async with trio.open_nursery() as writers:
            for value in "abc":
                writers.start_soon(engine.write, lambda c, value=value: c.execute(
                    "INSERT INTO items VALUES (?)", (value,)))
        await engine.aclose()
    assert [cbor2.loads(record)[2:] for record in tracer.records] == [
        ["commit", "storage", "", {"batch": 1, "jobs": 1}],
        ["commit", "storage", "", {"batch": 2, "jobs": 3}],
    ]
