"""The operation log: storage functions (run inside ``engine.write`` / ``engine.read`` jobs by
the sync actor) that capture local changes as signed operations, store operations from peers
exactly once, fold them into each item's CRDT state and answer anti-entropy.

Why the log keeps operations, not only winners: anti-entropy must be able to hand a peer
anything it misses.  Compaction (``compact``) bounds the growth without breaking that: an
upsert that another operation of its item covers causally (it can never win again) and that
every peer holds leaves ``sync_ops`` for a payload-free placeholder in ``sync_covered``, which
anti-entropy still hands to a device paired later so its version vector moves over it;
tombstones never leave.  ``/sync/state``'s ``operation_digest`` is over the operations no
other held one covers, so compaction never changes it and two replicas holding the same
operations answer the same digest whether or not they compacted yet.
Operations are sent to peers as their stored canonical JSON (``operations_missing_documents``),
never decoded and encoded again on the way out.

Capture (``capture``) drains ``sync_outbox`` (filled by triggers, ``_schema``): an item whose
row differs from what was last captured or materialised (version and content hash) becomes an
``upsert`` carrying its title, body, status, entities, relations and its newest evidence rows;
a forgotten item becomes a ``tombstone``.  A local change's lamport is above every operation
seen for the item (``next_lamport``); when that is above the row's version the row takes it,
so every replica shows the winner at the same version.  Materialising a remote winner
(``_replication``) records the row's new version and hash first, so the drain that follows
sees nothing new and echoes nothing back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.knowledge._store import (
    Relation,
    evidence_ids_for_knowledge_many,
    forgotten_among,
    get_evidence_many,
    get_knowledge_many,
    ids_per_lookup_max,
)

from ._crdt import (
    ItemState,
    Operation,
    canonical_json,
    clock_merge,
    content_hash,
    digest_and_document,
    kind_tombstone,
    kind_upsert,
    merge,
    next_lamport,
    operation_digest,
    set_digest,
)
from ._identity import DeviceIdentity
from ._protocol import KnowledgeSyncState, operation_bytes_max

operation_evidence_max = 4
"""Evidence rows one upsert carries (the newest links): enough for every item to resolve to
real evidence on the receiver."""
capture_batch_items_max = 1_000
"""Outbox rows one capture job drains (a page: its sources are read with one query each)."""
assert capture_batch_items_max <= ids_per_lookup_max
shared_scope_prefix = "shared:"

setting_enabled = "sync_runtime:enabled"
setting_paused = "sync_runtime:paused"
setting_last_anti_entropy = "sync:last_anti_entropy"
setting_total_ops_synced = "sync:total_ops_synced"


def setting_get(connection: apsw.Connection, name: str, default: Any = None) -> Any:
    row = connection.execute("SELECT value_json FROM sync_settings WHERE name = ?", (name,)).fetchone()
    return default if row is None else json.loads(row[0])


def setting_put(connection: apsw.Connection, name: str, value: Any) -> None:
    connection.execute("INSERT OR REPLACE INTO sync_settings (name, value_json) VALUES (?, ?)",
                       (name, json.dumps(value)))


def setting_add(connection: apsw.Connection, name: str, amount: int) -> None:
    setting_put(connection, name, int(setting_get(connection, name, 0)) + amount)


# -- item states -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredItem:
    state: ItemState
    local_version: int
    local_hash: str
    updated_at: float


def _document(connection: apsw.Connection, op_id: str) -> Operation:
    row = connection.execute("SELECT document FROM sync_ops WHERE op_id = ?", (op_id,)).fetchone()
    assert row is not None, op_id
    return Operation.decode(json.loads(row[0]))


def load_item(connection: apsw.Connection, knowledge_id: str) -> StoredItem | None:
    row = connection.execute(
        "SELECT winner_op_id, winner_digest, clock_json, operations, local_version, local_hash, updated_at "
        "FROM sync_items WHERE knowledge_id = ?", (knowledge_id,)).fetchone()
    if row is None:
        return None
    state = ItemState(knowledge_id, _document(connection, row[0]), row[1], json.loads(row[2]), int(row[3]))
    return StoredItem(state, int(row[4]), row[5], float(row[6]))


def _chunks(values: Sequence[str], size: int = ids_per_lookup_max) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def load_items(connection: apsw.Connection, knowledge_ids: Iterable[str]) -> dict[str, StoredItem]:
    """``load_item`` for many items: one query per ``ids_per_lookup_max`` ids (the winner's
    document joined in), absent items left out."""
    wanted = list(dict.fromkeys(knowledge_ids))
    found: dict[str, StoredItem] = {}
    for chunk in _chunks(wanted):
        for row in connection.execute(
                "SELECT i.knowledge_id, i.winner_digest, i.clock_json, i.operations, i.local_version, i.local_hash, "
                "i.updated_at, o.document FROM sync_items i JOIN sync_ops o ON o.op_id = i.winner_op_id "
                f"WHERE i.knowledge_id IN ({','.join('?' * len(chunk))})", chunk):
            state = ItemState(row[0], Operation.decode(json.loads(row[7])), row[1], json.loads(row[2]), int(row[3]))
            found[row[0]] = StoredItem(state, int(row[4]), row[5], float(row[6]))
    return found


def _item_row(state: ItemState, local: tuple[int, str]) -> tuple[Any, ...]:
    return (state.knowledge_id, state.winner.scope, state.winner.op_id, state.winner_digest, int(state.tombstone),
            json.dumps(dict(state.clock), sort_keys=True), state.operations, state.winner.created_at, *local)


_save_item_sql = ("INSERT OR REPLACE INTO sync_items (knowledge_id, scope, winner_op_id, winner_digest, tombstone, "
                  "clock_json, operations, updated_at, local_version, local_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_insert_operation_sql = ("INSERT INTO sync_ops (op_id, origin, counter, knowledge_id, digest, document, received_at) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)")


def _save_item(connection: apsw.Connection, state: ItemState, now: float, *,
               local: tuple[int, str] | None = None) -> None:
    previous = connection.execute("SELECT local_version, local_hash FROM sync_items WHERE knowledge_id = ?",
                                  (state.knowledge_id,)).fetchone()
    local_version, local_hash = local or ((int(previous[0]), previous[1]) if previous else (0, ""))
    connection.execute(
        "INSERT OR REPLACE INTO sync_items (knowledge_id, scope, winner_op_id, winner_digest, tombstone, "
        "clock_json, operations, updated_at, local_version, local_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (state.knowledge_id, state.winner.scope, state.winner.op_id, state.winner_digest, int(state.tombstone),
         json.dumps(dict(state.clock), sort_keys=True), state.operations, state.winner.created_at,
         local_version, local_hash))


def record_local(connection: apsw.Connection, knowledge_id: str, version: int, hashed: str) -> None:
    """What the local row shows now that the winner is materialised (or captured)."""
    connection.execute("UPDATE sync_items SET local_version = ?, local_hash = ? WHERE knowledge_id = ?",
                       (version, hashed, knowledge_id))


# -- storing operations ------------------------------------------------------------------------


def version_vector(connection: apsw.Connection) -> dict[str, int]:
    return {origin: int(counter) for origin, counter in connection.execute(
        "SELECT origin, contiguous FROM sync_origins ORDER BY origin")}


def holds(connection: apsw.Connection, op_id: str) -> bool:
    """Whether the operation is held, in full or compacted (``sync_covered``)."""
    return (connection.execute("SELECT 1 FROM sync_ops WHERE op_id = ?", (op_id,)).fetchone() is not None
            or connection.execute("SELECT 1 FROM sync_covered WHERE op_id = ?", (op_id,)).fetchone() is not None)


def _held_counter(connection: apsw.Connection, origin: str, counter: int) -> bool:
    return (connection.execute("SELECT 1 FROM sync_ops WHERE origin = ? AND counter = ?",
                               (origin, counter)).fetchone() is not None
            or connection.execute("SELECT 1 FROM sync_covered WHERE origin = ? AND counter = ?",
                                  (origin, counter)).fetchone() is not None)


def _contiguous(connection: apsw.Connection, origin: str) -> int:
    row = connection.execute("SELECT contiguous FROM sync_origins WHERE origin = ?", (origin,)).fetchone()
    return 0 if row is None else int(row[0])


def _advance_origin(connection: apsw.Connection, origin: str, counter: int) -> None:
    """Move ``origin``'s contiguous counter over ``counter`` (just stored) and whatever held
    operations follow it: one index probe per step, so operations arriving out of order cost
    no rescan of what is held above the gap."""
    current = _contiguous(connection, origin)
    if counter != current + 1:
        return  # a gap remains below it (or it was below already)
    current = counter
    while _held_counter(connection, origin, current + 1):
        current += 1
    connection.execute("INSERT OR REPLACE INTO sync_origins (origin, contiguous) VALUES (?, ?)", (origin, current))


@dataclass(frozen=True)
class Applied:
    """What folding one operation did: ``new`` (not held before), ``won`` (now the winner:
    materialise it), the item's state after."""

    new: bool
    won: bool
    state: ItemState | None


