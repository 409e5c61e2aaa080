"""crash() then reopen: exactly the acknowledged writes with the inline executor; at least them
(and no damage) with worker threads."""

import random
import threading

import pytest
import trio
import trio.testing

from troupe.runtime._real_env import ThreadExecutor
from troupe.storage import (
    Engine,
    InlineExecutor,
    StorageCrashed,
    journal_append,
    journal_load,
    open_engine,
)

from .conftest import make_env


def create_items(connection):
    connection.execute("CREATE TABLE IF NOT EXISTS items (value TEXT PRIMARY KEY)")


async def crash_during_writes(env, seed, *, writers=25, writes_each=20):
    """Interleave writers and crash after a seeded number of scheduling steps."""
    chooser = random.Random(seed)
    acknowledged: list[str] = []
    refused: list[str] = []
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        await engine.write(create_items)

        async def writer(number):
            for index in range(writes_each):
                value = f"{number}-{index}"

                def job(connection, value=value):
                    connection.execute("INSERT INTO items VALUES (?)", (value,))
                    journal_append(connection, "writer", str(number), [value])
                    return value

                try:
                    acknowledged.append(await engine.write(job))
                except StorageCrashed:
                    refused.append(value)
                    return

        async def crasher():
            for _ in range(chooser.randrange(2, 30)):
                await trio.lowlevel.checkpoint()
            engine.crash()

        for number in range(writers):
            nursery.start_soon(writer, number)
        nursery.start_soon(crasher)
    return engine, acknowledged, refused


async def committed_values(data_dir):
    env = make_env(data_dir, InlineExecutor())
    async with open_engine(env) as engine:
        assert await engine.read(lambda c: c.execute("PRAGMA integrity_check").get) == "ok"
        values = await engine.read(lambda c: [r[0] for r in c.execute("SELECT value FROM items")])
        journals = await engine.read(lambda c: {
            number: [payload for _, payload in journal_load(c, "writer", str(number)).records]
            for number in range(25)
        })
    return set(values), journals


@pytest.mark.parametrize("seed", range(8))
async def test_crash_then_reopen_sees_exactly_the_acknowledged_writes(tmp_path, seed):
    data_dir = tmp_path / "data"
    engine, acknowledged, refused = await crash_during_writes(
        make_env(data_dir, InlineExecutor()), seed)
    assert refused, "the crash should land while writes are in flight"
    statistics = engine.statistics()
    assert statistics.transactions < statistics.jobs  # group commit happened
    values, journals = await committed_values(data_dir)
    assert values == set(acknowledged)
    # Each writer's journal holds its acknowledged values in order, with no gaps.
    for number, payloads in journals.items():
        mine = [value for value in acknowledged if value.startswith(f"{number}-")]
        assert payloads == mine


@pytest.mark.parametrize("seed", range(3))
async def test_crash_with_worker_threads_keeps_every_acknowledged_write(tmp_path, seed):
    data_dir = tmp_path / "data"
    _, acknowledged, refused = await crash_during_writes(
        make_env(data_dir, ThreadExecutor()), seed)
    values, _ = await committed_values(data_dir)
    # A batch in its worker thread when the crash came may have committed unacknowledged.
    assert set(acknowledged) <= values <= set(acknowledged) | set(refused)


async def test_jobs_and_reads_after_a_crash_fail_with_storage_crashed(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        engine.crash()
        engine.crash()  # idempotent
        with pytest.raises(StorageCrashed):
            await engine.write(lambda c: None)
        with pytest.raises(StorageCrashed):
            await engine.read(lambda c: None)


async def test_crash_leaves_the_wal_for_recovery_like_a_dead_process(inline_env, tmp_path):
    async with open_engine(inline_env) as engine:
        await engine.write(create_items)
        await engine.write(lambda c: c.execute("INSERT INTO items VALUES ('kept')"))
        engine.crash()
    wal = tmp_path / "data" / "troupe.db-wal"
    assert wal.exists() and wal.stat().st_size > 0
    values, _ = await committed_values(tmp_path / "data")
    assert values == {"kept"}


async def test_crash_fails_the_running_and_the_queued_jobs_and_commits_nothing(tmp_path):
    env = make_env(tmp_path / "data", ThreadExecutor())
    release = threading.Event()
    outcomes = []
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        await engine.write(create_items)

        async def writer(value, hold=False):
            def job(connection):
                connection.execute("INSERT INTO items VALUES (?)", (value,))
                if hold:
                    release.wait()

            try:
                outcomes.append(await engine.write(job))
            except StorageCrashed:
                outcomes.append("crashed")

        # The first job holds the writer inside its batch (in a worker thread); three more
        # wait in the queue.  The crash must fail all four, and the held batch must roll back
        # instead of committing when it is released.
        nursery.start_soon(writer, "held", True)
        await trio.testing.wait_all_tasks_blocked()
        for value in ("a", "b", "c"):
            nursery.start_soon(writer, value)
        await trio.testing.wait_all_tasks_blocked()
        assert engine.statistics().write_queue_depth == 3
        engine.crash()
        release.set()
    assert outcomes == ["crashed"] * 4
    values, _ = await committed_values(tmp_path / "data")
    assert values == set()
