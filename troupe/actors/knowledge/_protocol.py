"""The messages the knowledge HTTP layer sends to the knowledge actors, their replies, and the
WebSocket events (the PIXIU memory API contract, ``seeds/004``).

Why one module: the HTTP slice, the actors and the recall/store slices are written in parallel;
this file is the one vocabulary they share, so each request and reply is a frozen dataclass
with ``encode()`` giving exactly the contract's JSON body.

Who answers what:

- ``("knowledge_scope", scope)`` (``scope_kind_name``): everything that writes inside one
  scope and needs one writer for its receipts and versions: ``WriteMemory``,
  ``UpdateKnowledge``, ``RecordLifecycle``, ``RecoverIdempotency``, ``PromoteContexts``,
  ``ArchiveKnowledge``.
- ``("knowledge_service", "main")`` (``service_kind_name``): reads and cross-scope work:
  ``QueryMemory``, ``BuildAgentContext``, ``GetEvidence``, ``ExtractPreferences``,
  ``ListPreferences``, ``GetPreferenceHistory``, ``ForgetMemory``, ``ListConflicts``,
  ``ListInsights``, ``BuildDigest``.
- ``("knowledge_events", "main")`` (``events_kind_name``): the WebSocket fan-out
  (``_events_hub``).

Domain failures are reply values, never exceptions: ``KnowledgeRefused(code, message,
status)`` with a code from ``error_statuses`` (the contract's §5 table).  The HTTP layer turns
it into ``{"error", "message", "request_id"}`` with that status.  An exception escaping an
actor is our bug and becomes 500 ``INTERNAL_ERROR`` without details.

Idempotent requests (``WriteMemory``, ``UpdateKnowledge``, ``RecordLifecycle``) have
``canonical()``: the request as a plain JSON value with every optional field present, the same
for the request and for the ``original_request`` of a recovery rebuilt through the same
pydantic model; the receipts slice hashes it.  Times are integer Unix seconds (the contract's
shape), taken from ``env.clock.wall()``.  All requests are keyword-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ._conflicts import severity_for
from ._receipts import (
    receipt_namespace_lifecycle,
    receipt_namespace_update,
    receipt_namespace_write,
)

scope_kind_name = "knowledge_scope"
service_kind_name = "knowledge_service"
service_key = "main"
events_kind_name = "knowledge_events"
events_key = "main"

# ---------------------------------------------------------------------------------------------
# The contract's identity and limits
# ---------------------------------------------------------------------------------------------

component_name = "pixiu-memory-backend"
"""``/version``'s ``component``: Module E fails closed on any other value."""
api_version = "0.4.0"
agent_memory_api_version = 1
product_version_development = "development"
"""``product_version`` when run from source and nothing was injected at packaging."""

agent_context_top_k_min = 1
agent_context_top_k_max = 20
agent_context_top_k_default = 5
agent_context_characters_min = 64
agent_context_characters_max = 16_000
agent_context_characters_default = 4_000
freshness_seconds_default = 30 * 24 * 3600
query_top_k_min = 1
query_top_k_max = 20
query_top_k_default = 5
insights_limit_min = 1
insights_limit_max = 10
insights_limit_default = 3
insights_window_seconds = 24 * 3600
forget_confirmation_seconds = 300
"""How long a ``confirm=false`` plan may be confirmed; later → 408 ``CONFLICT_TIMEOUT``.  The
one definition (the store and ``_forget`` import it).  The contract names no value (§3.8 and
§4.3 only show ``expires_at``); 300 s is the lifetime of its other human confirmation, the
pairing token's default ``ttl_seconds`` (§3.11)."""
preference_evidence_ids_max = 100
promote_context_ids_max = 100
short_term_context_seconds = 24 * 3600
mid_term_context_seconds = 7 * 24 * 3600

assert 1 <= agent_context_top_k_min <= agent_context_top_k_default <= agent_context_top_k_max
assert agent_context_characters_min <= agent_context_characters_default <= agent_context_characters_max
assert insights_limit_min <= insights_limit_default <= insights_limit_max
assert short_term_context_seconds < mid_term_context_seconds

