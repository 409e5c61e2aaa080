"""The knowledge store: pure storage functions over an apsw connection, run inside
``engine.write`` / ``engine.read`` jobs by the knowledge actors.

Why pure functions: the ``("knowledge_scope", scope)`` actor decides *when* to write and
serialises a scope's writers; this module says *what* a write is, so one request is one job
(one transaction) whatever it touches.  ``write_evidence`` takes the idempotency receipt,
inserts the evidence, queues its structuring and completes the receipt with the response
together; ``update_knowledge`` does the same for an update (a conditional version bump, a new
evidence row, a structuring task to rebuild entities, relations and vectors);
``record_lifecycle`` for a lifecycle context.  A replay of a completed request reads the
stored response and writes nothing.  Tests drive the functions against a real engine.

What is kept (tables in ``_schema``): evidence with its raw content, source type, context,
provenance, sensitivity and scope; knowledge items (scope, status ACTIVE | ARCHIVED |
SUPERSEDED, version, title, body) with their entities and relations; evidence ↔ knowledge
links; preferences with every version; conflicts with field-level old/new values; lifecycle
contexts with tier and ``expires_at``; pending forget confirmations; tombstones of what was
forgotten.  Forgetting (``forget_apply``) removes an item, its links, entities, relations and
conflicts, and the evidence no surviving item links to, for good.

The store re-checks what it is handed and raises ``ValueError`` for our own misuse (a source
type the HTTP layer should have refused, sensitive content for a shared scope, a bad scope);
domain refusals the client can cause (unknown or out-of-scope id, stale version, inactive
item, idempotency states) are ``StoreRefusal`` values in the outcomes.  Times are wall-clock
seconds (floats) given by the caller; the contract's integer seconds are made at the edge
(``Evidence.detail``, the responses built here).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import apsw

from ._conflicts import conflicts_list_max, resolutions, severity_by_resolution
from ._protocol import (
    KnowledgeStatus,
    forget_confirmation_seconds,
    lifecycle_events,
    preference_categories,
    source_types,
    tier_lifetimes_seconds,
    tier_of,
    turn_lifecycle_events,
)
from ._receipts import (
    ReceiptDecision,
    decision_proceed,
    decision_replay,
    operation_lifecycle,
    operation_memory_update,
    operation_memory_write,
    receipt_check,
    receipt_complete,
    receipt_insert_completed,
    receipt_namespace_lifecycle,
    receipt_namespace_update,
    receipt_namespace_write,
    receipt_take,
)
from ._scopes import parse_scope

# ------------------------------------------------------------------------------ constants

source_type_ocr = "OCR"
source_type_tool_result = "TOOL_RESULT"
source_type_user_behavior = "USER_BEHAVIOR"
source_type_manual_config = "MANUAL_CONFIG"
source_type_conversation = "CONVERSATION"
assert set(source_types) == {source_type_ocr, source_type_tool_result,
                             source_type_user_behavior, source_type_manual_config,
                             source_type_conversation}

evidence_origin_write = "write"
evidence_origin_update = "update"
evidence_origin_promotion = "promotion"
evidence_origins = (evidence_origin_write, evidence_origin_update, evidence_origin_promotion)

knowledge_status_active = "ACTIVE"
knowledge_status_archived = "ARCHIVED"
knowledge_status_superseded = "SUPERSEDED"
knowledge_statuses = (knowledge_status_active, knowledge_status_archived,
                      knowledge_status_superseded)
assert set(get_args(KnowledgeStatus)) == set(knowledge_statuses), "one status vocabulary"

code_not_found = "NOT_FOUND"
code_knowledge_not_active = "KNOWLEDGE_NOT_ACTIVE"
code_version_conflict = "VERSION_CONFLICT"
code_request_not_found = "REQUEST_NOT_FOUND"
code_conflict_timeout = "CONFLICT_TIMEOUT"

evidence_raw_bytes_max = 1_048_576
"""``raw`` as stored (compact JSON, UTF-8); the HTTP body limit refuses larger bodies first."""
evidence_side_bytes_max = 65_536
"""``context`` and ``provenance`` each, as stored JSON."""
knowledge_title_characters_max = 256
knowledge_body_bytes_max = evidence_raw_bytes_max
entities_per_knowledge_max = 64
relations_per_knowledge_max = 128
entity_characters_max = 128
relation_type_characters_max = 64
ids_per_lookup_max = 1000
"""One ``*_many`` lookup, forget plan or status query takes at most this many ids."""
list_rows_max = 1000
"""The most rows one listing returns (conflicts, preferences, knowledge pages)."""
structuring_attempts_max = 5
"""After this many failed attempts an evidence's structuring task is dropped (the evidence
stays, as written; it is simply never turned into knowledge)."""
structuring_batch_max = 64
preference_versions_max = 10_000
"""Versions kept per preference; ``upsert_preference`` refuses a change beyond it."""
stored_preference_key_characters_max = 128
forget_items_per_call_max = 100
"""Knowledge items one forget command may remove."""
lifecycle_data_bytes_max = 65_536
assert entities_per_knowledge_max <= ids_per_lookup_max
assert forget_items_per_call_max <= ids_per_lookup_max

context_status_active = "ACTIVE"
context_status_promoted = "PROMOTED"
context_status_expired = "EXPIRED"
context_statuses = (context_status_active, context_status_promoted, context_status_expired)

resolution_new_wins = "NEW_WINS"
resolution_merge = "MERGE"
resolution_manual = "MANUAL"
_resolutions = (resolution_new_wins, resolution_merge, resolution_manual)
assert set(_resolutions) == set(resolutions)
_severity_by_resolution = severity_by_resolution
"""One table, ``_conflicts``': the severity is derived from the resolution everywhere."""
conflict_source_local = "local"
conflict_source_sync = "sync"
conflict_status_none = "none"
conflict_status_resolved = "resolved"
conflict_status_manual = "manual"

forgotten_kind_knowledge = "knowledge"
forgotten_kind_evidence = "evidence"

forget_request_pending = "PENDING"
forget_request_confirmed = "CONFIRMED"

_quality_base = {source_type_manual_config: 0.9, source_type_tool_result: 0.8,
                 source_type_ocr: 0.75, source_type_conversation: 0.75,
                 source_type_user_behavior: 0.6}


# --------------------------------------------------------------------------------- records


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def stored_json_bytes(value: Any) -> int:
    """How many bytes ``value`` takes as the store keeps it (compact JSON, UTF-8): what the
    ``*_bytes_max`` limits measure, so a caller can refuse before the store would raise."""
    return len(_json_text(value).encode("utf-8"))


def _bounded_json(value: Any, bytes_max: int, what: str) -> str:
    text = _json_text(value)
    if len(text.encode("utf-8")) > bytes_max:
        raise ValueError(f"{what} is larger than {bytes_max} bytes")
    return text


@dataclass(frozen=True)
class StoreRefusal:
    """A refusal the client caused: the contract's ``code``, a ``message`` and the HTTP
    ``status``.  The actor turns it into its ``KnowledgeRefused`` reply."""

    code: str
    message: str
    status: int

    @classmethod
    def from_receipt(cls, decision: ReceiptDecision) -> StoreRefusal:
        assert decision.code and decision.message and decision.status
        return cls(decision.code, decision.message, decision.status)


@dataclass(frozen=True)
class Relation:
    """An edge ``source`` → ``target`` of ``type`` (the contract's ``from``/``to``/``type``)."""

    source: str
    target: str
    type: str

    def encode(self) -> dict[str, str]:
        return {"from": self.source, "to": self.target, "type": self.type}

    @classmethod
    def decode(cls, value: Mapping[str, Any]) -> Relation:
        return cls(str(value["from"]), str(value["to"]), str(value["type"]))


