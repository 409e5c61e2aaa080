"""troupe.http.host: the host surface (Iris host API v1, contract ``000``).

- ``host_surface`` / ``new_host_surface``: the ``troupe serve`` plug-in (listener ``host``,
  default 127.0.0.1:8080, its actor kinds and migrations; goal dedup knobs from the
  environment);
- ``create_host_app`` / ``HostAppDependencies``: the app itself, for tests and the simulator;
- ``HostGate`` / ``NoStore``: the ASGI checks in the contract's order (readiness, token, rate,
  entry id, scope, per-route body limit) and ``Cache-Control: no-store``;
- the unified error body (``HostError``, ``error_document``, ``host_error_envelope``) and the
  route table (body limits per route, ``entry_segment``);
- request models (``MessageIn``, ``parse_message_batch``) and the OpenAPI document;
- ``add_persona_commands`` / ``run_persona_command``: ``troupe persona set|show|time-zone``;
- ``EventsHub`` / ``EventSettings`` (``app.state.events``: slots, event ids, replay cursors,
  ``shutdown()``) and ``EventsRoute``: ``GET /api/v1/events`` (SSE) and ``/events/status``;
  ``GET /api/v1/notifications`` (``_routes_notifications``).
"""

from ._app import EntryIdConverter, HostAppDependencies, ask_actor, create_host_app
from ._errors import (
    FieldProblem,
    HostError,
    default_messages,
    error_document,
    host_error_envelope,
    retry_at_text,
)
from ._events import (
    EventCursors,
    EventLimitReached,
    EventSettings,
    EventsHub,
    StreamStart,
    code_event_global_limit,
    code_event_token_limit,
    event_connection_seconds_max,
    event_connections_max,
    event_connections_per_token_max,
    event_cursors_max,
    event_final_send_seconds_max,
    event_heartbeat_seconds,
    event_idle_seconds,
    event_limit_retry_after_seconds,
    event_notification_window_ids,
    event_poll_seconds,
    event_replay_seconds,
    event_send_seconds_max,
    parse_event_id,
    resync_cursor_unavailable,
    resync_window_exceeded,
)
from ._gate import GateAdmission, HostGate, NoStore, admission_key, admission_of
from ._openapi import docs_page, openapi_document
from ._persona_cli import add_persona_commands, run_persona_command
from ._routes import (
    api_prefix,
    body_bytes_max_for,
    content_bytes_max,
    entry_segment,
    goal_body_bytes_max,
    media_body_bytes_max,
    messages_body_bytes_max,
    other_body_bytes_max,
    raw_routes,
    state_body_bytes_max,
)
from ._routes_events import EventsRoute, events_path, events_status_path, requested_event_id
from ._routes_notifications import notifications_path
from ._schemas import CustomPace, MessageIn, parse_message_batch
from ._surface import (
    allowed_hosts_variable,
    contract_allowed_hosts,
    goal_fallback_seconds_max,
    goal_fallback_seconds_variable,
    goal_judgement_variable,
    goal_settings_from_environment,
    host_listen_default,
    host_surface,
    new_host_surface,
)

__all__ = [
    "EventCursors",
    "EventLimitReached",
    "EventSettings",
    "EventsHub",
    "EventsRoute",
    "StreamStart",
    "code_event_global_limit",
    "code_event_token_limit",
    "event_connection_seconds_max",
    "event_connections_max",
    "event_connections_per_token_max",
    "event_cursors_max",
    "event_final_send_seconds_max",
    "event_heartbeat_seconds",
    "event_idle_seconds",
    "event_limit_retry_after_seconds",
    "event_notification_window_ids",
    "event_poll_seconds",
    "event_replay_seconds",
    "event_send_seconds_max",
    "events_path",
    "events_status_path",
    "notifications_path",
    "parse_event_id",
    "requested_event_id",
    "resync_cursor_unavailable",
    "resync_window_exceeded",
    "CustomPace",
    "EntryIdConverter",
    "FieldProblem",
    "GateAdmission",
    "HostAppDependencies",
    "HostError",
    "HostGate",
    "MessageIn",
    "NoStore",
    "admission_key",
    "add_persona_commands",
    "admission_of",
    "allowed_hosts_variable",
    "api_prefix",
    "ask_actor",
    "raw_routes",
    "body_bytes_max_for",
    "content_bytes_max",
    "contract_allowed_hosts",
    "create_host_app",
    "default_messages",
    "docs_page",
    "entry_segment",
    "error_document",
    "goal_body_bytes_max",
    "goal_fallback_seconds_max",
    "goal_fallback_seconds_variable",
    "goal_judgement_variable",
    "goal_settings_from_environment",
    "host_error_envelope",
    "host_listen_default",
    "host_surface",
    "new_host_surface",
    "media_body_bytes_max",
    "messages_body_bytes_max",
    "openapi_document",
    "other_body_bytes_max",
    "parse_message_batch",
    "retry_at_text",
    "run_persona_command",
    "state_body_bytes_max",
]
