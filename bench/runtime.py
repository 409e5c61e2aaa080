"""Runtime benchmark: prints one JSON line of figures (not a test; nothing here asserts time).

- ask round-trips per second versus a raw trio memory-channel ping-pong in the same run;
- live actors per GiB after 100k activations, and what is left once they passivated;
- p99 reactivation from storage (first ask to a passivated, journal-backed actor);
- time to ready after a crash with 1M journal records;
- worst event-loop stall during a burst of actor writes (storage on worker threads);
- burst writes per second with group commit at ``synchronous=FULL`` (the engine's default,
  one fsync of the WAL per batch) and at ``NORMAL`` (no fsync at commit: not power-safe), in
  the same run, on the same disk (the temporary directory; pass ``TMPDIR`` to choose it).

Usage: python bench/runtime.py [--activations 100000] [--journal-records 1000000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from troupe.runtime import Actor, ActorKind, ActorSystem, real_env  # noqa: E402
from troupe.storage import (  # noqa: E402
    Engine,
    journal_append,
    journal_load,
    journal_snapshot,
    synchronous_default,
)


def resident_bytes() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Echo(Actor):
    async def receive(self, message):
        return message


class Ledger(Actor):
    """Event-sourced: the journal is replayed on activation; each turn appends one record."""

    async def on_activate(self):
        key = self.context.key
        loaded = await self.context.storage.read(lambda connection: journal_load(connection, "ledger", key))
        self.total = (loaded.snapshot or 0) + sum(record for _, record in loaded.records)

    async def receive(self, message):
        key = self.context.key
        await self.context.storage.write(lambda connection: journal_append(connection, "ledger", key, [message]))
        self.total += message
        return self.total


async def raw_ping_pong(round_trips: int) -> float:
    send_request, receive_request = trio.open_memory_channel(1)
    send_reply, receive_reply = trio.open_memory_channel(1)

    async def server():
        async for message in receive_request:
            await send_reply.send(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        started = time.perf_counter()
        for index in range(round_trips):
            await send_request.send(index)
            await receive_reply.receive()
        elapsed = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    return round_trips / elapsed


async def ask_round_trips(system: ActorSystem, round_trips: int) -> float:
    ref = system.ref("echo", "bench")
    await ref.ask(0)
    started = time.perf_counter()
    for index in range(round_trips):
        await ref.ask(index)
    return round_trips / (time.perf_counter() - started)


async def live_actor_memory(system: ActorSystem, activations: int) -> dict:
    gc.collect()
    before = resident_bytes()
    for index in range(activations):
        await system.ref("echo", f"actor-{index}").ask(index)
    gc.collect()
    after = resident_bytes()
    per_actor = max(after - before, 1) / activations
    await system.drain()
    gc.collect()
    drained = resident_bytes()
    return {
        "activations": activations,
        "bytes_per_live_actor": round(per_actor),
        "live_actors_per_gib": round(2**30 / per_actor),
        "resident_mib_after_passivation_delta": round((drained - before) / 2**20, 1),
    }


async def reactivation(env, directory: str, actors: int = 2000, records_each: int = 20) -> dict:
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)

        def fill(connection):
            for index in range(actors):
                journal_append(connection, "ledger", f"l-{index}", list(range(records_each)))

        await engine.write(fill)
        system = ActorSystem(env, [ActorKind("ledger", Ledger)], storage=engine)
        await nursery.start(system.run)
        latencies = []
        for index in range(actors):
            started = time.perf_counter()
            await system.ref("ledger", f"l-{index}").ask(1)
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        await system.drain()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return {
        "reactivation_p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "reactivation_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
        "reactivation_records_each": records_each,
    }


async def write_burst_stall(env, tasks: int = 50, writes_each: int = 400,
                            synchronous: str = synchronous_default) -> dict:
    worst = 0.0
    tick_seconds = 0.001
    stop = trio.Event()

    async def ticker():
        nonlocal worst
        while not stop.is_set():
            before = trio.current_time()
            await trio.sleep(tick_seconds)
            worst = max(worst, trio.current_time() - before - tick_seconds)

    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery, synchronous=synchronous)
        system = ActorSystem(env, [ActorKind("ledger", Ledger)], storage=engine)
        await nursery.start(system.run)
        nursery.start_soon(ticker)
        started = time.perf_counter()

        async def writer(index):
            for _ in range(writes_each):
                await system.ref("ledger", f"w-{index}").ask(1)

        async with trio.open_nursery() as writers:
            for index in range(tasks):
                writers.start_soon(writer, index)
        elapsed = time.perf_counter() - started
        stop.set()
        statistics_ = engine.statistics()
        await system.drain()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    writes = tasks * writes_each
    return {
        "burst_writes": writes,
        "burst_writes_per_second": round(writes / elapsed),
        "burst_transactions": statistics_.transactions,
        "worst_loop_stall_ms": round(worst * 1000, 3),
    }


async def ready_after_crash(env, records: int) -> dict:
    actors = max(records // 100, 1)
    per_actor = records // actors
    build_started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        batch_actors = 500
        for first in range(0, actors, batch_actors):

            def fill(connection, first=first):
                for index in range(first, min(first + batch_actors, actors)):
                    key = f"j-{index}"
                    last = journal_append(connection, "ledger", key, [1] * per_actor)
                    # A snapshot every 64 records, as a runtime would: keep the last unpruned
                    # tail so recovery replays a bounded number of records.
                    journal_snapshot(connection, "ledger", key, last - last % 64, last - last % 64, prune=False)

            await engine.write(fill)
        build_seconds = time.perf_counter() - build_started
        engine.crash()
        nursery.cancel_scope.cancel()
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery)
        system = ActorSystem(env, [ActorKind("ledger", Ledger)], storage=engine)
        await nursery.start(system.run)
        total = await system.ref("ledger", "j-0").ask(0)
        ready_seconds = time.perf_counter() - started
        assert total == per_actor, total
        count = await engine.read(lambda connection: connection.execute("SELECT count(*) FROM journal").fetchone()[0])
        await system.drain()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return {
        "journal_records": count,
        "journal_build_seconds": round(build_seconds, 2),
        "ready_after_crash_seconds": round(ready_seconds, 3),
    }


async def main(arguments) -> dict:
    figures: dict = {"python": sys.version.split()[0], "trio": trio.__version__}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-") as directory:
        env = real_env(directory)
        round_trips = arguments.round_trips
        async with trio.open_nursery() as nursery:
            system = ActorSystem(env, [ActorKind("echo", Echo, idle_seconds=3600)], live_actors_max=10**7)
            await nursery.start(system.run)
            raw = statistics.median([await raw_ping_pong(round_trips) for _ in range(3)])
            asks = statistics.median([await ask_round_trips(system, round_trips) for _ in range(3)])
            figures.update(
                raw_channel_round_trips_per_second=round(raw),
                ask_round_trips_per_second=round(asks),
                ask_to_raw_ratio=round(asks / raw, 3),
            )
            figures.update(await live_actor_memory(system, arguments.activations))
            nursery.cancel_scope.cancel()
        figures.update(await reactivation(env, directory))
        figures.update(await write_burst_stall(real_env(os.path.join(directory, "burst"))))
        for synchronous in ("FULL", "NORMAL"):
            burst = await write_burst_stall(
                real_env(os.path.join(directory, f"burst-{synchronous.lower()}")),
                synchronous=synchronous)
            figures[f"burst_writes_per_second_{synchronous.lower()}"] = burst[
                "burst_writes_per_second"]
            figures[f"burst_transactions_{synchronous.lower()}"] = burst["burst_transactions"]
        figures.update(await ready_after_crash(real_env(os.path.join(directory, "crash")), arguments.journal_records))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", type=int, default=100_000)
    parser.add_argument("--journal-records", type=int, default=1_000_000)
    parser.add_argument("--round-trips", type=int, default=20_000)
    print(json.dumps(trio.run(main, parser.parse_args())))
