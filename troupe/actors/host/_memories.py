"""The host memory store: memories learned from entries, durable in SQLite and recallable.

Why two homes for one memory: ``host_memories`` (and ``host_memory_sources``) is the source of
truth for what the contract shows — stance, lifecycle, belief, kind, people, sources (entry
and message ids), occurred time, strength — while ``troupe.retrieval.MemoryIndex`` is the
hybrid BM25 + vector recall over the same text (key = the memory id as text, tenant
``host``, scope = the entry it was learned in, kind = the memory kind).  ``store_memories``
commits the rows first, in one transaction (with the caller's own ``in_transaction`` work,
e.g. marking a learning batch succeeded, so a batch and its memories commit together), then
adds them to the index.  A crash between the two leaves rows without index items;
``catch_up_index`` (run whenever an index is opened) adds every memory the index lacks, so
an acknowledged memory is never unrecallable for long and never indexed twice (the index
refuses duplicate keys, and catch-up only adds missing ones).

One index per engine, shared with every surface: ``MemoryIndex`` keeps caches (bitmaps, the
vector graph) that only its own writes update, so every user of an engine — the learning
worker that stores, the prepare and search handlers that recall, and the character surface's
recall (its own tenants) — must share one instance.  ``troupe.retrieval.shared_memory_indexes``
opens it; ``HostMemoryIndexes.index_for(engine, embedder)`` (``host_memory_indexes`` is the
process's instance; ``MemoryIndexes`` is its historic name) takes that index and runs the
host's ``catch_up_index`` once per engine before handing it out.

The retrieval tables' migration (``retrieval_migration``) and ``TokenizedDatabase`` (the
tokenizer on every connection a job touches) live in ``troupe.retrieval`` and are
re-exported here under their old names.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw
import trio

from troupe.retrieval import (
    MemoryIndex,
    MemoryItem,
    SharedMemoryIndexes,
    TokenizedDatabase,
    retrieval_migration,
    shared_memory_indexes,
)

memory_tenant = "host"
"""The retrieval tenant of every host memory (recall never crosses tenants)."""

memories_per_store_max = 1000
memory_content_characters_max = 32_768
memory_people_max = 100
memory_sources_max = 1000
catch_up_batch_memories = 1000

assert memories_per_store_max <= 10_000  # MemoryIndex.add's batch limit

memory_tables_sql = """
    CREATE TABLE host_memories (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        entry_id TEXT NOT NULL,
        content TEXT NOT NULL,
        kind TEXT NOT NULL,
        stance TEXT NOT NULL,
        lifecycle TEXT NOT NULL,
        belief REAL NOT NULL,
        people TEXT NOT NULL,
        occurred_at TEXT NOT NULL,
        occurred_at_seconds REAL NOT NULL,
        created_at REAL NOT NULL,
        strength INTEGER NOT NULL DEFAULT 0,
        forgotten INTEGER NOT NULL DEFAULT 0,
        deleted_at REAL
    );
    CREATE INDEX host_memories_by_entry ON host_memories (entry_id, id);
    CREATE TABLE host_memory_sources (
        memory_id INTEGER NOT NULL,
        position INTEGER NOT NULL,
        entry_id TEXT NOT NULL,
        message_id INTEGER NOT NULL,
        PRIMARY KEY (memory_id, position)
    ) WITHOUT ROWID;
    CREATE TABLE host_memory_people (
        person TEXT NOT NULL,
        memory_id INTEGER NOT NULL,
        PRIMARY KEY (person, memory_id)
    ) WITHOUT ROWID;
    -- prepare's other_entries_pending: only messages still waiting, small whatever the history.
    CREATE INDEX host_messages_waiting ON host_messages (entry_id, received_at)
        WHERE learning_state IN ('pending', 'batched');
    CREATE TABLE host_recalls (
        recall_id TEXT PRIMARY KEY,
        token_id TEXT NOT NULL,
        token_name TEXT NOT NULL,
        entry_id TEXT,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE host_recall_memories (
        recall_id TEXT NOT NULL,
        memory_id INTEGER NOT NULL,
        position INTEGER NOT NULL,
        strengthened_at REAL,
        PRIMARY KEY (recall_id, memory_id)
    ) WITHOUT ROWID;
"""
"""Appended to ``host_migrations`` as the host component's memory step (see ``_schema``)."""


@dataclass(frozen=True)
class NewMemory:
    """One memory as the learning worker hands it over."""

    content: str
    kind: str
    stance: str
    lifecycle: str
    belief: float
    """How far the character believes it, 0..1."""
    people: list[str]
    sources: list[tuple[str, int]]
    """``(entry_id, message_id)`` of the messages it was learned from."""
    occurred_at: datetime.datetime
    entry_id: str
    """The entry whose batch produced it (the index scope)."""

    def __post_init__(self) -> None:
        assert self.occurred_at.tzinfo is not None, "occurred_at must be aware"
        assert 0.0 <= self.belief <= 1.0
        assert len(self.content) <= memory_content_characters_max
        assert len(self.people) <= memory_people_max and len(self.sources) <= memory_sources_max


@dataclass(frozen=True)
class MemoryRecord:
    """One stored memory, as prepare and search read it."""

    id: int
    entry_id: str
    content: str
    kind: str
    stance: str
    lifecycle: str
    belief: float
    people: tuple[str, ...]
    occurred_at: str
    occurred_at_seconds: float
    strength: int
    forgotten: bool
    deleted: bool
    sources: tuple[tuple[str, int], ...] = field(default=())


class HostMemoryIndexes:
    """The shared index of an engine, caught up with the host's memories once per engine
    (see the module docstring)."""

    # Kept in the engine's attachments (never in a registry keyed by engine: the index
    # references its engine, so such a registry would keep every engine ever opened).
    caught_up_key = "troupe.host.caught_up_index"
    lock_key = "troupe.host.catch_up_lock"

    def __init__(self, shared: SharedMemoryIndexes | None = None) -> None:
        self._shared = shared if shared is not None else shared_memory_indexes

    async def index_for(self, engine: Any, embedder: Any = None) -> MemoryIndex:
        index = await self._shared.index_for(engine, embedder)
        attachments = engine.attachments
        if attachments.get(self.caught_up_key) is index:
            return index
        lock = attachments.setdefault(self.lock_key, trio.Lock())
        async with lock:
            if attachments.get(self.caught_up_key) is not index:
                await catch_up_index(engine, index)
                attachments[self.caught_up_key] = index
        return index

    def forget_engine(self, engine: Any) -> None:
        """Drop the index of an engine that is closing (tests, restarts)."""
        engine.attachments.pop(self.caught_up_key, None)
        self._shared.forget_engine(engine)


MemoryIndexes = HostMemoryIndexes
"""The historic name (tests and callers construct ``MemoryIndexes()``)."""

host_memory_indexes = HostMemoryIndexes()


def _memory_item(memory_id: int, memory: NewMemory, created_at: float) -> MemoryItem:
    return MemoryItem(
        key=str(memory_id),
        text=memory.content,
        tenant=memory_tenant,
        created_at=datetime.datetime.fromtimestamp(created_at, tz=datetime.UTC),
        scope=memory.entry_id,
        kind=memory.kind,
        event_start=memory.occurred_at,
    )


def insert_memories(connection: apsw.Connection, memories: Sequence[NewMemory], created_at: float) -> list[int]:
    """The SQL half of ``store_memories`` (inside the caller's transaction)."""
    ids = []
    for memory in memories:
        connection.execute(
            "INSERT INTO host_memories (entry_id, content, kind, stance, lifecycle, belief, people, "
            "occurred_at, occurred_at_seconds, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (memory.entry_id, memory.content, memory.kind, memory.stance, memory.lifecycle,
             float(memory.belief), json.dumps(list(memory.people), ensure_ascii=False),
             memory.occurred_at.isoformat(), memory.occurred_at.timestamp(), created_at),
        )
        memory_id = connection.last_insert_rowid()
        ids.append(memory_id)
        connection.executemany(
            "INSERT OR IGNORE INTO host_memory_people (person, memory_id) VALUES (?, ?)",
            [(person, memory_id) for person in memory.people],
        )
        connection.executemany(
            "INSERT INTO host_memory_sources (memory_id, position, entry_id, message_id) VALUES (?, ?, ?, ?)",
            [(memory_id, position, entry_id, message_id)
             for position, (entry_id, message_id) in enumerate(memory.sources)],
        )
    return ids


