"""The notifications read model: ``GET /notifications`` pages and the events stream's reads.

Why a read model and not an actor: the goals actor is the only writer of publications and
cancellations (``_goal_schema`` describes the table); what hosts do with notifications is read
them, and the one write a pull makes (marking what it returned ``taken``) is idempotent and
commutes with everything the goals actor does (it only fills ``taken_at`` where it is still
empty and turns ``pending`` into ``taken``).  So a pull is one write transaction of its own
(``take_notifications``) and the stream's polls are plain read snapshots; neither waits in
an actor's mailbox behind goal work.

Rules the contract fixes and where they hold:
- scope filtering happens *before* paging and before marking taken: rows the token may not
  see are skipped in the query (and re-checked with ``notification_visible``), so ``limit``
  counts visible items, ``has_more`` is about visible items and nothing invisible is marked;
- taking is idempotent: the first ``taken_at`` is kept, a cancelled item stays ``cancelled``
  (it is still returned, with its ``cancelled_at``, so a host learns the reminder is void);
  taking never touches the goal;
- the stream's poll is a primary-key range read of at most ``poll_notifications_max`` rows
  (``notifications_after``); which rows become frames (goal reminders, not cancelled, in
  scope) is decided by the caller on that snapshot.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from dataclasses import dataclass
from typing import Any

import apsw

from ._goal_schema import (
    NotificationRow,
    character_time_zone,
    notification_columns,
    notification_item,
    notification_status_pending,
    notification_status_taken,
    notification_visible,
)

notifications_limit_max = 100
"""``GET /notifications?limit=`` at most (the contract's page size cap)."""

notifications_limit_default = notifications_limit_max
"""``limit`` when the host gives none (the contract names no default; a host that omits it
wants as much as one page may hold)."""

poll_notifications_max = 100
"""One events-stream poll reads at most this many rows of the primary-key range."""

assert 1 <= notifications_limit_default <= notifications_limit_max
assert poll_notifications_max >= 1


@dataclass(frozen=True)
class NotificationPage:
    """One ``GET /notifications`` answer: ``items`` (contract documents), ``next_cursor``
    (the last item's id, or ``after`` when the page is empty) and ``has_more``."""

    items: tuple[dict[str, Any], ...]
    next_cursor: int
    has_more: bool

    def document(self) -> dict[str, Any]:
        return {"items": list(self.items), "next_cursor": self.next_cursor, "has_more": self.has_more}


def scope_condition(scope: Any) -> tuple[str, tuple[Any, ...]]:
    """An SQL condition on ``entry_id`` equivalent to ``notification_visible(entry_id,
    scope.allows)`` for the three host scope kinds (global rows always pass), so a narrow
    token never scans past the rows it may not see.  Unknown kinds see only global rows."""
    kind = getattr(scope, "kind", None)
    if kind == "all":
        return "1", ()
    if kind == "entries":
        return "(entry_id IS NULL OR entry_id IN (SELECT value FROM json_each(?)))", (
            _json_list(sorted(scope.entries)),)
    if kind == "prefix":
        # substr counts characters, as Python's startswith does; % and _ stay literal.
        return "(entry_id IS NULL OR substr(entry_id, 1, ?) = ?)", (len(scope.prefix), scope.prefix)
    return "entry_id IS NULL", ()


def _json_list(values: list[Any]) -> str:
    return json.dumps(values, ensure_ascii=False)


def take_notifications(
    connection: apsw.Connection,
    *,
    after: int,
    limit: int,
    scope: Any,
    now: float,
) -> NotificationPage:
    """The page after ``after`` that ``scope`` may see, marked taken (run inside a write job).

    Idempotent: rows already taken keep their first ``taken_at``; cancelled rows keep their
    status.  Items are projected after marking, in the character's time zone."""
    assert after >= 0 and 1 <= limit <= notifications_limit_max
    condition, parameters = scope_condition(scope)
    cursor = connection.execute(
        f"SELECT {notification_columns} FROM host_notifications "
        f"WHERE id > ? AND {condition} ORDER BY id LIMIT ?",
        (after, *parameters, limit + 1),
    )
    rows = [NotificationRow(*row) for row in cursor]
    rows = [row for row in rows if notification_visible(row.entry_id, scope.allows)]
    has_more = len(rows) > limit
    rows = rows[:limit]
    untaken = [row.id for row in rows if row.taken_at is None]
    if untaken:
        connection.execute(
            "UPDATE host_notifications SET taken_at = ?, "
            "status = CASE status WHEN ? THEN ? ELSE status END "
            "WHERE taken_at IS NULL AND id IN (SELECT value FROM json_each(?))",
            (now, notification_status_pending, notification_status_taken, _json_list(untaken)),
        )
    zone = character_time_zone(connection)
    items = tuple(notification_item(_taken(row, now), zone) for row in rows)
    next_cursor = rows[-1].id if rows else after
    return NotificationPage(items, next_cursor, has_more)


def _taken(row: NotificationRow, now: float) -> NotificationRow:
    """``row`` as the update above left it."""
    if row.taken_at is not None:
        return row
    status = notification_status_taken if row.status == notification_status_pending else row.status
    return dataclasses.replace(row, taken_at=now, status=status)


def notification_id_bounds(connection: apsw.Connection) -> tuple[int | None, int | None]:
    """(smallest, largest) notification id, (None, None) when nothing was ever published."""
    row = connection.execute("SELECT MIN(id), MAX(id) FROM host_notifications").fetchone()
    return (row[0], row[1]) if row else (None, None)


def notifications_after(
    connection: apsw.Connection, after: int, *, limit: int = poll_notifications_max
) -> tuple[list[NotificationRow], datetime.tzinfo]:
    """The events stream's poll: at most ``limit`` rows with ``id > after`` in id order (all
    kinds, all scopes, cancelled ones too) and the character's time zone, from one snapshot."""
    assert 1 <= limit <= poll_notifications_max
    rows = [
        NotificationRow(*row)
        for row in connection.execute(
            f"SELECT {notification_columns} FROM host_notifications WHERE id > ? ORDER BY id LIMIT ?",
            (after, limit),
        )
    ]
    return rows, character_time_zone(connection)


__all__ = [
    "NotificationPage",
    "notification_id_bounds",
    "notifications_after",
    "notifications_limit_default",
    "notifications_limit_max",
    "poll_notifications_max",
    "scope_condition",
    "take_notifications",
]