# ---------------------------------------------------------------------------------------------
# Enumerations
# ---------------------------------------------------------------------------------------------

SourceType = Literal["OCR", "TOOL_RESULT", "USER_BEHAVIOR", "MANUAL_CONFIG", "CONVERSATION"]
source_types: tuple[str, ...] = ("OCR", "TOOL_RESULT", "USER_BEHAVIOR", "MANUAL_CONFIG", "CONVERSATION")

LifecycleEvent = Literal["TURN_START", "TURN_END", "PRE_COMPRESS", "SESSION_SWITCH", "SESSION_END", "DELEGATION"]
Tier = Literal["SHORT_TERM", "MID_TERM"]
lifecycle_tiers: dict[str, str] = {
    "TURN_START": "SHORT_TERM",
    "TURN_END": "SHORT_TERM",
    "PRE_COMPRESS": "MID_TERM",
    "SESSION_SWITCH": "MID_TERM",
    "SESSION_END": "MID_TERM",
    "DELEGATION": "MID_TERM",
}
"""The server chooses the tier from the event; the caller cannot."""
lifecycle_events: tuple[str, ...] = tuple(lifecycle_tiers)
turn_lifecycle_events: frozenset[str] = frozenset({"TURN_START", "TURN_END"})
"""These need a ``turn_id``."""
tier_lifetimes_seconds: dict[str, int] = {
    "SHORT_TERM": short_term_context_seconds,
    "MID_TERM": mid_term_context_seconds,
}

# Receipt namespaces, idempotency-key and recovery-reason limits, and the recovery operations
# live in ``_receipts``; resolutions, severities and conflict statuses in ``_conflicts``.

Freshness = Literal["fresh", "stale"]
PreferenceCategory = Literal["OP_HABIT", "OUTPUT_STYLE", "SECURITY_POLICY"]
preference_categories: tuple[str, ...] = ("OP_HABIT", "OUTPUT_STYLE", "SECURITY_POLICY")
KnowledgeStatus = Literal["ACTIVE", "ARCHIVED", "SUPERSEDED"]
"""A knowledge item's status, as the store keeps it (``_store.knowledge_statuses``).  A
forgotten item has no status: its row is deleted and a tombstone keeps its id."""


def tier_of(event: str) -> str:
    return lifecycle_tiers[event]


# ---------------------------------------------------------------------------------------------
# Errors: the contract's §5 table
# ---------------------------------------------------------------------------------------------

error_statuses: dict[str, int] = {
    "INVALID_REQUEST": 400,
    "IDEMPOTENCY_CONFLICT": 409,
    "IDEMPOTENCY_IN_PROGRESS": 409,
    "IDEMPOTENCY_FAILED": 409,
    "IDEMPOTENCY_NOT_FOUND": 404,
    "IDEMPOTENCY_COMPLETED": 409,
    "IDEMPOTENCY_KEY_REQUIRED": 400,
    "INVALID_RECOVERY_REQUEST": 400,
    "SENSITIVE_SHARED_SCOPE": 422,
    "SENSITIVITY_CHECK_FAILED": 503,
    "SCHEMA_NOT_READY": 503,
    "NOT_FOUND": 404,
    "CONFLICT_TIMEOUT": 408,
    "PAIRING_FAILED": 422,
    "PEER_NOT_FOUND": 404,
    "REQUEST_NOT_FOUND": 404,
    "INTERNAL_ERROR": 500,
    # Named in §3.1a (update), not in the §5 table.
    "VERSION_CONFLICT": 409,
    "KNOWLEDGE_NOT_ACTIVE": 409,
    # Overload of a bounded mailbox (design: 503 with Retry-After).
    "OVERLOADED": 503,
    # §3.4: no OCR engine installed.
    "OCR_UNAVAILABLE": 503,
}


