"""Process death at a chosen I/O (``FaultPlan.crash_after``): between two jobs of a batch, at
every I/O of a COMMIT, at every I/O of the engine's checkpoint, and at random moments while
worker threads run batches.  Whatever the moment, nothing is acknowledged after the crash and
a reopened engine holds every acknowledged write."""

from __future__ import annotations

import random

import cbor2
import pytest
import trio
import trio.testing

from troupe.runtime import Tracer
from troupe.runtime._real_env import ThreadExecutor
from troupe.storage import (
    Engine,
    FaultPlan,
    FaultyVFS,
    InlineExecutor,
    StorageCrashed,
    StorageError,
    open_engine,
    power_loss_modes,
)

from .conftest import make_env, unique_vfs_name


def create_items(connection):
    connection.execute("CREATE TABLE IF NOT EXISTS items (value TEXT PRIMARY KEY, pad BLOB)")


def insert(value):
    def job(connection):
        connection.execute("INSERT INTO items VALUES (?, randomblob(300))", (value,))
        return value

    return job


def events(tracer):
    return [tuple(cbor2.loads(record)[2:]) for record in tracer.records]


async def recovered_values(data_dir):
    async with open_engine(make_env(data_dir, InlineExecutor())) as engine:
        assert await engine.read(lambda c: c.execute("PRAGMA integrity_check").get) == "ok"
        return {row[0] for row in await engine.read(
            lambda c: c.execute("SELECT value FROM items").fetchall())}


async def crash_inside_one_batch(data_dir, crash_at, *, checkpoint_frames, power_loss=None):
    """Commit 'kept', then write 'y' with death armed at I/O ``crash_at`` of its batch.
    Returns (what 'y' got, the trace, commits before, commits at the crash, recovered)."""
    plan = FaultPlan(random.Random(1))
    tracer = Tracer(keep_in_memory=True)
    seen = {}
    with FaultyVFS(unique_vfs_name("anywhere"), plan) as vfs:
        env = make_env(data_dir, InlineExecutor(), vfs_name=vfs.name)
        with trio.CancelScope() as lifetime:
            async with trio.open_nursery() as nursery:
                engine = await Engine.open(env, nursery=nursery, tracer=tracer,
                                           wal_checkpoint_frames=checkpoint_frames)
                await engine.write(create_items)
                await engine.write(insert("kept"))
                seen["before"] = engine.statistics().commits

                def crash():
                    seen["at_crash"] = engine.statistics().commits
                    engine.crash()
                    lifetime.cancel()

                plan.crash_after(crash_at, crash)
                try:
                    seen["y"] = await engine.write(insert("y"))
                except StorageCrashed:
                    seen["y"] = "crashed"
                if not plan.crashed:
                    seen["y"] += " (no crash)"
                    crash()
        if power_loss:
            vfs.power_loss(random.Random(crash_at), power_loss)
    seen["operation"] = plan.crash_operation
    return seen, events(tracer), await recovered_values(data_dir)


@pytest.mark.parametrize("power_loss", [None, "drop"])
async def test_a_crash_at_every_io_of_a_commit(tmp_path, power_loss):
    operations = []
    for crash_at in range(1, 6):  # a one-job COMMIT here is 4 WAL writes and a sync
        seen, trace, recovered = await crash_inside_one_batch(
            tmp_path / f"{crash_at}", crash_at, checkpoint_frames=10**6, power_loss=power_loss)
        operations.append(seen["operation"])
        assert seen["y"] == "crashed"  # never acknowledged
        assert seen["at_crash"] == seen["before"]  # inside COMMIT: it had not returned
        assert ("commit_failed", "storage", "", {"batch": 3, "jobs": 1,
                                                   "error": "IOError"}) in trace
        assert "kept" in recovered
        if power_loss:
            assert "y" not in recovered  # never synced
        else:
            # Died on the sync: every frame reached the OS, so the process crash keeps it.
            assert ("y" in recovered) == (seen["operation"] == "sync")
    assert operations == ["write", "write", "write", "write", "sync"]


