import threading

import apsw
import pytest
import trio
import trio.testing

from troupe.storage import (
    Engine,
    Migration,
    MigrationError,
    StorageClosed,
    StorageOverloaded,
    open_engine,
)

from .conftest import make_env


def create_items(connection):
    connection.execute("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, value TEXT)")


async def test_write_returns_after_commit_and_a_read_sees_it(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        row_id = await engine.write(
            lambda c: c.execute("INSERT INTO items (value) VALUES ('a') RETURNING id").get
        )
        assert await engine.read(
            lambda c: c.execute("SELECT value FROM items WHERE id = ?", (row_id,)).get
        ) == "a"
        statistics = engine.statistics()
        assert statistics.commits >= 2 and statistics.read_jobs == 1


async def test_pragmas_are_set(env):
    async with open_engine(env) as engine:
        assert await engine.write(lambda c: c.execute("PRAGMA journal_mode").get) == "wal"
        assert await engine.write(lambda c: c.execute("PRAGMA foreign_keys").get) == 1
        # FULL: the power-loss tests show NORMAL loses acknowledged writes.
        assert await engine.write(lambda c: c.execute("PRAGMA synchronous").get) == 2


async def test_synchronous_normal_is_an_option(env):
    async with open_engine(env, synchronous="NORMAL") as engine:
        assert await engine.write(lambda c: c.execute("PRAGMA synchronous").get) == 1


async def test_read_connections_are_read_only(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        with pytest.raises(apsw.ReadOnlyError):
            await engine.read(lambda c: c.execute("INSERT INTO items (value) VALUES ('x')"))
        with pytest.raises(apsw.ReadOnlyError):
            await engine.read(lambda c: c.execute("CREATE TABLE other (x)"))
        assert await engine.read(lambda c: c.execute("SELECT count(*) FROM items").get) == 0


async def test_a_raising_job_fails_alone_inside_a_batch(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        outcomes: dict[int, object] = {}

        async def writer(number):
            def job(connection):
                connection.execute("INSERT INTO items (value) VALUES (?)", (f"v{number}",))
                if number % 3 == 0:
                    raise ValueError(number)
                return number

            try:
                outcomes[number] = await engine.write(job)
            except ValueError as exc:
                outcomes[number] = exc

        async with trio.open_nursery() as nursery:
            for number in range(30):
                nursery.start_soon(writer, number)
        values = await engine.read(
            lambda c: sorted(row[0] for row in c.execute("SELECT value FROM items"))
        )
        expected = sorted(f"v{number}" for number in range(30) if number % 3)
        assert values == expected
        for number in range(30):
            if number % 3 == 0:
                assert isinstance(outcomes[number], ValueError)
            else:
                assert outcomes[number] == number


async def test_group_commit_batches_concurrent_writers(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        before = engine.statistics()

        async def writer(number):
            for round_number in range(5):
                value = f"{number}-{round_number}"
                await engine.write(
                    lambda c, value=value: c.execute("INSERT INTO items (value) VALUES (?)", (value,))
                )

        async with trio.open_nursery() as nursery:
            for number in range(40):
                nursery.start_soon(writer, number)
        after = engine.statistics()
        jobs = after.jobs - before.jobs
        transactions = after.transactions - before.transactions
        assert jobs == 200
        assert transactions < jobs
        assert after.commits - before.commits == transactions
        assert await engine.read(lambda c: c.execute("SELECT count(*) FROM items").get) == 200


async def test_full_write_queue_raises_overloaded(tmp_path):
    from troupe.runtime._real_env import ThreadExecutor

    env = make_env(tmp_path / "data", ThreadExecutor())
    release = threading.Event()
    results = []
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery, write_queue_jobs_max=4,
                                   write_batch_jobs_max=2)

        async def writer(function):
            results.append(await engine.write(function))

        # The first job holds the writer (in its worker thread) until released, so the next
        # four fill the queue and the sixth is refused at once instead of waiting.
        nursery.start_soon(writer, lambda c: release.wait() and "first")
        await trio.testing.wait_all_tasks_blocked()
        for number in range(4):
            nursery.start_soon(writer, lambda c, number=number: number)
        await trio.testing.wait_all_tasks_blocked()
        assert engine.statistics().write_queue_depth == 4
        with pytest.raises(StorageOverloaded) as caught:
            await engine.write(lambda c: "refused")
        assert caught.value.retry_after_seconds > 0
        release.set()
        await engine.aclose()
    assert results[0] == "first" and sorted(results[1:]) == [0, 1, 2, 3]


async def test_aclose_drains_queued_writes_and_then_refuses(env):
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        await engine.write(create_items)
        results = []

        async def writer(number):
            def job(connection):
                connection.execute("INSERT INTO items (value) VALUES (?)", (str(number),))
                return number

            results.append(await engine.write(job))

        for number in range(20):
            nursery.start_soon(writer, number)
        await trio.testing.wait_all_tasks_blocked()
        await engine.aclose()
        with pytest.raises(StorageClosed):
            await engine.write(lambda c: None)
        with pytest.raises(StorageClosed):
            await engine.read(lambda c: None)
    assert sorted(results) == list(range(20))
    async with open_engine(env) as engine:
        assert await engine.read(lambda c: c.execute("SELECT count(*) FROM items").get) == 20


async def test_engine_without_nursery_uses_a_system_task(env):
    engine = await Engine.open(env)
    assert await engine.write(lambda c: 7) == 7
    await engine.aclose()


async def test_migrations_are_ordered_idempotent_and_recorded(env):
    order = []

    def function_step(connection):
        order.append("retrieval-2")
        connection.execute("CREATE TABLE r2 (x)")

    extras = [
        Migration("retrieval", 2, "second", function_step),
        Migration("retrieval", 1, "first", "CREATE TABLE r1 (x)"),
        Migration("billing", 1, "first", "CREATE TABLE b1 (x)"),
    ]
    async with open_engine(env, migrations=extras) as engine:
        applied = await engine.read(lambda c: c.execute(
            "SELECT component, number, name FROM schema_migrations ORDER BY rowid"
        ).fetchall())
    components = [row[0] for row in applied]
    assert components[:5] == ["core"] * 5
    assert applied[5:] == [("retrieval", 1, "first"), ("retrieval", 2, "second"),
                           ("billing", 1, "first")]
    assert order == ["retrieval-2"]
    async with open_engine(env, migrations=extras) as engine:
        count = await engine.read(lambda c: c.execute(
            "SELECT count(*) FROM schema_migrations").get)
    assert count == len(applied)
    assert order == ["retrieval-2"]


async def test_a_failing_migration_is_rolled_back_and_reported(env):
    broken = [Migration("retrieval", 1, "broken", "CREATE TABLE ok (x); CREATE TABLE ok (x)")]
    with pytest.raises(MigrationError):
        await Engine.open(env, migrations=broken)
    async with open_engine(env) as engine:
        assert await engine.read(lambda c: c.execute(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'ok'").get) == 0


async def test_a_renamed_recorded_migration_is_refused(env):
    async with open_engine(env, migrations=[Migration("x", 1, "one", "CREATE TABLE x1 (a)")]):
        pass
    with pytest.raises(MigrationError):
        await Engine.open(env, migrations=[Migration("x", 1, "uno", "CREATE TABLE x1 (a)")])


async def test_connection_setup_runs_on_every_connection_before_migrations(env):
    seen = []

    def setup(connection):
        seen.append("setup")
        connection.create_scalar_function("double_it", lambda value: value * 2, 1)

    def migration(connection):
        seen.append("migration")
        connection.execute("CREATE TABLE d (x)")
        connection.execute("INSERT INTO d VALUES (double_it(21))")

    async with open_engine(env, migrations=[Migration("t", 1, "d", migration)],
                           connection_setup=[setup]) as engine:
        assert await engine.read(lambda c: c.execute("SELECT double_it(x) FROM d").get) == 84
    assert seen[:2] == ["setup", "migration"]
    assert seen.count("setup") == 2  # the writer and one reader


async def test_reads_run_concurrently_up_to_readers_max(tmp_path):
    from troupe.runtime._real_env import ThreadExecutor

    env = make_env(tmp_path / "data", ThreadExecutor(threads_max=8))
    async with open_engine(env, readers_max=3) as engine:
        await engine.write(create_items)
        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(engine.read, lambda c: c.execute("SELECT 1").get)
        assert len(engine._idle_readers) <= 3
        assert engine.statistics().read_jobs == 12


async def test_a_read_sees_a_consistent_snapshot(env):
    async with open_engine(env) as engine:
        await engine.write(create_items)
        await engine.write(lambda c: c.execute("INSERT INTO items (value) VALUES ('a')"))

        def two_reads(connection):
            first = connection.execute("SELECT count(*) FROM items").get
            second = connection.execute("SELECT count(*) FROM items").get
            return first, second

        assert await engine.read(two_reads) == (1, 1)
