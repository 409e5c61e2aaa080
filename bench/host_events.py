"""Host events-stream benchmark: prints one JSON line of figures (not a test; nothing asserts).

Why: issue 11 asks what the host surface's reminder push costs and how late it is.  The
contract's stream design is a poll (``GET /api/v1/events``: each live connection reads the
notifications table read-only about once per ``poll_seconds``, 1 s), so delivery latency is
bounded below by that interval, not by the machine: a reminder published just after a
stream's poll waits for its next one.  This script measures that honestly, with the limits
the contract fixes (32 streams in all, 2 per token) and the server as ``troupe serve`` builds it.

In this process, hypercorn (trio) serves the real host app over the parts ``troupe serve``
starts (as ``bench/host_intake.py``: a real ``Engine`` with default settings, so
``synchronous=FULL``, in a temporary directory; the real ``ActorSystem`` with every surface's
kinds and services; the offline model and embedder; the contract's ``EventSettings``), with
``--tokens`` tokens of scope ``all``.  The request-rate bucket keeps its defaults (streams
make two requests per token).

Publication goes through the path production uses, end to end: ``--reminders`` goals are
created by asking the goals actor ``("host_goals", "global")`` with the same ``CreateGoal``
command ``POST /api/v1/goals`` sends (entry goals spread over ``--entries`` entries, random
distinct contents so dedup never holds one, ``reminder_minutes`` 0 so each goal has exactly
one reminder, ``due``, at its deadline).  Each creation writes the goal and its durable
reminder row in one transaction.  The deadlines lie in the near future, spread evenly over
``--spread-seconds``; when they come, the runtime's reminder service fires each reminder as
an actor turn of the goals actor, which publishes one ``host_notifications`` row in one write
transaction (``fire_reminder`` -> ``publish``), and deletes the reminder row in a second one.
Nothing is inserted into the table directly.

Waves (``--waves``, 10 by default): the goals are created and published in that many waves, a
wave's goals all created before its first deadline, the next wave created once it is published.
Why: the reminder service reads *all* of an actor's pending reminder rows to fire one of them
(``reminders_for`` in ``troupe/runtime/_reminders.py``), and every goal reminder belongs to one
actor, so firing cost grows with the pending count and N reminders pending at once cost O(N²)
reads.  ``--waves 1`` (all 10,000 pending at once) measures that case; the default keeps 1,000
pending at a time, which is what the stream side is measured under.

A load generator in a *separate process* (off this process's interpreter lock; both share the
machine's cores, reported as ``cpu_count``) opens every stream over a raw socket, counts
``reminder`` frames per stream, and stamps each with the wall time of the read that completed
it.  Delivery latency = that receive time minus the row's ``published_at`` (the Env wall clock
read at the start of the goals actor's turn, so the publishing commit, ``synchronous=FULL``, is
inside the figure; the same machine clock on both sides).  Every stream sees every reminder
(scope ``all``), so there are ``reminders x streams`` deliveries.

Phases:
1. idle baseline: server CPU (this process, every thread) over ``--idle-seconds`` with no
   stream connected (the runtime, the learning worker and the reminder service idle too);
2. idle with all streams connected (before any reminder exists, after their first heartbeat):
   CPU over ``--idle-seconds``; per connection = CPU / streams / second, reported raw and net of
   the baseline (what the connections themselves cost: about one read snapshot per second
   each, plus a heartbeat every 15 s);
3. publication, wave by wave: goals created (their rate is reported, not a target), reminders
   fire, the client reports when every stream got every reminder; latency p50/p99/max over all
   deliveries, the reminder service's firing lag (``published_at`` minus the deadline) and the
   publication rate (published / time from each wave's first deadline to its last publication).

The streams must see a reminder within the contract's 300 s idle end: the script refuses a
wave whose estimated creation time (plus, for the first, the idle phases) leaves no room.

Usage: python bench/host_events.py [--reminders 10000] [--waves 10] [--tokens 16]
       [--streams-per-token 2] [--entries 500] [--spread-seconds 10] [--idle-seconds 30]
       [--delivery-timeout-seconds 1800] [--profile]
"""

