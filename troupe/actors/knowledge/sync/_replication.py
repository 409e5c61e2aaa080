"""Replication: materialising a remote winner into the knowledge store, and the peer-to-peer
HTTP calls (signed requests through ``env.http``).

Why materialisation reuses the store's own functions: a remote winner must look exactly like
a local item to every reader (recall, agent context, forget, conflicts), so it is written
with the knowledge store's functions (``insert_evidence``, ``link_evidence``,
``replace_structure``, ``forget_apply``, ``insert_conflict``) and its entities and relations
are rebuilt by the same offline extractor structuring uses (``extract_structure``, with the
origin's entities and relations as declared hints, as an update's rebuild does); the caller
then refreshes the recall index (text and vectors re-embedded; a tombstone's vectors removed).

- ``upsert``: evidence rows the receiver lacks are inserted (never over a forgotten one), the
  item is inserted or overwritten at the winner's lamport as its version, its evidence linked.
  A FIRST materialisation goes through the conflict service with source ``sync``: when the
  scope already holds another ACTIVE item of the same subject, the two bodies are diffed in the
  stable total order (the smaller knowledge id is "old") and one conflict row per changed
  field is recorded on the newer item, with ids derived from the operation's digest so every
  replica records the same rows whatever the arrival order.
- ``tombstone``: the item, its links, entities, relations, conflicts and the evidence only it
  links to are removed for good (``forget_apply``) and a ``knowledge_forgotten`` row is left, so
  no later upsert, local or remote, brings it back.

Peer requests are signed (``signed_headers``): ``X-Troupe-Device``, ``X-Troupe-Signed-At`` and
``X-Troupe-Signature`` over ``method``, ``path``, the time and SHA-256 of the body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import httpx

from troupe.actors.knowledge._conflicts import detect_conflicts, normalised_subject, stored_value
from troupe.actors.knowledge._protocol import ConflictDetected
from troupe.actors.knowledge._store import (
    EvidenceDraft,
    conflict_source_sync,
    evidence_origin_write,
    evidence_origins,
    forget_apply,
    forgotten_among,
    get_evidence_many,
    get_knowledge_many,
    ids_per_lookup_max,
    insert_conflict,
    insert_evidence,
    knowledge_status_active,
    link_evidence,
    replace_structure,
)
from troupe.actors.knowledge._structuring import SubjectItem, extract_structure

from ._crdt import Operation, canonical_json, content_hash, kind_tombstone
from ._identity import DeviceIdentity
from ._oplog import record_local

peer_request_seconds_max = 10.0
"""One peer HTTP request, at most (connect, send, answer)."""
peer_request_attempts_max = 2
"""Sends of one peer request when the peer dropped a reused keep-alive connection."""
header_device = "X-Troupe-Device"
header_signed_at = "X-Troupe-Signed-At"
header_signature = "X-Troupe-Signature"


def signing_text(method: str, path: str, signed_at: int, body: bytes) -> bytes:
    return f"{method}\n{path}\n{signed_at}\n{hashlib.sha256(body).hexdigest()}".encode()


def signed_headers(identity: DeviceIdentity, method: str, path: str, body: bytes, now: float) -> dict[str, str]:
    signed_at = int(now)
    return {header_device: identity.device_id, header_signed_at: str(signed_at),
            header_signature: identity.sign(signing_text(method, path, signed_at, body)),
            "Content-Type": "application/json"}


class PeerUnreachable(Exception):
    """A peer did not answer 2xx (network error, timeout, refusal): retried with backoff."""

    def __init__(self, status: int | None, message: str = "") -> None:
        super().__init__(message or f"peer answered {status}")
        self.status = status


def operations_body(documents: Sequence[bytes], **fields: Any) -> bytes:
    """A peer request's JSON body: ``fields`` plus ``"operations"``, the stored documents
    spliced in as they are (each is canonical JSON already; decoding and re-encoding thousands
    of them per push was most of a push's cost)."""
    head = canonical_json(fields)
    return head[:-1] + (b"," if fields else b"") + b'"operations":[' + b",".join(documents) + b"]}"


async def post_to_peer(http: Any, identity: DeviceIdentity, address: str, path: str, document: Any,
                       now: float, *, body: bytes | None = None) -> Any:
    """POST a signed JSON document (or a ready ``body``) to a peer; the answer's JSON, or
    ``PeerUnreachable``."""
    if http is None:
        raise PeerUnreachable(None, "outbound HTTP is not configured")
    body = canonical_json(document) if body is None else body
    headers = signed_headers(identity, "POST", path, body, now)
    for attempt in range(peer_request_attempts_max):
        try:
            response = await http.post(address.rstrip("/") + path, content=body, headers=headers,
                                       timeout=peer_request_seconds_max)
            break
        except httpx.RemoteProtocolError as exc:
            # Mostly the peer closing a kept-alive connection as we reused it (its idle
            # timeout), the request not taken: it goes once more on a new connection instead
            # of a backoff of the peer.  Sending a peer request twice is harmless (operations
            # and vectors are deduplicated; a join's nonce is single-use, so a join that was
            # taken the first time fails the second, as it failed before this retry).
            if attempt + 1 == peer_request_attempts_max:
                raise PeerUnreachable(None, type(exc).__name__) from exc
        except Exception as exc:  # httpx's transport errors, the simulator's network faults
            raise PeerUnreachable(None, type(exc).__name__) from exc
    if not 200 <= response.status_code < 300:
        raise PeerUnreachable(response.status_code)
    try:
        return response.json()
    except ValueError as exc:
        raise PeerUnreachable(response.status_code, "the answer was not JSON") from exc


# -- materialisation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Materialised:
    knowledge_id: str
    removed: bool
    conflicts: tuple[ConflictDetected, ...] = ()
    created: bool = False
    """The item was not in the store before (a first materialisation): the recall index has no
    entry to replace, so refreshing it needs no forced re-index."""


@dataclass
class _Known:
    """What a batch's materialisation looked up once for all its items: forgotten ids
    (items and evidence), the items present, the evidence present (grown as rows are
    inserted, so two items sharing evidence insert it once)."""

    forgotten: set[str]
    items: dict[str, Any]
    evidence: set[str]


def _evidence_ids(operation: Operation) -> list[str]:
    rows = (operation.payload or {}).get("evidence")
    if not isinstance(rows, list):
        return []
    return [row["id"] for row in rows if isinstance(row, Mapping) and isinstance(row.get("id"), str)]


def _look_up(connection: apsw.Connection, operations: Sequence[Operation]) -> _Known:
    item_ids = list(dict.fromkeys(operation.knowledge_id for operation in operations))
    evidence_ids = list(dict.fromkeys(evidence_id for operation in operations
                                      for evidence_id in _evidence_ids(operation)))
    known = _Known(set(), {}, set())
    for start in range(0, max(len(item_ids), len(evidence_ids)), ids_per_lookup_max):
        items, evidence = item_ids[start:start + ids_per_lookup_max], evidence_ids[start:start + ids_per_lookup_max]
        if items:
            known.forgotten.update(forgotten_among(connection, items))
            known.items.update(get_knowledge_many(connection, items))
        if evidence:
            known.forgotten.update(forgotten_among(connection, evidence))
            known.evidence.update(get_evidence_many(connection, evidence))
    return known


def _insert_evidence_rows(connection: apsw.Connection, scope: str, rows: Any, now: float, known: _Known
                          ) -> list[str]:
    if not isinstance(rows, list):
        return []
    present = []
    for row in rows:
        if not isinstance(row, Mapping) or not isinstance(row.get("id"), str) or row["id"] in known.forgotten:
            continue
        evidence_id = row["id"]
        if evidence_id not in known.evidence:
            origin = row.get("origin") if row.get("origin") in evidence_origins else evidence_origin_write
            draft = EvidenceDraft(scope=scope, source_type=str(row.get("source_type")),
                                  raw=dict(row.get("raw") or {}), context=row.get("context"),
                                  provenance=row.get("provenance"),
                                  quality_score=float(row.get("quality_score") or 0.0))
            try:
                insert_evidence(connection, draft, evidence_id=evidence_id, now=float(row.get("created_at") or now),
                                origin=origin, knowledge_id=row.get("knowledge_id"))
            except ValueError:
                continue  # what this store refuses (an unknown source type) is not copied
            known.evidence.add(evidence_id)
        present.append(evidence_id)
    return present


def _sync_conflicts(connection: apsw.Connection, operation: Operation, digest: str, now: float,
                    subject: SubjectItem | None) -> tuple[ConflictDetected, ...]:
    """A first materialisation meets the conflict service (source ``sync``): ``subject`` is
    the scope's ACTIVE item of the same subject, looked up before the remote item was
    inserted; the conflicts are recorded after (the store records a conflict only on an item
    that exists, and the remote item is "new" when its id is the greater)."""
    payload = operation.payload or {}
    if subject is None or subject.knowledge_id == operation.knowledge_id:
        return ()
    remote_id, remote_body = operation.knowledge_id, payload.get("body")
    if subject.knowledge_id < remote_id:
        old_body, new_body, target, title = subject.body, remote_body, remote_id, str(payload.get("title", ""))
    else:
        old_body, new_body, target, title = remote_body, subject.body, subject.knowledge_id, subject.title
    events = []
    for position, change in enumerate(detect_conflicts(old_body, new_body).changes):
        conflict_id = f"cfl_sync_{digest[:24]}_{position}"
        if connection.execute("SELECT 1 FROM knowledge_conflicts WHERE id = ?", (conflict_id,)).fetchone():
            continue
        old_value, new_value = stored_value(change.old_value), stored_value(change.new_value)
        insert_conflict(connection, conflict_id=conflict_id, knowledge_id=target, field=change.field,
                        old_value=old_value, new_value=new_value, resolution=change.resolution, now=now,
                        source=conflict_source_sync)
        events.append(ConflictDetected(conflict_id=conflict_id, knowledge_title=title, field=change.field,
                                       old_value=old_value, new_value=new_value, resolution=change.resolution))
    return tuple(events)


def materialise(connection: apsw.Connection, operation: Operation, digest: str, now: float) -> Materialised | None:
    """Make the store show ``operation``, the item's new winner (inside the job that stored
    it); None when there is nothing to show (an upsert of a forgotten item)."""
    return _materialise(connection, operation, digest, now, _look_up(connection, [operation]))


def materialise_many(connection: apsw.Connection, winners: Sequence[tuple[Operation, str]], now: float
                     ) -> list[Materialised]:
    """``materialise`` for a batch's new winners (one per item), with the lookups every item
    needs (forgotten ids, present items and evidence) made once for the batch; what was shown."""
    known: _Known | None = None
    shown = []
    for position, (operation, digest) in enumerate(winners):
        if known is None:
            known = _look_up(connection, [later for later, _ in winners[position:]])
        result = _materialise(connection, operation, digest, now, known)
        if operation.kind == kind_tombstone:
            known = None  # forgetting removed evidence and links: look the rest up again
        if result is not None:
            shown.append(result)
    return shown


def _materialise(connection: apsw.Connection, operation: Operation, digest: str, now: float, known: _Known
                 ) -> Materialised | None:
    knowledge_id = operation.knowledge_id
    if operation.kind == kind_tombstone:
        if knowledge_id in known.items:
            forget_apply(connection, [knowledge_id], now)
        connection.execute("INSERT OR IGNORE INTO knowledge_forgotten (id, kind, scope, forgotten_at) "
                           "VALUES (?, 'knowledge', ?, ?)", (knowledge_id, operation.scope, now))
        known.forgotten.add(knowledge_id)
        known.items.pop(knowledge_id, None)
        record_local(connection, knowledge_id, 0, "")
        _settled(connection, knowledge_id)
        return Materialised(knowledge_id, removed=True)
    if knowledge_id in known.forgotten:
        return None  # forgotten here: the local tombstone operation wins everywhere
    payload = operation.payload or {}
    title, body, status = str(payload.get("title", ""))[:256], payload.get("body"), str(payload.get("status", "ACTIVE"))
    evidence_ids = _insert_evidence_rows(connection, operation.scope, payload.get("evidence"), now, known)
    conflicts: tuple[ConflictDetected, ...] = ()
    body_json = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    created = knowledge_id not in known.items
    if created:
        subject = _subject_item(connection, operation.scope, title)
        origin_evidence = payload.get("origin_evidence_id")
        taken = connection.execute("SELECT 1 FROM knowledge_items WHERE origin_evidence_id = ?",
                                   (origin_evidence,)).fetchone()
        if origin_evidence not in evidence_ids or taken:
            origin_evidence = None
        connection.execute(
            "INSERT INTO knowledge_items (id, scope, status, version, title, body_json, origin_evidence_id, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (knowledge_id, operation.scope, status, operation.lamport, title, body_json, origin_evidence,
             float(payload.get("created_at") or now), now))
        known.items[knowledge_id] = True
        conflicts = _sync_conflicts(connection, operation, digest, now, subject)
    else:
        connection.execute(
            "UPDATE knowledge_items SET status = ?, version = ?, title = ?, body_json = ?, updated_at = ? "
            "WHERE id = ?", (status, operation.lamport, title, body_json, now, knowledge_id))
    for evidence_id in evidence_ids:
        link_evidence(connection, knowledge_id, evidence_id, now)
    structure = extract_structure("MANUAL_CONFIG", {"title": title, "body": body,
                                                    "entities": payload.get("entities") or [],
                                                    "relations": payload.get("relations") or []})
    replace_structure(connection, knowledge_id, structure.entities, list(structure.relations))
    record_local(connection, knowledge_id, operation.lamport, content_hash(title, body, status))
    _settled(connection, knowledge_id)
    return Materialised(knowledge_id, removed=False, conflicts=conflicts, created=created)


