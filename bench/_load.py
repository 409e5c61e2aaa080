"""What the HTTP benchmarks share: the raw keep-alive client their load generators speak, the
start-up of the server under test (the engine and actor system ``troupe serve`` starts, its
tokens, and hypercorn configured as ``troupe serve`` configures it), the server-side meters
(CPU and commits per phase, writer time per kind of job) and the ``--profile`` switch.

A helper module, not a benchmark (it prints nothing); the scripts import it as ``_load`` (their
own directory is first on ``sys.path`` when they run, in the server and in the load-generator
child process alike).
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import trio


class RawConnection:
    """One keep-alive HTTP/1.1 connection: send pre-built requests, read length-framed replies."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buffer += data

    async def exchange(self, request: bytes) -> tuple[int, bytes]:
        await self.stream.send_all(request)
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            await self._fill()
        head = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        length = None
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
            elif name.strip().lower() == "transfer-encoding":
                raise ConnectionError("chunked responses are not expected here")
        if length is None:
            raise ConnectionError(f"a response without Content-Length: {head!r}")
        while len(self.buffer) < length:
            await self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return status, body


late_send_seconds = 0.002
"""An open-loop send that leaves later than this after its due time counts as late."""
open_loop_drain_seconds_max = 10.0
"""After the last send, how long an open loop waits for the requests still in flight; also how
far past its planned end an overloaded loop goes on sending (the rest is ``unsent``)."""


async def open_loop(
    *,
    port: int,
    rate: float,
    connections: int,
    warm_up_seconds: float,
    seconds: float,
    request_for: Callable[[int], bytes],
    refusal: Callable[[int, bytes], str | None] = lambda status, body: None if status == 200 else str(status),
) -> dict[str, Any]:
    """An open-loop load: request ``n`` (``request_for(n)``) is due at ``start + n / rate``
    whatever happened to the others, on the first idle connection of a pool of
    ``connections`` (large enough that one is normally free).  A latency runs from the
    request's DUE time to its answer, so a late send (no idle connection, or the generator
    itself woke late) counts against the server's figure instead of hiding it (no coordinated
    omission); late sends are counted.  The first ``warm_up_seconds`` are sent but not
    measured.  ``refusal(status, body)`` names what makes an answer an error (``None``: a
    good answer)."""
    idle_send, idle_receive = trio.open_memory_channel[RawConnection](connections)
    latencies: list[float] = []
    errors: list[str] = []
    state = {"measured_sent": 0, "answered": 0, "errors": 0, "measured_errors": 0, "late": 0, "waited": 0,
             "in_flight": 0, "in_flight_max": 0}
    streams = []
    for _ in range(connections):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        streams.append(stream)
        idle_send.send_nowait(RawConnection(stream))

    async def one(connection: RawConnection, request: bytes, due: float, measured: bool) -> None:
        try:
            status, body = await connection.exchange(request)
        finally:
            state["in_flight"] -= 1
        elapsed = time.perf_counter() - due
        idle_send.send_nowait(connection)
        refused = refusal(status, body)
        if refused is not None:
            state["errors"] += 1
            state["measured_errors"] += measured
            if len(errors) < 5:
                errors.append(f"{refused}: {status} {body[:300]!r}")
            return
        state["answered"] += 1
        if measured:
            latencies.append(elapsed)

    total = int(rate * (warm_up_seconds + seconds))
    first_measured = int(rate * warm_up_seconds)
    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        number = 0
        give_up_at = began + warm_up_seconds + seconds + open_loop_drain_seconds_max
        while number < total:
            due = began + number / rate
            now = time.perf_counter()
            if now > give_up_at:
                break  # overloaded: what is still due is reported unsent, not waited for
            if due > now:
                await trio.sleep(due - now)
                continue
            try:
                connection = idle_receive.receive_nowait()
            except trio.WouldBlock:
                state["waited"] += 1
                connection = await idle_receive.receive()
            if time.perf_counter() - due > late_send_seconds:
                state["late"] += number >= first_measured
            measured = number >= first_measured
            state["measured_sent"] += measured
            # Counted in flight from here, not when the task first runs: the drain below
            # must not end before the last request's task has started.
            state["in_flight"] += 1
            state["in_flight_max"] = max(state["in_flight_max"], state["in_flight"])
            nursery.start_soon(one, connection, request_for(number), due, measured)
            number += 1
        sent_seconds = time.perf_counter() - began - warm_up_seconds
        with trio.move_on_after(open_loop_drain_seconds_max):
            while state["in_flight"]:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    for stream in streams:
        await stream.aclose()
    return {
        "requests": len(latencies), "answered_total": state["answered"], "sent": state["measured_sent"],
        "offered_per_second": round(state["measured_sent"] / max(sent_seconds, 1e-9), 1),
        "unsent": total - first_measured - state["measured_sent"],
        "unanswered": state["measured_sent"] - len(latencies) - state["measured_errors"],
        "late_sends": state["late"], "waited_for_connection": state["waited"],
        "in_flight_max": state["in_flight_max"],
        "p50_ms": rounded_ms(percentile(latencies, 0.5)), "p99_ms": rounded_ms(percentile(latencies, 0.99)),
        "max_ms": rounded_ms(max(latencies, default=None)),
        "errors": errors, "error_count": state["errors"],
    }


