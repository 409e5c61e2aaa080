"""The ``knowledge_monitor`` component's migrations: the monitor's configuration, its activity
log and what it has already captured.

Why a component of its own (not a third ``knowledge`` migration): the monitor's tables are
read and written only by the monitor actor and the log reader, never inside a knowledge
write's transaction, so they can evolve without renumbering the knowledge core's migrations.

Tables:
- ``knowledge_monitor_config``: one row (``id = 1``), the normalised configuration as JSON;
  no row means the defaults (everything off, no directories);
- ``knowledge_monitor_log``: the activity log (``/monitor/log``, ``/delivery/digest``);
  ``seq`` only grows, so "newest first" is ``seq DESC`` even when the wall clock jumps back;
- ``knowledge_monitor_files``: the SHA-256 of each file's last captured content, so a file
  touched without a change is not captured twice; since migration 2 also its size and
  modification time when last seen, so the catch-up scan at watch start reads only files
  whose size or time differ (files changed while the server was down).
"""

from __future__ import annotations

from troupe.storage import Migration

monitor_component = "knowledge_monitor"

monitor_tables_sql = """
    CREATE TABLE knowledge_monitor_config (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        config_json TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE knowledge_monitor_log (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        source TEXT NOT NULL,
        status TEXT NOT NULL,
        summary TEXT NOT NULL,
        evidence_id TEXT,
        knowledge_id TEXT
    );
    CREATE INDEX knowledge_monitor_log_by_time ON knowledge_monitor_log (ts);
    CREATE TABLE knowledge_monitor_files (
        path TEXT PRIMARY KEY,
        content_sha256 TEXT NOT NULL,
        evidence_id TEXT,
        captured_at REAL NOT NULL
    ) WITHOUT ROWID;
"""

monitor_file_stat_sql = """
    ALTER TABLE knowledge_monitor_files ADD COLUMN size_bytes INTEGER;
    ALTER TABLE knowledge_monitor_files ADD COLUMN mtime_ns INTEGER;
"""

monitor_migrations: tuple[Migration, ...] = (
    Migration(component=monitor_component, number=1, name="monitor config, log and files",
              sql=monitor_tables_sql),
    Migration(component=monitor_component, number=2, name="monitor files: size and mtime for catch-up",
              sql=monitor_file_stat_sql),
)

__all__ = ["monitor_component", "monitor_file_stat_sql", "monitor_migrations", "monitor_tables_sql"]
