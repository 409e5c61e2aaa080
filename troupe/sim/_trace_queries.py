"""Questions checkers ask of the run's own trace.

Some outcomes are legal only because the runtime decided them: a durable reminder whose turn
crashed twice is dropped as poison (``reminder_poison``), and the work it would have finished
then waits for an operator.  Checkers must not call that a lost reminder, and must not take
the actor's word for it either, so they ask the trace the runtime wrote.
"""

from __future__ import annotations

from typing import Any

import cbor2


def poisoned_reminders(tracer: Any, kind: str) -> set[tuple[str, str]]:
    """``(key, reminder name)`` of every reminder of ``kind`` the runtime dropped as poison."""
    found = set()
    for encoded in tracer.records:
        if b"reminder_poison" in encoded:
            _, _, event, record_kind, key, fields = cbor2.loads(encoded)
            if event == "reminder_poison" and record_kind == kind:
                found.add((key, fields.get("name")))
    return found
