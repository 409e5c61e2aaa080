"""The ``sessions`` component's migrations: agent sessions, their committed events, their
history and their checkpoints.

Why these shapes:
- ``agent_sessions`` is one row per session and carries the recovery anchors the contract
  reads on the dormant path: ``last_seq`` (the durable watermark: the highest seq of a
  committed turn), ``seq_sealed`` (the last epoch ended cleanly at a turn end, so the next
  epoch starts exactly at ``last_seq + 1``), ``epoch_start_seq`` and ``message_count``.
  ``message_count`` is also the integrity check of the history: a history that has fewer
  rows than the session row says is damage, never a shorter transcript.
- ``options_json`` and ``usage_json`` are compact JSON objects: they are read whole, never
  queried, and JSON keeps the client's key order (client tool parameter schemas included).
- ``agent_session_events`` keeps each committed event's exact JSON text, so a replay from the
  store sends the same bytes the live stream sent.  It is bounded per session
  (``session_log_events_max``); ``events_dropped`` on the session row counts what was pruned.
- ``agent_session_messages`` is the governed transcript, one row per message at a dense
  ``position`` (0..message_count-1); a turn appends, a checkpoint restore or a compaction
  replaces the whole set in one transaction.
- ``agent_session_checkpoints`` stores a checkpoint's history as one CBOR blob (a list of the
  messages' JSON texts) with its SHA-256, so a damaged blob is detected, and a rowid
  (``sequence``) that orders checkpoints by creation.
- ``(end_user_id, last_activity_at_ms, session_id)`` serves the per-user listing, newest
  activity first.
"""

from __future__ import annotations

from troupe.storage import Migration

from ._inputs import inputs_migrations

sessions_component = "sessions"

sessions_tables_sql = """
    CREATE TABLE agent_sessions (
        session_id TEXT PRIMARY KEY,
        end_user_id TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        last_activity_at_ms INTEGER NOT NULL,
        status TEXT NOT NULL,
        title TEXT,
        options_json TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        seq_sealed INTEGER NOT NULL,
        epoch_start_seq INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        usage_json TEXT,
        events_dropped INTEGER NOT NULL,
        forked_from TEXT
    ) WITHOUT ROWID;
    CREATE INDEX agent_sessions_by_end_user
        ON agent_sessions (end_user_id, last_activity_at_ms DESC, session_id DESC);
    CREATE TABLE agent_session_events (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE agent_session_messages (
        session_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        message_json TEXT NOT NULL,
        PRIMARY KEY (session_id, position)
    ) WITHOUT ROWID;
    CREATE TABLE agent_session_checkpoints (
        sequence INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        kind TEXT NOT NULL,
        name TEXT,
        message_count INTEGER NOT NULL,
        last_seq INTEGER NOT NULL,
        history BLOB NOT NULL,
        history_sha256 TEXT NOT NULL,
        UNIQUE (session_id, checkpoint_id)
    );
"""

sessions_migrations: tuple[Migration, ...] = (
    Migration(component=sessions_component, number=1, name="agent_sessions", sql=sessions_tables_sql),
    # Strict inputs' receipts and history epochs (their own component: ``_inputs``).
    *inputs_migrations,
)

__all__ = ["sessions_component", "sessions_migrations"]