def store_operation(connection: apsw.Connection, operation: Operation, now: float,
                    digest: str | None = None) -> Applied:
    """Store ``operation`` unless held, and fold it into its item's state (one job);
    ``digest``: the operation's, when the caller computed it already."""
    if operation.counter <= _contiguous(connection, operation.origin) or holds(connection, operation.op_id):
        return Applied(False, False, None)  # held (or compacted away: a later one dominates it)
    digest, document = digest_and_document(operation)
    connection.execute(_insert_operation_sql, (operation.op_id, operation.origin, operation.counter,
                                               operation.knowledge_id, digest, document.decode(), now))
    _advance_origin(connection, operation.origin, operation.counter)
    stored = load_item(connection, operation.knowledge_id)
    state, won = merge(None if stored is None else stored.state, operation, digest)
    _save_item(connection, state, now)
    return Applied(True, won, state)


@dataclass(frozen=True)
class StoredBatch:
    """What storing a batch did: how many operations were new, and the items whose winner
    changed (their final state: only that winner is materialised, once per batch)."""

    applied: int
    changed: tuple[ItemState, ...]


def _advance_origin_over(connection: apsw.Connection, origin: str, counters: Iterable[int]) -> None:
    """``_advance_origin`` for many counters just stored: walk the new ones in memory, probe
    storage only past them."""
    current = _contiguous(connection, origin)
    fresh = set(counters)
    start = current
    while True:
        if current + 1 in fresh or _held_counter(connection, origin, current + 1):
            current += 1
            continue
        break
    if current != start:
        connection.execute("INSERT OR REPLACE INTO sync_origins (origin, contiguous) VALUES (?, ?)",
                           (origin, current))


