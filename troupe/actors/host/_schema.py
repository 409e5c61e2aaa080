"""The ``host`` component's migrations: entries, their messages and the messages' media.

Why these shapes:
- ``host_messages.id`` is ``INTEGER PRIMARY KEY AUTOINCREMENT``: message ids are integers that
  only ever increase across the whole server (never reused, even after deletes), and they are
  assigned inside the entry actor's write transaction, so a batch's ids follow input order.
- ``UNIQUE (entry_id, dedupe_key)``: the same key in the same entry is one message forever;
  the index is also the dedupe lookup.
- ``learning_state`` starts ``pending`` with ``received_at`` (wall seconds from the Env clock),
  which is what pace batching measures; ``(entry_id, learning_state, id)`` finds an entry's
  pending messages in order, and ``pending_count`` counts ``pending`` + ``batched``.
- ``source`` is the token's name: who posted it, never a request field.
- ``host_message_media`` keeps ``media_ids`` as rows (position kept) so that media clean-up can
  ask "is this object still referenced" with an index instead of parsing JSON.
"""

from __future__ import annotations

from troupe.storage import Migration

from ._goal_schema import goal_tables_sql
from ._learning_schema import learning_tables_sql
from ._media_store import media_tables_sql
from ._memories import memory_tables_sql, retrieval_migration
from ._persona import persona_tables_sql
from ._state import state_tables_sql

host_component = "host"

host_migrations: tuple[Migration, ...] = (
    Migration(
        component=host_component,
        number=1,
        name="entries_and_messages",
        sql="""
            CREATE TABLE host_entries (
                entry_id TEXT PRIMARY KEY,
                name TEXT,
                kind TEXT,
                pace_name TEXT,
                pace_count INTEGER NOT NULL,
                pace_idle_seconds REAL NOT NULL,
                pace_max_wait_seconds REAL NOT NULL,
                created_at REAL NOT NULL,
                created_by TEXT NOT NULL
            ) WITHOUT ROWID;
            CREATE TABLE host_messages (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                entry_id TEXT NOT NULL,
                dedupe_key TEXT NOT NULL,
                kind TEXT NOT NULL,
                sender TEXT NOT NULL,
                account_id TEXT,
                content TEXT NOT NULL,
                occurred_at TEXT NOT NULL,
                occurred_at_seconds REAL NOT NULL,
                received_at REAL NOT NULL,
                quote_author TEXT,
                quote_author_account_id TEXT,
                quote_content TEXT,
                scene_identity TEXT,
                platform TEXT,
                source TEXT NOT NULL,
                learning_state TEXT NOT NULL DEFAULT 'pending',
                batch_id INTEGER,
                UNIQUE (entry_id, dedupe_key)
            );
            CREATE INDEX host_messages_learning ON host_messages (entry_id, learning_state, id);
            CREATE TABLE host_message_media (
                message_id INTEGER NOT NULL,
                position INTEGER NOT NULL,
                media_id TEXT NOT NULL,
                PRIMARY KEY (message_id, position)
            ) WITHOUT ROWID;
            CREATE INDEX host_message_media_by_media ON host_message_media (media_id);
        """,
    ),
    # The retrieval tables (memory recall) and the host's memory, source and recall tables.
    retrieval_migration,
    Migration(component=host_component, number=2, name="memories_and_recalls", sql=memory_tables_sql),
    # Learning batches and the model-call log (``_learning_schema``).
    Migration(component=host_component, number=3, name="learning_batches", sql=learning_tables_sql),
    # Uploaded media and their authorisation records (``_media_store``).
    Migration(component=host_component, number=4, name="media", sql=media_tables_sql),
    # The character's global state and its report history (``_state``).
    Migration(component=host_component, number=5, name="state", sql=state_tables_sql),
    # The character's persona, one row per version (``_persona``).
    Migration(component=host_component, number=6, name="persona", sql=persona_tables_sql),
    # Goals, host-key receipts, published notifications, the character's time zone (``_goal_schema``).
    Migration(component=host_component, number=7, name="goals_and_notifications", sql=goal_tables_sql),
)

learning_state_pending = "pending"
learning_state_batched = "batched"
learning_states_unlearned = (learning_state_pending, learning_state_batched)
"""What ``pending_count`` counts (the contract: pending / batched messages of the entry)."""

__all__ = [
    "host_component",
    "host_migrations",
    "learning_state_batched",
    "learning_state_pending",
    "learning_states_unlearned",
]