from __future__ import annotations

import argparse
import array
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _load import (  # noqa: E402  (bench/ is first on sys.path)
    create_tokens,
    profiled,
    start_runtime,
    start_server,
)

events_path = "/api/v1/events"
bench_entry_prefix = "bench:events-"
goal_content_characters = 12
"""Random CJK characters per goal: two such contents share no bigram in practice, so dedup
neither merges nor holds a bench goal."""
cjk_first, cjk_last = 0x4E00, 0x9FA5
creation_concurrency = 32
"""Creations in flight at once (below the goals actor's 256-message mailbox)."""
rate_probe_goals = 100
"""Goals (without deadlines, in their own entry) created first to estimate the creation rate."""
deadline_margin_factor = 1.5
"""Deadlines start this many times the estimated creation time after the probe, plus the lead."""
deadline_lead_seconds = 5.0
settle_seconds = 2.0
"""After the streams connected (first heartbeat read), wait this long before measuring idle."""
stream_idle_end_seconds = 300.0
"""The contract's idle end: a stream that pushed no reminder for this long is closed."""
idle_end_margin_seconds = 30.0
wave_poll_seconds = 0.2
"""How often the driver checks whether a wave is fully published (a cheap count read)."""
connect_concurrency = 8
client_timeout_seconds_extra = 120.0

reminder_frame_pattern = re.compile(rb'event: reminder\ndata: \{"id":(\d+),')
heartbeat_pattern = re.compile(rb"event: heartbeat\n")
resync_pattern = re.compile(rb"event: resync\n")