def store_operations(connection: apsw.Connection, operations: Sequence[tuple[Operation, str, bytes]], now: float
                     ) -> StoredBatch:
    """``store_operation`` for a batch of checked ``(operation, digest, document)`` triples
    (``digest_and_document``) in one job,
    without a round trip per operation: one lookup of what is held, one insert of what is new,
    one load and one save of the touched items' states; the CRDT fold is the same ``merge``, so
    the final winner of every item is the one ``store_operation`` one by one would give."""
    origins = {operation.origin for operation, _, _ in operations}
    contiguous = {origin: _contiguous(connection, origin) for origin in origins}
    candidates = {operation.op_id: (operation, digest, document) for operation, digest, document in operations
                  if operation.counter > contiguous[operation.origin]}
    held: set[str] = set()
    for chunk in _chunks(list(candidates)):
        marks = ",".join("?" * len(chunk))
        held.update(row[0] for row in connection.execute(
            f"SELECT op_id FROM sync_ops WHERE op_id IN ({marks}) "
            f"UNION ALL SELECT op_id FROM sync_covered WHERE op_id IN ({marks})", [*chunk, *chunk]))
    new = [pair for op_id, pair in candidates.items() if op_id not in held]
    if not new:
        return StoredBatch(0, ())
    connection.executemany(_insert_operation_sql, [
        (operation.op_id, operation.origin, operation.counter, operation.knowledge_id, digest, document.decode(), now)
        for operation, digest, document in new])
    for origin in origins:
        _advance_origin_over(connection, origin, [op.counter for op, _, _ in new if op.origin == origin])
    stored = load_items(connection, [operation.knowledge_id for operation, _, _ in new])
    states: dict[str, ItemState | None] = {key: item.state for key, item in stored.items()}
    before = {key: state.winner.op_id for key, state in states.items() if state is not None}
    for operation, digest, _ in new:
        states[operation.knowledge_id], _ = merge(states.get(operation.knowledge_id), operation, digest)
    saved = []
    for key, state in states.items():
        assert state is not None
        previous = stored.get(key)
        saved.append(_item_row(state, (previous.local_version, previous.local_hash) if previous else (0, "")))
    connection.executemany(_save_item_sql, saved)
    changed = tuple(state for key, state in states.items()
                    if state is not None and before.get(key) != state.winner.op_id)
    return StoredBatch(len(new), changed)