async def store_memories(
    database: Any,
    index: MemoryIndex,
    memories: list[NewMemory],
    *,
    created_at: float | None = None,
    in_transaction: Callable[[apsw.Connection, list[int]], None] | None = None,
) -> list[int]:
    """Commit ``memories`` (and ``in_transaction(connection, ids)``, if given) in one
    transaction, then add them to ``index``; returns their ids in input order.

    ``created_at`` is wall seconds from the caller's Env clock (pass it; without it the
    first memory's occurred time stands in, as no clock may be read here).  When this returns the
    memories are durable; if the index add fails afterwards, ``catch_up_index`` adds them at
    the next open (the error still propagates so the caller's turn sees it).
    """
    assert len(memories) <= memories_per_store_max
    if not memories:
        return []
    if created_at is None:
        created_at = memories[0].occurred_at.timestamp()

    def job(connection: apsw.Connection) -> list[int]:
        ids = insert_memories(connection, memories, created_at)
        if in_transaction is not None:
            in_transaction(connection, ids)
        return ids

    ids = await database.write(job)
    await index.add([_memory_item(memory_id, memory, created_at) for memory_id, memory in zip(ids, memories, strict=True)])
    return ids


def _missing_memories(connection: apsw.Connection, after: int, limit: int) -> list[tuple]:
    return list(connection.execute(
        "SELECT m.id, m.entry_id, m.content, m.kind, m.occurred_at, m.created_at, m.forgotten, "
        "m.deleted_at FROM host_memories m WHERE m.id > ? AND NOT EXISTS "
        "(SELECT 1 FROM retrieval_items r WHERE r.key = CAST(m.id AS TEXT)) ORDER BY m.id LIMIT ?",
        (after, limit),
    ))


