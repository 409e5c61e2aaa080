"""The production Env: real clocks, the OS's randomness, time-ordered ids, worker threads.

This is the only runtime module allowed to call ``time.time`` and ``secrets`` (ruff's
banned-API rule exempts it by path).
"""

from __future__ import annotations

import datetime
import os
import secrets
import time

import trio

from ._env import Env


class RealClock:
    def monotonic(self) -> float:
        return trio.current_time()

    def wall(self) -> float:
        return time.time()

    def wall_datetime(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.wall(), tz=datetime.UTC)


class RealRandom:
    """Cryptographically strong; nothing in production needs reproducible randomness."""

    def __init__(self) -> None:
        self._generator = secrets.SystemRandom()

    def random(self) -> float:
        return self._generator.random()

    def randrange(self, start: int, stop: int) -> int:
        return self._generator.randrange(start, stop)

    def token_bytes(self, count: int) -> bytes:
        return secrets.token_bytes(count)


class RealIds:
    """Ids of the form ``<prefix><millis:12 hex><random:16 hex>``: sortable by creation."""

    def __init__(self, clock: RealClock, random: RealRandom) -> None:
        self._clock = clock
        self._random = random

    def new_id(self, prefix: str = "") -> str:
        millis = int(self._clock.wall() * 1000)
        return f"{prefix}{millis:012x}{self._random.token_bytes(8).hex()}"


class RealStorageOpener:
    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.vfs_name: str | None = None


class ThreadExecutor:
    """Runs blocking work on trio's worker threads so storage never stalls the event loop.

    apsw releases the GIL while SQLite works, so reads and the writer overlap with the loop.
    """

    def __init__(self, threads_max: int = 4) -> None:
        self._limiter = trio.CapacityLimiter(threads_max)

    async def run_sync(self, function, *args):
        return await trio.to_thread.run_sync(function, *args, limiter=self._limiter)


def real_env(data_dir: str) -> Env:
    clock = RealClock()
    random = RealRandom()
    return Env(
        clock=clock,
        random=random,
        ids=RealIds(clock, random),
        storage=RealStorageOpener(data_dir),
        executor=ThreadExecutor(),
    )