@pytest.mark.parametrize("power_loss", [None, *power_loss_modes])
async def test_a_crash_at_every_io_of_a_checkpoint(tmp_path, power_loss):
    in_checkpoint = 0
    for crash_at in range(1, 13):  # WAL restart + COMMIT + checkpoint of one batch
        seen, trace, recovered = await crash_inside_one_batch(
            tmp_path / f"{crash_at}", crash_at, checkpoint_frames=1, power_loss=power_loss)
        assert seen["y"] == "crashed"
        assert "kept" in recovered
        if seen["at_crash"] > seen["before"]:
            # COMMIT returned (synced), the crash came in the writer's checkpoint after it:
            # committed though not acknowledged, and durable even through power loss.
            in_checkpoint += 1
            assert ("commit", "storage", "", {"batch": 3, "jobs": 1}) in trace
            assert "y" in recovered
    assert in_checkpoint >= 4


async def test_a_crash_between_two_jobs_of_a_batch(tmp_path):
    plan = FaultPlan(random.Random(1))
    tracer = Tracer(keep_in_memory=True)
    outcomes = {}
    with FaultyVFS(unique_vfs_name("between"), plan) as vfs:
        env = make_env(tmp_path / "data", InlineExecutor(), vfs_name=vfs.name)
        with trio.CancelScope() as lifetime:
            async with trio.open_nursery() as nursery:
                engine = await Engine.open(env, nursery=nursery, tracer=tracer)
                await engine.write(create_items)

                def crash():
                    outcomes["jobs_run"] = engine.statistics().jobs
                    engine.crash()
                    lifetime.cancel()

                async def writer(value):
                    try:
                        outcomes[value] = await engine.write(insert(value))
                    except StorageCrashed:
                        outcomes[value] = "crashed"

                jobs_before = engine.statistics().jobs
                plan.crash_after(1, crash)  # the first boundary: after one job, before COMMIT
                async with trio.open_nursery() as writers:
                    for value in ("a", "b", "c"):
                        writers.start_soon(writer, value)
    assert plan.crash_operation == "job boundary"
    assert outcomes["jobs_run"] == jobs_before + 1
    assert sorted(outcomes[value] for value in "abc") == ["crashed"] * 3
    assert events(tracer)[-1] == ("commit_failed", "storage", "",
                                  {"batch": 2, "jobs": 1, "error": "StorageCrashed"})
    assert await recovered_values(tmp_path / "data") == set()


async def crash_with_worker_threads(data_dir, seed):
    """Writers on the production thread executor; the process dies at a random I/O (from the
    worker thread) or at a random moment (from trio); maybe power is lost too."""
    chooser = random.Random(seed)
    plan = FaultPlan(random.Random(seed))
    acknowledged, attempted = [], []
    with FaultyVFS(unique_vfs_name("threads"), plan) as vfs:
        env = make_env(data_dir, ThreadExecutor(), vfs_name=vfs.name, seed=seed)
        with trio.CancelScope() as lifetime:
            async with trio.open_nursery() as nursery:
                engine = await Engine.open(env, nursery=nursery, wal_checkpoint_frames=8)
                await engine.write(create_items)

                def crash():
                    engine.crash()
                    lifetime.cancel()

                if seed % 2:
                    # Called in the worker thread, inside SQLite: hop to trio to crash.
                    plan.crash_after(chooser.randrange(1, 150),
                                     lambda: trio.from_thread.run_sync(crash))

                async def writer(number):
                    for index in range(10):
                        value = f"{number}-{index}"
                        attempted.append(value)
                        try:
                            acknowledged.append(await engine.write(insert(value)))
                        except StorageError:
                            return

                for number in range(4):
                    nursery.start_soon(writer, number)
                # Die once a random share of the writes was acknowledged: batches are then in
                # flight in worker threads (or the I/O count above came first).
                target = chooser.randrange(0, 40)
                while len(acknowledged) < target and not plan.crashed:
                    await trio.sleep(0)
                crash()
        if chooser.random() < 0.5:
            vfs.power_loss(chooser)
    recovered = await recovered_values(data_dir)
    assert set(acknowledged) <= recovered <= set(attempted), seed
    return len(acknowledged)


async def test_crashes_while_worker_threads_run_batches_lose_no_acknowledged_write(tmp_path):
    acknowledged = 0
    for seed in range(30):
        acknowledged += await crash_with_worker_threads(tmp_path / f"data-{seed}", seed)
    assert acknowledged > 0
