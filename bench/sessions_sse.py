"""Sessions event-stream benchmark: prints one JSON line of figures (not a test; nothing asserts).

Why: issue 8 sets three targets on the sessions surface's SSE path (the ring, the per-connection
subscribers, the stream writer): fan-out to many subscribers at no less than half the rate of a
plain SSE app, reconnect replay of a full ring in at most 50 ms at p99, and at most 64 KiB per
idle connection.  This script measures all three in one run, on 127.0.0.1 with ephemeral ports.

In this process, hypercorn (trio) serves the real sessions app as ``troupe serve`` builds it: a
real ``Engine`` (default settings) in a temporary directory, the real ``ActorSystem`` with every
surface's kinds and services, the configured model (the offline default: its scripted agent
mode, ``troupe/models/_local_agent.py``) and a real end-user token.  Events are made the way
production makes them: ``POST …/messages`` with a ``/say`` directive of many sentences; the
local model streams one ``msg.text.delta`` per sentence, the session actor publishes each (one
encoding, into the ring, offered to every ``Subscriber``) and every connection's SSE writer
sends what its subscriber queued.

A *reference* app runs in a child process: sse-starlette on uvicorn (asyncio, h11; whatever
uvicorn picks here, reported as ``reference_stack``), one ``asyncio.Queue`` per connection,
publishing bursts of the same number of events with the same envelope keys and sentences.

Load generators run in *separate processes* (off this process's interpreter lock; all processes
share the machine's cores, reported as ``cpu_count``) over raw sockets, counting frames by their
``id:`` lines and reading each frame's ``ts`` with a regular expression (a JSON parse per frame
would make the client the bottleneck):

1. idle memory: after 16 connections came and went (one-time costs), ``--idle`` connections
   subscribe and wait, twice: the RSS delta without tracing (everything, allocator slack
   included), then ``tracemalloc`` (Python allocations only); each divided by the count;
2. fan-out: ``--subscribers`` connections on one session; bursts (turns) of ``--events`` events
   are published back to back for ``--seconds`` (each burst waits until every subscriber got its
   terminal event): deliveries/s across all subscribers (from the first measured event's ``ts``
   to the last receive) and publish-to-receive latency (receive wall clock minus the event's
   ``ts``; same machine clock; ``ts`` is whole milliseconds, so figures carry up to 1 ms of
   truncation);
3. the same fan-out against the reference app; the ratio;
4. replay: ``--replays`` reconnects in turn, each with ``Last-Event-ID`` 1024 events back: time
   from opening the connection to having read all 1024 replayed frames.

Server-side figures per phase: CPU seconds (this process, every thread; the reference app's
own), and the garbage collector's collections, full collections, wall pauses and CPU time in the
collecting thread (a busy machine inflates wall pauses; CPU time does not).

Targets (issue 8): fan-out >= 50% of the reference's deliveries/s; replay of 1024 events
p99 <= 50 ms; <= 64 KiB per idle connection (judged on the RSS figure).

Usage: python bench/sessions_sse.py [--subscribers 500] [--events 1100] [--seconds 10]
       [--idle 500] [--replays 200] [--profile fanout|replay|idle] [--memory-top N]
       [--gc-threshold N] [--no-gc-freeze] [--gc-census N]
(the last three are experiments on the server process's garbage collector, see docs/sessions.md;
by default the server's start-up heap is frozen once it is ready, as ``troupe serve`` does:
``troupe/server/_process.py``)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _load import (  # noqa: E402  (bench/ is first on sys.path)
    create_tokens,
    profiled_phase,
    start_runtime,
    start_server,
)

end_user_id = "u_bench"
replay_events = 1024
"""The contract's ring size: a reconnect replays this many events at most."""
connect_concurrency = 64
"""Connections opened at once by a load generator (the listen backlog is finite)."""
burst_timeout_seconds = 120.0
"""A burst whose terminal event has not reached every subscriber by then is reported, not waited."""
warm_up_events = 100
idle_warm_up_connections = 16
settle_seconds = 0.5
"""Idle phase: after every connection is subscribed, wait this long before measuring memory."""
turn_events_overhead = 6
"""Events of a ``/say`` turn besides its text deltas (started, usage, block start and end,
completed, one spare): ``--events`` is the turn's total, roughly."""

