"""What the HTTP benchmarks share: the raw keep-alive client their load generators speak, the
hypercorn start-up of the server under test (as ``troupe serve`` configures it), and the
server-side meters (CPU and commits per phase, writer time per kind of job).

A helper module, not a benchmark (it prints nothing); the scripts import it as ``_load`` (their
own directory is first on ``sys.path`` when they run, in the server and in the load-generator
child process alike).
"""

from __future__ import annotations

import os
import time
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


__all__ = ["PhaseMeter", "RawConnection", "start_server", "time_write_jobs"]
