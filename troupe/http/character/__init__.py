"""troupe.http.character: the character surface (the N.E.K.O memory server API).

- ``create_character_app`` / ``CharacterAppDependencies``: the app, for serve, tests and the
  simulator (``character_surface`` / ``new_character_surface``, in ``_surface``, are the
  ``troupe serve`` plug-in; ``MEMORY_SERVER_PORT`` moves the default port);
- ``CharacterGate``: Host, Origin, route, limited mode, character name, per-route body limit;
- the operation table (``operations``, ``match_route``) and its body limits;
- errors: ``CharacterError`` and FastAPI's ``{"detail": ...}`` shape, ``failure_documents``
  (the contract's 200 failure bodies);
- request parsing (``claim_parameters``, ``funnel_window``, ``format_time``) and the OpenAPI
  document.
"""

from ._app import (
    ActorFailed,
    CharacterAppDependencies,
    ask_timeout_seconds,
    create_character_app,
    failure_documents,
    lifecycle_ask_timeout_seconds,
    memory_hit_document,
    memory_results_document,
    search_placeholder_template,
)
from ._errors import (
    CharacterError,
    detail_document,
    detail_error_envelope,
    retry_after_seconds_default,
)
from ._gate import CharacterGate, route_key, route_of
from ._openapi import docs_page, openapi_document
from ._routes import (
    Operation,
    RouteMatch,
    control_body_bytes_max,
    history_body_bytes_max,
    match_route,
    operations,
    operations_by_name,
)
from ._schemas import (
    claim_parameters,
    format_time,
    funnel_window,
    funnel_window_seconds_default,
    parse_time,
    query_characters_max,
)
from ._surface import (
    blocking_reason_variable,
    character_listen_address,
    character_listen_default,
    character_port_default,
    character_surface,
    enable_shutdown_variable,
    new_character_surface,
    port_variable,
    start_blocked_variable,
)

__all__ = [
    "ActorFailed",
    "CharacterAppDependencies",
    "CharacterError",
    "CharacterGate",
    "Operation",
    "RouteMatch",
    "ask_timeout_seconds",
    "blocking_reason_variable",
    "character_listen_address",
    "character_listen_default",
    "character_port_default",
    "character_surface",
    "claim_parameters",
    "control_body_bytes_max",
    "create_character_app",
    "detail_document",
    "detail_error_envelope",
    "docs_page",
    "enable_shutdown_variable",
    "failure_documents",
    "format_time",
    "funnel_window",
    "funnel_window_seconds_default",
    "history_body_bytes_max",
    "lifecycle_ask_timeout_seconds",
    "match_route",
    "memory_hit_document",
    "memory_results_document",
    "new_character_surface",
    "openapi_document",
    "operations",
    "operations_by_name",
    "parse_time",
    "port_variable",
    "query_characters_max",
    "retry_after_seconds_default",
    "route_key",
    "route_of",
    "search_placeholder_template",
    "start_blocked_variable",
]