@dataclass(frozen=True)
class EvidenceDraft:
    """Evidence to write.  ``sensitivity`` comes from the detector, run by the caller before
    the receipt; ``quality_score`` from ``evidence_quality_score`` unless the caller knows
    better."""

    scope: str
    source_type: str
    raw: Mapping[str, Any]
    context: Mapping[str, Any] | None = None
    provenance: Mapping[str, Any] | None = None
    sensitivity: int = 0
    sensitivity_categories: tuple[str, ...] = ()
    quality_score: float = 0.0
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Evidence:
    id: str
    scope: str
    source_type: str
    raw: Any
    context: Any
    provenance: Any
    sensitivity: int
    sensitivity_categories: tuple[str, ...]
    quality_score: float
    idempotency_key: str | None
    origin: str
    knowledge_id: str | None
    created_at: float

    def detail(self) -> dict[str, Any]:
        """The ``GET /evidence/{id}`` body (contract §3.3); ``provenance`` is returned as it
        was written (``null`` when there was none)."""
        return {
            "id": self.id,
            "source_type": self.source_type,
            "raw": self.raw,
            "quality_score": self.quality_score,
            "sensitivity": self.sensitivity,
            "scope": self.scope,
            "created_at": int(self.created_at),
            "provenance": self.provenance,
        }


@dataclass(frozen=True)
class KnowledgeItem:
    id: str
    scope: str
    status: str
    version: int
    title: str
    body: Any
    origin_evidence_id: str | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class KnowledgeUpdateDraft:
    """An update of an ACTIVE item (contract §3.1a): ``title`` and/or ``body`` replace the
    item's; ``raw`` of the new evidence is ``{"title", "body"}`` as requested."""

    knowledge_id: str
    expected_version: int
    scope: str
    title: str | None = None
    body: Any = None
    provenance: Mapping[str, Any] | None = None
    sensitivity: int = 0
    sensitivity_categories: tuple[str, ...] = ()
    quality_score: float = 0.0
    idempotency_key: str | None = None


@dataclass(frozen=True)
class WriteOutcome:
    """What ``write_evidence``, ``update_knowledge`` and ``record_lifecycle`` did.

    Exactly one of: ``refusal`` set (nothing written); ``replayed`` (a completed receipt's
    first response is ``response_json``, nothing written); or a fresh write (``evidence`` /
    ``knowledge`` / ``context`` set, ``response_json`` the response to send, which the
    receipt also holds when there was a key).  ``recovered`` when the write consumed a retry
    authorisation; ``previous`` is the item before an update (for conflict detection)."""

    response_json: str | None = None
    refusal: StoreRefusal | None = None
    replayed: bool = False
    recovered: bool = False
    evidence: Evidence | None = None
    knowledge: KnowledgeItem | None = None
    previous: KnowledgeItem | None = None
    context: LifecycleContext | None = None

    def response(self) -> dict[str, Any] | None:
        return None if self.response_json is None else json.loads(self.response_json)


@dataclass(frozen=True)
class StructuringTask:
    """Evidence waiting to be structured; ``knowledge_id`` is set for an update's evidence
    (rebuild that item's structure) and ``None`` for a write's (create an item)."""

    evidence_id: str
    scope: str
    knowledge_id: str | None
    attempts: int
    available_at: float


@dataclass(frozen=True)
class Preference:
    id: str
    scope: str
    category: str
    key: str
    value: Any
    confidence: float
    version: int
    created_at: float
    updated_at: float

    def encode(self) -> dict[str, Any]:
        """One entry of ``GET /preferences`` (contract §3.6)."""
        return {"id": self.id, "category": self.category, "key": self.key,
                "value": self.value, "confidence": self.confidence, "version": self.version,
                "scope": self.scope, "created_at": int(self.created_at),
                "updated_at": int(self.updated_at)}


@dataclass(frozen=True)
class StoredPreferenceVersion:
    version: int
    category: str
    value: Any
    confidence: float
    evidence_ids: tuple[str, ...]
    updated_at: float

    def encode(self) -> dict[str, Any]:
        """One entry of ``history`` (contract §3.7)."""
        return {"version": self.version, "value": self.value,
                "updated_at": int(self.updated_at)}


@dataclass(frozen=True)
class Conflict:
    id: str
    scope: str
    knowledge_id: str
    field: str
    old_value: Any
    new_value: Any
    resolution: str
    source: str
    pending: bool
    created_at: float
    resolved_at: float | None

    @property
    def severity(self) -> str:
        """Always derived from the resolution (contract §3.9), never read from the row."""
        return _severity_by_resolution[self.resolution]

    def encode(self, knowledge_title: str) -> dict[str, Any]:
        """One entry of ``GET /conflicts``."""
        return {"id": self.id, "target_knowledge": self.knowledge_id, "field": self.field,
                "old_value": self.old_value, "new_value": self.new_value,
                "resolution": self.resolution, "created_at": int(self.created_at),
                "knowledge_title": knowledge_title, "severity": self.severity}


@dataclass(frozen=True)
class ContextDraft:
    """A lifecycle event to record (contract §3.2b); the tier is chosen here, not by the
    caller."""

    scope: str
    event: str
    session_id: str
    data: Mapping[str, Any]
    occurred_at: float
    run_id: str | None = None
    turn_id: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class LifecycleContext:
    id: str
    scope: str
    event: str
    tier: str
    status: str
    session_id: str
    run_id: str | None
    turn_id: str | None
    occurred_at: float
    data: Any
    idempotency_key: str | None
    created_at: float
    expires_at: float
    promoted_knowledge_id: str | None
    promoted_at: float | None


@dataclass(frozen=True)
class ForgetCascade:
    """What forgetting ``knowledge`` would remove: the items, the evidence only they link to,
    and the relation count (contract §3.8 ``cascade``)."""

    knowledge: tuple[KnowledgeItem, ...]
    evidence_ids: tuple[str, ...]
    relation_count: int
    entity_count: int

    def targets(self) -> list[dict[str, Any]]:
        return [{"type": "knowledge", "id": item.id, "title": item.title}
                for item in self.knowledge]

    def cascade(self) -> dict[str, int]:
        return {"evidence_count": len(self.evidence_ids), "relation_count": self.relation_count}


@dataclass(frozen=True)
class ForgetResult:
    knowledge_ids: tuple[str, ...]
    evidence_ids: tuple[str, ...]
    relation_count: int

    @property
    def forgotten_ids(self) -> list[str]:
        """The contract's ``forgotten_ids``: knowledge first, then evidence."""
        return [*self.knowledge_ids, *self.evidence_ids]


@dataclass(frozen=True)
class ForgetRequest:
    id: str
    command: str
    scope: str | None
    targets: tuple[str, ...]
    state: str
    created_at: float
    expires_at: float


# ------------------------------------------------------------------------------- evidence


def evidence_quality_score(source_type: str, raw: Mapping[str, Any]) -> float:
    """A deterministic quality score in [0, 1]: a base per source type, plus up to 0.09 for
    substance (how much text the raw content holds) and 0.01 for a title.  Rounded to two
    decimals so the stored response is stable."""
    base = _quality_base[source_type]
    size = len(_json_text(raw))
    substance = min(0.09, size / 4000)
    titled = 0.01 if isinstance(raw, Mapping) and raw.get("title") else 0.0
    return round(min(1.0, base + substance + titled), 2)


def _check_scope(scope: str) -> None:
    parse_scope(scope)  # raises ScopeInvalid (a ValueError) for our own misuse