def rates_argument(text: str) -> list[float]:
    """An argparse ``type``: comma-separated open-loop rates (per second)."""
    return [float(rate) for rate in text.split(",")]


async def open_loop_series(engine: Any, rates: list[float],
                           run_rate: Callable[[float], Awaitable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One open loop per rate (``run_rate(rate)`` returns ``open_loop``'s result, usually from
    the load-generator process), each with the server's CPU share during it: the entries a
    bench's JSON line lists."""
    runs = []
    for rate in rates:
        with PhaseMeter(engine) as meter:
            measured = await run_rate(rate)
        runs.append({
            "rate": rate, "offered_per_second": measured["offered_per_second"], "requests": measured["requests"],
            "p50_ms": measured["p50_ms"], "p99_ms": measured["p99_ms"], "max_ms": measured["max_ms"],
            "late_sends": measured["late_sends"], "unsent": measured["unsent"], "unanswered": measured["unanswered"],
            "errors": measured["error_count"], "in_flight_max": measured["in_flight_max"],
            "server_cpu_share": meter.figures["server_cpu_share"],
        })
    return runs


def p99_targets_per_load(name: str, limit_ms: float, *, one_caller_p99: float | None,
                         open_loop_runs: list[dict[str, Any]], closed_loop_p99: float | None,
                         connections: int) -> dict[str, bool]:
    """A p99 latency target judged per load: one caller at a time, each open-loop rate (with
    nothing unsent, unanswered or refused), and the closed loop of ``connections``."""

    def within(p99: float | None) -> bool:
        return p99 is not None and p99 <= limit_ms

    limit = f"{limit_ms:g}"
    targets = {f"{name}_p99_at_most_{limit}_ms_one_caller": within(one_caller_p99)}
    for measured in open_loop_runs:
        clean = not (measured["unsent"] or measured["unanswered"] or measured["errors"])
        targets[f"{name}_p99_at_most_{limit}_ms_at_{measured['rate']:g}_per_second"] = clean and within(measured["p99_ms"])
    targets[f"{name}_p99_at_most_{limit}_ms_closed_loop_{connections}_connections"] = within(closed_loop_p99)
    return targets


async def start_server(nursery: trio.Nursery, app: Any) -> int:
    import hypercorn.trio
    from hypercorn.config import Config

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.include_server_header = False  # as ``troupe serve``
    binds = await nursery.start(
        lambda task_status: hypercorn.trio.serve(app, config, task_status=task_status)
    )
    return int(binds[0].rsplit(":", 1)[1])


@dataclass
class Runtime:
    """The parts ``troupe serve`` starts under the surfaces' apps (see ``troupe.server._serve``)."""

    env: Any
    engine: Any
    system: Any
    surfaces: list[Any]


async def start_runtime(nursery: trio.Nursery, data_dir: str,
                        environment: Mapping[str, str] | None = None) -> Runtime:
    """A real ``Engine`` in ``data_dir`` (default settings, so ``synchronous=FULL``), the model
    and embedder configured from ``environment`` (default ``os.environ``: the offline ones),
    and the real ``ActorSystem`` with every surface's kinds and services, running in
    ``nursery``; what a benchmark puts a surface's app on."""
    import httpx

    from troupe.models import embedder_from_environment, model_from_configuration
    from troupe.runtime import ActorSystem, real_env
    from troupe.server import (
        default_surfaces,
        surface_actor_kinds,
        surface_migrations,
        surface_services,
    )
    from troupe.storage import Engine, StorageError

    environment = os.environ if environment is None else environment
    surfaces = default_surfaces()
    env = real_env(data_dir)
    env.model = model_from_configuration(environment)
    env.embedder = embedder_from_environment(environment)
    env.http = httpx.AsyncClient(timeout=30)
    engine = await Engine.open(env, nursery=nursery, migrations=surface_migrations(surfaces))
    system = ActorSystem(
        env,
        surface_actor_kinds(surfaces),
        storage=engine,
        services=surface_services(surfaces),
        transient_errors=(StorageError,),
    )
    await nursery.start(system.run)
    return Runtime(env, engine, system, surfaces)


async def create_tokens(runtime: Runtime, names: list[str], scope: Any, **token_options: Any) -> list[str]:
    """One bearer token per name, all of ``scope`` (``token_options``: ``audience``), in one
    write; returns their secrets in the order of ``names``."""
    from troupe.auth import new_token_secret, token_create

    secrets = [new_token_secret(runtime.env.random) for _ in names]
    now = runtime.env.clock.wall()

    def create(connection: Any) -> None:
        for name, secret in zip(names, secrets, strict=True):
            token_create(connection, name=name, scope=scope, secret=secret, created_at=now, **token_options)

    await runtime.engine.write(create)
    return secrets


@contextlib.contextmanager
def profiled(enabled: bool, *, sort: str = "tottime", lines: int = 40) -> Iterator[None]:
    """When ``enabled``, cProfile this process's main thread (the trio loop: HTTP, actors) over
    the ``with`` block, timed by the thread's CPU clock, and print the top ``lines`` functions
    by ``sort`` to stderr; storage jobs run on other threads and are not seen."""
    if not enabled:
        yield
        return
    # The thread's CPU clock, not the wall clock: on shared cores a wall-clock profile
    # charges other processes' time (and waits for the interpreter lock) to whatever
    # function happened to be running.
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(sort).print_stats(lines)


def profiled_phase(arguments: Any, phase: str) -> contextlib.AbstractContextManager[None]:
    """``--profile PHASE`` (with ``--profile-sort`` and ``--profile-lines``): ``profiled`` when
    ``phase`` is the one named."""
    return profiled(arguments.profile == phase, sort=arguments.profile_sort, lines=arguments.profile_lines)


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank ``fraction`` percentile of ``values`` (the ``int(n * fraction)``-th
    smallest, the largest at most); None when there are none.  What every load generator
    reports, so that their p50/p99 mean the same thing."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def rounded_ms(seconds: float | None) -> float | None:
    """``seconds`` as milliseconds to two decimals (None stays None)."""
    return None if seconds is None else round(seconds * 1000, 2)


class PhaseMeter:
    """The server process's CPU seconds (every thread) and the engine's commits over a phase:
    tells a CPU-bound server from one waiting on fsync."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __enter__(self) -> PhaseMeter:
        self.times = os.times()
        self.wall = time.perf_counter()
        self.statistics = self.engine.statistics()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        times, statistics = os.times(), self.engine.statistics()
        wall = time.perf_counter() - self.wall
        cpu = (times.user - self.times.user) + (times.system - self.times.system)
        commits = statistics.commits - self.statistics.commits
        jobs = statistics.jobs - self.statistics.jobs
        self.cpu_seconds = cpu
        self.wall_seconds = wall
        self.figures = {
            "server_cpu_share": round(cpu / wall, 2),
            "commits_per_second": round(commits / wall, 1),
            "jobs_per_commit": round(jobs / commits, 1) if commits else None,
            "commit_ms_mean": round((statistics.commit_seconds_total - self.statistics.commit_seconds_total)
                                    / commits * 1000, 2) if commits else None,
        }


def time_write_jobs() -> dict[str, list[float]]:
    """``--job-times``: wrap ``Engine.write`` so each job's run time on the writer thread is
    summed by the job function's qualified name (diagnostics; printed to stderr)."""
    from troupe.storage import Engine

    totals: dict[str, list[float]] = {}
    original = Engine.write

    async def write(self: Any, function: Any) -> Any:
        name = getattr(function, "__qualname__", repr(function))

        def timed(connection: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(connection)
            finally:
                entry = totals.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - began

        return await original(self, timed)

    Engine.write = write  # type: ignore[method-assign]
    return totals


def print_job_times(totals: Mapping[str, list[float]]) -> None:
    """``--job-times``' report: what ``time_write_jobs`` summed, the costliest kind of job first,
    to stderr (stdout carries the benchmark's one JSON line)."""
    for name, (count, seconds) in sorted(totals.items(), key=lambda item: -item[1][1]):
        print(f"job {name}: {count} runs, {seconds:.3f} s, {seconds / count * 1000:.3f} ms each", file=sys.stderr)


__all__ = [
    "PhaseMeter",
    "RawConnection",
    "Runtime",
    "create_tokens",
    "percentile",
    "print_job_times",
    "profiled",
    "profiled_phase",
    "rounded_ms",
    "start_runtime",
    "start_server",
    "time_write_jobs",
]
