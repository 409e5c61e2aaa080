"""The goals and notifications tables, their row shapes and the one projection both slices use.

Why this module exists on its own: two parts of the host surface meet at these tables.  The
goals actor (``_goals``) writes goals, their host-key receipts and, when a reminder is due,
one row of ``host_notifications``; the notifications read model and the events stream
(``_notifications``, ``troupe.http.host._events``) only read them (and ``GET /notifications``
marks rows taken).  Keeping the migration, the row dataclasses and the contract's item
projection here means both sides agree through code, not through a copy of the column list.

Shapes and why:
- ``host_notifications.id`` is ``INTEGER PRIMARY KEY AUTOINCREMENT``: the contract's publication
  cursor must only ever increase and never be reused (``after`` / ``next_cursor`` and the SSE
  window compare ids), and ids are assigned inside the goals actor's write transaction, so
  publication order is commit order.
- ``UNIQUE (goal_id, reminder_kind, schedule_revision)``: a reminder is published once per goal
  schedule even if its durable timer fires again after a crash between the commit and the
  timer's deletion (the insert is ``OR IGNORE``).  A deadline or lead-time change bumps the
  goal's ``schedule_revision``, so the new schedule may publish again.
- ``entry_id`` is copied onto the notification (goals never change entry), so scope filtering
  (``entry_id IS NULL`` = global, visible to every token) needs no join.
- ``content`` is copied too: goal content is never edited (the contract has no content edit),
  so the copy is the current projection; ``status`` / ``taken_at`` / ``cancelled_at`` are the
  mutable part.  A notification is ``pending`` until the first ``GET /notifications`` that
  returns it marks it ``taken`` (first ``taken_at`` kept), or ``cancelled`` (with
  ``cancelled_at``) when its goal is completed or abandoned before it was taken.
- Times are wall seconds (REAL) from the Env clock; documents show them in the character's
  time zone (``host_character_profile.time_zone``, an IANA name, ``UTC`` until set).
"""

from __future__ import annotations

import datetime
import zoneinfo
from dataclasses import dataclass
from typing import Any

import apsw

goal_kind_normal = "normal"
goal_kind_question = "question"
goal_kinds = (goal_kind_normal, goal_kind_question)

goal_status_active = "active"
goal_status_completed = "completed"
goal_status_abandoned = "abandoned"
goal_status_merged = "merged"
goal_statuses = (goal_status_active, goal_status_completed, goal_status_abandoned, goal_status_merged)

dedup_state_none = "none"
"""No dedup judgement outstanding (created plainly, or judged, or released by the fallback)."""
dedup_state_pending = "pending"
"""Awaiting the background judgement: not injected, no reminders, until judged or released."""
dedup_states = (dedup_state_none, dedup_state_pending)

notification_kind_goal_reminder = "goal_reminder"
notification_kind_goal_dedup = "goal_dedup"
"""A background dedup verdict merged a goal (pulled through /notifications, never streamed)."""
notification_kinds = (notification_kind_goal_reminder, notification_kind_goal_dedup)

reminder_kind_near = "near"
reminder_kind_due = "due"
reminder_kinds = (reminder_kind_near, reminder_kind_due)

notification_status_pending = "pending"
notification_status_taken = "taken"
notification_status_cancelled = "cancelled"
notification_statuses = (notification_status_pending, notification_status_taken, notification_status_cancelled)

character_time_zone_default = "UTC"

goal_tables_sql = """
    CREATE TABLE host_character_profile (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        time_zone TEXT NOT NULL
    );
    CREATE TABLE host_goals (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        content TEXT NOT NULL,
        content_key TEXT NOT NULL,
        kind TEXT NOT NULL,
        people_json TEXT NOT NULL,
        entry_id TEXT,
        deadline_at REAL,
        deadline_is_date INTEGER NOT NULL DEFAULT 0,
        reminder_minutes INTEGER NOT NULL,
        status TEXT NOT NULL,
        revision INTEGER NOT NULL DEFAULT 1,
        schedule_revision INTEGER NOT NULL DEFAULT 1,
        canonical_id INTEGER,
        dedup_state TEXT NOT NULL,
        dedup_candidate_id INTEGER,
        dedup_queued_at REAL,
        dedup_fallback_at REAL,
        dedup_released_at REAL,
        dedup_attempts INTEGER NOT NULL DEFAULT 0,
        basis_changed_at REAL,
        source TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        completed_at REAL,
        abandoned_at REAL
    );
    CREATE INDEX host_goals_by_status ON host_goals (status, id);
    CREATE INDEX host_goals_by_content ON host_goals (content_key, status);
    CREATE TABLE host_goal_receipts (
        source TEXT NOT NULL,
        host_key TEXT NOT NULL,
        goal_id INTEGER NOT NULL,
        receipt_json TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (source, host_key)
    ) WITHOUT ROWID;
    CREATE TABLE host_notifications (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        goal_id INTEGER NOT NULL,
        entry_id TEXT,
        reminder_kind TEXT,
        schedule_revision INTEGER NOT NULL,
        deadline_at REAL,
        scheduled_at REAL NOT NULL,
        published_at REAL NOT NULL,
        content TEXT NOT NULL,
        details_json TEXT,
        status TEXT NOT NULL DEFAULT 'pending',
        taken_at REAL,
        cancelled_at REAL,
        UNIQUE (goal_id, kind, reminder_kind, schedule_revision)
    );
    CREATE INDEX host_notifications_by_goal ON host_notifications (goal_id, status);
"""
"""The character profile (time zone), goals, host-key receipts and published notifications."""


