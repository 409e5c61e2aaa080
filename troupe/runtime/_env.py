"""The Env: every source of time, randomness, identity, disk and network an actor may use.

Actors and storage never call ``time.time()``, ``random``, ``uuid4`` or open sockets
themselves; they receive an ``Env``.  Production wires the real ports
(``troupe.runtime._real_env``); the simulator wires seeded fakes (``troupe.sim``).  This is
what makes a whole-server run reproducible from a seed.

The ports are narrow ``Protocol``s so that a fake needs to implement only what is used.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._fault_points import FaultPoints, no_fault_points


@runtime_checkable
class Clock(Protocol):
    """Monotonic time for timeouts and wall time for durable timers and timestamps."""

    def monotonic(self) -> float:
        """Seconds on trio's clock (the MockClock in the simulator)."""

    def wall(self) -> float:
        """Seconds since the Unix epoch; may jump (the simulator injects jumps)."""

    def wall_datetime(self) -> datetime.datetime:
        """``wall()`` as an aware UTC datetime."""


@runtime_checkable
class RandomSource(Protocol):
    """Seeded in the simulator; cryptographic in production where it matters."""

    def random(self) -> float: ...

    def randrange(self, start: int, stop: int) -> int: ...

    def token_bytes(self, count: int) -> bytes: ...


@runtime_checkable
class IdSource(Protocol):
    """Unique identifiers: sortable by creation where the format allows."""

    def new_id(self, prefix: str = "") -> str: ...


@runtime_checkable
class StorageOpener(Protocol):
    """Opens database files: the real filesystem in production, a fault-injecting VFS in sim.

    ``vfs_name`` is the apsw VFS to open connections with (``None`` for SQLite's default).
    """

    data_dir: str
    vfs_name: str | None


@runtime_checkable
class Executor(Protocol):
    """Runs blocking storage work, and pure CPU work too long for the event loop (a
    ``CpuBoundModel``'s learning answers): in a worker thread in production, inline in the
    simulator (threads are not deterministic).  A function given to it must not touch state
    the event loop's tasks share unguarded."""

    async def run_sync(self, function: Any, *args: Any) -> Any: ...


@dataclass
class Env:
    """The bundle of ports handed to the actor system, storage and surfaces.

    ``http``, ``model`` and ``embedder`` are filled by later layers (``troupe.models``, the
    outbound HTTP client); ``None`` means "not configured".
    """

    clock: Clock
    random: RandomSource
    ids: IdSource
    storage: StorageOpener
    executor: Executor
    http: Any = None
    model: Any = None
    embedder: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    fault_points: FaultPoints = no_fault_points
    """Where the simulator injects runtime faults (``NoFaultPoints`` in production)."""
    planted_bugs: frozenset[str] = frozenset()
    """Deliberate bugs the simulator's own tests switch on (always empty in production)."""
