"""The production Env: real clocks, the OS's randomness, time-ordered ids, worker threads.

This is the only runtime module allowed to call ``time.time`` and ``secrets`` (ruff's
banned-API rule exempts it by path).
"""

from __future__ import annotations

import datetime
import itertools
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


id_process_random_hex_digits = 8
"""Per-process random part of a real id (32 bits, drawn once when the id source is made)."""
id_counter_hex_digits = 8
"""Per-process counter part of a real id (32 bits, starting at a random value, wrapping)."""

assert id_process_random_hex_digits + id_counter_hex_digits == 16  # the ids' historic width


class RealIds:
    """Ids of the form ``<prefix><millis:12 hex><process random:8 hex><counter:8 hex>``:
    sortable by creation (to the millisecond), unique within and across processes.

    Why not 8 fresh random bytes per id: that is one ``getrandom`` system call per id, which
    measured ~1 µs idle but 50–250 µs on a loaded machine (a hot route makes several ids per
    request).  Within a process the counter makes ids unique: it only wraps after 2**32 ids,
    and the millisecond never goes back (a wall clock that steps back is held at the last
    value seen).  Across processes and restarts the millisecond and the 32 random bits drawn
    at start-up tell them apart: two ids collide only if two processes drew the same random
    part *and* reached the same counter value in the same millisecond.  Ids are identifiers,
    not secrets (the ``IdSource`` port promises uniqueness, not unguessability): anything
    that must be unguessable uses ``Env.random.token_bytes``."""

    def __init__(self, clock: RealClock, random: RealRandom) -> None:
        self._clock = clock
        self._process = random.token_bytes(id_process_random_hex_digits // 2).hex()
        start = int.from_bytes(random.token_bytes(id_counter_hex_digits // 2), "big")
        self._counter = itertools.count(start)
        self._counter_modulus = 16**id_counter_hex_digits
        self._millis_last = 0

    def new_id(self, prefix: str = "") -> str:
        millis = max(int(self._clock.wall() * 1000), self._millis_last)
        self._millis_last = millis
        counter = next(self._counter) % self._counter_modulus  # next() is atomic under the GIL
        return f"{prefix}{millis:012x}{self._process}{counter:08x}"


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