def _settled(connection: apsw.Connection, knowledge_id: str) -> None:
    """The row now shows the winner and says so (``record_local``): the outbox entry the
    capture trigger made for this very write would only be read back to find nothing new.
    (Local changes of the item made before were captured first: ``_oplog.capture_items``.)"""
    connection.execute("DELETE FROM sync_outbox WHERE knowledge_id = ?", (knowledge_id,))


def _subject_item(connection: apsw.Connection, scope: str, title: str) -> SubjectItem | None:
    """``read_subject_item`` through the ``(scope, title)`` index: its query lets SQLite pick
    the ``(scope, status, updated_at)`` index for the ORDER BY and scan every ACTIVE item of
    the scope, which made materialising N remote items cost N² row reads."""
    subject = normalised_subject(title)
    if not subject:
        return None
    rows = connection.execute(
        "SELECT id, version, title, body_json, updated_at, status FROM knowledge_items "
        "INDEXED BY knowledge_items_by_title WHERE scope = ? AND title = ?", (scope, title)).fetchall()
    rows.sort(key=lambda row: (-float(row[4]), row[0]))
    for knowledge_id, version, stored_title, body_json, _, status in rows:
        if status == knowledge_status_active and normalised_subject(stored_title) == subject:
            return SubjectItem(knowledge_id, int(version), stored_title, json.loads(body_json))
    return None


__all__ = [
    "Materialised",
    "PeerUnreachable",
    "header_device",
    "header_signature",
    "header_signed_at",
    "materialise",
    "materialise_many",
    "peer_request_attempts_max",
    "peer_request_seconds_max",
    "operations_body",
    "post_to_peer",
    "signed_headers",
    "signing_text",
]
