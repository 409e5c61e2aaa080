"""Questions checkers ask of the run's own trace.

Some outcomes are legal only because the runtime decided them: a durable reminder whose turn
crashed twice is dropped as poison (``reminder_poison``), and a turn the ``turn_overruns`` fault
stretched is late by design until the watchdog ends it.  Checkers must not call that lost work,
and must not take the actor's word for it either, so they ask the trace the runtime wrote.

The trace only grows, and checkers ask after every restart, so each question is a follower
that decodes only the records added since it last looked.
"""

from __future__ import annotations

from typing import Any

import cbor2


class _TraceFollower:
    """Decodes the records added since the last call that contain one of ``markers``."""

    def __init__(self, tracer: Any, markers: tuple[bytes, ...]) -> None:
        self._tracer = tracer
        self._markers = markers
        self._position = 0

    def new_records(self) -> list[list[Any]]:
        records = self._tracer.records
        found = []
        for index in range(self._position, len(records)):
            encoded = records[index]
            if any(marker in encoded for marker in self._markers):
                found.append(cbor2.loads(encoded))
        self._position = len(records)
        return found


class PoisonedReminders:
    """``(kind, key, reminder name)`` of every reminder the runtime dropped as poison."""

    def __init__(self, tracer: Any) -> None:
        self._follower = _TraceFollower(tracer, (b"reminder_poison",))
        self._found: set[tuple[str, str, str]] = set()

    def of_kind(self, kind: str) -> set[tuple[str, str]]:
        """``(key, name)`` pairs of ``kind``, up to the present."""
        for _, _, event, record_kind, key, fields in self._follower.new_records():
            if event == "reminder_poison":
                self._found.add((record_kind, key, fields.get("name")))
        return {(key, name) for record_kind, key, name in self._found if record_kind == kind}


class OverrunningTurns:
    """Actors of the current process lifetime still inside a turn that the ``turn_overruns``
    fault stretched and no watchdog has ended yet: their work is late by design, not lost."""

    def __init__(self, tracer: Any) -> None:
        self._follower = _TraceFollower(tracer, (b"sim_restart", b"turn_overruns", b"turn_timeout"))
        self._running: set[tuple[str, str]] = set()

    def current(self) -> set[tuple[str, str]]:
        for _, _, event, kind, key, fields in self._follower.new_records():
            if event == "sim_restart":
                self._running.clear()
            elif event == "fault" and fields.get("point") == "turn_overruns":
                self._running.add((kind, key))
            elif event == "turn_timeout":
                self._running.discard((kind, key))
        return set(self._running)