@dataclass(frozen=True)
class KnowledgeRefused:
    """A domain failure: the HTTP layer answers ``status`` with ``{"error": code, "message":
    message, "request_id"}``.  ``status`` defaults to the table's value for ``code``.
    ``message`` never carries exception text from inside the process."""

    code: str
    message: str
    status: int = 0

    def __post_init__(self) -> None:
        assert self.code in error_statuses, self.code
        if self.status == 0:
            object.__setattr__(self, "status", error_statuses[self.code])

    def encode(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where an agent write came from; persisted separately and returned by
    ``/evidence/{id}`` as sent (``encode`` omits absent fields)."""

    session_id: str | None = None
    run_id: str | None = None
    turn_id: str | None = None
    occurred_at: int | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    approved: bool | None = None

    def encode(self) -> dict[str, Any]:
        return {name: value for name, value in self.canonical().items() if value is not None}

    def canonical(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "run_id": self.run_id,
            "turn_id": self.turn_id,
            "occurred_at": self.occurred_at,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "approved": self.approved,
        }

    @classmethod
    def decode(cls, value: dict[str, Any] | None) -> Provenance | None:
        if value is None:
            return None
        return cls(**{name: value.get(name) for name in cls().canonical()})


def _canonical_provenance(provenance: Provenance | None) -> dict[str, Any] | None:
    return None if provenance is None else provenance.canonical()


# ---------------------------------------------------------------------------------------------
# Writes, updates, lifecycle, recovery: ("knowledge_scope", scope)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WriteMemory:
    """``POST /memory/write``, already validated by the HTTP layer (source-type rules, key
    format).  → ``MemoryWritten`` | ``KnowledgeRefused``."""

    source_type: str
    raw: dict[str, Any]
    scope: str
    context: dict[str, Any] | None = None
    provenance: Provenance | None = None
    idempotency_key: str | None = None

    operation = "MEMORY_WRITE"
    namespace = receipt_namespace_write

    def canonical(self) -> dict[str, Any]:
        return {
            "source_type": self.source_type,
            "raw": self.raw,
            "scope": self.scope,
            "context": self.context,
            "provenance": _canonical_provenance(self.provenance),
            "idempotency_key": self.idempotency_key,
        }


@dataclass(frozen=True, kw_only=True)
class MemoryWritten:
    evidence_id: str
    quality_score: float
    sensitivity: int
    latency_ms: int
    status: str = "accepted"

    def encode(self) -> dict[str, Any]:
        return {
            "evidence_id": self.evidence_id,
            "status": self.status,
            "quality_score": self.quality_score,
            "sensitivity": self.sensitivity,
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, kw_only=True)
class UpdateKnowledge:
    """``POST /memory/update``: ``title`` or ``body`` (at least one, checked by the HTTP layer).
    → ``KnowledgeUpdated`` | ``KnowledgeRefused`` (404 ``NOT_FOUND`` also for a scope
    mismatch, 409 ``VERSION_CONFLICT`` / ``KNOWLEDGE_NOT_ACTIVE``)."""

    knowledge_id: str
    expected_version: int
    scope: str
    title: str | None = None
    body: dict[str, Any] | None = None
    provenance: Provenance | None = None
    idempotency_key: str | None = None

    operation = "MEMORY_UPDATE"
    namespace = receipt_namespace_update

    def canonical(self) -> dict[str, Any]:
        return {
            "knowledge_id": self.knowledge_id,
            "expected_version": self.expected_version,
            "scope": self.scope,
            "title": self.title,
            "body": self.body,
            "provenance": _canonical_provenance(self.provenance),
            "idempotency_key": self.idempotency_key,
        }


@dataclass(frozen=True, kw_only=True)
class KnowledgeUpdated:
    knowledge_id: str
    evidence_id: str
    version: int
    latency_ms: int
    status: str = "updated"

    def encode(self) -> dict[str, Any]:
        return {
            "knowledge_id": self.knowledge_id,
            "evidence_id": self.evidence_id,
            "version": self.version,
            "status": self.status,
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, kw_only=True)
class RecordLifecycle:
    """``POST /agent/lifecycle``: ``data`` non-empty and ``turn_id`` for TURN events are
    checked by the HTTP layer and again by the actor.  → ``LifecycleRecorded`` |
    ``KnowledgeRefused``."""

    event: str
    scope: str
    session_id: str
    idempotency_key: str
    occurred_at: int
    data: dict[str, Any]
    run_id: str | None = None
    turn_id: str | None = None

    operation = "LIFECYCLE"
    namespace = receipt_namespace_lifecycle

    def canonical(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "scope": self.scope,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "turn_id": self.turn_id,
            "occurred_at": self.occurred_at,
            "idempotency_key": self.idempotency_key,
            "data": self.data,
        }


@dataclass(frozen=True, kw_only=True)
class LifecycleRecorded:
    event: str
    context_id: str
    tier: str
    expires_at: int
    status: str = "ACTIVE"

    def encode(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "context_id": self.context_id,
            "tier": self.tier,
            "status": self.status,
            "expires_at": self.expires_at,
        }


IdempotentRequest = WriteMemory | UpdateKnowledge | RecordLifecycle


@dataclass(frozen=True, kw_only=True)
class RecoverIdempotency:
    """``POST /agent/idempotency/recover``: ``original`` is the complete original request,
    rebuilt by the HTTP layer through the original endpoint's schema (400
    ``INVALID_RECOVERY_REQUEST`` when it does not fit ``operation``; 400
    ``IDEMPOTENCY_KEY_REQUIRED`` when it has no key); ``confirm_duplicate_risk`` is checked
    true there.  ``reason`` is already trimmed (3–256 characters).  Sent to the scope actor of
    ``original.scope``.  → ``RetryAuthorized`` | ``KnowledgeRefused`` (404
    ``IDEMPOTENCY_NOT_FOUND``, 409 ``IDEMPOTENCY_CONFLICT`` / ``IDEMPOTENCY_IN_PROGRESS`` /
    ``IDEMPOTENCY_COMPLETED``)."""

    original: IdempotentRequest
    reason: str

    @property
    def operation(self) -> str:
        return self.original.operation


@dataclass(frozen=True, kw_only=True)
class RetryAuthorized:
    operation: str
    idempotency_key: str
    recovery_count: int
    authorized_at: int
    status: str = "RETRY_AUTHORIZED"

    def encode(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "idempotency_key": self.idempotency_key,
            "status": self.status,
            "recovery_count": self.recovery_count,
            "authorized_at": self.authorized_at,
        }


@dataclass(frozen=True, kw_only=True)
class PromoteContexts:
    """``POST /memory/flow/promote``: lifecycle contexts of ``scope`` (of tier ``source``) to
    long-term knowledge.  Unknown, expired or other-scope ids are skipped, not leaked.
    → ``ContextsPromoted`` | ``KnowledgeRefused``."""

    source: str
    context_ids: tuple[str, ...]
    scope: str


@dataclass(frozen=True, kw_only=True)
class ContextsPromoted:
    promoted_count: int
    knowledge_ids: tuple[str, ...]
    latency_ms: int

    def encode(self) -> dict[str, Any]:
        return {
            "promoted_count": self.promoted_count,
            "knowledge_ids": list(self.knowledge_ids),
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, kw_only=True)
class ArchiveKnowledge:
    """Take an ACTIVE item of ``scope`` out of recall (status ARCHIVED; its rows, evidence and
    history stay).  No contract endpoint yet: the sync issue materialises remote archives
    through it.  → ``KnowledgeArchived`` | ``KnowledgeRefused`` (404 ``NOT_FOUND`` also for a
    scope mismatch, 409 ``KNOWLEDGE_NOT_ACTIVE`` for a SUPERSEDED item)."""

    knowledge_id: str
    scope: str


@dataclass(frozen=True, kw_only=True)
class KnowledgeArchived:
    knowledge_id: str
    version: int
    status: str = "ARCHIVED"

    def encode(self) -> dict[str, Any]:
        return {"knowledge_id": self.knowledge_id, "version": self.version, "status": self.status}


# ---------------------------------------------------------------------------------------------
# Recall: ("knowledge_service", "main")
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class QueryMemory:
    """``POST /memory/query``.  ``time_range`` is the contract's hint (e.g. ``last_month``).
    → ``MemoryAnswer``."""

    text: str
    scope: str | None = None
    time_range: str | None = None
    top_k: int = query_top_k_default


@dataclass(frozen=True, kw_only=True)
class MemoryAnswer:
    answer: str
    source_evidence: tuple[str, ...]
    source_knowledge: str | None
    confidence: float
    latency_ms: int

    def encode(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "source_evidence": list(self.source_evidence),
            "source_knowledge": self.source_knowledge,
            "confidence": self.confidence,
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, kw_only=True)
class BuildAgentContext:
    """``POST /agent/context``.  → ``AgentContext``."""

    query: str
    scope: str
    session_id: str
    turn_id: str
    top_k: int = agent_context_top_k_default
    max_chars: int = agent_context_characters_default
    freshness_seconds: int = freshness_seconds_default


@dataclass(frozen=True, kw_only=True)
class AgentContextItem:
    knowledge_id: str
    version: int
    title: str
    scope: str
    evidence_ids: tuple[str, ...]
    confidence: float
    updated_at: int
    freshness: str
    conflict_status: str

    def encode(self) -> dict[str, Any]:
        return {
            "knowledge_id": self.knowledge_id,
            "version": self.version,
            "title": self.title,
            "scope": self.scope,
            "evidence_ids": list(self.evidence_ids),
            "confidence": self.confidence,
            "updated_at": self.updated_at,
            "freshness": self.freshness,
            "conflict_status": self.conflict_status,
        }


@dataclass(frozen=True, kw_only=True)
class AgentContext:
    session_id: str
    turn_id: str
    context: str
    items: tuple[AgentContextItem, ...]
    truncated: bool
    latency_ms: int

    def encode(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "context": self.context,
            "items": [item.encode() for item in self.items],
            "truncated": self.truncated,
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True, kw_only=True)
class GetEvidence:
    """``GET /evidence/{id}``.  → ``EvidenceRecord`` | ``KnowledgeRefused`` (404
    ``NOT_FOUND``)."""

    evidence_id: str


@dataclass(frozen=True, kw_only=True)
class EvidenceRecord:
    id: str
    source_type: str
    raw: dict[str, Any]
    quality_score: float
    sensitivity: int
    scope: str
    created_at: int
    provenance: Provenance | None = None
    context: dict[str, Any] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "source_type": self.source_type,
            "raw": self.raw,
            "quality_score": self.quality_score,
            "sensitivity": self.sensitivity,
            "scope": self.scope,
            "created_at": self.created_at,
        }
        body["provenance"] = None if self.provenance is None else self.provenance.encode()
        return body


# ---------------------------------------------------------------------------------------------
# Preferences
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ExtractPreferences:
    """``POST /preference/extract``.  → ``PreferencesExtracted`` | ``KnowledgeRefused``."""

    evidence_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ExtractedPreference:
    id: str
    category: str
    key: str
    value: dict[str, Any]
    confidence: float

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "category": self.category, "key": self.key, "value": self.value,
                "confidence": self.confidence}


@dataclass(frozen=True, kw_only=True)
class PreferencesExtracted:
    extracted_preferences: tuple[ExtractedPreference, ...]
    latency_ms: int

    def encode(self) -> dict[str, Any]:
        return {"extracted_preferences": [item.encode() for item in self.extracted_preferences],
                "latency_ms": self.latency_ms}


@dataclass(frozen=True, kw_only=True)
class ListPreferences:
    """``GET /preferences?scope=``.  → ``PreferenceList``."""

    scope: str | None = None


@dataclass(frozen=True, kw_only=True)
class PreferenceRecord:
    id: str
    category: str
    key: str
    value: dict[str, Any]
    confidence: float
    version: int
    scope: str
    created_at: int
    updated_at: int

    def encode(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "category": self.category,
            "key": self.key,
            "value": self.value,
            "confidence": self.confidence,
            "version": self.version,
            "scope": self.scope,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, kw_only=True)
class PreferenceList:
    preferences: tuple[PreferenceRecord, ...]

    def encode(self) -> dict[str, Any]:
        return {"preferences": [item.encode() for item in self.preferences]}


@dataclass(frozen=True, kw_only=True)
class GetPreferenceHistory:
    """``GET /preference/{id}/history``.  → ``PreferenceHistory`` | ``KnowledgeRefused``
    (404)."""

    preference_id: str


@dataclass(frozen=True, kw_only=True)
class PreferenceVersion:
    version: int
    value: dict[str, Any]
    updated_at: int

    def encode(self) -> dict[str, Any]:
        return {"version": self.version, "value": self.value, "updated_at": self.updated_at}


@dataclass(frozen=True, kw_only=True)
class PreferenceHistory:
    id: str
    key: str
    current_version: int
    history: tuple[PreferenceVersion, ...]

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "current_version": self.current_version,
                "history": [item.encode() for item in self.history]}


# ---------------------------------------------------------------------------------------------
# Forgetting and conflicts
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ForgetMemory:
    """``POST /forget``.  ``confirm=false`` plans and remembers the plan for
    ``forget_confirmation_seconds``; ``confirm=true`` with the same ``command`` (and the plan's
    ``confirmation_token`` when the client kept it) executes it; an expired plan → 408
    ``CONFLICT_TIMEOUT``.  ``scope`` optionally narrows the targets.  → ``ForgetPlan`` |
    ``Forgotten`` | ``KnowledgeRefused``."""

    command: str
    confirm: bool
    scope: str | None = None
    confirmation_token: str | None = None


@dataclass(frozen=True, kw_only=True)
class ForgetTarget:
    type: str
    id: str
    title: str | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {"type": self.type, "id": self.id}
        if self.title is not None:
            body["title"] = self.title
        return body


@dataclass(frozen=True, kw_only=True)
class ForgetPlan:
    targets: tuple[ForgetTarget, ...]
    evidence_count: int
    relation_count: int
    expires_at: int
    confirmation_token: str
    irreversible: bool = True

    def encode(self) -> dict[str, Any]:
        return {
            "targets": [target.encode() for target in self.targets],
            "cascade": {"evidence_count": self.evidence_count, "relation_count": self.relation_count},
            "irreversible": self.irreversible,
            "expires_at": self.expires_at,
            "confirmation_token": self.confirmation_token,
        }


@dataclass(frozen=True, kw_only=True)
class Forgotten:
    forgotten_ids: tuple[str, ...]
    latency_ms: int
    status: str = "forgotten"

    def encode(self) -> dict[str, Any]:
        return {"status": self.status, "forgotten_ids": list(self.forgotten_ids), "latency_ms": self.latency_ms}


@dataclass(frozen=True, kw_only=True)
class ListConflicts:
    """``GET /conflicts``.  → ``ConflictList``."""

    scope: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConflictRecord:
    id: str
    target_knowledge: str
    field: str
    old_value: Any
    new_value: Any
    resolution: str
    created_at: int
    knowledge_title: str

    @property
    def severity(self) -> str:
        return severity_for(self.resolution)

    def encode(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "target_knowledge": self.target_knowledge,
            "field": self.field,
            "old_value": self.old_value,
            "new_value": self.new_value,
            "resolution": self.resolution,
            "created_at": self.created_at,
            "knowledge_title": self.knowledge_title,
            "severity": self.severity,
        }


@dataclass(frozen=True, kw_only=True)
class ConflictList:
    conflicts: tuple[ConflictRecord, ...]

    def encode(self) -> dict[str, Any]:
        return {"conflicts": [item.encode() for item in self.conflicts]}


# ---------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ListInsights:
    """``GET /delivery/insights?limit=`` (1–10, checked by the HTTP layer).  → ``InsightList``."""

    limit: int = insights_limit_default


@dataclass(frozen=True, kw_only=True)
class Insight:
    title: str
    summary: str
    knowledge_id: str
    score: float
    kind: str = "recent"

    def encode(self) -> dict[str, Any]:
        return {"title": self.title, "summary": self.summary, "knowledge_id": self.knowledge_id,
                "score": self.score, "kind": self.kind}


@dataclass(frozen=True, kw_only=True)
class InsightList:
    insights: tuple[Insight, ...]

    def encode(self) -> dict[str, Any]:
        return {"insights": [item.encode() for item in self.insights]}


@dataclass(frozen=True, kw_only=True)
class BuildDigest:
    """``GET /delivery/digest?date=``: ``date`` strictly ``YYYY-MM-DD`` (checked by the HTTP
    layer; ``None`` = today), ``utc_offset_seconds`` the server's local offset for that day.
    → ``Digest``."""

    date: str | None = None
    utc_offset_seconds: int = 0


@dataclass(frozen=True, kw_only=True)
class Digest:
    date: str
    summary: str

    def encode(self) -> dict[str, Any]:
        return {"date": self.date, "summary": self.summary}


# ---------------------------------------------------------------------------------------------
# Handshake data (built by the HTTP layer from the engine's migrations and the Env)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VersionInfo:
    product_version: str
    schema_version: int
    component: str = component_name
    api_version: str = api_version
    agent_memory_api: int = agent_memory_api_version

    def encode(self) -> dict[str, Any]:
        return {
            "product_version": self.product_version,
            "component": self.component,
            "api_version": self.api_version,
            "agent_memory_api": self.agent_memory_api,
            "schema_version": self.schema_version,
        }


@dataclass(frozen=True, kw_only=True)
class HealthReport:
    product_version: str
    schema_version: int
    status: str = "ready"
    database: str = "ok"
    component: str = component_name

    def encode(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "product_version": self.product_version,
            "component": self.component,
            "database": self.database,
            "schema_version": self.schema_version,
        }


@dataclass(frozen=True, kw_only=True)
class BackendCapability:
    configured: str
    runtime: str
    compliant: bool

    def encode(self) -> dict[str, Any]:
        return {"configured": self.configured, "runtime": self.runtime, "compliant": self.compliant}


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    platform_family: str
    platform_version_major: str
    embedding: BackendCapability
    vector_store: BackendCapability

    @property
    def v11(self) -> bool:
        return self.platform_family == "kylin" and self.platform_version_major == "11"

    @property
    def contest_ready(self) -> bool:
        """True only on Kylin V11 with both runtimes really ``kylin``."""
        return self.v11 and self.embedding.runtime == "kylin" and self.vector_store.runtime == "kylin"

    def encode(self) -> dict[str, Any]:
        return {
            "platform": {"family": self.platform_family, "version_major": self.platform_version_major,
                         "v11": self.v11},
            "embedding": self.embedding.encode(),
            "vector_store": self.vector_store.encode(),
            "contest_ready": self.contest_ready,
        }


# ---------------------------------------------------------------------------------------------
# WebSocket events (§4): {"event": name, "data": {...}}
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MemoryReady:
    evidence_id: str
    knowledge_id: str
    title: str
    scope: str

    event = "memory_ready"

    def encode(self) -> dict[str, Any]:
        return {"event": self.event, "data": {"evidence_id": self.evidence_id, "knowledge_id": self.knowledge_id,
                                              "title": self.title, "scope": self.scope}}


@dataclass(frozen=True, kw_only=True)
class ConflictDetected:
    conflict_id: str
    knowledge_title: str
    field: str
    old_value: Any
    new_value: Any
    resolution: str

    event = "conflict_detected"

    @property
    def severity(self) -> str:
        return severity_for(self.resolution)

    def encode(self) -> dict[str, Any]:
        return {"event": self.event, "data": {
            "conflict_id": self.conflict_id,
            "knowledge_title": self.knowledge_title,
            "field": self.field,
            "old_value": self.old_value,
            "new_value": self.new_value,
            "severity": self.severity,
        }}


@dataclass(frozen=True, kw_only=True)
class ForgetConfirmation:
    """Broadcast when a forget is executed: the forgotten ids by type and the relation count;
    ``expires_at`` is the plan's confirmation deadline."""

    command: str
    knowledge_ids: tuple[str, ...]
    evidence_ids: tuple[str, ...]
    relation_count: int
    expires_at: int
    forgotten_ids: tuple[str, ...] = field(default=())

    event = "forget_confirmation"

    def encode(self) -> dict[str, Any]:
        targets: list[dict[str, Any]] = [{"type": "knowledge", "id": item} for item in self.knowledge_ids]
        targets += [{"type": "evidence", "id": item} for item in self.evidence_ids]
        targets.append({"type": "relation", "count": self.relation_count})
        forgotten = list(self.forgotten_ids) or [*self.knowledge_ids, *self.evidence_ids]
        return {"event": self.event, "data": {"command": self.command, "targets": targets,
                                              "forgotten_ids": forgotten, "expires_at": self.expires_at}}