# -- capture -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sources:
    """What capturing a page of items reads, each with one query per ``ids_per_lookup_max``."""

    states: dict[str, StoredItem]
    items: dict[str, Any]
    forgotten_scopes: dict[str, str]
    entities: dict[str, list[str]]
    relations: dict[str, list[dict[str, str]]]
    evidence: dict[str, list[dict[str, Any]]]


def _read_sources(connection: apsw.Connection, ids: Sequence[str]) -> _Sources:
    states = load_items(connection, ids)
    items: dict[str, Any] = {}
    forgotten_scopes: dict[str, str] = {}
    entities: dict[str, list[str]] = {}
    relations: dict[str, list[dict[str, str]]] = {}
    evidence: dict[str, list[dict[str, Any]]] = {}
    for chunk in _chunks(ids):
        items.update(get_knowledge_many(connection, chunk))
        marks = ",".join("?" * len(chunk))
        absent = [knowledge_id for knowledge_id in chunk if knowledge_id not in items]
        if absent:
            forgotten_scopes.update(connection.execute(
                f"SELECT id, scope FROM knowledge_forgotten WHERE kind = 'knowledge' AND id IN "
                f"({','.join('?' * len(absent))})", absent).fetchall())
        for knowledge_id, name in connection.execute(
                f"SELECT knowledge_id, name FROM knowledge_entities WHERE knowledge_id IN ({marks}) "
                "ORDER BY knowledge_id, name", chunk):
            entities.setdefault(knowledge_id, []).append(name)
        for knowledge_id, source, target, kind in connection.execute(
                f"SELECT knowledge_id, source, target, type FROM knowledge_relations WHERE knowledge_id IN ({marks}) "
                "ORDER BY knowledge_id, position", chunk):
            relations.setdefault(knowledge_id, []).append(Relation(source, target, kind).encode())
        newest = {knowledge_id: links[-operation_evidence_max:]
                  for knowledge_id, links in evidence_ids_for_knowledge_many(connection, chunk).items()}
        wanted = [evidence_id for links in newest.values() for evidence_id in links]
        rows: dict[str, Any] = {}
        for evidence_chunk in _chunks(wanted):
            rows.update(get_evidence_many(connection, evidence_chunk))
        for knowledge_id, links in newest.items():
            evidence[knowledge_id] = [_evidence_document(rows[evidence_id]) for evidence_id in links
                                      if evidence_id in rows]
    return _Sources(states, items, forgotten_scopes, entities, relations, evidence)


def _evidence_document(evidence: Any) -> dict[str, Any]:
    return {"id": evidence.id, "source_type": evidence.source_type, "raw": evidence.raw,
            "context": evidence.context, "provenance": evidence.provenance,
            "quality_score": evidence.quality_score, "origin": evidence.origin,
            "knowledge_id": evidence.knowledge_id, "created_at": evidence.created_at}


def _upsert_payload(item: Any, version: int, sources: _Sources) -> dict[str, Any]:
    payload = {
        "title": item.title, "body": item.body, "status": item.status, "version": version,
        "entities": sources.entities.get(item.id, []), "relations": sources.relations.get(item.id, []),
        "origin_evidence_id": item.origin_evidence_id, "created_at": item.created_at, "evidence": [],
    }
    candidates = sources.evidence.get(item.id, [])
    size = len(canonical_json(payload)) + len(canonical_json(candidates))
    while candidates and size > operation_bytes_max - 4096:  # the oldest go first until it fits
        size -= len(canonical_json(candidates[0]))
        candidates = candidates[1:]
    payload["evidence"] = candidates
    return payload