def _insert_evidence(connection: apsw.Connection, draft: EvidenceDraft, *, evidence_id: str,
                     origin: str, knowledge_id: str | None, now: float) -> Evidence:
    _check_scope(draft.scope)
    if draft.source_type not in source_types:
        raise ValueError(f"unknown source type {draft.source_type!r}")
    if draft.sensitivity > 0 and parse_scope(draft.scope).is_shared:
        raise ValueError("sensitive content must never be stored in a shared scope")
    raw_json = _bounded_json(dict(draft.raw), evidence_raw_bytes_max, "raw")
    context_json = (None if draft.context is None
                    else _bounded_json(dict(draft.context), evidence_side_bytes_max, "context"))
    provenance_json = (None if draft.provenance is None else
                       _bounded_json(dict(draft.provenance), evidence_side_bytes_max,
                                     "provenance"))
    categories = tuple(sorted(draft.sensitivity_categories))
    connection.execute(
        "INSERT INTO knowledge_evidence (id, scope, source_type, raw_json, context_json, "
        "provenance_json, sensitivity, sensitivity_categories_json, quality_score, "
        "idempotency_key, origin, knowledge_id, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (evidence_id, draft.scope, draft.source_type, raw_json, context_json, provenance_json,
         draft.sensitivity, _json_text(list(categories)), draft.quality_score,
         draft.idempotency_key, origin, knowledge_id, now))
    return Evidence(evidence_id, draft.scope, draft.source_type, json.loads(raw_json),
                    _json_or_none(context_json), _json_or_none(provenance_json),
                    draft.sensitivity, categories, draft.quality_score, draft.idempotency_key,
                    origin, knowledge_id, now)


def insert_evidence(connection: apsw.Connection, draft: EvidenceDraft, *, evidence_id: str,
                    now: float, origin: str = evidence_origin_write,
                    knowledge_id: str | None = None, structure: bool = False) -> Evidence:
    """Insert evidence without a receipt (promotion, legacy writes without a key);
    ``structure`` also queues its structuring task."""
    assert origin in evidence_origins, origin
    evidence = _insert_evidence(connection, draft, evidence_id=evidence_id, origin=origin,
                                knowledge_id=knowledge_id, now=now)
    if structure:
        _queue_structuring(connection, evidence, now)
    return evidence


def write_response(evidence: Evidence, latency_ms: int) -> dict[str, Any]:
    """The ``/memory/write`` 200 body (contract §3.1)."""
    return {"evidence_id": evidence.id, "status": "accepted",
            "quality_score": evidence.quality_score, "sensitivity": evidence.sensitivity,
            "latency_ms": int(latency_ms)}


def _take(connection: apsw.Connection, namespace: str, operation: str, key: str | None,
          request_hash: str | None, scope: str, now: float) -> ReceiptDecision | None:
    if key is None:
        return None
    assert request_hash is not None, "a request with an idempotency key needs its hash"
    return receipt_take(connection, namespace, key, scope=scope, operation=operation,
                        request_hash=request_hash, now=now)


def _unless_proceeding(decision: ReceiptDecision | None) -> WriteOutcome | None:
    """The outcome for a replay or a refusal, ``None`` when the work should run."""
    if decision is None or decision.action == decision_proceed:
        return None
    if decision.action == decision_replay:
        return WriteOutcome(response_json=decision.response_json, replayed=True)
    return WriteOutcome(refusal=StoreRefusal.from_receipt(decision))


def write_evidence(connection: apsw.Connection, draft: EvidenceDraft, *, evidence_id: str,
                   now: float, latency_ms: int, request_hash: str | None = None
                   ) -> WriteOutcome:
    """``/memory/write`` in one job: take the receipt (when the draft has a key), insert the
    evidence, queue its structuring, complete the receipt with the response.  A completed
    identical request replays its first response; other receipt states refuse."""
    key = draft.idempotency_key
    if key is not None:
        assert request_hash is not None, "a request with an idempotency key needs its hash"
        checked = receipt_check(connection, receipt_namespace_write, key, request_hash,
                                scope=draft.scope)
        if checked.action == decision_proceed and checked.receipt is None:
            # The common case, a key never seen: the receipt is written once, COMPLETED.
            evidence = insert_evidence(connection, draft, evidence_id=evidence_id, now=now,
                                       structure=True)
            text = receipt_insert_completed(
                connection, receipt_namespace_write, key, scope=draft.scope,
                operation=operation_memory_write, request_hash=request_hash,
                response=write_response(evidence, latency_ms), now=now)
            return WriteOutcome(response_json=text, evidence=evidence)
        refused_or_replayed = _unless_proceeding(checked)
        if refused_or_replayed is not None:
            return refused_or_replayed
    decision = _take(connection, receipt_namespace_write, operation_memory_write,
                     key, request_hash, draft.scope, now)
    finished = _unless_proceeding(decision)
    if finished is not None:
        return finished
    evidence = insert_evidence(connection, draft, evidence_id=evidence_id, now=now,
                               structure=True)
    response = write_response(evidence, latency_ms)
    if draft.idempotency_key is not None:
        text = receipt_complete(connection, receipt_namespace_write, draft.idempotency_key,
                                response, now, scope=draft.scope)
    else:
        text = _json_text(response)
    return WriteOutcome(response_json=text, evidence=evidence,
                        recovered=bool(decision and decision.recovered))


def _evidence(row: tuple) -> Evidence:
    (id_, scope, source_type, raw_json, context_json, provenance_json, sensitivity,
     categories_json, quality_score, key, origin, knowledge_id, created_at) = row
    return Evidence(id_, scope, source_type, json.loads(raw_json), _json_or_none(context_json),
                    _json_or_none(provenance_json), sensitivity,
                    tuple(json.loads(categories_json)), quality_score, key, origin,
                    knowledge_id, created_at)


_evidence_columns = ("id, scope, source_type, raw_json, context_json, provenance_json, "
                     "sensitivity, sensitivity_categories_json, quality_score, "
                     "idempotency_key, origin, knowledge_id, created_at")


def get_evidence(connection: apsw.Connection, evidence_id: str) -> Evidence | None:
    row = connection.execute(
        f"SELECT {_evidence_columns} FROM knowledge_evidence WHERE id = ?",
        (evidence_id,)).fetchone()
    return None if row is None else _evidence(row)


def _checked_ids(ids: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(ids))
    if len(unique) > ids_per_lookup_max:
        raise ValueError(f"more than {ids_per_lookup_max} ids in one lookup")
    return unique


def _placeholders(count: int) -> str:
    return ",".join("?" * count)


def get_evidence_many(connection: apsw.Connection, evidence_ids: Iterable[str]
                      ) -> dict[str, Evidence]:
    """The evidence rows that exist among ``evidence_ids`` (at most ``ids_per_lookup_max``)."""
    ids = _checked_ids(evidence_ids)
    if not ids:
        return {}
    rows = connection.execute(
        f"SELECT {_evidence_columns} FROM knowledge_evidence "
        f"WHERE id IN ({_placeholders(len(ids))})", ids).fetchall()
    return {row[0]: _evidence(row) for row in rows}


# ------------------------------------------------------------------------------ knowledge


_knowledge_columns = ("id, scope, status, version, title, body_json, origin_evidence_id, "
                      "created_at, updated_at")


def _knowledge(row: tuple) -> KnowledgeItem:
    id_, scope, status, version, title, body_json, origin, created_at, updated_at = row
    return KnowledgeItem(id_, scope, status, version, title, json.loads(body_json), origin,
                         created_at, updated_at)


def get_knowledge(connection: apsw.Connection, knowledge_id: str) -> KnowledgeItem | None:
    row = connection.execute(
        f"SELECT {_knowledge_columns} FROM knowledge_items WHERE id = ?",
        (knowledge_id,)).fetchone()
    return None if row is None else _knowledge(row)


def get_knowledge_many(connection: apsw.Connection, knowledge_ids: Iterable[str]
                       ) -> dict[str, KnowledgeItem]:
    ids = _checked_ids(knowledge_ids)
    if not ids:
        return {}
    rows = connection.execute(
        f"SELECT {_knowledge_columns} FROM knowledge_items "
        f"WHERE id IN ({_placeholders(len(ids))})", ids).fetchall()
    return {row[0]: _knowledge(row) for row in rows}


