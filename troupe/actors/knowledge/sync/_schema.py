"""The ``knowledge_sync`` component's migrations: identity, peers, pairing, the operation log,
the per-item CRDT state and the capture outbox.

Why triggers capture local changes: every path that changes a shared knowledge item
(structuring, ``/memory/update``, promotion, archive, ``/forget``) already commits through the
knowledge store; three triggers on ``knowledge_items`` and ``knowledge_forgotten`` put the
item's id in ``sync_outbox`` in the SAME transaction, so no change is ever missed (a crash
cannot separate a change from its capture) and no knowledge code had to learn about sync.
The sync actor drains the outbox into signed operations (``_oplog.capture``).  Only
``shared:*`` scopes are captured; ``user:*`` never leaves the device.  The first migration also
queues every shared item and tombstone already present, so knowledge written before sync
existed replicates too.

Tables: ``sync_identity`` (one row: this device's key pair), ``sync_settings`` (the runtime
switches ``sync_runtime:enabled`` / ``sync_runtime:paused`` and a few counters),
``sync_peers`` (paired devices, ACTIVE or REVOKED, with their key, address, push cursor and
health), ``sync_pairing_tokens`` and ``sync_pair_requests`` (pending pairings with their
expiry), ``sync_ops`` (every operation held, local or remote, in arrival order ``seq``),
``sync_origins`` (the device version vector: per origin, the counter below which every
operation is held), ``sync_items`` (per item: the winner, its merged clock, and the local
row's version and content hash as last materialised or captured).
"""

from __future__ import annotations

from troupe.storage import Migration

from ._domain import domain_members_sql

sync_component = "knowledge_sync"

sync_tables_sql = """
    CREATE TABLE sync_identity (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        device_id TEXT NOT NULL,
        device_name TEXT NOT NULL,
        public_key TEXT NOT NULL,
        private_seed BLOB NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE sync_settings (
        name TEXT PRIMARY KEY,
        value_json TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE sync_peers (
        device_id TEXT PRIMARY KEY,
        device_name TEXT NOT NULL,
        public_key TEXT NOT NULL,
        address TEXT NOT NULL,
        status TEXT NOT NULL,
        paired_at REAL NOT NULL,
        revoked_at REAL,
        last_sync_at REAL,
        sent_seq INTEGER NOT NULL DEFAULT 0,
        online INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0,
        retry_at REAL NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE TABLE sync_pairing_tokens (
        nonce TEXT PRIMARY KEY,
        method TEXT NOT NULL,
        pin TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        used_at REAL
    ) WITHOUT ROWID;
    CREATE TABLE sync_pair_requests (
        request_id TEXT PRIMARY KEY,
        target_device_id TEXT NOT NULL,
        pin TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE sync_ops (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        op_id TEXT NOT NULL UNIQUE,
        origin TEXT NOT NULL,
        counter INTEGER NOT NULL,
        knowledge_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        document TEXT NOT NULL,
        received_at REAL NOT NULL
    );
    CREATE INDEX sync_ops_by_origin ON sync_ops (origin, counter);
    CREATE INDEX sync_ops_by_knowledge ON sync_ops (knowledge_id);
    CREATE TABLE sync_origins (
        origin TEXT PRIMARY KEY,
        contiguous INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE sync_items (
        knowledge_id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        winner_op_id TEXT NOT NULL,
        winner_digest TEXT NOT NULL,
        tombstone INTEGER NOT NULL,
        clock_json TEXT NOT NULL,
        operations INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        local_version INTEGER NOT NULL DEFAULT 0,
        local_hash TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID;
    CREATE TABLE sync_outbox (
        knowledge_id TEXT PRIMARY KEY,
        queued_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TRIGGER sync_capture_item_insert AFTER INSERT ON knowledge_items
        WHEN substr(NEW.scope, 1, 7) = 'shared:'
        BEGIN INSERT OR IGNORE INTO sync_outbox (knowledge_id, queued_at) VALUES (NEW.id, NEW.updated_at); END;
    CREATE TRIGGER sync_capture_item_update AFTER UPDATE ON knowledge_items
        WHEN substr(NEW.scope, 1, 7) = 'shared:'
        BEGIN INSERT OR IGNORE INTO sync_outbox (knowledge_id, queued_at) VALUES (NEW.id, NEW.updated_at); END;
    CREATE TRIGGER sync_capture_forgotten AFTER INSERT ON knowledge_forgotten
        WHEN NEW.kind = 'knowledge' AND substr(NEW.scope, 1, 7) = 'shared:'
        BEGIN INSERT OR IGNORE INTO sync_outbox (knowledge_id, queued_at) VALUES (NEW.id, NEW.forgotten_at); END;
    INSERT OR IGNORE INTO sync_outbox (knowledge_id, queued_at)
        SELECT id, updated_at FROM knowledge_items WHERE substr(scope, 1, 7) = 'shared:';
    INSERT OR IGNORE INTO sync_outbox (knowledge_id, queued_at)
        SELECT id, forgotten_at FROM knowledge_forgotten
        WHERE kind = 'knowledge' AND substr(scope, 1, 7) = 'shared:';
"""

sync_known_vectors_sql = """
    ALTER TABLE sync_peers ADD COLUMN known_json TEXT NOT NULL DEFAULT '{}';
"""
"""Migration 2: each peer's version vector as it last told us (``known_json``): gossip and
anti-entropy send only what it is missing, and an idle round sends vectors, not operations."""

sync_covered_sql = """
    CREATE TABLE sync_covered (
        op_id TEXT PRIMARY KEY,
        origin TEXT NOT NULL,
        counter INTEGER NOT NULL,
        knowledge_id TEXT NOT NULL,
        digest TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX sync_covered_by_origin ON sync_covered (origin, counter);
"""
"""Migration 4: ``sync_covered``, what log compaction leaves of an upsert a later operation
covers and every peer holds (``_oplog.compact``): its id and digest, no payload.  Kept apart
from ``sync_ops`` so everything that reads full operations there never meets a stub."""

sync_migrations: tuple[Migration, ...] = (
    Migration(component=sync_component, number=1, name="knowledge sync", sql=sync_tables_sql),
    Migration(component=sync_component, number=2, name="peer version vectors", sql=sync_known_vectors_sql),
    Migration(component=sync_component, number=3, name="domain membership records", sql=domain_members_sql),
    Migration(component=sync_component, number=4, name="compacted operations", sql=sync_covered_sql),
)
"""Migration 3: ``sync_domain_records``, the signed membership records of the shared domain
(``_domain``)."""

__all__ = [
    "sync_component",
    "sync_migrations",
]