frame_id_pattern = b"\nid: "
ts_pattern = re.compile(rb'"ts":(\d+)')
terminal_pattern = re.compile(rb'"type":"turn\.(?:completed|aborted|error)"')


def sentence(index: int) -> str:
    """One streamed text delta (the local model streams one per sentence)."""
    return f"这是第{index}句流式输出，用来测量扇出与重放。"


def say_prompt(events: int) -> str:
    deltas = max(1, events - turn_events_overhead)
    return "/say " + "".join(sentence(index) for index in range(deltas))


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


# ---------------------------------------------------------------------------- load generators
# Run in child processes: ``sessions_sse.py --client SPEC_JSON``; the last stdout line is JSON.


def _request(method: str, path: str, port: int, headers: dict[str, str], body: bytes | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b"")


async def _read_head(stream: trio.SocketStream, buffer: bytearray) -> tuple[int, dict[str, str]]:
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection before its response head")
        buffer += data
    head = bytes(buffer[:end]).decode("latin-1")
    del buffer[: end + 4]
    status_line, *header_lines = head.split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ", 2)[1]), headers


async def _exchange(stream: trio.SocketStream, request: bytes) -> tuple[int, bytes]:
    """One request on a keep-alive connection; the reply must carry Content-Length."""
    await stream.send_all(request)
    buffer = bytearray()
    status, headers = await _read_head(stream, buffer)
    length = int(headers.get("content-length", "0"))
    while len(buffer) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection mid-reply")
        buffer += data
    return status, bytes(buffer[:length])


class StreamReader:
    """One SSE connection: counts event frames (``id:`` lines), terminal events and the
    publish-to-receive latency of every frame carrying a ``ts``.  Chunked transfer framing is
    left in place: chunk-size lines sit between whole frames and match none of the patterns."""

    def __init__(self, record_latency: bool) -> None:
        self.record_latency = record_latency
        self.buffer = bytearray()
        self.frames = 0
        self.bytes = 0
        self.terminals = 0
        self.latencies_ms: list[float] = []
        self.first_ts: int | None = None
        self.last_receive: float = 0.0
        self.closed = False
        self.stream: trio.SocketStream | None = None
        self.sample: bytes | None = None
        """One ``msg.text.delta`` frame's data, so the reference app can publish the same shape."""

    async def open(self, port: int, path: str, headers: dict[str, str]) -> None:
        self.stream = await trio.open_tcp_stream("127.0.0.1", port)
        await self.stream.send_all(_request("GET", path, port, headers))
        status, _ = await _read_head(self.stream, self.buffer)
        if status != 200:
            raise ConnectionError(f"events: HTTP {status} {bytes(self.buffer[:300])!r}")
        # The stream is open once its first frame (``retry:``) arrived: the subscriber is live.
        while b"\n\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                raise ConnectionError("the stream ended before its first frame")
            self.buffer += data
        self._feed(b"", time.time())

    def _feed(self, data: bytes, now: float) -> None:
        self.buffer += data
        cut = self.buffer.rfind(b"\n\n")
        if cut < 0:
            return
        complete = bytes(self.buffer[: cut + 2])
        del self.buffer[: cut + 2]
        self.bytes += len(complete)
        self.frames += complete.count(frame_id_pattern) + complete.startswith(b"id: ")
        if self.record_latency:
            stamps = [int(stamp) for stamp in ts_pattern.findall(complete)]
            if stamps:
                if self.first_ts is None:
                    self.first_ts = stamps[0]
                now_ms = now * 1000.0
                self.latencies_ms.extend(now_ms - stamp for stamp in stamps)
        self.terminals += len(terminal_pattern.findall(complete))
        self.last_receive = now
        if self.sample is None and self.record_latency:
            self.sample = _delta_sample(complete)

    async def pump(self, changed: list[trio.Event]) -> None:
        """Read until the server ends the stream (or the task is cancelled)."""
        assert self.stream is not None
        try:
            while True:
                data = await self.stream.receive_some(262144)
                if not data:
                    break
                terminals = self.terminals
                self._feed(data, time.time())
                if self.terminals != terminals:
                    changed[0].set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self.closed = True
        changed[0].set()

    def reset_measure(self) -> None:
        self.frames = 0
        self.bytes = 0
        self.latencies_ms = []
        self.first_ts = None


def _delta_sample(complete: bytes) -> bytes | None:
    for frame in complete.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: ") and b'"type":"msg.text.delta"' in line:
                return line[6:]
    return None