def _checked_structure(entities: Sequence[str], relations: Sequence[Relation]
                       ) -> tuple[list[str], list[Relation]]:
    names = list(dict.fromkeys(name for name in entities if name))
    if len(names) > entities_per_knowledge_max:
        raise ValueError(f"more than {entities_per_knowledge_max} entities")
    if len(relations) > relations_per_knowledge_max:
        raise ValueError(f"more than {relations_per_knowledge_max} relations")
    for name in names:
        if len(name) > entity_characters_max:
            raise ValueError(f"an entity is longer than {entity_characters_max} characters")
    for relation in relations:
        if max(len(relation.source), len(relation.target)) > entity_characters_max:
            raise ValueError(f"a relation end is longer than {entity_characters_max} characters")
        if len(relation.type) > relation_type_characters_max:
            raise ValueError(
                f"a relation type is longer than {relation_type_characters_max} characters")
    return names, list(relations)


def replace_structure(connection: apsw.Connection, knowledge_id: str,
                      entities: Sequence[str], relations: Sequence[Relation]) -> None:
    """Replace an item's entities and relations (structuring and every update rebuild them)."""
    names, edges = _checked_structure(entities, relations)
    connection.execute("DELETE FROM knowledge_entities WHERE knowledge_id = ?", (knowledge_id,))
    connection.execute("DELETE FROM knowledge_relations WHERE knowledge_id = ?",
                       (knowledge_id,))
    connection.executemany(
        "INSERT INTO knowledge_entities (knowledge_id, name) VALUES (?, ?)",
        [(knowledge_id, name) for name in names])
    connection.executemany(
        "INSERT INTO knowledge_relations (knowledge_id, position, source, target, type) "
        "VALUES (?, ?, ?, ?, ?)",
        [(knowledge_id, position, edge.source, edge.target, edge.type)
         for position, edge in enumerate(edges)])


def _check_title(title: str) -> None:
    if len(title) > knowledge_title_characters_max:
        raise ValueError(f"title is longer than {knowledge_title_characters_max} characters")


def create_knowledge(connection: apsw.Connection, *, knowledge_id: str, evidence_id: str,
                     title: str, body: Any, entities: Sequence[str] = (),
                     relations: Sequence[Relation] = (), now: float
                     ) -> tuple[KnowledgeItem | None, bool]:
    """Structure evidence into a new ACTIVE item (version 1) with its link, entities and
    relations, and finish the evidence's structuring task, in one job.

    Idempotent per evidence: when an item already came from ``evidence_id`` it is returned
    with ``False`` (one knowledge per evidence, so one per idempotency key); when the evidence
    no longer exists (forgotten meanwhile) the result is ``(None, False)`` and nothing is
    written."""
    evidence = get_evidence(connection, evidence_id)
    if evidence is None:
        structuring_done(connection, evidence_id)
        return None, False
    row = connection.execute(
        f"SELECT {_knowledge_columns} FROM knowledge_items WHERE origin_evidence_id = ?",
        (evidence_id,)).fetchone()
    if row is not None:
        structuring_done(connection, evidence_id)
        return _knowledge(row), False
    _check_title(title)
    body_json = _bounded_json(body, knowledge_body_bytes_max, "body")
    connection.execute(
        f"INSERT INTO knowledge_items ({_knowledge_columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (knowledge_id, evidence.scope, knowledge_status_active, 1, title, body_json,
         evidence_id, now, now))
    link_evidence(connection, knowledge_id, evidence_id, now)
    replace_structure(connection, knowledge_id, entities, relations)
    structuring_done(connection, evidence_id)
    return get_knowledge(connection, knowledge_id), True


def link_evidence(connection: apsw.Connection, knowledge_id: str, evidence_id: str,
                  now: float) -> None:
    connection.execute(
        "INSERT OR IGNORE INTO knowledge_links (knowledge_id, evidence_id, linked_at) "
        "VALUES (?, ?, ?)", (knowledge_id, evidence_id, now))


def evidence_ids_for_knowledge(connection: apsw.Connection, knowledge_id: str) -> list[str]:
    """The evidence linked to an item, oldest link first."""
    return [row[0] for row in connection.execute(
        "SELECT evidence_id FROM knowledge_links WHERE knowledge_id = ? "
        "ORDER BY linked_at, evidence_id", (knowledge_id,))]


def evidence_ids_for_knowledge_many(connection: apsw.Connection, knowledge_ids: Iterable[str]
                                    ) -> dict[str, list[str]]:
    """``evidence_ids_for_knowledge`` for many items at once (absent items map to [])."""
    ids = _checked_ids(knowledge_ids)
    links: dict[str, list[str]] = {knowledge_id: [] for knowledge_id in ids}
    if ids:
        for knowledge_id, evidence_id in connection.execute(
                "SELECT knowledge_id, evidence_id FROM knowledge_links "
                f"WHERE knowledge_id IN ({_placeholders(len(ids))}) "
                "ORDER BY linked_at, evidence_id", ids):
            links[knowledge_id].append(evidence_id)
    return links


def knowledge_ids_for_evidence(connection: apsw.Connection, evidence_id: str) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT knowledge_id FROM knowledge_links WHERE evidence_id = ? ORDER BY knowledge_id",
        (evidence_id,))]


def knowledge_entities(connection: apsw.Connection, knowledge_id: str) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT name FROM knowledge_entities WHERE knowledge_id = ? ORDER BY name",
        (knowledge_id,))]


def knowledge_relations(connection: apsw.Connection, knowledge_id: str) -> list[Relation]:
    return [Relation(*row) for row in connection.execute(
        "SELECT source, target, type FROM knowledge_relations WHERE knowledge_id = ? "
        "ORDER BY position", (knowledge_id,))]


def knowledge_sharing_entities(connection: apsw.Connection, scope: str, names: Iterable[str],
                               *, limit: int = list_rows_max) -> list[tuple[str, int]]:
    """ACTIVE items of ``scope`` that mention any of ``names`` as an entity or a relation end,
    with how many of the names each mentions, most first: the relation graph's one hop."""
    wanted = _checked_ids(names)
    limit = min(limit, list_rows_max)
    if not wanted:
        return []
    marks = _placeholders(len(wanted))
    rows = connection.execute(
        "SELECT item.id, COUNT(DISTINCT hit.name) AS hits FROM ("
        f"  SELECT knowledge_id, name FROM knowledge_entities WHERE name IN ({marks})"
        f"  UNION ALL SELECT knowledge_id, source FROM knowledge_relations WHERE source IN ({marks})"
        f"  UNION ALL SELECT knowledge_id, target FROM knowledge_relations WHERE target IN ({marks})"
        ") AS hit JOIN knowledge_items AS item ON item.id = hit.knowledge_id "
        "WHERE item.scope = ? AND item.status = ? GROUP BY item.id "
        "ORDER BY hits DESC, item.updated_at DESC, item.id LIMIT ?",
        [*wanted, *wanted, *wanted, scope, knowledge_status_active, limit]).fetchall()
    return [(row[0], row[1]) for row in rows]


def knowledge_in_scope(connection: apsw.Connection, scope: str, *,
                       status: str | None = knowledge_status_active,
                       created_since: float | None = None, limit: int = list_rows_max
                       ) -> list[KnowledgeItem]:
    """Items of ``scope`` (with ``status``, ``None`` = any), newest change first; with
    ``created_since`` only those created at or after it (the insights' last 24 hours)."""
    limit = min(limit, list_rows_max)
    clauses, parameters = ["scope = ?"], [scope]
    if status is not None:
        clauses.append("status = ?")
        parameters.append(status)
    if created_since is not None:
        clauses.append("created_at >= ?")
        parameters.append(created_since)
    rows = connection.execute(
        f"SELECT {_knowledge_columns} FROM knowledge_items WHERE {' AND '.join(clauses)} "
        "ORDER BY updated_at DESC, id LIMIT ?", [*parameters, limit]).fetchall()
    return [_knowledge(row) for row in rows]