def _next_counter(connection: apsw.Connection, origin: str) -> int:
    row = connection.execute("SELECT MAX(counter) FROM (SELECT counter FROM sync_ops WHERE origin = ? UNION ALL "
                             "SELECT counter FROM sync_covered WHERE origin = ?)", (origin, origin)).fetchone()
    return 1 + (int(row[0]) if row and row[0] is not None else 0)


def _capture_ids(connection: apsw.Connection, identity: DeviceIdentity, now: float,
                 ids: Sequence[str]) -> list[Operation]:
    """Turn the local changes of ``ids`` into signed operations, stored and folded (one job):
    the sources are read per page (no query per item) and the new operations and states are
    written with one ``executemany`` each.  Each operation keeps its own Ed25519 signature
    (≈ 50 µs): a device relays others' operations, and a relay's receiver verifies each one
    against its origin's key (a page signature would not survive pages being cut differently
    on the way)."""
    if not ids:
        return []
    sources = _read_sources(connection, ids)
    counter = _next_counter(connection, identity.device_id)
    first = counter
    made: list[Operation] = []
    operation_rows, item_rows, versions = [], [], []
    for knowledge_id in ids:
        stored = sources.states.get(knowledge_id)
        state = None if stored is None else stored.state
        item = sources.items.get(knowledge_id)
        if item is None:
            scope = sources.forgotten_scopes.get(knowledge_id)
            if scope is None or (state is not None and state.tombstone):
                continue
            kind, payload, lamport, local = kind_tombstone, None, next_lamport(state, 0), (0, "")
        else:
            if not item.scope.startswith(shared_scope_prefix) or (state is not None and state.tombstone):
                continue
            hashed = content_hash(item.title, item.body, item.status)
            if stored is not None and (stored.local_version, stored.local_hash) == (item.version, hashed):
                continue
            lamport = next_lamport(state, item.version)
            if lamport != item.version:
                # Every replica shows the winner at its lamport: the origin's row takes it too.
                versions.append((lamport, knowledge_id))
            scope, kind, payload, local = item.scope, kind_upsert, _upsert_payload(item, lamport, sources), (
                lamport, hashed)
        clock = clock_merge({} if state is None else state.clock, {identity.device_id: counter})
        unsigned = Operation(origin=identity.device_id, counter=counter, knowledge_id=knowledge_id, scope=scope,
                             lamport=lamport, kind=kind, clock=clock, payload=payload, created_at=now)
        digest = operation_digest(unsigned)
        operation = Operation(**{**unsigned.__dict__, "signature": identity.sign(digest.encode())})
        _, document = digest_and_document(operation)
        operation_rows.append((operation.op_id, operation.origin, counter, knowledge_id, digest, document.decode(),
                               now))
        merged, _ = merge(state, operation, digest)
        item_rows.append(_item_row(merged, local))
        made.append(operation)
        counter += 1
    if versions:
        connection.executemany("UPDATE knowledge_items SET version = ? WHERE id = ?", versions)
    if operation_rows:
        connection.executemany(_insert_operation_sql, operation_rows)
        connection.executemany(_save_item_sql, item_rows)
        if _contiguous(connection, identity.device_id) == first - 1:
            connection.execute("INSERT OR REPLACE INTO sync_origins (origin, contiguous) VALUES (?, ?)",
                               (identity.device_id, counter - 1))
        else:
            _advance_origin_over(connection, identity.device_id, range(first, counter))
    return made


def _drop_outbox(connection: apsw.Connection, ids: Sequence[str]) -> None:
    for chunk in _chunks(list(ids)):
        connection.execute(f"DELETE FROM sync_outbox WHERE knowledge_id IN ({','.join('?' * len(chunk))})", chunk)


def capture(connection: apsw.Connection, identity: DeviceIdentity, now: float, *,
            limit: int = capture_batch_items_max) -> list[Operation]:
    """Drain up to ``limit`` outbox rows into signed local operations (one job)."""
    ids = [row[0] for row in connection.execute(
        "SELECT knowledge_id FROM sync_outbox ORDER BY queued_at, knowledge_id LIMIT ?", (limit,))]
    made = _capture_ids(connection, identity, now, ids)
    _drop_outbox(connection, ids)
    return made


