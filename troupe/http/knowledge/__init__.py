"""troupe.http.knowledge: the knowledge surface (the PIXIU memory API, ``seeds/004``).

- ``create_knowledge_app`` / ``KnowledgeAppDependencies``: the app, for serve, tests and the
  simulator (``knowledge_surface`` / ``new_knowledge_surface``, in ``_surface``, are the
  ``troupe serve`` plug-in on 127.0.0.1:8765);
- ``KnowledgeGate``: request id, Host, route, schema readiness, per-route body limit;
- the operation table (``operations``, ``match_route``) and its body limits;
- errors: ``KnowledgeError`` and the ``{"error", "message", "request_id"}`` envelope;
- request models (``_schemas``), the handshake facts (``_handshake``), the read side
  (``KnowledgeReads``), the ``/events`` WebSocket handler and the OpenAPI document.
"""

from ._app import (
    ActorFailed,
    KnowledgeAppDependencies,
    answered,
    ask_timeout_seconds,
    create_knowledge_app,
    digest_date,
    insights_limit,
)
from ._errors import (
    KnowledgeError,
    encode_document,
    error_document,
    request_id_header,
    request_id_key,
    request_id_of,
    request_id_pattern,
    retry_after_seconds_default,
    statuses,
    valid_request_id,
)
from ._events import EventsSettings, encode_message, serve_events
from ._gate import KnowledgeGate, route_key, route_of
from ._handshake import (
    HandshakeSettings,
    KnowledgeBackendUnavailable,
    SchemaState,
    applied_schema_version,
    embedding_variable,
    platform_facts,
    product_version,
    product_version_variable,
    vector_store_variable,
)
from ._openapi import openapi_document
from ._reads import KnowledgeReads, local_utc_offset_seconds
from ._routes import (
    Operation,
    RouteMatch,
    lifecycle_body_bytes_max,
    match_route,
    operations,
    operations_by_name,
    small_body_bytes_max,
    write_body_bytes_max,
)
from ._schemas import (
    AgentContextIn,
    ForgetIn,
    LifecycleIn,
    MemoryQueryIn,
    MemoryUpdateIn,
    MemoryWriteIn,
    PreferenceExtractIn,
    PromoteIn,
    ProvenanceIn,
    RecoverIn,
    parse_json_body,
    recovery_models,
    validated,
)
from ._surface import (
    knowledge_listen_default,
    knowledge_port_default,
    knowledge_surface,
    new_knowledge_surface,
)

__all__ = [
    "ActorFailed",
    "AgentContextIn",
    "EventsSettings",
    "ForgetIn",
    "HandshakeSettings",
    "KnowledgeAppDependencies",
    "KnowledgeBackendUnavailable",
    "KnowledgeError",
    "KnowledgeGate",
    "KnowledgeReads",
    "LifecycleIn",
    "MemoryQueryIn",
    "MemoryUpdateIn",
    "MemoryWriteIn",
    "Operation",
    "PreferenceExtractIn",
    "PromoteIn",
    "ProvenanceIn",
    "RecoverIn",
    "RouteMatch",
    "SchemaState",
    "answered",
    "applied_schema_version",
    "ask_timeout_seconds",
    "create_knowledge_app",
    "digest_date",
    "embedding_variable",
    "encode_document",
    "encode_message",
    "error_document",
    "insights_limit",
    "knowledge_listen_default",
    "knowledge_port_default",
    "knowledge_surface",
    "lifecycle_body_bytes_max",
    "local_utc_offset_seconds",
    "match_route",
    "new_knowledge_surface",
    "openapi_document",
    "operations",
    "operations_by_name",
    "parse_json_body",
    "platform_facts",
    "product_version",
    "product_version_variable",
    "recovery_models",
    "request_id_header",
    "request_id_key",
    "request_id_of",
    "request_id_pattern",
    "retry_after_seconds_default",
    "route_key",
    "route_of",
    "serve_events",
    "small_body_bytes_max",
    "statuses",
    "validated",
    "valid_request_id",
    "vector_store_variable",
    "write_body_bytes_max",
]