def knowledge_sensitivity(connection: apsw.Connection, knowledge_ids: Iterable[str]
                          ) -> dict[str, int]:
    """The highest sensitivity among each item's linked evidence (0 without evidence): an
    agent context drops every item whose value is above 0."""
    ids = _checked_ids(knowledge_ids)
    result = {knowledge_id: 0 for knowledge_id in ids}
    if ids:
        for knowledge_id, sensitivity in connection.execute(
                "SELECT link.knowledge_id, MAX(evidence.sensitivity) FROM knowledge_links AS link "
                "JOIN knowledge_evidence AS evidence ON evidence.id = link.evidence_id "
                f"WHERE link.knowledge_id IN ({_placeholders(len(ids))}) "
                "GROUP BY link.knowledge_id", ids):
            result[knowledge_id] = sensitivity
    return result


def set_knowledge_status(connection: apsw.Connection, knowledge_id: str, status: str,
                         now: float) -> bool:
    """Change an item's status (archiving, superseding); False when there is no such item."""
    assert status in knowledge_statuses, status
    connection.execute(
        "UPDATE knowledge_items SET status = ?, updated_at = ? WHERE id = ?",
        (status, now, knowledge_id))
    return connection.changes() == 1


def update_response(knowledge: KnowledgeItem, evidence: Evidence,
                    latency_ms: int) -> dict[str, Any]:
    """The ``/memory/update`` 200 body (contract §3.1a)."""
    return {"knowledge_id": knowledge.id, "evidence_id": evidence.id,
            "version": knowledge.version, "status": "updated", "latency_ms": int(latency_ms)}


def _update_refusal(item: KnowledgeItem | None, draft: KnowledgeUpdateDraft
                    ) -> StoreRefusal | None:
    if item is None or item.scope != draft.scope:
        # Another scope's item answers exactly like a missing one: no existence leak.
        return StoreRefusal(code_not_found, f"knowledge {draft.knowledge_id!r} not found", 404)
    if item.status != knowledge_status_active:
        return StoreRefusal(code_knowledge_not_active,
                            f"knowledge {item.id!r} is {item.status}, not ACTIVE", 409)
    if item.version != draft.expected_version:
        return StoreRefusal(code_version_conflict,
                            f"knowledge {item.id!r} is at version {item.version}, "
                            f"not {draft.expected_version}", 409)
    return None


def update_knowledge(connection: apsw.Connection, draft: KnowledgeUpdateDraft, *,
                     evidence_id: str, now: float, latency_ms: int,
                     request_hash: str | None = None,
                     source_type: str = source_type_manual_config) -> WriteOutcome:
    """``/memory/update`` in one job.  The receipt (``update:`` namespace) is checked first,
    so a completed update replays even after the version moved on; then the item must exist
    in exactly this scope (404 otherwise), be ACTIVE (409 ``KNOWLEDGE_NOT_ACTIVE``) and be at
    ``expected_version`` (409 ``VERSION_CONFLICT``, checked again by the conditional UPDATE).
    A refusal writes nothing, not even the receipt.  Otherwise: a new evidence row (``raw`` =
    the requested title/body), the version bump with the merged title/body, the link, a
    structuring task to rebuild entities, relations and vectors, and the receipt completed.
    ``source_type`` is the new evidence's (``TOOL_RESULT`` for an agent's update)."""
    assert draft.title is not None or draft.body is not None, "an update changes something"
    key = draft.idempotency_key
    if key is not None:
        assert request_hash is not None
        decision = receipt_check(connection, receipt_namespace_update, key, request_hash,
                                 scope=draft.scope)
        finished = _unless_proceeding(decision)
        if finished is not None:
            return finished
    previous = get_knowledge(connection, draft.knowledge_id)
    refusal = _update_refusal(previous, draft)
    if refusal is not None:
        return WriteOutcome(refusal=refusal)
    assert previous is not None
    taken = _take(connection, receipt_namespace_update, operation_memory_update, key,
                  request_hash, draft.scope, now)
    assert taken is None or taken.action == decision_proceed
    raw: dict[str, Any] = {}
    if draft.title is not None:
        _check_title(draft.title)
        raw["title"] = draft.title
    if draft.body is not None:
        raw["body"] = draft.body
    evidence = _insert_evidence(connection, EvidenceDraft(
        scope=draft.scope, source_type=source_type, raw=raw, provenance=draft.provenance,
        sensitivity=draft.sensitivity, sensitivity_categories=draft.sensitivity_categories,
        quality_score=draft.quality_score, idempotency_key=key),
        evidence_id=evidence_id, origin=evidence_origin_update,
        knowledge_id=draft.knowledge_id, now=now)
    title = previous.title if draft.title is None else draft.title
    body = previous.body if draft.body is None else draft.body
    connection.execute(
        "UPDATE knowledge_items SET version = version + 1, title = ?, body_json = ?, "
        "updated_at = ? WHERE id = ? AND scope = ? AND status = ? AND version = ?",
        (title, _bounded_json(body, knowledge_body_bytes_max, "body"), now, draft.knowledge_id,
         draft.scope, knowledge_status_active, draft.expected_version))
    assert connection.changes() == 1, "the conditional update lost to a writer outside the job"
    link_evidence(connection, draft.knowledge_id, evidence_id, now)
    _queue_structuring(connection, evidence, now)
    knowledge = get_knowledge(connection, draft.knowledge_id)
    assert knowledge is not None
    response = update_response(knowledge, evidence, latency_ms)
    if key is not None:
        text = receipt_complete(connection, receipt_namespace_update, key, response, now,
                                scope=draft.scope)
    else:
        text = _json_text(response)
    return WriteOutcome(response_json=text, evidence=evidence, knowledge=knowledge,
                        previous=previous, recovered=bool(taken and taken.recovered))


# ------------------------------------------------------------------------------ structuring


def _queue_structuring(connection: apsw.Connection, evidence: Evidence, now: float) -> None:
    connection.execute(
        "INSERT OR IGNORE INTO knowledge_structuring (evidence_id, scope, knowledge_id, "
        "available_at, created_at) VALUES (?, ?, ?, ?, ?)",
        (evidence.id, evidence.scope, evidence.knowledge_id, now, now))


def structuring_due(connection: apsw.Connection, now: float, *,
                    limit: int = structuring_batch_max, scope: str | None = None
                    ) -> list[StructuringTask]:
    """Structuring tasks available at ``now`` (of ``scope``, or of every scope), oldest first,
    at most ``structuring_batch_max``.  The tasks are durable: after a crash they are still
    here.  A scope's tasks are read through ``knowledge_structuring_by_scope``."""
    where, parameters = "available_at <= ?", [now]
    if scope is not None:
        where, parameters = "scope = ? AND available_at <= ?", [scope, now]
    rows = connection.execute(
        "SELECT evidence_id, scope, knowledge_id, attempts, available_at "
        f"FROM knowledge_structuring WHERE {where} "
        "ORDER BY available_at, created_at, evidence_id LIMIT ?",
        [*parameters, min(limit, structuring_batch_max)]).fetchall()
    return [StructuringTask(*row) for row in rows]


def structuring_next_at(connection: apsw.Connection, scope: str | None = None
                        ) -> float | None:
    """When the earliest task (of ``scope``, or of every scope) becomes available (for a
    reminder), or ``None``."""
    if scope is None:
        row = connection.execute("SELECT MIN(available_at) FROM knowledge_structuring").fetchone()
    else:
        row = connection.execute(
            "SELECT MIN(available_at) FROM knowledge_structuring WHERE scope = ?",
            (scope,)).fetchone()
    return row[0]


def structuring_done(connection: apsw.Connection, evidence_id: str) -> None:
    connection.execute("DELETE FROM knowledge_structuring WHERE evidence_id = ?",
                       (evidence_id,))


