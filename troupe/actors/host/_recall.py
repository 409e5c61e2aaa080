"""Recall for hosts: what prepare and ``POST /memories/search`` share.

Why it is here and not in the HTTP layer: the rules are the contract's domain rules, not
transport — a recall is recorded durably (id, owner token, expiry, the memories it returned)
before the reply, so that feedback can later be checked against exactly what that token was
shown; memory sources name their entry only when the asking token's scope reaches it
(``entry_id``, ``entry_name`` and ``occurred_at`` become null otherwise, the rest of the memory
is unchanged); the ``other_entries_pending`` hint reveals counts and UTC bounds only.

These are plain async functions over the engine and the shared ``MemoryIndex`` rather than an
actor: they read, and their one write (the recall record) is an insert of a fresh id that no
other writer touches.  Everything they show is read outside that write, so the job that waits
for the group commit stays small; it also deletes a few recalls that expired more than a week
ago (``sweep_expired_recalls``), so the table stays bounded without a timer of its own.  Feedback's idempotence lives in its SQL (``_feedback``), which the
engine's single writer serialises.

Search without text lists memories by the filters, newest occurred first; with text it recalls
hybrid (over-fetching, then filtering by the facets the index does not hold: stances, people,
time), so a filter never lets an excluded memory through.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.auth import TokenGrant, TokenScope
from troupe.retrieval import MemoryIndex, RecallFilter

from ._goals import injected_goals
from ._memories import MemoryRecord, TokenizedDatabase, load_memories, memory_tenant
from ._schema import learning_states_unlearned
from ._state import load_state, state_document

recall_valid_seconds = 24 * 3600.0
"""A recall id accepts feedback for 24 hours (the contract)."""
recall_kept_after_expiry_seconds = 7 * 24 * 3600.0
"""An expired recall is kept this long so that feedback on it still answers 400
``recall_expired``; after that it is deleted and feedback on it answers 404."""
recall_sweep_rows_max = 16
"""Oldest recalls examined (and at most deleted) per recall written: each new recall pays for
the cleanup of up to this many old ones, so the table stays bounded with no separate task."""
recall_fetch_limit = 200
"""Candidates fetched from the index before the facets it does not hold filter them."""
search_limit_default = 8
search_goals_max = 10
"""Goals a search with ``include_goals`` returns (active, injectable, soonest deadline first)."""
search_limit_max = 100
recall_id_prefix = "recall_"
learned_state = "learned"
"""A message whose learning succeeded (``_batches.learning_state_learned``); any other state
is ``unlearned`` in prepare."""
unlearned_states = ("pending", "batched")
"""What ``other_entries_pending`` counts: waiting to be learned (not failed, not filtered)."""

assert unlearned_states == learning_states_unlearned

assert search_limit_max <= recall_fetch_limit


def utc_text(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="seconds")


def entry_names(connection: apsw.Connection, entry_ids: Sequence[str]) -> dict[str, str | None]:
    if not entry_ids:
        return {}
    marks = ", ".join("?" for _ in entry_ids)
    return dict(connection.execute(
        f"SELECT entry_id, name FROM host_entries WHERE entry_id IN ({marks})", tuple(entry_ids)))


def message_times(connection: apsw.Connection, message_ids: Sequence[int]) -> dict[int, str]:
    if not message_ids:
        return {}
    marks = ", ".join("?" for _ in message_ids)
    return dict(connection.execute(
        f"SELECT id, occurred_at FROM host_messages WHERE id IN ({marks})", tuple(message_ids)))


@dataclass(frozen=True)
class SourceLookup:
    """Entry names and message times of the sources of a set of memories."""

    names: dict[str, str | None]
    times: dict[int, str]


def source_lookup(connection: apsw.Connection, records: Sequence[MemoryRecord]) -> SourceLookup:
    entries = sorted({entry_id for record in records for entry_id, _ in record.sources})
    messages = sorted({message_id for record in records for _, message_id in record.sources})
    return SourceLookup(entry_names(connection, entries), message_times(connection, messages))


def memory_document(record: MemoryRecord, reason: str, scope: TokenScope, lookup: SourceLookup) -> dict[str, Any]:
    """One ``memories[]`` item; sources outside ``scope`` keep only ``message_id``."""
    sources = []
    for entry_id, message_id in record.sources:
        if scope.allows(entry_id):
            sources.append({"entry_id": entry_id, "entry_name": lookup.names.get(entry_id),
                            "message_id": message_id, "occurred_at": lookup.times.get(message_id)})
        else:
            sources.append({"entry_id": None, "entry_name": None, "message_id": message_id, "occurred_at": None})
    return {
        "id": record.id,
        "content": record.content,
        "kind": record.kind,
        "stance": record.stance,
        "lifecycle": record.lifecycle,
        "belief": record.belief,
        "people": list(record.people),
        "occurred_at": record.occurred_at,
        "forgotten": record.forgotten,
        "reason": reason,
        "sources": sources,
        "subject_annotations": [],
    }


def record_recall(
    connection: apsw.Connection, recall_id: str, grant: TokenGrant, entry_id: str | None,
    memory_ids: Sequence[int], now: float,
) -> None:
    """The durable recall: owner token, expiry and the memories it returned, in order."""
    connection.execute(
        "INSERT INTO host_recalls (recall_id, token_id, token_name, entry_id, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (recall_id, str(grant.id), grant.name, entry_id, now, now + recall_valid_seconds),
    )
    connection.executemany(
        "INSERT INTO host_recall_memories (recall_id, memory_id, position) VALUES (?, ?, ?)",
        [(recall_id, memory_id, position) for position, memory_id in enumerate(memory_ids)],
    )
    sweep_expired_recalls(connection, now)


def sweep_expired_recalls(connection: apsw.Connection, now: float, rows_max: int = recall_sweep_rows_max) -> int:
    """Deletes recalls (and their memory rows) expired more than
    ``recall_kept_after_expiry_seconds`` ago among the ``rows_max`` lowest recall ids; returns
    how many were deleted.

    Recall ids grow with creation (the Env's ids lead with the time or a counter), so the
    lowest ids are the oldest recalls and this walks a few rows of the primary key instead of
    scanning the table.  A row that is not yet deletable (a wall clock that stepped back)
    only delays the ones behind it until it expires in turn."""
    cutoff = now - recall_kept_after_expiry_seconds
    expired = [recall_id for recall_id, expires_at in connection.execute(
        "SELECT recall_id, expires_at FROM host_recalls ORDER BY recall_id LIMIT ?", (rows_max,))
        if expires_at < cutoff]
    if expired:
        marks = ", ".join("?" for _ in expired)
        connection.execute(f"DELETE FROM host_recall_memories WHERE recall_id IN ({marks})", expired)
        connection.execute(f"DELETE FROM host_recalls WHERE recall_id IN ({marks})", expired)
    return len(expired)


def other_entries_pending(connection: apsw.Connection, scope: TokenScope, entry_id: str | None) -> dict | None:
    """The ``other_entries_pending`` hint: entries in ``scope`` other than ``entry_id`` with
    messages waiting to be learned; only their count and the UTC receive-time bounds."""
    # Literal states (not parameters), so that SQLite can use the partial index
    # ``host_messages_waiting`` whose WHERE names the same states.
    rows = connection.execute(
        "SELECT entry_id, min(received_at), max(received_at) FROM host_messages "
        "WHERE learning_state IN ('pending', 'batched') GROUP BY entry_id"
    )
    count, earliest, latest = 0, None, None
    for other, first, last in rows:
        if other == entry_id or not scope.allows(other):
            continue
        count += 1
        earliest = first if earliest is None else min(earliest, first)
        latest = last if latest is None else max(latest, last)
    if count == 0:
        return None
    time_from, time_to = utc_text(earliest), utc_text(latest)
    return {
        "code": "other_entries_pending",
        "entry_count": count,
        "time_from": time_from,
        "time_to": time_to,
        "time_basis": "received_at",
        "message": f"另有 {count} 个入口有尚未学习的新消息（{time_from}—{time_to}）",
    }


def current_state(connection: apsw.Connection, scope: TokenScope, now: float) -> dict[str, Any]:
    """The host-reported state as ``GET /state`` shows it to this token (``{}`` when idle)."""
    return state_document(load_state(connection), now=now, allows=scope.allows)


recall_degraded_hint = {"code": "recall_degraded", "message": "向量检索暂不可用，本次仅按关键词召回。"}


async def recall_memory_ids(
    index: MemoryIndex, query: str, recall_filter: RecallFilter, limit: int
) -> tuple[list[int], str | None]:
    """Memory ids in recall order (at most ``limit``) and the index's degradation, if any."""
    result = await index.recall(query, recall_filter=recall_filter, limit=min(limit, recall_fetch_limit))
    return [int(hit.key) for hit in result.hits], result.degraded


@dataclass(frozen=True)
class SearchQuery:
    """A validated ``POST /memories/search`` body."""

    text: str | None
    entry_id: str | None
    include_forgotten: bool
    include_goals: bool
    include_state: bool
    people: tuple[str, ...] | None
    kinds: tuple[str, ...] | None
    stances: tuple[str, ...] | None
    time_from: float | None
    time_to: float | None
    limit: int


def _admits(record: MemoryRecord, query: SearchQuery) -> bool:
    if record.deleted or (record.forgotten and not query.include_forgotten):
        return False
    if query.kinds is not None and record.kind not in query.kinds:
        return False
    if query.stances is not None and record.stance not in query.stances:
        return False
    if query.people is not None and not set(query.people) & set(record.people):
        return False
    if query.time_from is not None and record.occurred_at_seconds < query.time_from:
        return False
    return query.time_to is None or record.occurred_at_seconds <= query.time_to


def _listed_ids(connection: apsw.Connection, query: SearchQuery) -> list[int]:
    """Without text: every admitted memory, newest occurred first (bounded by the limit)."""
    conditions, parameters = ["deleted_at IS NULL"], []
    if not query.include_forgotten:
        conditions.append("forgotten = 0")
    for column, values in (("kind", query.kinds), ("stance", query.stances)):
        if values is not None:
            conditions.append(f"{column} IN ({', '.join('?' for _ in values)})")
            parameters.extend(values)
    if query.people is not None:
        marks = ", ".join("?" for _ in query.people)
        conditions.append(f"id IN (SELECT memory_id FROM host_memory_people WHERE person IN ({marks}))")
        parameters.extend(query.people)
    if query.time_from is not None:
        conditions.append("occurred_at_seconds >= ?")
        parameters.append(query.time_from)
    if query.time_to is not None:
        conditions.append("occurred_at_seconds <= ?")
        parameters.append(query.time_to)
    sql = (f"SELECT id FROM host_memories WHERE {' AND '.join(conditions)} "
           "ORDER BY occurred_at_seconds DESC, id DESC LIMIT ?")
    return [row[0] for row in connection.execute(sql, (*parameters, query.limit))]


async def search_memories(
    engine: Any, index: MemoryIndex, grant: TokenGrant, query: SearchQuery, *, recall_id: str, now: float,
) -> dict[str, Any]:
    """The ``POST /memories/search`` answer, its recall recorded before it is returned."""
    database = TokenizedDatabase(engine)
    hints: list[dict] = []
    text = (query.text or "").strip()
    if text:
        recall_filter = RecallFilter(
            memory_tenant, kinds=frozenset(query.kinds) if query.kinds is not None else None,
            viewer=query.entry_id, include_forgotten=query.include_forgotten,
        )
        candidates, degraded = await recall_memory_ids(index, text, recall_filter, recall_fetch_limit)
        if degraded:
            hints.append(dict(recall_degraded_hint))
    else:
        candidates = await database.read(lambda connection: _listed_ids(connection, query))

    def read(connection: apsw.Connection) -> tuple[list[MemoryRecord], SourceLookup, dict[str, Any] | None, Any]:
        records = load_memories(connection, candidates)
        chosen = [records[memory_id] for memory_id in candidates
                  if memory_id in records and _admits(records[memory_id], query)][:query.limit]
        state = current_state(connection, grant.scope, now) if query.include_state else None
        goals = injected_goals(connection, now=now, allows=grant.scope.allows, entry_id=query.entry_id,
                               limit=search_goals_max, whole_scope=True) if query.include_goals else None
        return chosen, source_lookup(connection, chosen), state, goals

    chosen, lookup, state, goals = await database.read(read)
    chosen_ids = [record.id for record in chosen]
    # Only the recall record goes through the writer, and it is durable before the reply.
    await engine.write(
        lambda connection: record_recall(connection, recall_id, grant, query.entry_id, chosen_ids, now))
    document: dict[str, Any] = {
        "memories": [memory_document(record, "relevant", grant.scope, lookup) for record in chosen],
        "hints": hints,
        "recall_id": recall_id,
    }
    if goals is not None:
        document["goals"] = goals
    if state is not None:
        document["state"] = state
    return document


__all__ = [
    "SearchQuery",
    "SourceLookup",
    "current_state",
    "learned_state",
    "memory_document",
    "other_entries_pending",
    "recall_fetch_limit",
    "recall_id_prefix",
    "recall_degraded_hint",
    "recall_kept_after_expiry_seconds",
    "recall_memory_ids",
    "recall_sweep_rows_max",
    "recall_valid_seconds",
    "record_recall",
    "search_goals_max",
    "search_limit_default",
    "search_limit_max",
    "search_memories",
    "source_lookup",
    "sweep_expired_recalls",
    "unlearned_states",
    "utc_text",
]