def percentile(ordered: list[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# ---------------------------------------------------------------------------- load generator
# Runs in a child process: ``host_events.py --client SPEC_JSON``.  Protocol: it prints
# ``{"connected": n}`` once every stream read its first frame, ``{"delivered": ...}`` once every
# stream got ``expected`` reminder frames (or the deadline passed), then waits for one stdin line:
# a JSON object mapping notification id -> published_at; it then computes latencies, closes the
# streams and prints its result as the last line.


class StreamReader:
    """One ``/events`` connection: reminder frames (notification id, receive wall time),
    heartbeats, resyncs.  Chunked transfer framing stays in the buffer: the chunk-size lines sit
    between whole frames (hypercorn sends each ASGI body message as one chunk) and match none of
    the patterns."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.buffer = bytearray()
        self.notification_ids = array.array("q")
        self.received_at = array.array("d")
        self.heartbeats = 0
        self.resyncs = 0
        self.bytes = 0
        self.closed = False
        self.stream: trio.SocketStream | None = None

    async def open(self, port: int) -> None:
        self.stream = await trio.open_tcp_stream("127.0.0.1", port)
        request = (f"GET {events_path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n")
        await self.stream.send_all(request.encode("ascii"))
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the server closed the connection before the response head")
            self.buffer += data
        status_line = bytes(self.buffer[: self.buffer.find(b"\r\n")]).decode("latin-1")
        if " 200 " not in status_line + " ":
            raise ConnectionError(f"events: {status_line} {bytes(self.buffer[end:end + 300])!r}")
        del self.buffer[: end + 4]
        while self.heartbeats == 0:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the stream ended before its first heartbeat")
            self.feed(data, time.time())

    def feed(self, data: bytes, now: float) -> int:
        """Take ``data``; count the complete frames; the number of reminder frames among them."""
        self.buffer += data
        cut = self.buffer.rfind(b"\n\n")
        if cut < 0:
            return 0
        complete = bytes(self.buffer[: cut + 2])
        del self.buffer[: cut + 2]
        self.bytes += len(complete)
        self.heartbeats += len(heartbeat_pattern.findall(complete))
        self.resyncs += len(resync_pattern.findall(complete))
        found = reminder_frame_pattern.findall(complete)
        for identifier in found:
            self.notification_ids.append(int(identifier))
            self.received_at.append(now)
        return len(found)

    async def pump(self, progress: list[trio.Event]) -> None:
        """Read until the server ends the stream (or the task is cancelled)."""
        assert self.stream is not None
        try:
            while True:
                data = await self.stream.receive_some(262144)
                if not data:
                    break
                if self.feed(data, time.time()):
                    progress[0].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.closed = True
        progress[0].set()


def _emit(document: dict[str, Any]) -> None:
    print(json.dumps(document), flush=True)


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    readers = [StreamReader(token) for token in spec["tokens"] for _ in range(spec["streams_per_token"])]
    limiter = trio.CapacityLimiter(connect_concurrency)
    errors: list[str] = []

    async def open_one(reader: StreamReader) -> None:
        async with limiter:
            await reader.open(spec["port"])

    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(open_one, reader)
    _emit({"connected": len(readers)})

    expected = spec["expected"]
    progress = [trio.Event()]
    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(reader.pump, progress)
        with trio.move_on_after(spec["timeout_seconds"]) as waited:
            while not all(len(reader.notification_ids) >= expected or reader.closed for reader in readers):
                progress[0] = trio.Event()
                await progress[0].wait()
        if waited.cancelled_caught:
            errors.append(f"not every stream got {expected} reminders within {spec['timeout_seconds']} s")
        closed_early = sum(reader.closed for reader in readers)
        if closed_early:
            errors.append(f"{closed_early} streams were ended by the server before the end")
        _emit({"delivered": sum(len(reader.notification_ids) for reader in readers),
               "wait_seconds": round(time.perf_counter() - began, 1)})
        heartbeats_before = sum(reader.heartbeats for reader in readers)
        reminders_before = sum(len(reader.notification_ids) for reader in readers)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        heartbeats_after = sum(reader.heartbeats for reader in readers)
        reminders_after = sum(len(reader.notification_ids) for reader in readers)
        nursery.cancel_scope.cancel()
    for reader in readers:
        if reader.stream is not None:
            await reader.stream.aclose()

    published = {int(key): value for key, value in json.loads(line).items()}
    latencies: list[float] = []
    unknown = duplicates = out_of_order = 0
    for reader in readers:
        seen: set[int] = set()
        previous = 0
        for identifier, received in zip(reader.notification_ids, reader.received_at, strict=True):
            if identifier in seen:
                duplicates += 1
            seen.add(identifier)
            if identifier <= previous:
                out_of_order += 1
            previous = identifier
            at = published.get(identifier)
            if at is None:
                unknown += 1
                continue
            latencies.append(received - at)
    latencies.sort()
    per_stream = [len(reader.notification_ids) for reader in readers]
    if unknown or duplicates or out_of_order:
        errors.append(f"frames with unknown ids {unknown}, duplicates {duplicates}, out of order {out_of_order}")
    return {
        "streams": len(readers),
        "deliveries": len(latencies),
        "reminders_per_stream_min": min(per_stream),
        "reminders_per_stream_max": max(per_stream),
        "latency_p50_ms": _round(None if not latencies else percentile(latencies, 0.50) * 1000, 1),
        "latency_p99_ms": _round(None if not latencies else percentile(latencies, 0.99) * 1000, 1),
        "latency_max_ms": _round(None if not latencies else latencies[-1] * 1000, 1),
        "latency_min_ms": _round(None if not latencies else latencies[0] * 1000, 1),
        "latency_mean_ms": _round(None if not latencies else sum(latencies) / len(latencies) * 1000, 1),
        "bytes_received": sum(reader.bytes for reader in readers),
        "resyncs": sum(reader.resyncs for reader in readers),
        "heartbeats_during_hold": heartbeats_after - heartbeats_before,
        "reminders_during_hold": reminders_after - reminders_before,
        "errors": errors,
    }


def client_main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    result = trio.run(_client, spec)
    times = os.times()
    result["client_cpu_seconds"] = round(times.user + times.system, 2)
    _emit(result)


class ClientProcess:
    """The load generator as a child process: its stdout read line by line, its stdin written."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buffer = bytearray()

    @classmethod
    async def start(cls, nursery: trio.Nursery, spec: dict[str, Any]) -> ClientProcess:
        command = [sys.executable, os.path.abspath(__file__), "--client", json.dumps(spec)]
        process = await nursery.start(lambda task_status: trio.run_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, check=False, task_status=task_status))
        return cls(process)

    async def line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while (end := self.buffer.find(b"\n")) < 0:
            data = await self.process.stdout.receive_some(1 << 20)
            if not data:
                raise RuntimeError(f"the load generator ended early (exit {self.process.returncode})")
            self.buffer += data
        text = bytes(self.buffer[:end]).decode()
        del self.buffer[: end + 1]
        return json.loads(text)

    async def say(self, document: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all((json.dumps(document) + "\n").encode())


# ---------------------------------------------------------------------------- server


async def start_host(nursery: trio.Nursery, data_dir: str, tokens: int) -> tuple[Any, Any, Any, Any, int, list[str]]:
    """The host app over the parts ``troupe serve`` starts (see ``troupe.server._serve``) and
    ``tokens`` tokens of scope ``all``."""
    from troupe.auth import TokenScope
    from troupe.http.host import HostAppDependencies, create_host_app

    runtime = await start_runtime(nursery, data_dir)
    env, engine, system = runtime.env, runtime.engine, runtime.system
    secrets = await create_tokens(runtime, [f"bench-events-{number}" for number in range(tokens)], TokenScope.all())
    dependencies = HostAppDependencies(env=env, engine=engine, system=system, readiness=lambda: system.running)
    app = create_host_app(dependencies)
    port = await start_server(nursery, app)
    return env, engine, system, app, port, secrets


class CpuMeter:
    """Process CPU (every thread), wall time and, given an engine, its storage counters over a
    ``with`` block."""

    def __init__(self, engine: Any = None) -> None:
        self.engine = engine

    def __enter__(self) -> CpuMeter:
        self.began_cpu = time.process_time()
        self.wall = time.perf_counter()
        self.began_statistics = self.engine.statistics() if self.engine is not None else None
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.seconds = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.began_cpu
        if self.engine is not None:
            before, after = self.began_statistics, self.engine.statistics()
            commits = after.commits - before.commits
            self.storage = {
                "commits": commits,
                "write_jobs": after.jobs - before.jobs,
                "read_jobs": after.read_jobs - before.read_jobs,
                "commit_ms_mean": round((after.commit_seconds_total - before.commit_seconds_total)
                                        / commits * 1000, 2) if commits else None,
            }


def goal_content(chooser: random.Random) -> str:
    return "".join(chr(chooser.randint(cjk_first, cjk_last)) for _ in range(goal_content_characters))


def create_command(content: str, entry_id: str, deadline_seconds: float | None) -> Any:
    from troupe.actors.host._goals import CreateGoal, Deadline

    return CreateGoal(
        content=content, kind="normal", people=(), entry_id=entry_id,
        deadline=None if deadline_seconds is None else Deadline(seconds=deadline_seconds),
        reminder_minutes=0, host_key=None, source="bench-events", all_scope=True, allows=lambda _entry: True,
    )


async def create_goals(system: Any, commands: list[Any]) -> dict[str, int]:
    """Ask the goals actor to create each goal (``creation_concurrency`` in flight); outcomes
    by dedup result (``created`` expected) or failure kind."""
    from troupe.actors.host._goals import GoalReply, goals_key, goals_kind_name

    outcomes: dict[str, int] = {}
    limiter = trio.CapacityLimiter(creation_concurrency)
    goals = system.ref(goals_kind_name, goals_key)

    async def create(command: Any) -> None:
        async with limiter:
            reply = await goals.ask(command, timeout=120)
        outcome = reply.document["dedup"]["result"] if isinstance(reply, GoalReply) else type(reply).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    async with trio.open_nursery() as nursery:
        for command in commands:
            nursery.start_soon(create, command)
    return outcomes


def wave_sizes(total: int, waves: int) -> list[int]:
    """``total`` goals in ``waves`` waves as even as possible (no empty wave)."""
    waves = max(1, min(waves, total))
    return [total // waves + (1 if index < total % waves else 0) for index in range(waves)]


class MeterTotals:
    """Sums of several ``CpuMeter`` blocks (wall, CPU, storage counters)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self._storage: dict[str, float] = {"commits": 0, "write_jobs": 0, "read_jobs": 0, "commit_seconds": 0.0}

    def add(self, meter: CpuMeter) -> None:
        self.seconds += meter.seconds
        self.cpu += meter.cpu
        for name in ("commits", "write_jobs", "read_jobs"):
            self._storage[name] += meter.storage[name]
        self._storage["commit_seconds"] += (meter.storage["commit_ms_mean"] or 0) * meter.storage["commits"] / 1000

    @property
    def storage(self) -> dict[str, Any]:
        commits = self._storage["commits"]
        return {"commits": commits, "write_jobs": self._storage["write_jobs"], "read_jobs": self._storage["read_jobs"],
                "commit_ms_mean": round(self._storage["commit_seconds"] / commits * 1000, 2) if commits else None}


async def published_count(engine: Any) -> int:
    return await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM host_notifications WHERE kind = 'goal_reminder'").fetchone()[0])


async def published_rows(engine: Any) -> list[tuple[int, float, float]]:
    """(id, published_at, scheduled_at) of every goal reminder."""
    return await engine.read(lambda connection: [tuple(row) for row in connection.execute(
        "SELECT id, published_at, scheduled_at FROM host_notifications WHERE kind = 'goal_reminder' ORDER BY id")])


async def idle_cpu(seconds: float) -> dict[str, float]:
    with CpuMeter() as meter:
        await trio.sleep(seconds)
    return {"cpu_seconds": round(meter.cpu, 3), "wall_seconds": round(meter.seconds, 2),
            "cpu_share": round(meter.cpu / meter.seconds, 4)}


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    streams = arguments.tokens * arguments.streams_per_token
    figures: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        "note": "server and load generator processes share these cores",
        "publication_path": "goals actor CreateGoal (as POST /goals) -> durable due reminder -> "
                            "reminder service fires -> goals actor turn publishes one row (fire_reminder)",
        "tokens": arguments.tokens,
        "streams": streams,
        "reminders": arguments.reminders,
        "entries": arguments.entries,
        "spread_seconds": arguments.spread_seconds,
        "waves": arguments.waves,
        "idle_seconds": arguments.idle_seconds,
    }
    chooser = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="troupe-bench-events-") as directory:
        async with trio.open_nursery() as nursery:
            env, engine, system, app, port, secrets = await start_host(nursery, directory, arguments.tokens)
            hub = app.state.events
            figures["poll_seconds"] = hub.settings.poll_seconds
            figures["heartbeat_seconds"] = hub.settings.heartbeat_seconds
            await trio.sleep(settle_seconds)

            figures["idle_no_streams"] = await idle_cpu(arguments.idle_seconds)

            spec = {"port": port, "tokens": secrets, "streams_per_token": arguments.streams_per_token,
                    "expected": arguments.reminders,
                    "timeout_seconds": arguments.delivery_timeout_seconds}
            client = await ClientProcess.start(nursery, spec)
            connected = await client.line()
            connected_at = time.perf_counter()
            assert connected["connected"] == streams and hub.connections == streams, (connected, hub.connections)
            await trio.sleep(settle_seconds)
            idle = await idle_cpu(arguments.idle_seconds)
            assert hub.connections == streams, "a stream ended during the idle phase"
            baseline = figures["idle_no_streams"]["cpu_share"]
            idle["cpu_ms_per_connection_second"] = round(idle["cpu_share"] / streams * 1000, 3)
            idle["net_cpu_ms_per_connection_second"] = round((idle["cpu_share"] - baseline) / streams * 1000, 3)
            figures["idle_streams"] = idle

            # Estimate the creation rate, then publish in waves: each wave's goals are all created
            # before the first of their deadlines, and a wave starts once the previous one published.
            probe = [create_command(goal_content(chooser), f"{bench_entry_prefix}probe", None)
                     for _ in range(rate_probe_goals)]
            with CpuMeter() as meter:
                await create_goals(system, probe)
            seconds_per_goal = meter.seconds / rate_probe_goals
            waves = wave_sizes(arguments.reminders, arguments.waves)
            creation_outcomes: dict[str, int] = {}
            creation_totals = MeterTotals()
            publication_totals = MeterTotals()
            wave_figures = []
            number = 0
            published_before = 0
            for wave, size in enumerate(waves):
                lead = size * seconds_per_goal * deadline_margin_factor + deadline_lead_seconds
                # The streams' idle clock runs from their connection until the first reminder.
                waited = time.perf_counter() - connected_at if wave == 0 else 0.0
                if waited + lead >= stream_idle_end_seconds - idle_end_margin_seconds:
                    raise SystemExit(f"host_events: creating a wave of {size} goals should take about "
                                     f"{lead:.0f} s: the streams would reach their {stream_idle_end_seconds:.0f} s "
                                     "idle end first (use more --waves)")
                first_deadline = env.clock.wall() + lead
                step = arguments.spread_seconds / max(1, size - 1)
                commands = []
                for index in range(size):
                    entry_id = f"{bench_entry_prefix}{(number + index) % arguments.entries}"
                    commands.append(create_command(goal_content(chooser), entry_id, first_deadline + index * step))
                number += size
                with CpuMeter(engine) as creation:
                    outcomes = await create_goals(system, commands)
                creation_totals.add(creation)
                for outcome, count in outcomes.items():
                    creation_outcomes[outcome] = creation_outcomes.get(outcome, 0) + count
                in_time = env.clock.wall() < first_deadline
                await trio.sleep(max(0.0, first_deadline - env.clock.wall()))
                # From the wave's first deadline until all of it is published.
                with profiled(arguments.profile, lines=arguments.profile_lines), CpuMeter(engine) as publication:
                    while await published_count(engine) < published_before + size:
                        await trio.sleep(wave_poll_seconds)
                publication_totals.add(publication)
                published_before += size
                wave_figures.append({"goals": size, "created_before_deadline": in_time,
                                     "publish_seconds": round(publication.seconds, 1)})

            delivered = await client.line()
            rows = await published_rows(engine)
            figures["creation"] = {
                "goals_per_second": round(arguments.reminders / creation_totals.seconds, 1),
                "seconds": round(creation_totals.seconds, 1),
                "outcomes": creation_outcomes,
                "storage": creation_totals.storage,
            }
            figures["per_wave"] = wave_figures
            figures["delivery_wait_seconds"] = delivered["wait_seconds"]
            published = {row[0]: row[1] for row in rows}
            lags = sorted(row[1] - row[2] for row in rows)
            figures["publication"] = {
                "published": len(rows),
                "seconds": round(publication_totals.seconds, 1),
                "per_second": round(len(rows) / publication_totals.seconds, 1),
                "firing_lag_p50_ms": _round(None if not lags else percentile(lags, 0.5) * 1000, 1),
                "firing_lag_p99_ms": _round(None if not lags else percentile(lags, 0.99) * 1000, 1),
                "firing_lag_max_ms": _round(None if not lags else lags[-1] * 1000, 1),
                "server_cpu_seconds": round(publication_totals.cpu, 1),
                "server_cpu_share": round(publication_totals.cpu / publication_totals.seconds, 2),
                "reminders_pushed": hub.reminders_pushed,
                "storage": publication_totals.storage,
            }
            await client.say({str(key): value for key, value in published.items()})
            result = await client.line()
            figures["delivery"] = result
            hub.shutdown()
            await system.drain()
            nursery.cancel_scope.cancel()
    if figures["delivery"].get("errors"):
        print(f"host_events: errors: {figures['delivery']['errors']}", file=sys.stderr)
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reminders", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--streams-per-token", type=int, default=2)
    parser.add_argument("--entries", type=int, default=500,
                        help="entries the goals are spread over (dedup compares goals within an entry)")
    parser.add_argument("--spread-seconds", type=float, default=10.0,
                        help="the deadlines are spread evenly over this many seconds (0: all at once)")
    parser.add_argument("--waves", type=int, default=10,
                        help="publish in this many waves (1: every goal pending at once; see the docstring)")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--delivery-timeout-seconds", type=float, default=1800.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the publication phase (stderr)")
    parser.add_argument("--profile-lines", type=int, default=30)
    parsed = parser.parse_args()
    print(json.dumps(trio.run(main, parsed)), flush=True)
