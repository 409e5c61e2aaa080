"""Plain actor state: one CBOR value per actor, for actors that are not event-sourced.

Why: many actors (settings, counters, claim tokens) only need "the current value", and a
journal would add replay cost for nothing.  Trade-off: no history; each put replaces the value.
"""

from __future__ import annotations

from typing import Any

import apsw

from ._codec import decode, encode


def state_put(connection: apsw.Connection, kind: str, key: str, value: Any) -> None:
    """Store ``value`` as the actor's state, replacing any previous value."""
    connection.execute(
        "INSERT INTO actor_state (kind, key, value) VALUES (?, ?, ?) "
        "ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
        (kind, key, encode(value)),
    )


def state_get(connection: apsw.Connection, kind: str, key: str) -> Any:
    """The actor's stored state, or ``None`` when it has none."""
    row = connection.execute(
        "SELECT value FROM actor_state WHERE kind = ? AND key = ?", (kind, key)
    ).fetchone()
    return None if row is None else decode(row[0])


def state_delete(connection: apsw.Connection, kind: str, key: str) -> bool:
    """Forget the actor's state; return whether there was any."""
    connection.execute("DELETE FROM actor_state WHERE kind = ? AND key = ?", (kind, key))
    return connection.changes() > 0