def capture_items(connection: apsw.Connection, identity: DeviceIdentity, now: float,
                  knowledge_ids: Iterable[str]) -> list[Operation]:
    """Capture the local changes of these items still waiting in the outbox (one job): run
    before remote operations of the same items are merged, so a local edit made just before
    is an operation that competes in the order, never silently overwritten."""
    wanted = sorted(set(knowledge_ids))
    made = []
    for chunk in _chunks(wanted):
        marks = ",".join("?" * len(chunk))
        waiting = [row[0] for row in connection.execute(
            f"SELECT knowledge_id FROM sync_outbox WHERE knowledge_id IN ({marks}) ORDER BY knowledge_id", chunk)]
        made.extend(_capture_ids(connection, identity, now, waiting))
        _drop_outbox(connection, waiting)
    return made


def outbox_size(connection: apsw.Connection) -> int:
    return int(connection.execute("SELECT COUNT(*) FROM sync_outbox").fetchone()[0])


# -- reading for peers -------------------------------------------------------------------------


def own_operations_after(connection: apsw.Connection, origin: str, seq: int, limit: int
                         ) -> list[tuple[int, dict[str, Any]]]:
    """This device's operations after ``seq`` (a peer's push cursor), oldest first."""
    return [(int(row_seq), json.loads(document)) for row_seq, document in connection.execute(
        "SELECT seq, document FROM sync_ops WHERE origin = ? AND seq > ? ORDER BY seq LIMIT ?",
        (origin, seq, limit))]


def own_operations_pending(connection: apsw.Connection, origin: str, seq: int) -> int:
    return int(connection.execute("SELECT COUNT(*) FROM sync_ops WHERE origin = ? AND seq > ?",
                                  (origin, seq)).fetchone()[0])


def operations_missing(connection: apsw.Connection, theirs: Mapping[str, int], limit: int,
                       refused_origins: Iterable[str] = ()) -> tuple[list[dict[str, Any]], bool]:
    """Operations we hold that a replica with version vector ``theirs`` misses (at most
    ``limit``, oldest counters first per origin); ``more`` when others remain."""
    refused = set(refused_origins)
    found: list[dict[str, Any]] = []
    more = False
    for origin, counter in version_vector(connection).items():
        if origin in refused:
            continue
        above = int(theirs.get(origin, 0))
        if counter <= above and not _held_above(connection, origin, max(above, counter)):
            continue
        room = limit - len(found)
        rows = connection.execute(
            "SELECT document FROM sync_ops WHERE origin = ? AND counter > ? ORDER BY counter LIMIT ?",
            (origin, above, room + 1)).fetchall()
        if len(rows) > room:
            more = True
            rows = rows[:room]
        found.extend(json.loads(row[0]) for row in rows)
        if len(found) >= limit:
            more = more or len(rows) == room
            break
    return found, more


def operations_missing_documents(connection: apsw.Connection, theirs: Mapping[str, int], *,
                                 operations_max: int, bytes_max: int, origins: Iterable[str] | None = None,
                                 refused_origins: Iterable[str] = (), seq_max: int | None = None
                                 ) -> tuple[list[bytes], bool]:
    """The stored documents (canonical JSON, sent as they are: no decoding and encoding again)
    of the operations a replica with version vector ``theirs`` misses: at most
    ``operations_max`` and ``bytes_max`` bytes, oldest counters first per origin; ``origins``
    limits the origins (gossip sends only this device's own); ``seq_max`` leaves out what
    arrived after that arrival number (``operations_arrived``; compaction placeholders are
    always in); ``more`` when others remain."""
    refused = set(refused_origins)
    chosen = None if origins is None else set(origins)
    found: list[bytes] = []
    size = 0
    for origin, counter in version_vector(connection).items():
        if origin in refused or (chosen is not None and origin not in chosen):
            continue
        above = int(theirs.get(origin, 0))
        if counter <= above and not _held_above(connection, origin, max(above, counter)):
            continue
        for (document,) in connection.execute(
                "SELECT document FROM (SELECT counter, document FROM sync_ops WHERE origin = ?1 AND counter > ?2 "
                "AND seq <= ?4 UNION ALL SELECT counter, json_object('covered', json('true'), 'origin', origin, "
                "'counter', counter, 'knowledge_id', knowledge_id, 'digest', digest) FROM sync_covered "
                "WHERE origin = ?1 AND counter > ?2) "
                "ORDER BY counter LIMIT ?3", (origin, above, operations_max - len(found) + 1,
                                              seq_unbounded if seq_max is None else seq_max)):
            encoded = document.encode()
            grown = size + len(encoded) + (1 if found else 0)  # the page is the documents joined by commas
            if len(found) >= operations_max or (found and grown > bytes_max):
                return found, True
            found.append(encoded)
            size = grown
    return found, False


