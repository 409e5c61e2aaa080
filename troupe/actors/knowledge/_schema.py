"""The ``knowledge`` component's migrations: everything the knowledge surface keeps durable.

Why one set of tables in the one engine: a write's evidence, its idempotency receipt and its
structuring task must commit in ONE transaction (an acknowledged write is durable and a retry
never creates a second evidence), and forgetting must remove knowledge, evidence, links,
entities and relations together.  Vectors and the text index are not here: they belong to the
recall engine (``troupe.retrieval``), which follows these rows; ``knowledge_forgotten`` keeps
the ids forgotten for good so nothing the user forgot is ever indexed or returned again.

Tables:
- ``knowledge_evidence``: raw evidence as written (``raw_json``), source type, context,
  provenance, sensitivity (level and categories), quality score, scope, the idempotency key it
  was written with, and for an update's evidence the knowledge item it updated;
- ``knowledge_items``: knowledge with scope, status (ACTIVE | ARCHIVED | SUPERSEDED), version,
  title and body; ``origin_evidence_id`` (unique) is the evidence it was structured from, so
  structuring the same evidence twice yields one item;
- ``knowledge_links``: evidence ↔ knowledge; ``knowledge_entities`` and
  ``knowledge_relations``: the structure of an item (rebuilt on every update);
- ``knowledge_structuring``: the durable outbox of evidence waiting to be structured;
- ``knowledge_receipts``: idempotency receipts (``_receipts``);
- ``knowledge_preferences`` and ``knowledge_preference_versions`` (every version kept);
- ``knowledge_conflicts``: field-level old/new values, resolution and derived severity;
- ``knowledge_contexts``: lifecycle contexts (tier, status, ``expires_at``, promotion);
- ``knowledge_forget_requests``: pending forget confirmations with their expiry;
- ``knowledge_forgotten``: tombstones of forgotten ids.

Migration 2 adds the indexes two hot reads need: a scope actor's due structuring tasks
(``scope, available_at``: every scope actor asks for its own, and without the index each
asks by scanning every scope's queue), and structuring's same-subject lookup
(``knowledge_items (scope, title)``: one probe per write instead of a scan of the scope).
Migration 3 keys receipts by ``(scope, namespace, key)``: idempotency keys are per scope.
"""

from __future__ import annotations

from troupe.storage import Migration

knowledge_component = "knowledge"