async def _open_all(spec: dict[str, Any], count: int, record_latency: bool) -> list[StreamReader]:
    readers = [StreamReader(record_latency) for _ in range(count)]
    limiter = trio.CapacityLimiter(connect_concurrency)

    async def open_one(reader: StreamReader) -> None:
        async with limiter:
            await reader.open(spec["port"], spec["events_path"], spec["headers"])

    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(open_one, reader)
    return readers


async def _fanout(spec: dict[str, Any]) -> dict[str, Any]:
    readers = await _open_all(spec, spec["subscribers"], record_latency=True)
    changed = [trio.Event()]
    errors: list[str] = []
    bursts = 0
    terminals_before = 0

    async def burst(events: int) -> bool:
        nonlocal terminals_before
        document = {**spec["publish_body"], spec["publish_count_key"]: _count_value(spec, events)}
        body = json.dumps(document, ensure_ascii=False).encode("utf-8")
        # A connection per burst: a burst can outlast the server's keep-alive timeout.
        async with await trio.open_tcp_stream("127.0.0.1", spec["port"]) as publisher:
            status, reply = await _exchange(publisher, _request(
                "POST", spec["publish_path"], spec["port"], {**spec["headers"], "Connection": "close"}, body))
        if status not in (200, 201, 202):
            errors.append(f"publish HTTP {status} {reply[:300]!r}")
            return False
        target = terminals_before + 1
        with trio.move_on_after(burst_timeout_seconds) as scope:
            while not all(reader.terminals >= target or reader.closed for reader in readers):
                changed[0] = trio.Event()
                await changed[0].wait()
        if scope.cancelled_caught:
            late = sum(reader.terminals < target and not reader.closed for reader in readers)
            errors.append(f"burst {target}: {late} subscribers without the terminal event after "
                          f"{burst_timeout_seconds}s")
            return False
        terminals_before = target
        return True

    async with trio.open_nursery() as nursery:
        for reader in readers:
            nursery.start_soon(reader.pump, changed)
        ok = await burst(min(spec["events"], warm_up_events))
        for reader in readers:
            reader.reset_measure()
        began = time.perf_counter()
        while ok:
            ok = await burst(spec["events"])
            bursts += ok
            if time.perf_counter() - began >= spec["seconds"]:
                break
        nursery.cancel_scope.cancel()
    for reader in readers:
        if reader.stream is not None:
            with contextlib.suppress(Exception):
                await reader.stream.aclose()
    latencies = [latency for reader in readers for latency in reader.latencies_ms]
    delivered = sum(reader.frames for reader in readers)
    first_ts = min((reader.first_ts for reader in readers if reader.first_ts is not None), default=None)
    last_receive = max(reader.last_receive for reader in readers)
    seconds = last_receive - first_ts / 1000.0 if first_ts is not None else None
    closed = sum(reader.closed for reader in readers)
    if closed:
        errors.append(f"{closed} subscribers were disconnected by the server")
    return {
        "subscribers": len(readers),
        "bursts": bursts,
        "events_per_subscriber": readers[0].frames,
        "frame_bytes_mean": round(sum(r.bytes for r in readers) / delivered, 1) if delivered else None,
        "delivered": delivered,
        "seconds": round(seconds, 3) if seconds else None,
        "delivered_per_second": round(delivered / seconds, 1) if seconds else None,
        "latency_p50_ms": _round(percentile(latencies, 0.50)),
        "latency_p99_ms": _round(percentile(latencies, 0.99)),
        "latency_max_ms": _round(max(latencies) if latencies else None),
        "sample_delta": readers[0].sample.decode("utf-8") if readers[0].sample else None,
        "errors": errors,
    }


def _count_value(spec: dict[str, Any], events: int) -> Any:
    """What the publish body says about the burst size: a ``/say`` prompt (the sessions app) or
    a plain count (the reference app)."""
    return say_prompt(events) if spec["publish_count_key"] == "prompt" else events


