"""Workload plug-ins: what the simulated clients do, and what must hold afterwards.

A workload brings its actor kinds and migrations, drives the system through ``client_step``
(one client operation a call, recording what was acknowledged), and checks invariants at two
moments: right after every crash-and-restart (``after_restart``: durable state agrees with what
was acknowledged) and once at the end when the system is quiet (``at_quiescence``: everything
that was started has finished, nothing was applied twice).  Each surface registers its own
workload under its own name; ``troupe sim workloads`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from troupe.runtime import ActorKind, ActorSystem, Env, Tracer
from troupe.storage import StorageError


@dataclass
class World:
    """What a workload sees of the simulation; ``engine`` and ``system`` change at each restart."""

    env: Env
    random: Any
    tracer: Tracer
    planted_bugs: frozenset[str]
    engine: Any = None
    system: ActorSystem | None = None
    generation: int = 0
    apps: dict[str, Any] = field(default_factory=dict)
    """The surfaces' apps of the current lifetime, by surface name, each behind an in-process
    ASGI driver (``troupe.sim._asgi``): workloads speak HTTP to them."""
    notes: dict[str, Any] = field(default_factory=dict)


class Workload(Protocol):
    name: str

    def actor_kinds(self, world: World) -> list[ActorKind]: ...

    def migrations(self) -> list[Any]: ...

    async def client_step(self, world: World, client: int) -> None: ...

    async def after_restart(self, world: World) -> list[str]: ...

    async def at_quiescence(self, world: World) -> list[str]: ...

    # Optional: ``services(world) -> list[ChildSpec]``, long-lived children the simulator adds
    # to the actor system's root supervisor in every lifetime.  Checkers may return
    # ``Violation``s (which name trace sequences) instead of strings.


Chosen = TypeVar("Chosen")
Snapshot = TypeVar("Snapshot")
shares_tolerance = 1e-9
"""How far a table's shares may sum from 1 (float rounding)."""


def check_shares(table: Sequence[tuple[float, Any]]) -> None:
    """Assert (at import, where the table is written) that a workload's operation shares sum to 1."""
    assert abs(sum(share for share, _ in table) - 1.0) < shares_tolerance, "operation shares must sum to 1"


def choose_by_share(roll: float, table: Sequence[tuple[float, Chosen]]) -> Chosen | None:
    """The item of ``table`` (share, item) that ``roll``, uniform in [0, 1), falls on: each item
    is chosen with its share's probability, from one random draw (so the simulator's draws stay
    the same whatever the table holds).  None when rounding leaves the roll past the last share."""
    for share, item in table:
        if roll < share:
            return item
        roll -= share
    return None


async def read_checkpoint(world: World, reader: Callable[[Any], Snapshot],
                          violate: Callable[[str], None]) -> Snapshot | None:
    """``reader`` run in one read transaction of the current lifetime's engine, for a checker;
    None, reported through ``violate``, when storage refuses the read (the engine is the
    simulator's fault-injecting one: an unreadable database at a checkpoint is a finding)."""
    try:
        return await world.engine.read(reader)
    except StorageError as error:
        violate(f"durable state unreadable at a checkpoint: {type(error).__name__}")
        return None


_registry: dict[str, Callable[[], Workload]] = {}
_not_in_default: set[str] = set()


def register_workload(name: str, factory: Callable[[], Workload], *, in_default: bool = True) -> None:
    """Make a workload available to ``troupe sim run --workload NAME``.  ``in_default=False``:
    only when named (a part that another default workload already runs, such as the host's
    goals: two copies on one server would each see the other's goals as foreign)."""
    assert name not in _registry, f"workload {name!r} is registered twice"
    _registry[name] = factory
    if not in_default:
        _not_in_default.add(name)


def workload_names() -> list[str]:
    _load_builtin_workloads()
    return sorted(_registry)


def make_workloads(names: list[str] | None) -> list[Workload]:
    _load_builtin_workloads()
    selected = names or sorted(name for name in _registry if name not in _not_in_default)
    unknown = [name for name in selected if name not in _registry]
    if unknown:
        raise KeyError(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(sorted(_registry))}")
    return [_registry[name]() for name in selected]


def _load_builtin_workloads() -> None:
    # Each module registers its workload when imported (imported here, late, because the
    # workloads import this module).
    from . import (  # noqa: F401
        _admin_workload,
        _bank,
        _character_workload,
        _host_workload,
        _knowledge_sync_workload,
        _knowledge_workload,
        _registers,
        _sessions_api_workload,
        _sessions_workload,
    )