def structuring_failed(connection: apsw.Connection, evidence_id: str, *, error: str,
                       retry_at: float, counted: bool = True) -> bool:
    """Count a failed attempt; the task is retried at ``retry_at``, or dropped once it failed
    ``structuring_attempts_max`` times (then ``False``).  ``counted=False``: the failure was
    the storage's, not the evidence's (an I/O error, a full disk), so it is retried without
    counting, or an acknowledged write would never become knowledge after a bad minute."""
    connection.execute(
        "UPDATE knowledge_structuring SET attempts = attempts + ?, available_at = ?, "
        "last_error = ? WHERE evidence_id = ?", (1 if counted else 0, retry_at, error[:1024], evidence_id))
    row = connection.execute("SELECT attempts FROM knowledge_structuring WHERE evidence_id = ?",
                             (evidence_id,)).fetchone()
    if row is None:
        return False
    if row[0] >= structuring_attempts_max:
        structuring_done(connection, evidence_id)
        return False
    return True


# ------------------------------------------------------------------------------- lifecycle


def lifecycle_response(context: LifecycleContext) -> dict[str, Any]:
    """The ``/agent/lifecycle`` 200 body."""
    return {"event": context.event, "context_id": context.id, "tier": context.tier,
            "status": context.status, "expires_at": int(context.expires_at)}


_context_columns = ("id, scope, event, tier, status, session_id, run_id, turn_id, occurred_at, "
                    "data_json, idempotency_key, created_at, expires_at, promoted_knowledge_id, "
                    "promoted_at")


def _context(row: tuple) -> LifecycleContext:
    values = list(row)
    values[9] = json.loads(values[9])
    return LifecycleContext(*values)


def record_lifecycle(connection: apsw.Connection, draft: ContextDraft, *, context_id: str,
                     now: float, request_hash: str | None = None) -> WriteOutcome:
    """``/agent/lifecycle`` in one job, with a receipt in the ``lifecycle`` namespace when the
    draft has a key.  The tier is ``tier_of(event)``; the context expires
    ``tier_lifetimes_seconds[tier]`` after ``int(now)`` (the server's clock, never the
    client's ``occurred_at``), as ``_lifecycle.context_expires_at`` computes it."""
    _check_scope(draft.scope)
    if draft.event not in lifecycle_events:
        raise ValueError(f"unknown lifecycle event {draft.event!r}")
    tier = tier_of(draft.event)
    if draft.event in turn_lifecycle_events and not draft.turn_id:
        raise ValueError(f"{draft.event} needs a turn_id")
    if not draft.data:
        raise ValueError("lifecycle data must be a non-empty object")
    decision = _take(connection, receipt_namespace_lifecycle, operation_lifecycle,
                     draft.idempotency_key, request_hash, draft.scope, now)
    finished = _unless_proceeding(decision)
    if finished is not None:
        return finished
    expires_at = float(int(now) + tier_lifetimes_seconds[tier])
    data_json = _bounded_json(dict(draft.data), lifecycle_data_bytes_max, "data")
    connection.execute(
        f"INSERT INTO knowledge_contexts ({_context_columns}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
        (context_id, draft.scope, draft.event, tier, context_status_active, draft.session_id,
         draft.run_id, draft.turn_id, draft.occurred_at, data_json, draft.idempotency_key,
         now, expires_at))
    context = get_context(connection, context_id)
    assert context is not None
    response = lifecycle_response(context)
    if draft.idempotency_key is not None:
        text = receipt_complete(connection, receipt_namespace_lifecycle, draft.idempotency_key,
                                response, now, scope=draft.scope)
    else:
        text = _json_text(response)
    return WriteOutcome(response_json=text, context=context,
                        recovered=bool(decision and decision.recovered))


def get_context(connection: apsw.Connection, context_id: str) -> LifecycleContext | None:
    row = connection.execute(f"SELECT {_context_columns} FROM knowledge_contexts WHERE id = ?",
                             (context_id,)).fetchone()
    return None if row is None else _context(row)


def get_contexts(connection: apsw.Connection, context_ids: Iterable[str]
                 ) -> dict[str, LifecycleContext]:
    ids = _checked_ids(context_ids)
    if not ids:
        return {}
    rows = connection.execute(
        f"SELECT {_context_columns} FROM knowledge_contexts "
        f"WHERE id IN ({_placeholders(len(ids))})", ids).fetchall()
    return {row[0]: _context(row) for row in rows}


def mark_context_promoted(connection: apsw.Connection, context_id: str, knowledge_id: str,
                          now: float) -> bool:
    """An ACTIVE context became long-term knowledge; False when it was not ACTIVE."""
    connection.execute(
        "UPDATE knowledge_contexts SET status = ?, promoted_knowledge_id = ?, promoted_at = ? "
        "WHERE id = ? AND status = ?",
        (context_status_promoted, knowledge_id, now, context_id, context_status_active))
    return connection.changes() == 1


def expire_contexts(connection: apsw.Connection, now: float, *,
                    limit: int = list_rows_max) -> int:
    """Mark ACTIVE contexts whose ``expires_at`` passed EXPIRED (at most ``limit`` per call)."""
    connection.execute(
        "UPDATE knowledge_contexts SET status = ? WHERE id IN (SELECT id FROM knowledge_contexts "
        "WHERE status = ? AND expires_at <= ? ORDER BY expires_at LIMIT ?)",
        (context_status_expired, context_status_active, now, min(limit, list_rows_max)))
    return connection.changes()


# ------------------------------------------------------------------------------ preferences


_preference_columns = ("id, scope, category, key, value_json, confidence, version, "
                       "created_at, updated_at")


def _preference(row: tuple) -> Preference:
    values = list(row)
    values[4] = json.loads(values[4])
    return Preference(*values)


def get_preference(connection: apsw.Connection, preference_id: str) -> Preference | None:
    row = connection.execute(
        f"SELECT {_preference_columns} FROM knowledge_preferences WHERE id = ?",
        (preference_id,)).fetchone()
    return None if row is None else _preference(row)


def upsert_preference(connection: apsw.Connection, *, preference_id: str, scope: str,
                      category: str, key: str, value: Any, confidence: float,
                      evidence_ids: Sequence[str], now: float) -> tuple[Preference, bool]:
    """Record an extracted preference.  A new ``(scope, key)`` gets ``preference_id`` and
    version 1; an existing one gets a new version when its value or category changed (every
    version is kept) and only a refreshed confidence otherwise.  Returns the preference and
    whether a version was added."""
    _check_scope(scope)
    if category not in preference_categories:
        raise ValueError(f"unknown preference category {category!r}")
    if not key or len(key) > stored_preference_key_characters_max:
        raise ValueError(f"a preference key has 1 to {stored_preference_key_characters_max} characters")
    value_json = _bounded_json(value, evidence_side_bytes_max, "preference value")
    row = connection.execute(
        f"SELECT {_preference_columns} FROM knowledge_preferences WHERE scope = ? AND key = ?",
        (scope, key)).fetchone()
    if row is None:
        connection.execute(
            f"INSERT INTO knowledge_preferences ({_preference_columns}) "
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)",
            (preference_id, scope, category, key, value_json, confidence, now, now))
        version, current_id = 1, preference_id
    else:
        current = _preference(row)
        current_id = current.id
        if _json_text(current.value) == value_json and current.category == category:
            connection.execute(
                "UPDATE knowledge_preferences SET confidence = ? WHERE id = ?",
                (confidence, current_id))
            return _required(get_preference(connection, current_id)), False
        if current.version >= preference_versions_max:
            raise ValueError(f"preference {current_id!r} has {preference_versions_max} versions")
        version = current.version + 1
        connection.execute(
            "UPDATE knowledge_preferences SET category = ?, value_json = ?, confidence = ?, "
            "version = ?, updated_at = ? WHERE id = ?",
            (category, value_json, confidence, version, now, current_id))
    connection.execute(
        "INSERT INTO knowledge_preference_versions (preference_id, version, category, "
        "value_json, confidence, evidence_ids_json, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (current_id, version, category, value_json, confidence,
         _json_text(list(evidence_ids)), now))
    return _required(get_preference(connection, current_id)), True


def _required(value: Any) -> Any:
    assert value is not None
    return value