seq_unbounded = 2**63 - 1
"""No bound on arrival numbers (SQLite's largest integer)."""


def operations_arrived(connection: apsw.Connection) -> int:
    """The arrival number (``sync_ops.seq``, never reused) of the last operation stored: an
    anti-entropy exchange bounds what it sends by the value at its first page."""
    return int(connection.execute("SELECT COALESCE(MAX(seq), 0) FROM sync_ops").fetchone()[0])


def operations_pending(ours: Mapping[str, int], theirs: Mapping[str, int], origin: str) -> int:
    """How many of ``origin``'s operations a peer that told us ``theirs`` still misses."""
    return max(0, int(ours.get(origin, 0)) - int(theirs.get(origin, 0)))


def _held_above(connection: apsw.Connection, origin: str, counter: int) -> bool:
    return (connection.execute("SELECT 1 FROM sync_ops WHERE origin = ? AND counter > ? LIMIT 1",
                               (origin, counter)).fetchone() is not None
            or connection.execute("SELECT 1 FROM sync_covered WHERE origin = ? AND counter > ? LIMIT 1",
                                  (origin, counter)).fetchone() is not None)


def _covered(operations: Sequence[Operation]) -> set[str]:
    """The upserts among an item's operations that another one covers causally: it was made
    by a device that had seen them (its clock holds their counter).  Such an upsert can never
    win again (the later one has a greater lamport, or is a tombstone)."""
    covered = set()
    for operation in operations:
        if operation.kind == kind_tombstone:
            continue
        if any(other.op_id != operation.op_id and other.clock.get(operation.origin, 0) >= operation.counter
               for other in operations):
            covered.add(operation.op_id)
    return covered


def item_sync_state(connection: apsw.Connection, knowledge_id: str) -> KnowledgeSyncState:
    """§3.15: payload-free: no ids, scope, body, signatures or device ids.  The digest is over
    the operations no other held operation covers (tombstones never are), so it is the same on
    a device that compacted the covered ones away and on one that has not yet."""
    stored = load_item(connection, knowledge_id)
    if stored is None:
        return KnowledgeSyncState(present=False)
    rows = connection.execute("SELECT digest, document FROM sync_ops WHERE knowledge_id = ?",
                              (knowledge_id,)).fetchall()
    operations = [Operation.decode(json.loads(document)) for _, document in rows]
    covered = _covered(operations)
    digests = [digest for (digest, _), operation in zip(rows, operations, strict=True)
               if operation.op_id not in covered]
    clock = stored.state.clock
    return KnowledgeSyncState(present=True, tombstone=stored.state.tombstone, clock_entries=len(clock),
                              clock_total=sum(clock.values()), operation_digest=set_digest(digests),
                              updated_at=int(stored.updated_at))


# -- compaction --------------------------------------------------------------------------------


compaction_items_per_batch_max = 256
"""Items one compaction job examines (a cursor walks the log; the next job goes on from it)."""
setting_compaction_cursor = "sync:compaction_cursor"
kind_covered_key = "covered"
"""A compacted operation travels as ``{"covered": true, origin, counter, knowledge_id,
digest}``: a placeholder that moves the receiver's version vector over it (it holds the
operation that covers it, or will)."""