def _round(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


async def _replay(spec: dict[str, Any]) -> dict[str, Any]:
    timings: list[float] = []
    errors: list[str] = []
    headers = {**spec["headers"], "Last-Event-ID": str(spec["after_seq"])}
    for _ in range(spec["replays"]):
        began = time.perf_counter()
        stream = await trio.open_tcp_stream("127.0.0.1", spec["port"])
        async with stream:
            await stream.send_all(_request("GET", spec["events_path"], spec["port"], headers))
            buffer = bytearray()
            status, _ = await _read_head(stream, buffer)
            if status != 200:
                errors.append(f"replay HTTP {status}")
                break
            reader = StreamReader(record_latency=False)
            reader._feed(bytes(buffer), 0.0)
            while reader.frames < replay_events:
                data = await stream.receive_some(262144)
                if not data:
                    break
                reader._feed(data, 0.0)
            elapsed = time.perf_counter() - began
        if reader.frames != replay_events:
            errors.append(f"replay read {reader.frames} frames, not {replay_events}")
            break
        timings.append(elapsed * 1000.0)
    return {
        "replays": len(timings),
        "p50_ms": _round(percentile(timings, 0.50)),
        "p99_ms": _round(percentile(timings, 0.99)),
        "max_ms": _round(max(timings) if timings else None),
        "errors": errors,
    }


async def _idle(spec: dict[str, Any]) -> dict[str, Any]:
    """Open the connections, say so on stdout, hold them until stdin says ``close``."""
    readers = await _open_all(spec, spec["connections"], record_latency=False)
    print(json.dumps({"connected": len(readers)}), flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)
    for reader in readers:
        if reader.stream is not None:
            await reader.stream.aclose()
    return {"connections": len(readers), "errors": []}


def client_main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    runner = {"fanout": _fanout, "replay": _replay, "idle": _idle}[spec["mode"]]
    result = trio.run(runner, spec)
    result["client_cpu_seconds"] = round(time.process_time(), 2)
    print(json.dumps(result), flush=True)


def _client_command(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--client", json.dumps(spec, ensure_ascii=False)]


async def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one load generator in a child process (off this process's interpreter lock)."""
    completed = await trio.run_process(_client_command(spec), capture_stdout=True, capture_stderr=True,
                                       check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"load generator failed: {completed.stderr.decode()[-3000:]}")
    result = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    if result.get("errors"):
        print(f"sessions_sse: {spec['mode']} errors: {result['errors']}", file=sys.stderr)
    return result


# ---------------------------------------------------------------------------- the reference app
# Runs in a child process: ``sessions_sse.py --reference``; prints its port, serves until killed.


def reference_main() -> None:
    """sse-starlette on uvicorn: ``GET /events`` (one queue per connection), ``POST /publish``
    ``{"events": n, "template": {...}}`` (202 at once; the burst is published in a task, one
    event per loop turn: text deltas shaped like the template, then a ``turn.completed``)."""
    import uvicorn
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    queues: set[asyncio.Queue[dict[str, str]]] = set()
    tasks: set[asyncio.Task[None]] = set()
    sequence = [0]

    async def events(request: Request) -> EventSourceResponse:
        queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        queues.add(queue)

        async def stream() -> Any:
            try:
                yield {"retry": 3000}
                while True:
                    yield await queue.get()
            finally:
                queues.discard(queue)

        return EventSourceResponse(stream(), sep="\n")

    def event(template: dict[str, Any], event_type: str, payload: dict[str, Any]) -> dict[str, str]:
        sequence[0] += 1
        document = {**template, "type": event_type, "seq": sequence[0], "ts": int(time.time() * 1000), **payload}
        return {"id": str(sequence[0]), "data": json.dumps(document, separators=(",", ":"), ensure_ascii=False)}

    async def burst(count: int, template: dict[str, Any]) -> None:
        # The sessions app's delta frame as the template (same ids, same keys, same sentences),
        # so both apps send frames of the same size.
        for index in range(count):
            if index == 0:
                # The sessions app's turn.started echoes the prompt (the ``/say`` directive).
                item = event(template, "turn.started", {"text": "", "input": say_prompt(count)})
            elif index == count - 1:
                item = event(template, "turn.completed", {"text": sentence(index)})
            else:
                item = event(template, "msg.text.delta", {"text": sentence(index)})
            for queue in list(queues):
                queue.put_nowait(item)
            await asyncio.sleep(0)

    async def publish(request: Request) -> JSONResponse:
        body = await request.json()
        task = asyncio.get_running_loop().create_task(burst(int(body["events"]), body["template"]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return JSONResponse({"accepted": True}, status_code=202)

    async def cpu(request: Request) -> JSONResponse:
        return JSONResponse({"cpu_seconds": time.process_time()})

    app = Starlette(routes=[Route("/events", events), Route("/publish", publish, methods=["POST"]),
                            Route("/cpu", cpu)])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", backlog=1024)
    server = uvicorn.Server(config)
    config.load()
    stack = {"server": f"uvicorn {uvicorn.__version__}", "loop": config.loop,
             "http": type(config.http_protocol_class).__name__ if not isinstance(config.http_protocol_class, type)
             else config.http_protocol_class.__name__}
    print(json.dumps({"port": listener.getsockname()[1], "stack": stack}), flush=True)
    asyncio.run(server.serve(sockets=[listener]))


async def _first_json_line(stream: Any, ended: str) -> Any:
    """The first line a child process prints, decoded as JSON; ``RuntimeError(ended)`` if its
    output ends first."""
    buffer = b""
    while b"\n" not in buffer:
        data = await stream.receive_some(4096)
        if not data:
            raise RuntimeError(ended)
        buffer += data
    return json.loads(buffer.split(b"\n", 1)[0])


@contextlib.asynccontextmanager
async def reference_server() -> Any:
    command = [sys.executable, os.path.abspath(__file__), "--reference"]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        yield await _first_json_line(process.stdout, "the reference app did not start")
    finally:
        process.terminate()
        with trio.move_on_after(5):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


# ---------------------------------------------------------------------------- the sessions app


async def start_sessions(nursery: trio.Nursery, data_dir: str) -> tuple[Any, Any, int, str]:
    """The sessions app over the parts ``troupe serve`` starts (see ``troupe.server._serve``)."""
    from troupe.auth import TokenScope, sessions_audience
    from troupe.http.sessions import SessionsAppDependencies, create_sessions_app

    runtime = await start_runtime(nursery, data_dir)
    engine, system = runtime.engine, runtime.system
    [secret] = await create_tokens(runtime, ["bench"], TokenScope.of_end_user(end_user_id), audience=sessions_audience)
    dependencies = SessionsAppDependencies(
        env=runtime.env, engine=engine, system=system, readiness=lambda: system.running,
    )
    port = await start_server(nursery, create_sessions_app(dependencies))
    return engine, system, port, secret


async def _http(port: int, method: str, path: str, secret: str, body: Any = None) -> tuple[int, Any]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8") if body is not None else None
        status, reply = await _exchange(stream, _request(
            method, path, port, {"Authorization": f"Bearer {secret}", "Connection": "close"}, payload))
    return status, json.loads(reply) if reply else None


async def session_last_seq(port: int, secret: str, session_id: str) -> int:
    status, reply = await _http(port, "GET", f"/v2/sessions/{session_id}", secret)
    assert status == 200, (status, reply)
    return int(reply["lastSeq"])


async def wait_idle(port: int, secret: str, session_id: str) -> int:
    while True:
        status, reply = await _http(port, "GET", f"/v2/sessions/{session_id}", secret)
        assert status == 200, (status, reply)
        if reply["status"] != "running":
            return int(reply["lastSeq"])
        await trio.sleep(0.05)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _hold_idle(spec: dict[str, Any], measure: Any) -> int:
    """Run an idle load generator; call ``measure()`` while its connections are all open."""
    process = await trio.lowlevel.open_process(_client_command(spec), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    try:
        connected = int((await _first_json_line(process.stdout, "the idle load generator ended early"))["connected"])
        await trio.sleep(settle_seconds)
        measure()
        await process.stdin.send_all(b"close\n")
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return connected


async def measure_idle(spec: dict[str, Any], top_lines: int) -> dict[str, Any]:
    """Memory per idle subscribed connection, in this (the server's) process, in two rounds:
    the RSS delta without tracing (tracemalloc's own bookkeeping would count), then the traced
    Python allocations.  A few connections come and go first, so that one-time costs (modules
    and code paths first used by a stream) are not charged to the measured ones."""
    await _hold_idle({**spec, "connections": idle_warm_up_connections}, lambda: None)
    await trio.sleep(settle_seconds)
    gc.collect()
    rss_before = _rss_bytes()
    after: dict[str, Any] = {}

    def measure_rss() -> None:
        gc.collect()
        after["rss"] = _rss_bytes()

    connected = await _hold_idle(spec, measure_rss)
    await trio.sleep(settle_seconds)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot() if top_lines else None
        traced_before, _ = tracemalloc.get_traced_memory()

        def measure_traced() -> None:
            gc.collect()
            after["traced"], _ = tracemalloc.get_traced_memory()
            if before is not None:
                statistics = tracemalloc.take_snapshot().compare_to(before, "lineno")
                for line in statistics[:top_lines]:
                    print(f"idle memory: {line}", file=sys.stderr)

        traced_connected = await _hold_idle(spec, measure_traced)
    finally:
        tracemalloc.stop()
    return {
        "idle_connections": connected,
        "idle_bytes_per_connection_rss": round((after["rss"] - rss_before) / connected),
        "idle_bytes_per_connection_tracemalloc": round((after["traced"] - traced_before) / traced_connected),
    }


class GcPauses:
    """The server's garbage-collector pauses over a phase (a full collection over a large heap
    is a latency tail of its own): ``with GcPauses() as pauses: ...; pauses.figures``."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self.cpu_seconds = 0.0
        """The collector's CPU time in the collecting thread (wall pauses include descheduling
        on a busy machine)."""
        self._began = 0.0
        self._began_cpu = 0.0
        self.figures: dict[str, Any] = {}

    census_lines = 0
    """``--gc-census N``: after the phase's 3rd full collection, the N most common tracked types."""

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            self._began_cpu = time.thread_time()
            return
        self.pauses.append((info["generation"], time.perf_counter() - self._began))
        self.cpu_seconds += time.thread_time() - self._began_cpu
        if self.census_lines and info["generation"] == 2 and sum(g == 2 for g, _ in self.pauses) == 3:
            counts: dict[str, int] = {}
            for item in gc.get_objects():
                name = type(item).__qualname__
                counts[name] = counts.get(name, 0) + 1
            print(f"gc census: {sum(counts.values())} tracked objects", file=sys.stderr)
            for name, count in sorted(counts.items(), key=lambda pair: -pair[1])[: self.census_lines]:
                print(f"gc census: {count:>9} {name}", file=sys.stderr)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)
        self.figures = {
            "gc_collections": len(self.pauses),
            "gc_full_collections": sum(generation == 2 for generation, _ in self.pauses),
            "gc_pause_max_ms": _round(max((pause for _, pause in self.pauses), default=0.0) * 1000),
            "gc_pause_total_ms": _round(sum(pause for _, pause in self.pauses) * 1000),
            "gc_cpu_ms": _round(self.cpu_seconds * 1000),
        }


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "note": "server, reference app and load generators share these cores",
        "subscribers": arguments.subscribers,
        "events_per_burst": arguments.events,
        "seconds": arguments.seconds,
        "gc_freeze": arguments.gc_freeze,
    }
    with tempfile.TemporaryDirectory(prefix="troupe-bench-sse-") as directory:
        async with trio.open_nursery() as nursery:
            engine, system, port, secret = await start_sessions(nursery, directory)
            figures["server_gc_objects_at_start"] = len(gc.get_objects())
            if arguments.gc_threshold:
                # Experiment: fewer young collections (each one promotes what a burst holds).
                gc.set_threshold(arguments.gc_threshold, *gc.get_threshold()[1:])
            figures["gc_threshold"] = list(gc.get_threshold())
            if arguments.gc_freeze:
                # As ``troupe serve`` does once ready: the start-up heap (modules, the apps, the
                # embedder) out of every collection.
                from troupe.server._process import freeze_startup_heap

                freeze_startup_heap()
            status, created = await _http(port, "POST", "/v2/sessions", secret, {"prompt": "/say 你好。"})
            assert status == 201, (status, created)
            session_id = created["sessionId"]
            last_seq = await wait_idle(port, secret, session_id)
            headers = {"Authorization": f"Bearer {secret}"}
            events_path = f"/v2/sessions/{session_id}/events"

            if arguments.idle > 0:
                idle_spec = {"mode": "idle", "port": port, "events_path": events_path,
                             "headers": {**headers, "Last-Event-ID": str(last_seq)},
                             "connections": arguments.idle}
                with profiled_phase(arguments, "idle"):
                    figures.update(await measure_idle(idle_spec, arguments.memory_top))

            fanout_spec = {"mode": "fanout", "port": port, "events_path": events_path,
                           "headers": headers, "subscribers": arguments.subscribers,
                           "events": arguments.events, "seconds": arguments.seconds,
                           "publish_path": f"/v2/sessions/{session_id}/messages",
                           "publish_body": {}, "publish_count_key": "prompt"}
            # Subscribers start from the live end (``Last-Event-ID`` = the current seq).
            fanout_spec["headers"] = {**headers, "Last-Event-ID": str(await wait_idle(port, secret, session_id))}
            cpu_before = time.process_time()
            with profiled_phase(arguments, "fanout"), GcPauses() as pauses:
                fanout = await run_client(fanout_spec)
            fanout["server_cpu_seconds"] = round(time.process_time() - cpu_before, 2)
            fanout["server"] = pauses.figures
            sample_delta = fanout.pop("sample_delta")
            figures["fanout"] = fanout

            async with reference_server() as reference:
                figures["reference_stack"] = reference["stack"]
                reference_spec = {**fanout_spec, "port": reference["port"], "events_path": "/events",
                                  "headers": {}, "publish_path": "/publish",
                                  "publish_body": {"template": json.loads(sample_delta)},
                                  "publish_count_key": "events",
                                  "events": fanout["events_per_subscriber"] // max(1, fanout["bursts"])}
                cpu_before = (await _http(reference["port"], "GET", "/cpu", ""))[1]["cpu_seconds"]
                reference_run = await run_client(reference_spec)
                cpu_after = (await _http(reference["port"], "GET", "/cpu", ""))[1]["cpu_seconds"]
                reference_run["server_cpu_seconds"] = round(cpu_after - cpu_before, 2)
            reference_run.pop("sample_delta")
            figures["reference_fanout"] = reference_run
            if fanout["delivered_per_second"] and reference_run["delivered_per_second"]:
                figures["fanout_ratio_to_reference"] = round(
                    fanout["delivered_per_second"] / reference_run["delivered_per_second"], 3)

            last_seq = await wait_idle(port, secret, session_id)
            if last_seq < replay_events + 1:
                await _http(port, "POST", f"/v2/sessions/{session_id}/messages", secret,
                            {"prompt": say_prompt(replay_events + turn_events_overhead)})
                last_seq = await wait_idle(port, secret, session_id)
            replay_spec = {"mode": "replay", "port": port, "events_path": events_path, "headers": headers,
                           "after_seq": last_seq - replay_events, "replays": arguments.replays}
            with profiled_phase(arguments, "replay"), GcPauses() as pauses:
                figures["replay"] = await run_client(replay_spec)
            figures["replay"]["server"] = pauses.figures

            idle_rss = figures.get("idle_bytes_per_connection_rss")
            figures["targets_met"] = {
                "fanout_ratio_at_least_0.5": (figures.get("fanout_ratio_to_reference") or 0) >= 0.5,
                "replay_1024_p99_at_most_50_ms": (figures["replay"]["p99_ms"] or 1e9) <= 50,
                "idle_connection_at_most_64_KiB": idle_rss <= 64 * 1024 if idle_rss is not None else None,
            }
            await system.drain()
            nursery.cancel_scope.cancel()
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        sys.exit(0)
    if len(sys.argv) == 2 and sys.argv[1] == "--reference":
        reference_main()
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--events", type=int, default=1100, help="events per burst (one turn)")
    parser.add_argument("--seconds", type=float, default=10.0, help="fan-out duration (bursts back to back)")
    parser.add_argument("--idle", type=int, default=500, help="idle connections for the memory figure (0: skip)")
    parser.add_argument("--replays", type=int, default=200)
    parser.add_argument("--profile", choices=["idle", "fanout", "replay"], default=None,
                        help="cProfile the server during this phase (stderr)")
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument("--no-gc-freeze", dest="gc_freeze", action="store_false",
                        help="do not freeze the server's start-up heap (troupe serve does; experiment)")
    parser.add_argument("--gc-threshold", type=int, default=0,
                        help="the server's gc generation-0 threshold (experiment; 0: Python's 700)")
    parser.add_argument("--gc-census", type=int, default=0,
                        help="print the most common tracked types at a full collection (stderr)")
    parser.add_argument("--memory-top", type=int, default=0,
                        help="print this many top allocation sites of the idle phase (stderr)")
    parsed = parser.parse_args()
    GcPauses.census_lines = parsed.gc_census
    print(json.dumps(trio.run(main, parsed)), flush=True)
