"""The ``sessions_webhooks`` component's migrations: pending turn-end deliveries and the
once-per-turn decisions.

Why these shapes:
- ``sessions_webhook_deliveries`` is the durable queue.  A row is written before an enqueue
  counts as accepted and removed when its delivery ends (delivered or finally failed), so what
  a restart finds there is exactly what still has to be sent.  ``id`` is ``AUTOINCREMENT``:
  ids only increase, which makes the table FIFO and lets the dispatcher read "rows after the
  last one I took" without marking rows in flight.  The row keeps the body, the timestamp and
  the nonce (a retry or a resend after a restart repeats them byte for byte, as the contract
  wants) but never the secret or the headers: those are signed at each attempt.
- ``sessions_webhook_turns`` is the dedupe: one row per ``(session_id, turn_id)`` ever decided,
  whatever the outcome (accepted or dropped because the queue was full), so a turn is
  notified at most once even across crashes.  ``decided_at`` (wall seconds) lets old
  decisions be pruned: a turn id never comes back, the table only has to outlive retries.
"""

from __future__ import annotations

from troupe.storage import Migration

webhook_component = "sessions_webhooks"

webhook_migrations: tuple[Migration, ...] = (
    Migration(
        component=webhook_component,
        number=1,
        name="deliveries_and_turns",
        sql="""
            CREATE TABLE sessions_webhook_deliveries (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                delivery_id TEXT NOT NULL UNIQUE,
                session_id TEXT NOT NULL,
                turn_id TEXT NOT NULL,
                body BLOB NOT NULL,
                timestamp_ms INTEGER NOT NULL,
                nonce TEXT NOT NULL,
                enqueued_at REAL NOT NULL
            );
            CREATE TABLE sessions_webhook_turns (
                session_id TEXT NOT NULL,
                turn_id TEXT NOT NULL,
                decided_at REAL NOT NULL,
                outcome TEXT NOT NULL,
                PRIMARY KEY (session_id, turn_id)
            ) WITHOUT ROWID;
            CREATE INDEX sessions_webhook_turns_by_time ON sessions_webhook_turns (decided_at);
        """,
    ),
)

__all__ = ["webhook_component", "webhook_migrations"]
