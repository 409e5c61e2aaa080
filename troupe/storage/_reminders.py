"""Durable reminders: timers that survive restarts, stored per actor with a wall-clock due time.

Why: pace idle timeouts, goal reminders, claim expiry and webhook retries must fire even if the
process restarts in between; the runtime re-arms them from this table.  Due times are wall
clock (``Env.clock.wall()``) because monotonic time does not survive a restart.  Trade-off:
wall time can jump; callers treat a reminder as "due no earlier than", and the order of due
reminders is made total by (due_wall, kind, key, name) so that firing order is deterministic.
``attempts`` counts deliveries so a reminder that keeps failing can be given up on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

from ._codec import decode, encode

reminders_due_limit_max = 10_000


@dataclass(frozen=True)
class Reminder:
    kind: str
    key: str
    name: str
    due_wall: float
    payload: Any
    attempts: int
    revision: int = 0
    """Bumped by every ``reminder_set``: tells one setting of a reminder from the next, even
    when both are due at the same moment."""


_columns = "kind, key, name, due_wall, payload, attempts, revision"


def _reminder(row: tuple) -> Reminder:
    kind, key, name, due_wall, payload, attempts, revision = row
    return Reminder(kind, key, name, float(due_wall), decode(payload), int(attempts), int(revision))


def reminder_set(
    connection: apsw.Connection, kind: str, key: str, name: str, due_wall: float, payload: Any
) -> None:
    """Create or replace the reminder ``name`` of the actor; replacing resets ``attempts``."""
    connection.execute(
        "INSERT INTO reminders (kind, key, name, due_wall, payload, attempts) "
        "VALUES (?, ?, ?, ?, ?, 0) ON CONFLICT (kind, key, name) DO UPDATE SET "
        "due_wall = excluded.due_wall, payload = excluded.payload, attempts = 0, "
        "revision = reminders.revision + 1",
        (kind, key, name, float(due_wall), encode(payload)),
    )


def reminder_delete(
    connection: apsw.Connection, kind: str, key: str, name: str, *, due_wall: float | None = None,
    revision: int | None = None,
) -> bool:
    """Remove the reminder; return whether it existed.  With ``due_wall`` (and ``revision``),
    only if it is still that setting: a reminder set again meanwhile is kept."""
    sql = "DELETE FROM reminders WHERE kind = ? AND key = ? AND name = ?"
    parameters: tuple = (kind, key, name)
    if due_wall is not None:
        sql += " AND due_wall = ?"
        parameters += (float(due_wall),)
    if revision is not None:
        sql += " AND revision = ?"
        parameters += (int(revision),)
    connection.execute(sql, parameters)
    return connection.changes() > 0


def reminders_due(connection: apsw.Connection, before_wall: float, limit: int) -> list[Reminder]:
    """Reminders with ``due_wall <= before_wall``, oldest first, ties broken by identity."""
    if not 0 < limit <= reminders_due_limit_max:
        raise ValueError(f"limit must be in 1..{reminders_due_limit_max}, got {limit}")
    rows = connection.execute(
        f"SELECT {_columns} FROM reminders WHERE due_wall <= ? "
        "ORDER BY due_wall, kind, key, name LIMIT ?",
        (float(before_wall), limit),
    )
    return [_reminder(row) for row in rows]


def reminders_for(connection: apsw.Connection, kind: str, key: str) -> list[Reminder]:
    """All reminders of one actor, in due order (for re-arming on activation)."""
    rows = connection.execute(
        f"SELECT {_columns} FROM reminders WHERE kind = ? AND key = ? ORDER BY due_wall, name",
        (kind, key),
    )
    return [_reminder(row) for row in rows]


def reminder_get(connection: apsw.Connection, kind: str, key: str, name: str) -> Reminder | None:
    """One reminder by its primary key (firing one must not read all of its actor's: an actor
    with thousands pending, like the host's goals, made each firing cost their number)."""
    row = connection.execute(
        f"SELECT {_columns} FROM reminders WHERE kind = ? AND key = ? AND name = ?", (kind, key, name)
    ).fetchone()
    return None if row is None else _reminder(row)


def reminder_attempt(connection: apsw.Connection, kind: str, key: str, name: str) -> int:
    """Count one delivery attempt; return the new count (0 if the reminder does not exist)."""
    row = connection.execute(
        "UPDATE reminders SET attempts = attempts + 1 "
        "WHERE kind = ? AND key = ? AND name = ? RETURNING attempts",
        (kind, key, name),
    ).fetchone()
    return 0 if row is None else int(row[0])
