"""Storage recovery and loop-stall benchmark: prints one JSON line.

1. Build: 1,000,000 journal records over 10,000 actors through ``Engine.write``, with a
   snapshot (and prune) every ``snapshot_every_records`` records per actor, as the runtime does.
2. open_seconds: a clean reopen (after ``aclose``) until ``Engine.open`` returns.
3. ready_seconds: after some more writes, an abrupt stop (``crash()``: WAL left behind, no
   checkpoint), then reopen until the engine has served a read (an actor's ``journal_load``).
4. worst_loop_stall_ms: 20,000 small writes from 50 trio tasks with the thread executor while a
   ticker sleeps 1 ms and records how late it wakes (trio.current_time()).

Every engine here runs the default ``synchronous`` (FULL since power loss is modelled; the
figure is in the JSON line).

Run: ``.venv/bin/python bench/storage_recovery.py [--records N] [--actors N]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

import trio

from troupe.runtime._real_env import real_env
from troupe.storage import (
    Engine,
    journal_append,
    journal_load,
    journal_snapshot,
    synchronous_default,
)

snapshot_every_records = 64
records_per_job = 1000


async def build(engine: Engine, records: int, actors: int) -> None:
    per_actor_chunk = 10
    sequence_by_actor = [0] * actors
    written = 0
    actor = 0
    while written < records:
        batch_records = min(records_per_job, records - written)

        def job(connection, start_actor=actor, count=batch_records):
            done = 0
            index = start_actor
            while done < count:
                key = f"a{index % actors}"
                chunk = min(per_actor_chunk, count - done)
                payloads = [{"type": "message", "text": "hello " * 8, "n": done + offset}
                            for offset in range(chunk)]
                last = journal_append(connection, "entry", key, payloads)
                before = sequence_by_actor[index % actors]
                if last // snapshot_every_records > before // snapshot_every_records:
                    journal_snapshot(connection, "entry", key, last, {"count": last})
                sequence_by_actor[index % actors] = last
                done += chunk
                index += 1
            return index

        actor = await engine.write(job)
        written += batch_records


async def stall_burst(env, writes: int, tasks: int) -> dict:
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        await engine.write(lambda c: c.execute(
            "CREATE TABLE IF NOT EXISTS burst (id INTEGER PRIMARY KEY, value TEXT)"))
        worst = 0.0
        done = trio.Event()

        async def ticker():
            nonlocal worst
            while not done.is_set():
                expected = trio.current_time() + 0.001
                await trio.sleep(0.001)
                worst = max(worst, trio.current_time() - expected)

        async def writer(count):
            for _ in range(count):
                await engine.write(lambda c: c.execute(
                    "INSERT INTO burst (value) VALUES ('x')"))

        nursery.start_soon(ticker)
        started = time.perf_counter()
        async with trio.open_nursery() as writers:
            for _ in range(tasks):
                writers.start_soon(writer, writes // tasks)
        elapsed = time.perf_counter() - started
        done.set()
        statistics = engine.statistics()
        await engine.aclose()
    return {
        "burst_writes": writes,
        "burst_seconds": round(elapsed, 3),
        "burst_transactions": statistics.transactions,
        "worst_loop_stall_ms": round(worst * 1000, 2),
    }


async def main(records: int, actors: int) -> dict:
    data_dir = tempfile.mkdtemp(prefix="troupe-bench-")
    try:
        env = real_env(data_dir)
        started = time.perf_counter()
        engine = await Engine.open(env)
        await build(engine, records, actors)
        build_seconds = time.perf_counter() - started
        kept = await engine.read(lambda c: c.execute("SELECT count(*) FROM journal").get)
        await engine.aclose()

        started = time.perf_counter()
        engine = await Engine.open(env)
        open_seconds = time.perf_counter() - started
        for number in range(200):
            await engine.write(lambda c, n=number: journal_append(c, "entry", f"a{n}", [n]))
        engine.crash()

        started = time.perf_counter()
        engine = await Engine.open(env)
        state = await engine.read(lambda c: journal_load(c, "entry", "a7"))
        ready_seconds = time.perf_counter() - started
        assert state.records[-1][1] == 7, state.records[-1]
        await engine.aclose()

        figures = {
            "journal_records": records,
            "actors": actors,
            "journal_rows_kept": kept,
            "snapshot_every_records": snapshot_every_records,
            "synchronous": synchronous_default,
            "build_seconds": round(build_seconds, 2),
            "open_seconds": round(open_seconds, 4),
            "ready_seconds": round(ready_seconds, 4),
        }
        figures.update(await stall_burst(env, writes=20_000, tasks=50))
        return figures
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--actors", type=int, default=10_000)
    arguments = parser.parse_args()
    print(json.dumps(trio.run(main, arguments.records, arguments.actors)))