def list_preferences(connection: apsw.Connection, scope: str | None = None, *,
                     limit: int = list_rows_max) -> list[Preference]:
    """Preferences (of ``scope``, or all), most recently changed first."""
    limit = min(limit, list_rows_max)
    where, parameters = ("WHERE scope = ?", [scope]) if scope is not None else ("", [])
    rows = connection.execute(
        f"SELECT {_preference_columns} FROM knowledge_preferences {where} "
        "ORDER BY updated_at DESC, id LIMIT ?", [*parameters, limit]).fetchall()
    return [_preference(row) for row in rows]


def preference_history(connection: apsw.Connection, preference_id: str
                       ) -> list[StoredPreferenceVersion]:
    """Every version of a preference, oldest first ([] for an unknown id)."""
    rows = connection.execute(
        "SELECT version, category, value_json, confidence, evidence_ids_json, updated_at "
        "FROM knowledge_preference_versions WHERE preference_id = ? ORDER BY version",
        (preference_id,)).fetchall()
    return [StoredPreferenceVersion(version, category, json.loads(value_json), confidence,
                              tuple(json.loads(evidence_json)), updated_at)
            for version, category, value_json, confidence, evidence_json, updated_at in rows]


# -------------------------------------------------------------------------------- conflicts


_conflict_columns = ("id, scope, knowledge_id, field, old_value_json, new_value_json, "
                     "resolution, source, pending, created_at, resolved_at")


def _conflict(row: tuple) -> Conflict:
    (id_, scope, knowledge_id, field_, old_json, new_json, resolution, source, pending,
     created_at, resolved_at) = row
    return Conflict(id_, scope, knowledge_id, field_, json.loads(old_json), json.loads(new_json),
                    resolution, source, bool(pending), created_at, resolved_at)


def insert_conflict(connection: apsw.Connection, *, conflict_id: str, knowledge_id: str,
                    field: str, old_value: Any, new_value: Any, resolution: str, now: float,
                    source: str = conflict_source_local) -> Conflict:
    """Record a field-level conflict of an item.  A MANUAL conflict is pending until
    ``resolve_conflict``; NEW_WINS and MERGE are resolved as they are recorded."""
    assert resolution in _resolutions, resolution
    assert source in (conflict_source_local, conflict_source_sync), source
    item = get_knowledge(connection, knowledge_id)
    if item is None:
        raise ValueError(f"no knowledge {knowledge_id!r} to record a conflict on")
    pending = resolution == resolution_manual
    connection.execute(
        "INSERT INTO knowledge_conflicts (id, scope, knowledge_id, field, old_value_json, "
        "new_value_json, resolution, severity, source, pending, created_at, resolved_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (conflict_id, item.scope, knowledge_id, field,
         _bounded_json(old_value, evidence_side_bytes_max, "old_value"),
         _bounded_json(new_value, evidence_side_bytes_max, "new_value"), resolution,
         _severity_by_resolution[resolution], source, int(pending), now,
         None if pending else now))
    return _required(get_conflict(connection, conflict_id))


def get_conflict(connection: apsw.Connection, conflict_id: str) -> Conflict | None:
    row = connection.execute(
        f"SELECT {_conflict_columns} FROM knowledge_conflicts WHERE id = ?",
        (conflict_id,)).fetchone()
    return None if row is None else _conflict(row)


def resolve_conflict(connection: apsw.Connection, conflict_id: str, resolution: str,
                     now: float) -> Conflict | None:
    """Settle a conflict with ``resolution`` (the stored severity column follows; reads derive
    it anyway).  ``None`` for an unknown id."""
    assert resolution in _resolutions, resolution
    pending = resolution == resolution_manual
    connection.execute(
        "UPDATE knowledge_conflicts SET resolution = ?, severity = ?, pending = ?, "
        "resolved_at = ? WHERE id = ?",
        (resolution, _severity_by_resolution[resolution], int(pending),
         None if pending else now, conflict_id))
    return get_conflict(connection, conflict_id)


def list_conflicts(connection: apsw.Connection, scope: str | None = None, *,
                   limit: int = conflicts_list_max) -> list[tuple[Conflict, str]]:
    """Conflicts (of ``scope``, or all), newest first, each with its item's current title;
    at most ``conflicts_list_max`` (what ``/conflicts`` answers: the contract gives the route
    no ``limit`` parameter, so the store's cap and the route's answer are one constant)."""
    limit = max(0, min(limit, conflicts_list_max))
    where, parameters = ("WHERE c.scope = ?", [scope]) if scope is not None else ("", [])
    columns = ", ".join(f"c.{name.strip()}" for name in _conflict_columns.split(","))
    rows = connection.execute(
        f"SELECT {columns}, COALESCE(k.title, '') FROM knowledge_conflicts AS c "
        f"LEFT JOIN knowledge_items AS k ON k.id = c.knowledge_id {where} "
        "ORDER BY c.created_at DESC, c.id LIMIT ?", [*parameters, limit]).fetchall()
    return [(_conflict(row[:-1]), row[-1]) for row in rows]


def manual_conflicts_pending(connection: apsw.Connection, scope: str | None = None) -> int:
    """How many MANUAL conflicts wait for a person (insights are suppressed while any does)."""
    if scope is None:
        row = connection.execute(
            "SELECT COUNT(*) FROM knowledge_conflicts WHERE pending = 1").fetchone()
    else:
        row = connection.execute(
            "SELECT COUNT(*) FROM knowledge_conflicts WHERE pending = 1 AND scope = ?",
            (scope,)).fetchone()
    return row[0]


def conflict_status_for_knowledge(connection: apsw.Connection, knowledge_ids: Iterable[str]
                                  ) -> dict[str, str]:
    """Per item: ``manual`` when a MANUAL conflict is pending, ``resolved`` when it had
    conflicts and none is pending, ``none`` otherwise (``/agent/context``'s
    ``conflict_status``)."""
    ids = _checked_ids(knowledge_ids)
    result = {knowledge_id: conflict_status_none for knowledge_id in ids}
    if ids:
        for knowledge_id, pending in connection.execute(
                "SELECT knowledge_id, MAX(pending) FROM knowledge_conflicts "
                f"WHERE knowledge_id IN ({_placeholders(len(ids))}) GROUP BY knowledge_id", ids):
            result[knowledge_id] = (conflict_status_manual if pending
                                    else conflict_status_resolved)
    return result


# ---------------------------------------------------------------------------------- forget


def forget_plan(connection: apsw.Connection, knowledge_ids: Sequence[str]) -> ForgetCascade:
    """What ``forget_apply`` would remove for these items (unknown ids are skipped): the
    items, the evidence linked to them and to no other item, and their relation and entity
    counts.  At most ``forget_items_per_call_max`` items."""
    if len(set(knowledge_ids)) > forget_items_per_call_max:
        raise ValueError(f"more than {forget_items_per_call_max} items in one forget")
    items = get_knowledge_many(connection, knowledge_ids)
    ordered = tuple(items[knowledge_id] for knowledge_id in dict.fromkeys(knowledge_ids)
                    if knowledge_id in items)
    ids = [item.id for item in ordered]
    if not ids:
        return ForgetCascade((), (), 0, 0)
    marks = _placeholders(len(ids))
    evidence_ids = tuple(row[0] for row in connection.execute(
        "SELECT DISTINCT evidence_id FROM knowledge_links "
        f"WHERE knowledge_id IN ({marks}) AND evidence_id NOT IN ("
        "  SELECT evidence_id FROM knowledge_links "
        f"  WHERE knowledge_id NOT IN ({marks})) ORDER BY evidence_id", [*ids, *ids]))
    # Evidence written by an update of one of the items belongs to it even before structuring
    # linked it; evidence whose structuring never ran is caught through its origin item too.
    extra = tuple(row[0] for row in connection.execute(
        f"SELECT id FROM knowledge_evidence WHERE knowledge_id IN ({marks}) ORDER BY id", ids))
    evidence_ids = tuple(sorted(set(evidence_ids) | set(extra)))
    relation_count = connection.execute(
        f"SELECT COUNT(*) FROM knowledge_relations WHERE knowledge_id IN ({marks})",
        ids).fetchone()[0]
    entity_count = connection.execute(
        f"SELECT COUNT(*) FROM knowledge_entities WHERE knowledge_id IN ({marks})",
        ids).fetchone()[0]
    return ForgetCascade(ordered, evidence_ids, relation_count, entity_count)


