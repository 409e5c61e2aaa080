"""The engine's own ("core") migrations: the tables every component of troupe shares.

Why here and not in each helper module: one ordered list makes the core schema's history
readable at a glance, and migrations are append-only (never edit a shipped one; add the next
number).  Trade-off: helper modules depend on table names defined far away; the tests of each
helper exercise these tables, so a mismatch fails loudly.
"""

from __future__ import annotations

from ._migrations import Migration

core_component = "core"

core_migrations: tuple[Migration, ...] = (
    Migration(
        component=core_component,
        number=1,
        name="journal_and_snapshots",
        sql="""
            CREATE TABLE journal (
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                seq INTEGER NOT NULL,
                payload BLOB NOT NULL,
                PRIMARY KEY (kind, key, seq)
            ) WITHOUT ROWID;
            CREATE TABLE snapshots (
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                seq INTEGER NOT NULL,
                state BLOB NOT NULL,
                PRIMARY KEY (kind, key)
            ) WITHOUT ROWID;
        """,
    ),
    Migration(
        component=core_component,
        number=2,
        name="actor_state",
        sql="""
            CREATE TABLE actor_state (
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                value BLOB NOT NULL,
                PRIMARY KEY (kind, key)
            ) WITHOUT ROWID;
        """,
    ),
    Migration(
        component=core_component,
        number=3,
        name="blobs",
        # A rowid table on purpose: blobs can be large, and WITHOUT ROWID tables store whole
        # rows in the index b-tree, which is slow for big values.
        sql="""
            CREATE TABLE blobs (
                sha256 TEXT NOT NULL UNIQUE,
                size INTEGER NOT NULL,
                data BLOB NOT NULL
            );
        """,
    ),
    Migration(
        component=core_component,
        number=4,
        name="reminders",
        sql="""
            CREATE TABLE reminders (
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                name TEXT NOT NULL,
                due_wall REAL NOT NULL,
                payload BLOB NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (kind, key, name)
            ) WITHOUT ROWID;
            CREATE INDEX reminders_by_due ON reminders (due_wall, kind, key, name);
        """,
    ),
    Migration(
        component=core_component,
        number=5,
        name="reminder revisions",
        # Every set bumps the revision, so the completion of one firing never deletes a
        # reminder set again meanwhile, even at the very same due time (the simulator's host
        # seed 83: a batch closed in the same instant its learner finished the last one).
        sql="ALTER TABLE reminders ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;",
    ),
)