@dataclass(frozen=True, kw_only=True)
class Connected:
    """The first message of every ``/events`` connection."""

    connection_id: str
    heartbeat_seconds: float

    event = "connected"

    def encode(self) -> dict[str, Any]:
        return {"event": self.event, "data": {"connection_id": self.connection_id,
                                              "heartbeat_seconds": self.heartbeat_seconds}}


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    timestamp: int

    event = "heartbeat"

    def encode(self) -> dict[str, Any]:
        return {"event": self.event, "data": {"timestamp": self.timestamp}}


KnowledgeEvent = MemoryReady | ConflictDetected | ForgetConfirmation | Connected | Heartbeat


__all__ = [
    "AgentContext",
    "AgentContextItem",
    "ArchiveKnowledge",
    "BackendCapability",
    "BuildAgentContext",
    "BuildDigest",
    "Capabilities",
    "ConflictDetected",
    "ConflictList",
    "ConflictRecord",
    "Connected",
    "ContextsPromoted",
    "Digest",
    "EvidenceRecord",
    "ExtractPreferences",
    "ExtractedPreference",
    "ForgetConfirmation",
    "ForgetMemory",
    "ForgetPlan",
    "ForgetTarget",
    "Forgotten",
    "Freshness",
    "GetEvidence",
    "GetPreferenceHistory",
    "HealthReport",
    "Heartbeat",
    "IdempotentRequest",
    "Insight",
    "InsightList",
    "KnowledgeArchived",
    "KnowledgeEvent",
    "KnowledgeRefused",
    "KnowledgeStatus",
    "KnowledgeUpdated",
    "LifecycleEvent",
    "LifecycleRecorded",
    "ListConflicts",
    "ListInsights",
    "ListPreferences",
    "MemoryAnswer",
    "MemoryReady",
    "MemoryWritten",
    "PreferenceCategory",
    "PreferenceHistory",
    "PreferenceList",
    "PreferenceRecord",
    "PreferenceVersion",
    "PreferencesExtracted",
    "PromoteContexts",
    "Provenance",
    "QueryMemory",
    "RecordLifecycle",
    "RecoverIdempotency",
    "RetryAuthorized",
    "SourceType",
    "Tier",
    "UpdateKnowledge",
    "VersionInfo",
    "WriteMemory",
    "agent_context_characters_default",
    "agent_context_characters_max",
    "agent_context_characters_min",
    "agent_context_top_k_default",
    "agent_context_top_k_max",
    "agent_context_top_k_min",
    "agent_memory_api_version",
    "api_version",
    "component_name",
    "error_statuses",
    "events_key",
    "events_kind_name",
    "forget_confirmation_seconds",
    "freshness_seconds_default",
    "insights_limit_default",
    "insights_limit_max",
    "insights_limit_min",
    "insights_window_seconds",
    "lifecycle_events",
    "lifecycle_tiers",
    "mid_term_context_seconds",
    "preference_categories",
    "preference_evidence_ids_max",
    "product_version_development",
    "promote_context_ids_max",
    "query_top_k_default",
    "query_top_k_max",
    "query_top_k_min",
    "scope_kind_name",
    "service_key",
    "service_kind_name",
    "short_term_context_seconds",
    "source_types",
    "tier_lifetimes_seconds",
    "tier_of",
    "turn_lifecycle_events",
]