def compact(connection: apsw.Connection, peers_known: Sequence[Mapping[str, int]], *,
            items_max: int = compaction_items_per_batch_max) -> int:
    """One bounded compaction job: of up to ``items_max`` items with several operations (from
    the stored cursor on), move to ``sync_covered`` every upsert that (1) another held
    operation of the item covers, (2) lies at or below its origin's contiguous counter (no gap
    can then ask for it again) and (3) every ACTIVE peer's vector says it holds
    (``peers_known``).  Tombstones are never compacted.  Answers how many were compacted."""
    cursor = str(setting_get(connection, setting_compaction_cursor, ""))
    items = [row[0] for row in connection.execute(
        "SELECT knowledge_id FROM sync_ops WHERE knowledge_id > ? GROUP BY knowledge_id HAVING COUNT(*) > 1 "
        "ORDER BY knowledge_id LIMIT ?", (cursor, items_max))]
    setting_put(connection, setting_compaction_cursor, items[-1] if len(items) == items_max else "")
    contiguous = version_vector(connection)
    moved = 0
    for knowledge_id in items:
        operations = [Operation.decode(json.loads(document)) for (document,) in connection.execute(
            "SELECT document FROM sync_ops WHERE knowledge_id = ?", (knowledge_id,))]
        droppable = [op_id for op_id in sorted(_covered(operations))
                     if _everyone_holds(op_id, contiguous, peers_known)]
        for op_id in droppable:
            connection.execute("INSERT OR IGNORE INTO sync_covered (op_id, origin, counter, knowledge_id, digest) "
                               "SELECT op_id, origin, counter, knowledge_id, digest FROM sync_ops WHERE op_id = ?",
                               (op_id,))
            connection.execute("DELETE FROM sync_ops WHERE op_id = ?", (op_id,))
        moved += len(droppable)
    return moved


def _everyone_holds(op_id: str, contiguous: Mapping[str, int], peers_known: Sequence[Mapping[str, int]]) -> bool:
    origin, _, counter_text = op_id.rpartition(":")
    counter = int(counter_text)
    return counter <= contiguous.get(origin, 0) and all(known.get(origin, 0) >= counter for known in peers_known)


def store_covered(connection: apsw.Connection, placeholders: Sequence[Mapping[str, Any]]) -> int:
    """Keep a peer's compacted placeholders not held yet (one job), moving the origins'
    contiguous counters over them; how many were new."""
    new = 0
    for origin, counter, knowledge_id, digest in (
            (item["origin"], item["counter"], item["knowledge_id"], item["digest"]) for item in placeholders):
        op_id = f"{origin}:{counter}"
        if counter <= _contiguous(connection, origin) or holds(connection, op_id):
            continue
        connection.execute("INSERT INTO sync_covered (op_id, origin, counter, knowledge_id, digest) "
                           "VALUES (?, ?, ?, ?, ?)", (op_id, origin, counter, knowledge_id, digest))
        _advance_origin(connection, origin, counter)
        new += 1
    return new


def covered_total(connection: apsw.Connection) -> int:
    return int(connection.execute("SELECT COUNT(*) FROM sync_covered").fetchone()[0])


def operations_total(connection: apsw.Connection) -> int:
    return int(connection.execute("SELECT COUNT(*) FROM sync_ops").fetchone()[0])


def forgotten(connection: apsw.Connection, ids: Sequence[str]) -> set[str]:
    return forgotten_among(connection, ids)


__all__ = [
    "Applied",
    "StoredItem",
    "capture",
    "capture_batch_items_max",
    "forgotten",
    "holds",
    "item_sync_state",
    "load_item",
    "operation_evidence_max",
    "capture_items",
    "operations_missing",
    "operations_arrived",
    "operations_missing_documents",
    "operations_pending",
    "operations_total",
    "outbox_size",
    "own_operations_after",
    "own_operations_pending",
    "record_local",
    "setting_add",
    "setting_enabled",
    "setting_get",
    "setting_last_anti_entropy",
    "setting_paused",
    "setting_put",
    "setting_total_ops_synced",
    "shared_scope_prefix",
    "StoredBatch",
    "compact",
    "compaction_items_per_batch_max",
    "covered_total",
    "kind_covered_key",
    "setting_compaction_cursor",
    "seq_unbounded",
    "store_covered",
    "load_items",
    "store_operation",
    "store_operations",
    "version_vector",
]
