"""troupe.http.sessions: the sessions surface (tansr /v2 and the unified /api/sessions).

- ``create_sessions_app`` / ``SessionsAppDependencies``: the app, for serve, tests and the
  simulator (``sessions_surface``, in ``_surface``, is the ``troupe serve`` plug-in);
- ``SessionsGate`` / ``SessionsAdmission``: Host, readiness, end-user bearer, route and
  legacy-prefix knob, per-operation body caps;
- errors: ``SessionsError`` and the two envelopes (``v2_document``, ``unified_document``),
  the code → status table ``statuses`` and ``retry_action_for``;
- the operation table (``operations``, ``match_route``), ``manifest_document``,
  ``LegacyPrefixPolicy`` and the OpenAPI document;
- the event stream (``EventStreamSettings``, ``install_event_route``).
"""

from ._app import (
    SessionsAppDependencies,
    body_discard_seconds,
    create_sessions_app,
    cwd_problem,
    discard_unread_body,
    history_limit_max,
    session_list_limit_default,
    voice_retry_after_seconds,
)
from ._errors import (
    SessionsError,
    default_messages,
    retry_action_for,
    retry_actions,
    statuses,
    unified_codes_by_status,
    unified_document,
    unified_error_envelope,
    v2_document,
    v2_error_envelope,
)
from ._events import (
    EventStreamSettings,
    envelope_header,
    event_stream_frames,
    exclude_of,
    grace_milliseconds_floor,
    grace_milliseconds_variable,
    install_event_route,
    last_event_id_of,
    max_buffer_bytes_floor,
    max_buffer_bytes_variable,
    rewrite_unified,
    shutdown_retry_milliseconds,
    slow_policy_variable,
    unified_envelope_value,
)
from ._gate import SessionsAdmission, SessionsGate, admission_key, admission_of
from ._openapi import docs_page, openapi_document
from ._routes import (
    LegacyPrefixPolicy,
    Operation,
    RouteMatch,
    default_body_bytes_max,
    deprecation_header_value,
    deprecation_link_value,
    import_body_bytes_max,
    large_body_bytes_max,
    legacy_prefix_variable,
    legacy_sunset_variable,
    manifest_document,
    manifest_revision,
    match_route,
    operations,
    operations_by_name,
)
from ._schemas import client_tools_max, session_key
from ._surface import sessions_listen_default, sessions_surface

__all__ = [
    "EventStreamSettings",
    "LegacyPrefixPolicy",
    "Operation",
    "RouteMatch",
    "SessionsAdmission",
    "SessionsAppDependencies",
    "SessionsError",
    "SessionsGate",
    "admission_key",
    "admission_of",
    "body_discard_seconds",
    "client_tools_max",
    "create_sessions_app",
    "cwd_problem",
    "default_body_bytes_max",
    "default_messages",
    "deprecation_header_value",
    "deprecation_link_value",
    "discard_unread_body",
    "docs_page",
    "envelope_header",
    "event_stream_frames",
    "exclude_of",
    "grace_milliseconds_floor",
    "grace_milliseconds_variable",
    "history_limit_max",
    "import_body_bytes_max",
    "install_event_route",
    "large_body_bytes_max",
    "last_event_id_of",
    "legacy_prefix_variable",
    "legacy_sunset_variable",
    "manifest_document",
    "manifest_revision",
    "match_route",
    "max_buffer_bytes_floor",
    "max_buffer_bytes_variable",
    "openapi_document",
    "operations",
    "operations_by_name",
    "retry_action_for",
    "retry_actions",
    "rewrite_unified",
    "session_key",
    "session_list_limit_default",
    "sessions_listen_default",
    "sessions_surface",
    "shutdown_retry_milliseconds",
    "slow_policy_variable",
    "statuses",
    "unified_codes_by_status",
    "unified_document",
    "unified_envelope_value",
    "unified_error_envelope",
    "v2_document",
    "v2_error_envelope",
    "voice_retry_after_seconds",
]
