"""The simulator's Env: seeded randomness, counter ids, trio's MockClock, inline storage work.

Everything here is a pure function of the seed and of trio's (seeded) scheduling, which is what
makes ``troupe sim run --seed N`` replay byte for byte.  The wall clock is ``epoch + trio time +
offset`` so the simulator can inject clock jumps without disturbing trio's monotonic clock.
"""

from __future__ import annotations

import datetime
import os
import random

import trio

from troupe.runtime._env import Env
from troupe.storage import InlineExecutor

simulation_epoch_seconds = 1_790_000_000.0
"""Wall time at simulated t=0 (late 2026): fixed, so timestamps in traces are reproducible."""


class SimClock:
    def __init__(self, epoch: float = simulation_epoch_seconds) -> None:
        self._epoch = epoch
        self.offset_seconds = 0.0
        self.jumps = 0

    def monotonic(self) -> float:
        return trio.current_time()

    def wall(self) -> float:
        return self._epoch + trio.current_time() + self.offset_seconds

    def wall_datetime(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.wall(), tz=datetime.UTC)

    def jump(self, seconds: float) -> None:
        """Move the wall clock (only) by ``seconds``; may be negative."""
        self.offset_seconds += seconds
        self.jumps += 1


class SimRandom:
    def __init__(self, seed: int) -> None:
        self._generator = random.Random(seed)

    def random(self) -> float:
        return self._generator.random()

    def randrange(self, start: int, stop: int) -> int:
        return self._generator.randrange(start, stop)

    def token_bytes(self, count: int) -> bytes:
        return self._generator.randbytes(count)

    def choice(self, items):
        return items[self._generator.randrange(0, len(items))]


class SimIds:
    def __init__(self) -> None:
        self._counter = 0

    def new_id(self, prefix: str = "") -> str:
        self._counter += 1
        return f"{prefix}{self._counter:016x}"


class SimStorageOpener:
    def __init__(self, data_dir: str, vfs_name: str | None = None) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.vfs_name = vfs_name


def sim_env(seed: int, data_dir: str, *, vfs_name: str | None = None) -> Env:
    """A seeded Env: the deterministic LocalModel and HashedEmbedder, and a simulated network
    (``env.extras["network"]``) behind ``env.http``, with its own seeded random stream."""
    from troupe.models import HashedEmbedder, LocalModel

    from ._network import SimulatedNetwork, simulated_http_client

    network = SimulatedNetwork(SimRandom(seed * 104729 + 7))
    return Env(
        clock=SimClock(),
        random=SimRandom(seed),
        ids=SimIds(),
        storage=SimStorageOpener(data_dir, vfs_name),
        executor=InlineExecutor(),
        http=simulated_http_client(network),
        model=LocalModel(),
        embedder=HashedEmbedder(),
        extras={"network": network, "resolver": network.resolve},
    )