async def catch_up_index(engine: Any, index: MemoryIndex) -> int:
    """Adds every stored memory the index lacks (a crash between commit and index add);
    returns how many were added."""
    database = TokenizedDatabase(engine)
    added = 0
    after = 0
    while True:
        rows = await database.read(lambda connection, after=after: _missing_memories(connection, after, catch_up_batch_memories))
        if not rows:
            return added
        items = []
        forgotten, deleted = [], []
        for memory_id, entry_id, content, kind, occurred_at, created_at, is_forgotten, deleted_at in rows:
            items.append(MemoryItem(
                key=str(memory_id), text=content, tenant=memory_tenant,
                created_at=datetime.datetime.fromtimestamp(created_at, tz=datetime.UTC),
                scope=entry_id, kind=kind, event_start=datetime.datetime.fromisoformat(occurred_at),
            ))
            if is_forgotten:
                forgotten.append(str(memory_id))
            if deleted_at is not None:
                deleted.append(str(memory_id))
        await index.add(items)
        if forgotten:
            await index.forget(forgotten)
        if deleted:
            await index.delete(deleted)
        added += len(items)
        after = rows[-1][0]


_record_columns = (
    "id, entry_id, content, kind, stance, lifecycle, belief, people, occurred_at, "
    "occurred_at_seconds, strength, forgotten, deleted_at"
)


def _record(row: tuple, sources: tuple[tuple[str, int], ...]) -> MemoryRecord:
    (memory_id, entry_id, content, kind, stance, lifecycle, belief, people, occurred_at,
     occurred_at_seconds, strength, forgotten, deleted_at) = row
    return MemoryRecord(
        memory_id, entry_id, content, kind, stance, lifecycle, belief, tuple(json.loads(people)),
        occurred_at, occurred_at_seconds, strength, bool(forgotten), deleted_at is not None, sources,
    )


def load_memories(connection: apsw.Connection, memory_ids: Sequence[int]) -> dict[int, MemoryRecord]:
    """The stored memories of ``memory_ids`` (deleted ones included, flagged), with sources."""
    records: dict[int, MemoryRecord] = {}
    for start in range(0, len(memory_ids), 500):
        chunk = list(memory_ids[start:start + 500])
        marks = ", ".join("?" for _ in chunk)
        sources: dict[int, list[tuple[str, int]]] = {}
        for memory_id, entry_id, message_id in connection.execute(
            f"SELECT memory_id, entry_id, message_id FROM host_memory_sources WHERE memory_id IN ({marks}) "
            "ORDER BY memory_id, position", chunk,
        ):
            sources.setdefault(memory_id, []).append((entry_id, message_id))
        for row in connection.execute(f"SELECT {_record_columns} FROM host_memories WHERE id IN ({marks})", chunk):
            records[row[0]] = _record(row, tuple(sources.get(row[0], ())))
    return records


async def delete_memories(engine: Any, index: MemoryIndex, memory_ids: Sequence[int], *, deleted_at: float) -> None:
    """Deletes memories for good (admin and tests): never recalled again; feedback on them is 404."""
    marks = ", ".join("?" for _ in memory_ids)
    await engine.write(lambda connection: connection.execute(
        f"UPDATE host_memories SET deleted_at = ?, content = '' WHERE id IN ({marks}) AND deleted_at IS NULL",
        (deleted_at, *memory_ids),
    ))
    await index.delete([str(memory_id) for memory_id in memory_ids])


async def forget_memories(engine: Any, index: MemoryIndex, memory_ids: Sequence[int]) -> None:
    """Marks memories forgotten: hidden from recall unless ``include_forgotten``."""
    marks = ", ".join("?" for _ in memory_ids)
    await engine.write(lambda connection: connection.execute(
        f"UPDATE host_memories SET forgotten = 1 WHERE id IN ({marks})", tuple(memory_ids)))
    await index.forget([str(memory_id) for memory_id in memory_ids])


__all__ = [
    "HostMemoryIndexes",
    "MemoryIndexes",
    "MemoryRecord",
    "NewMemory",
    "TokenizedDatabase",
    "catch_up_index",
    "delete_memories",
    "forget_memories",
    "host_memory_indexes",
    "insert_memories",
    "load_memories",
    "memory_tables_sql",
    "memory_tenant",
    "retrieval_migration",
    "store_memories",
]