@dataclass(frozen=True)
class NotificationRow:
    """One row of ``host_notifications`` (wall seconds)."""

    id: int
    kind: str
    goal_id: int
    entry_id: str | None
    reminder_kind: str | None
    schedule_revision: int
    deadline_at: float | None
    scheduled_at: float
    published_at: float
    content: str
    details_json: str | None
    status: str
    taken_at: float | None
    cancelled_at: float | None


notification_columns = (
    "id, kind, goal_id, entry_id, reminder_kind, schedule_revision, deadline_at, scheduled_at, "
    "published_at, content, details_json, status, taken_at, cancelled_at"
)
"""``SELECT {notification_columns} FROM host_notifications`` rows build ``NotificationRow(*row)``."""


def character_time_zone_name(connection: apsw.Connection) -> str:
    """The character's IANA time zone (``UTC`` until an operator sets one)."""
    row = connection.execute("SELECT time_zone FROM host_character_profile WHERE singleton = 1").fetchone()
    return character_time_zone_default if row is None else str(row[0])


def set_character_time_zone(connection: apsw.Connection, name: str) -> None:
    """Set the character's time zone; ``ValueError`` for an unknown IANA name."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {name!r}") from exc
    connection.execute(
        "INSERT OR REPLACE INTO host_character_profile (singleton, time_zone) VALUES (1, ?)", (name,)
    )


def character_time_zone(connection: apsw.Connection) -> datetime.tzinfo:
    try:
        return zoneinfo.ZoneInfo(character_time_zone_name(connection))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return datetime.UTC


def iso_in(seconds: float | None, zone: datetime.tzinfo) -> str | None:
    """Wall seconds as ISO text in ``zone`` (whole seconds), or None."""
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(int(seconds), tz=zone).isoformat(timespec="seconds")


def notification_item(row: NotificationRow, zone: datetime.tzinfo) -> dict[str, Any]:
    """The contract's ``/notifications`` item (and the SSE ``reminder`` frame's data), times in
    the character's time zone ``zone``."""
    return {
        "id": row.id,
        "kind": row.kind,
        "goal_id": row.goal_id,
        "reminder_kind": row.reminder_kind,
        "deadline_at": iso_in(row.deadline_at, zone),
        "scheduled_at": iso_in(row.scheduled_at, zone),
        "published_at": iso_in(row.published_at, zone),
        "content": row.content,
        "status": row.status,
        "taken_at": iso_in(row.taken_at, zone),
        "cancelled_at": iso_in(row.cancelled_at, zone),
    }


def notification_visible(entry_id: str | None, allows: Any) -> bool:
    """Scope rule: a global goal's notification (``entry_id`` None) is visible to every token;
    otherwise only to tokens whose scope ``allows`` the entry."""
    return entry_id is None or bool(allows(entry_id))


__all__ = [
    "NotificationRow",
    "character_time_zone",
    "character_time_zone_default",
    "character_time_zone_name",
    "dedup_state_none",
    "dedup_state_pending",
    "dedup_states",
    "goal_kind_normal",
    "goal_kind_question",
    "goal_kinds",
    "goal_status_abandoned",
    "goal_status_active",
    "goal_status_completed",
    "goal_status_merged",
    "goal_statuses",
    "goal_tables_sql",
    "iso_in",
    "notification_columns",
    "notification_item",
    "notification_kind_goal_dedup",
    "notification_kind_goal_reminder",
    "notification_kinds",
    "notification_status_cancelled",
    "notification_status_pending",
    "notification_status_taken",
    "notification_statuses",
    "notification_visible",
    "reminder_kind_due",
    "reminder_kind_near",
    "reminder_kinds",
    "set_character_time_zone",
]
