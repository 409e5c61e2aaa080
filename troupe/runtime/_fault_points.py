"""Fault points: places in the runtime where the simulator may make things go wrong on purpose.

FoundationDB calls this BUGGIFY.  Production code asks ``env.fault_points.fires(point)`` at a
handful of places (a turn, an activation, a passivation, a supervised service, a timer, the
reminder service) and does the rare, legal-but-unlikely thing when it answers True: raise, run
long, refuse a message, fire late.  The real Env wires ``NoFaultPoints``, which always answers
False, so production pays one method call per point and never changes behaviour; the
simulator wires a seeded implementation (``troupe.sim``) that chooses, per seed, which points
are armed and how often they fire, and counts what it injected.

``planted_bugs`` is the other half of proving the simulator: a named, deliberately wrong
behaviour (for example "a crashed actor keeps its instance") switched on only by ``troupe sim
--plant-bug NAME``.  Code asks ``env.planted_bugs`` (a frozenset, empty in production).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

fault_point_names = (
    "turn_raises_before",
    "turn_raises_after",
    "activate_fails",
    "passivate_fails",
    "service_crashes",
    "turn_overruns",
    "mailbox_full",
    "timer_late",
    "reminder_late",
    "reminder_service_crashes",
)
"""Every point the runtime consults; the simulator arms a per-seed subset of them.

``turn_raises_before`` fails a turn before the actor's code runs; ``turn_raises_after`` fails
it after the actor's code returned, so its writes are committed while the caller sees a crash
(the "unknown outcome" a client must be ready for).  ``activate_fails`` is consulted twice per
activation: before the instance is built and after ``on_activate`` returned."""

domain_fault_point_names = ("sensitivity_check_fails",)
"""Points a surface's domain code consults (``env.fault_points.fires(point)`` like the
runtime's).  ``sensitivity_check_fails``: the knowledge scope actor's sensitivity detector is
unavailable, so the write fails closed (503 ``SENSITIVITY_CHECK_FAILED``, nothing stored).

Kept apart from ``fault_point_names`` on purpose: the simulator's swarm draws one random number
per name in that tuple to choose a seed's armed points, so a new name there would change what
every existing seed (and every regression seed) injects.  A workload that reaches a domain
point arms it explicitly."""

assert not set(domain_fault_point_names) & set(fault_point_names)


class InjectedFault(Exception):
    """Raised by an armed fault point: a failure of the actor's own code, not of the
    infrastructure, so it counts toward poison and restart intensity like a real bug would."""


@runtime_checkable
class FaultPoints(Protocol):
    def fires(self, point: str) -> bool:
        """True when the fault at ``point`` (one of ``fault_point_names`` or
        ``domain_fault_point_names``) happens now."""

    def delay_seconds(self, point: str) -> float:
        """How long a late timer/reminder is late or an overrunning turn overruns, once
        ``fires(point)`` said True."""


class NoFaultPoints:
    """Production: nothing ever fires."""

    def fires(self, point: str) -> bool:
        return False

    def delay_seconds(self, point: str) -> float:
        return 0.0


no_fault_points = NoFaultPoints()