def forget_apply(connection: apsw.Connection, knowledge_ids: Sequence[str],
                 now: float) -> ForgetResult:
    """Remove the items, their links, entities, relations and conflicts, the evidence only
    they link to and its pending structuring, for good; leave a tombstone per id in
    ``knowledge_forgotten``.  Receipts stay (a replayed write answers its first response and
    writes nothing, so a forgotten write never comes back)."""
    plan = forget_plan(connection, knowledge_ids)
    ids = [item.id for item in plan.knowledge]
    scopes = {item.id: item.scope for item in plan.knowledge}
    evidence = get_evidence_many(connection, plan.evidence_ids)
    for table in ("knowledge_links", "knowledge_entities", "knowledge_relations",
                  "knowledge_conflicts", "knowledge_items"):
        column = "id" if table == "knowledge_items" else "knowledge_id"
        connection.executemany(f"DELETE FROM {table} WHERE {column} = ?",
                               [(knowledge_id,) for knowledge_id in ids])
    for evidence_id in plan.evidence_ids:
        connection.execute("DELETE FROM knowledge_links WHERE evidence_id = ?", (evidence_id,))
        connection.execute("DELETE FROM knowledge_evidence WHERE id = ?", (evidence_id,))
        structuring_done(connection, evidence_id)
    tombstones = [(knowledge_id, forgotten_kind_knowledge, scopes[knowledge_id], now)
                  for knowledge_id in ids]
    tombstones += [(evidence_id, forgotten_kind_evidence, evidence[evidence_id].scope, now)
                   for evidence_id in plan.evidence_ids if evidence_id in evidence]
    connection.executemany(
        "INSERT OR REPLACE INTO knowledge_forgotten (id, kind, scope, forgotten_at) "
        "VALUES (?, ?, ?, ?)", tombstones)
    return ForgetResult(tuple(ids), plan.evidence_ids, plan.relation_count)


def forgotten_among(connection: apsw.Connection, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` (knowledge or evidence) were forgotten."""
    unique = _checked_ids(ids)
    if not unique:
        return set()
    return {row[0] for row in connection.execute(
        f"SELECT id FROM knowledge_forgotten WHERE id IN ({_placeholders(len(unique))})",
        unique)}


def forget_request_put(connection: apsw.Connection, *, request_id: str, command: str,
                       scope: str | None, targets: Sequence[str], now: float,
                       seconds: float = forget_confirmation_seconds) -> ForgetRequest:
    """Keep a ``confirm=false`` plan so that a confirmation can be checked for expiry."""
    if len(targets) > forget_items_per_call_max:
        raise ValueError(f"more than {forget_items_per_call_max} forget targets")
    connection.execute(
        "INSERT INTO knowledge_forget_requests (id, command, scope, targets_json, state, "
        "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (request_id, command, scope, _json_text(list(targets)), forget_request_pending, now,
         now + seconds))
    return _required(forget_request_get(connection, request_id))


def forget_request_get(connection: apsw.Connection, request_id: str) -> ForgetRequest | None:
    row = connection.execute(
        "SELECT id, command, scope, targets_json, state, created_at, expires_at "
        "FROM knowledge_forget_requests WHERE id = ?", (request_id,)).fetchone()
    if row is None:
        return None
    id_, command, scope, targets_json, state, created_at, expires_at = row
    return ForgetRequest(id_, command, scope, tuple(json.loads(targets_json)), state,
                         created_at, expires_at)


def forget_request_confirm(connection: apsw.Connection, request_id: str, now: float
                           ) -> tuple[ForgetRequest | None, StoreRefusal | None]:
    """Consume a pending plan: 404 ``REQUEST_NOT_FOUND`` when unknown or already used, 408
    ``CONFLICT_TIMEOUT`` when it expired (``now`` > ``expires_at``)."""
    request = forget_request_get(connection, request_id)
    if request is None or request.state != forget_request_pending:
        return None, StoreRefusal(code_request_not_found,
                                  f"no pending forget request {request_id!r}", 404)
    if now > request.expires_at:
        return request, StoreRefusal(code_conflict_timeout,
                                     "the forget confirmation expired; ask again", 408)
    connection.execute("UPDATE knowledge_forget_requests SET state = ? WHERE id = ?",
                       (forget_request_confirmed, request_id))
    return forget_request_get(connection, request_id), None



__all__ = [
    "Conflict",
    "ContextDraft",
    "Evidence",
    "EvidenceDraft",
    "ForgetCascade",
    "ForgetRequest",
    "ForgetResult",
    "KnowledgeItem",
    "KnowledgeUpdateDraft",
    "LifecycleContext",
    "Preference",
    "Relation",
    "StoreRefusal",
    "StoredPreferenceVersion",
    "StructuringTask",
    "WriteOutcome",
    "code_conflict_timeout",
    "code_knowledge_not_active",
    "code_not_found",
    "code_request_not_found",
    "code_version_conflict",
    "conflict_source_local",
    "conflict_source_sync",
    "conflict_status_for_knowledge",
    "conflict_status_manual",
    "conflict_status_none",
    "conflict_status_resolved",
    "context_status_active",
    "context_status_expired",
    "context_status_promoted",
    "context_statuses",
    "create_knowledge",
    "entities_per_knowledge_max",
    "entity_characters_max",
    "evidence_ids_for_knowledge",
    "evidence_ids_for_knowledge_many",
    "evidence_origin_promotion",
    "evidence_origin_update",
    "evidence_origin_write",
    "evidence_origins",
    "evidence_quality_score",
    "evidence_raw_bytes_max",
    "evidence_side_bytes_max",
    "expire_contexts",
    "forget_apply",
    "forget_items_per_call_max",
    "forget_plan",
    "forget_request_confirm",
    "forget_request_confirmed",
    "forget_request_get",
    "forget_request_pending",
    "forget_request_put",
    "forgotten_among",
    "forgotten_kind_evidence",
    "forgotten_kind_knowledge",
    "get_conflict",
    "get_context",
    "get_contexts",
    "get_evidence",
    "get_evidence_many",
    "get_knowledge",
    "get_knowledge_many",
    "get_preference",
    "ids_per_lookup_max",
    "insert_conflict",
    "insert_evidence",
    "knowledge_body_bytes_max",
    "knowledge_entities",
    "knowledge_ids_for_evidence",
    "knowledge_in_scope",
    "knowledge_relations",
    "knowledge_sensitivity",
    "knowledge_sharing_entities",
    "knowledge_status_active",
    "knowledge_status_archived",
    "knowledge_status_superseded",
    "knowledge_statuses",
    "knowledge_title_characters_max",
    "lifecycle_data_bytes_max",
    "lifecycle_response",
    "link_evidence",
    "list_conflicts",
    "list_preferences",
    "list_rows_max",
    "manual_conflicts_pending",
    "mark_context_promoted",
    "preference_history",
    "preference_versions_max",
    "record_lifecycle",
    "relation_type_characters_max",
    "relations_per_knowledge_max",
    "replace_structure",
    "resolution_manual",
    "resolution_merge",
    "resolution_new_wins",
    "resolve_conflict",
    "set_knowledge_status",
    "source_type_conversation",
    "source_type_manual_config",
    "source_type_ocr",
    "source_type_tool_result",
    "source_type_user_behavior",
    "stored_json_bytes",
    "stored_preference_key_characters_max",
    "structuring_attempts_max",
    "structuring_batch_max",
    "structuring_done",
    "structuring_due",
    "structuring_failed",
    "structuring_next_at",
    "update_knowledge",
    "update_response",
    "upsert_preference",
    "write_evidence",
    "write_response",
]
