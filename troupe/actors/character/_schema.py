"""The ``character`` component's migrations: everything a character's memory keeps durable.

The contract describes one directory per character (``memory/<name>/``) holding JSON files,
an NDJSON event log, an outbox and a SQLite time index.  Here they are tables of the one
engine, keyed by the character name, because then a turn's writes (recent history, raw rows,
the post-turn task, the funnel event) commit in ONE transaction: an acknowledged ``/cache`` is
durable whole, and a crash never leaves history without its task or a transition without its
event.  Contract file → table:

- ``recent.json`` / ``recent_meta.json`` → ``character_recent`` (dense ``position`` per
  character) and ``character_profiles.recent_meta_json``;
- ``time_indexed.db`` → ``character_time_indexed`` (rowid = the row's sequence);
- ``facts.json`` / ``facts_archive.json`` → ``character_facts`` (``status`` active | archived);
- ``reflections.json`` / ``reflection_archive/`` → ``character_reflections`` (``status`` is the
  lifecycle; ``archived`` rows are the archive);
- ``persona.json`` / ``persona_corrections.json`` / ``persona_archive/`` →
  ``character_persona_entries`` (``status`` active | archived), ``character_persona_corrections``
  and ``character_profiles.persona_json`` (the whole internal persona object);
- ``events.ndjson`` → ``character_events``; ``outbox.ndjson`` → ``character_outbox``;
  ``cursors.json`` → ``character_cursors``; the surfacing cooldown sidecar →
  ``character_surfaced``.

``character_profiles`` is one row per character and also holds the counters that keep the
bounded tables cheap to prune (row counts, so no ``COUNT(*)`` per write) and the memory change
sequence the recall index follows (``memory_change_seq``; every fact or reflection row carries
the sequence of its last change, removed ones leave a row in ``character_memory_tombstones``).
"""

from __future__ import annotations

from troupe.storage import Migration

character_component = "character"

character_tables_sql = """
    CREATE TABLE character_profiles (
        name TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        settings_json TEXT,
        persona_json TEXT,
        recent_meta_json TEXT NOT NULL DEFAULT '{}',
        recent_count INTEGER NOT NULL DEFAULT 0,
        time_indexed_count INTEGER NOT NULL DEFAULT 0,
        facts_active_count INTEGER NOT NULL DEFAULT 0,
        facts_archived_count INTEGER NOT NULL DEFAULT 0,
        events_count INTEGER NOT NULL DEFAULT 0,
        outbox_finished_count INTEGER NOT NULL DEFAULT 0,
        last_conversation_at REAL,
        memory_change_seq INTEGER NOT NULL DEFAULT 0,
        tombstones_count INTEGER NOT NULL DEFAULT 0,
        tombstones_pruned_seq INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE TABLE character_recent (
        name TEXT NOT NULL,
        position INTEGER NOT NULL,
        role TEXT NOT NULL,
        content_json TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (name, position)
    ) WITHOUT ROWID;
    CREATE TABLE character_time_indexed (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        role TEXT NOT NULL,
        content_text TEXT NOT NULL,
        content_json TEXT NOT NULL,
        at REAL NOT NULL
    );
    CREATE INDEX character_time_indexed_by_name ON character_time_indexed (name, seq);
    CREATE INDEX character_time_indexed_by_time ON character_time_indexed (name, at);
    CREATE TABLE character_facts (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        text TEXT NOT NULL,
        entity TEXT NOT NULL,
        created_at REAL NOT NULL,
        event_start_at REAL,
        event_end_at REAL,
        status TEXT NOT NULL,
        archived_at REAL,
        embedding_fingerprint TEXT,
        changed_seq INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX character_facts_by_status ON character_facts (name, status, created_at);
    CREATE INDEX character_facts_by_change ON character_facts (name, changed_seq);
    CREATE TABLE character_reflections (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        text TEXT NOT NULL,
        entity TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        confirmed_at REAL,
        promoted_at REAL,
        archived_at REAL,
        event_start_at REAL,
        event_end_at REAL,
        source_fact_ids_json TEXT NOT NULL,
        merged_into TEXT,
        changed_seq INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX character_reflections_by_status
        ON character_reflections (name, status, created_at);
    CREATE INDEX character_reflections_by_change ON character_reflections (name, changed_seq);
    CREATE TABLE character_memory_tombstones (
        name TEXT NOT NULL,
        changed_seq INTEGER NOT NULL,
        id TEXT NOT NULL,
        PRIMARY KEY (name, changed_seq, id)
    ) WITHOUT ROWID;
    CREATE TABLE character_persona_entries (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        section TEXT NOT NULL,
        text TEXT NOT NULL,
        source TEXT NOT NULL,
        status TEXT NOT NULL,
        revision INTEGER NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        archived_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX character_persona_by_status
        ON character_persona_entries (name, status, created_at);
    CREATE TABLE character_persona_corrections (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        entry_id TEXT,
        proposed_text TEXT NOT NULL,
        state TEXT NOT NULL,
        task_id TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX character_corrections_by_name
        ON character_persona_corrections (name, created_at);
    CREATE TABLE character_surfaced (
        name TEXT NOT NULL,
        reflection_id TEXT NOT NULL,
        surfaced_at REAL NOT NULL,
        times INTEGER NOT NULL,
        PRIMARY KEY (name, reflection_id)
    ) WITHOUT ROWID;
    CREATE TABLE character_events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        at REAL NOT NULL,
        subject_id TEXT NOT NULL,
        amount INTEGER NOT NULL
    );
    CREATE INDEX character_events_by_time ON character_events (name, at);
    CREATE INDEX character_events_by_seq ON character_events (name, seq);
    CREATE TABLE character_outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload_json TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        attempts_max INTEGER NOT NULL,
        claims INTEGER NOT NULL DEFAULT 0,
        generation INTEGER NOT NULL,
        dedupe_key TEXT,
        created_at REAL NOT NULL,
        available_at REAL NOT NULL,
        claim TEXT,
        claimed_at REAL,
        finished_at REAL,
        last_error TEXT
    );
    CREATE INDEX character_outbox_by_state ON character_outbox (name, state, seq);
    CREATE UNIQUE INDEX character_outbox_dedupe ON character_outbox (name, kind, dedupe_key)
        WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running');
    CREATE TABLE character_cursors (
        name TEXT NOT NULL,
        loop TEXT NOT NULL,
        position INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (name, loop)
    ) WITHOUT ROWID;
"""

character_migrations: tuple[Migration, ...] = (
    Migration(component=character_component, number=1, name="character memory",
              sql=character_tables_sql),
)

__all__ = ["character_component", "character_migrations"]