knowledge_tables_sql = """
    CREATE TABLE knowledge_evidence (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        source_type TEXT NOT NULL,
        raw_json TEXT NOT NULL,
        context_json TEXT,
        provenance_json TEXT,
        sensitivity INTEGER NOT NULL,
        sensitivity_categories_json TEXT NOT NULL,
        quality_score REAL NOT NULL,
        idempotency_key TEXT,
        origin TEXT NOT NULL,
        knowledge_id TEXT,
        created_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_evidence_by_scope ON knowledge_evidence (scope, created_at);
    CREATE TABLE knowledge_items (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        status TEXT NOT NULL,
        version INTEGER NOT NULL,
        title TEXT NOT NULL,
        body_json TEXT NOT NULL,
        origin_evidence_id TEXT UNIQUE,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_items_by_scope ON knowledge_items (scope, status, updated_at);
    CREATE INDEX knowledge_items_by_creation ON knowledge_items (scope, created_at);
    CREATE TABLE knowledge_links (
        knowledge_id TEXT NOT NULL,
        evidence_id TEXT NOT NULL,
        linked_at REAL NOT NULL,
        PRIMARY KEY (knowledge_id, evidence_id)
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_links_by_evidence ON knowledge_links (evidence_id, knowledge_id);
    CREATE TABLE knowledge_entities (
        knowledge_id TEXT NOT NULL,
        name TEXT NOT NULL,
        PRIMARY KEY (knowledge_id, name)
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_entities_by_name ON knowledge_entities (name, knowledge_id);
    CREATE TABLE knowledge_relations (
        knowledge_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        source TEXT NOT NULL,
        target TEXT NOT NULL,
        type TEXT NOT NULL,
        PRIMARY KEY (knowledge_id, position)
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_relations_by_source ON knowledge_relations (source, knowledge_id);
    CREATE INDEX knowledge_relations_by_target ON knowledge_relations (target, knowledge_id);
    CREATE TABLE knowledge_structuring (
        evidence_id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        knowledge_id TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        available_at REAL NOT NULL,
        created_at REAL NOT NULL,
        last_error TEXT
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_structuring_by_time ON knowledge_structuring (available_at);
    CREATE TABLE knowledge_receipts (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        scope TEXT NOT NULL,
        operation TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        response_json TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        completed_at REAL,
        failed_at REAL,
        recovery_count INTEGER NOT NULL DEFAULT 0,
        recovery_reason TEXT,
        recovered_at REAL,
        retry_consumed_at REAL,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_receipts_by_state ON knowledge_receipts (scope, state);
    CREATE TABLE knowledge_preferences (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        category TEXT NOT NULL,
        key TEXT NOT NULL,
        value_json TEXT NOT NULL,
        confidence REAL NOT NULL,
        version INTEGER NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        UNIQUE (scope, key)
    ) WITHOUT ROWID;
    CREATE TABLE knowledge_preference_versions (
        preference_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        category TEXT NOT NULL,
        value_json TEXT NOT NULL,
        confidence REAL NOT NULL,
        evidence_ids_json TEXT NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (preference_id, version)
    ) WITHOUT ROWID;
    CREATE TABLE knowledge_conflicts (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        knowledge_id TEXT NOT NULL,
        field TEXT NOT NULL,
        old_value_json TEXT NOT NULL,
        new_value_json TEXT NOT NULL,
        resolution TEXT NOT NULL,
        severity TEXT NOT NULL,
        source TEXT NOT NULL,
        pending INTEGER NOT NULL,
        created_at REAL NOT NULL,
        resolved_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_conflicts_by_time ON knowledge_conflicts (created_at);
    CREATE INDEX knowledge_conflicts_by_knowledge ON knowledge_conflicts (knowledge_id);
    CREATE INDEX knowledge_conflicts_pending ON knowledge_conflicts (pending, scope);
    CREATE TABLE knowledge_contexts (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        event TEXT NOT NULL,
        tier TEXT NOT NULL,
        status TEXT NOT NULL,
        session_id TEXT NOT NULL,
        run_id TEXT,
        turn_id TEXT,
        occurred_at REAL NOT NULL,
        data_json TEXT NOT NULL,
        idempotency_key TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        promoted_knowledge_id TEXT,
        promoted_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX knowledge_contexts_by_scope ON knowledge_contexts (scope, tier, status);
    CREATE INDEX knowledge_contexts_by_expiry ON knowledge_contexts (status, expires_at);
    CREATE TABLE knowledge_forget_requests (
        id TEXT PRIMARY KEY,
        command TEXT NOT NULL,
        scope TEXT,
        targets_json TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE knowledge_forgotten (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        scope TEXT NOT NULL,
        forgotten_at REAL NOT NULL
    ) WITHOUT ROWID;
"""

knowledge_lookup_indexes_sql = """
    CREATE INDEX knowledge_structuring_by_scope ON knowledge_structuring (scope, available_at);
    CREATE INDEX knowledge_items_by_title ON knowledge_items (scope, title);
"""

# Restates migration 1's knowledge_receipts columns on purpose: SQLite cannot change a primary
# key in place, so the table is rebuilt under its new key, and a migration must keep the text it
# shipped with (a shared column list edited later would change what migration 3 did).
knowledge_receipts_per_scope_sql = """
    CREATE TABLE knowledge_receipts_per_scope (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        scope TEXT NOT NULL,
        operation TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        response_json TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        completed_at REAL,
        failed_at REAL,
        recovery_count INTEGER NOT NULL DEFAULT 0,
        recovery_reason TEXT,
        recovered_at REAL,
        retry_consumed_at REAL,
        PRIMARY KEY (scope, namespace, key)
    ) WITHOUT ROWID;
    INSERT INTO knowledge_receipts_per_scope SELECT namespace, key, scope, operation, request_hash, state,
        response_json, error, created_at, updated_at, completed_at, failed_at, recovery_count,
        recovery_reason, recovered_at, retry_consumed_at FROM knowledge_receipts;
    DROP TABLE knowledge_receipts;
    ALTER TABLE knowledge_receipts_per_scope RENAME TO knowledge_receipts;
    CREATE INDEX knowledge_receipts_by_state ON knowledge_receipts (scope, state);
"""
"""Migration 3: idempotency keys are per scope (``_receipts``); the rows keep their values."""

knowledge_migrations: tuple[Migration, ...] = (
    Migration(component=knowledge_component, number=1, name="knowledge store",
              sql=knowledge_tables_sql),
    Migration(component=knowledge_component, number=2, name="knowledge lookup indexes",
              sql=knowledge_lookup_indexes_sql),
    Migration(component=knowledge_component, number=3, name="idempotency receipts per scope",
              sql=knowledge_receipts_per_scope_sql),
)
knowledge_schema_version = len(knowledge_migrations)
"""The number of the newest knowledge migration (``/version`` and ``/health`` report it)."""

__all__ = [
    "knowledge_component",
    "knowledge_migrations",
    "knowledge_schema_version",
]
