"""troupe.http: what every HTTP surface shares, and the admin surface.

- ``protect`` and its parts (``SendGuard``, ``HostCheck``, ``BodyLimit``): the ASGI middleware
  stack every surface runs behind (final-send shield and bounded sends, Host allow-list,
  streaming body limit);
- error envelopes (``ErrorEnvelope``, ``install_error_handlers``) so each surface answers in its
  own contract's error shape, even for rejections made before its code runs;
- ``sse_response`` and ``ShutdownSignal`` for streams that heartbeat and end cleanly on shutdown;
- ``create_admin_app``: ``/healthz``, ``/readyz``, ``/metrics``, ``/actors``.

The surfaces themselves (host, sessions, character, knowledge) live beside this package and
import only these public names.
"""

from ._admin import AdminSource, create_admin_app
from ._envelope import (
    ErrorBody,
    ErrorEnvelope,
    default_error_envelope,
    envelope_response,
    error_code_for_status,
    install_error_handlers,
)
from ._exceptions import HttpError, MetricsError, SendTimeout
from ._metrics import Exposition, actors_document, render_metrics
from ._metrics import content_type as metrics_content_type
from ._middleware import (
    ASGIApp,
    BodyLimit,
    HostCheck,
    SendGuard,
    discard_request_body,
    linger_bytes_max,
    linger_seconds_max,
    loopback_host_names,
    protect,
    request_body_bytes_max_default,
    send_error,
    send_lingering,
    send_seconds_max_default,
    send_seconds_scope_key,
)
from ._plain_route import read_request_body, send_answer
from ._shutdown import ShutdownSignal
from ._sse import SseEvent, heartbeat_frame, heartbeat_seconds_default, sse_frames, sse_response

__all__ = [
    "ASGIApp",
    "AdminSource",
    "BodyLimit",
    "ErrorBody",
    "ErrorEnvelope",
    "Exposition",
    "HostCheck",
    "HttpError",
    "MetricsError",
    "SendGuard",
    "SendTimeout",
    "SseEvent",
    "ShutdownSignal",
    "actors_document",
    "create_admin_app",
    "default_error_envelope",
    "discard_request_body",
    "envelope_response",
    "error_code_for_status",
    "heartbeat_frame",
    "heartbeat_seconds_default",
    "install_error_handlers",
    "linger_bytes_max",
    "linger_seconds_max",
    "loopback_host_names",
    "metrics_content_type",
    "protect",
    "read_request_body",
    "render_metrics",
    "request_body_bytes_max_default",
    "send_answer",
    "send_error",
    "send_lingering",
    "send_seconds_max_default",
    "send_seconds_scope_key",
    "sse_frames",
    "sse_response",
]
