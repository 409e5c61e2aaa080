"""Injected disk faults: typed errors, no corruption, acknowledged writes survive reopen."""

import random

import apsw
import pytest
import trio

from troupe.storage import (
    DiskFull,
    Engine,
    FaultPlan,
    FaultyVFS,
    InlineExecutor,
    StorageError,
    StorageIOError,
    open_engine,
)

from .conftest import make_env, unique_vfs_name


def small_checkpoints(connection):
    # Checkpoint often so that faults also land on checkpoint writes and syncs.
    connection.execute("PRAGMA wal_autocheckpoint = 8")


def create_items(connection):
    connection.execute("CREATE TABLE IF NOT EXISTS items (value TEXT PRIMARY KEY, pad BLOB)")


async def run_faulty_workload(data_dir, executor, seed, *, io_error_probability,
                              disk_full_probability, writers=10, writes_each=30):
    """Write under faults; return (acknowledged, failed, errors, plan)."""
    plan = FaultPlan(random.Random(seed), io_error_probability=io_error_probability,
                     disk_full_probability=disk_full_probability, enabled=False)
    acknowledged: list[str] = []
    failed: list[str] = []
    errors: list[str] = []
    with FaultyVFS(unique_vfs_name(), plan) as vfs:
        env = make_env(data_dir, executor, vfs_name=vfs.name)
        async with open_engine(env, connection_setup=[small_checkpoints]) as engine:
            await engine.write(create_items)
            plan.enabled = True

            async def writer(number):
                for index in range(writes_each):
                    value = f"{number}-{index}"

                    def job(connection, value=value):
                        connection.execute("INSERT INTO items VALUES (?, zeroblob(200))",
                                           (value,))
                        return value

                    try:
                        acknowledged.append(await engine.write(job))
                    except StorageError as exc:
                        failed.append(value)
                        errors.append(type(exc).__name__)

            async with trio.open_nursery() as nursery:
                for number in range(writers):
                    nursery.start_soon(writer, number)
            plan.enabled = False
            assert engine.statistics().faults_seen > 0
    return acknowledged, failed, errors, plan


async def reopen_and_check(data_dir, acknowledged, failed):
    env = make_env(data_dir, InlineExecutor())
    async with open_engine(env) as engine:
        assert await engine.read(lambda c: c.execute("PRAGMA integrity_check").get) == "ok"
        present = set(await engine.read(
            lambda c: [row[0] for row in c.execute("SELECT value FROM items")]))
    assert set(acknowledged) <= present
    assert not (set(failed) & present)
    return present


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_io_errors_and_disk_full_are_typed_and_lose_nothing(tmp_path, executor, seed):
    data_dir = tmp_path / "data"
    acknowledged, failed, errors, plan = await run_faulty_workload(
        data_dir, executor, seed, io_error_probability=0.015, disk_full_probability=0.015)
    assert plan.io_errors_injected > 0 and plan.disk_full_injected > 0
    assert failed and acknowledged
    assert set(errors) <= {"StorageIOError", "DiskFull", "BatchAborted"}
    present = await reopen_and_check(data_dir, acknowledged, failed)
    assert present == set(acknowledged)


async def test_the_same_seed_injects_the_same_faults(tmp_path):
    # One writer task: trio shuffles runnable tasks, so only a single task's order is
    # reproducible without the simulator's seeded scheduler.
    runs = []
    for attempt in range(2):
        runs.append(await run_faulty_workload(
            tmp_path / f"data{attempt}", InlineExecutor(), 7,
            io_error_probability=0.05, disk_full_probability=0.05, writers=1, writes_each=60))
    first, second = runs
    assert first[0] == second[0] and first[1] == second[1] and first[2] == second[2]
    assert first[3].io_errors_injected == second[3].io_errors_injected
    assert first[1], "the seed should inject at least one failure"


async def test_a_failed_commit_fails_every_job_in_the_batch_and_the_engine_recovers(tmp_path):
    class Script:
        """Fails exactly the draws we name: deterministic without probabilities."""

        def __init__(self):
            self.draws = 0
            self.fail_from = None

        def random(self):
            self.draws += 1
            return 0.0 if self.fail_from is not None and self.draws >= self.fail_from else 0.99

    script = Script()
    plan = FaultPlan(script, disk_full_probability=0.5)
    with FaultyVFS(unique_vfs_name(), plan) as vfs:
        env = make_env(tmp_path / "data", InlineExecutor(), vfs_name=vfs.name)
        async with open_engine(env) as engine:
            await engine.write(create_items)
            script.fail_from = script.draws + 1
            results = []

            async def writer(value):
                try:
                    await engine.write(
                        lambda c: c.execute("INSERT INTO items VALUES (?, NULL)", (value,)))
                    results.append((value, "ok"))
                except DiskFull as exc:
                    assert isinstance(exc.__cause__, apsw.FullError)
                    results.append((value, "full"))

            async with trio.open_nursery() as nursery:
                for value in ("a", "b", "c"):
                    nursery.start_soon(writer, value)
            assert sorted(results) == [("a", "full"), ("b", "full"), ("c", "full")]
            script.fail_from = None
            await engine.write(lambda c: c.execute("INSERT INTO items VALUES ('d', NULL)"))
            assert await engine.read(lambda c: [r[0] for r in c.execute(
                "SELECT value FROM items")]) == ["d"]
    await reopen_and_check(tmp_path / "data", ["d"], ["a", "b", "c"])


async def test_io_error_raised_inside_a_job_is_wrapped(tmp_path):
    env = make_env(tmp_path / "data", InlineExecutor())
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)

        def job(connection):
            raise apsw.IOError("simulated")

        with pytest.raises(StorageIOError) as caught:
            await engine.write(job)
        assert isinstance(caught.value.__cause__, apsw.IOError)
        assert await engine.write(lambda c: 1) == 1
        await engine.aclose()


def test_fault_plan_rejects_impossible_probabilities():
    with pytest.raises(ValueError):
        FaultPlan(random.Random(1), io_error_probability=0.7, disk_full_probability=0.7)
    with pytest.raises(ValueError):
        FaultPlan(random.Random(1), io_error_probability=-0.1)


def test_disabled_plan_draws_nothing():
    class Counting:
        draws = 0

        def random(self):
            Counting.draws += 1
            return 0.5

    plan = FaultPlan(Counting(), io_error_probability=1.0, enabled=False)
    plan.consult("write", may_be_full=True)
    assert Counting.draws == 0
    plan.enabled = True
    with pytest.raises(apsw.IOError):
        plan.consult("write", may_be_full=True)
    assert plan.io_errors_injected == 1
