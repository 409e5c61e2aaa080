"""The admin surface: liveness, readiness, metrics and actor statistics for operators.

It is the one surface with no contract to follow, so it uses troupe's own error envelope and
plain JSON.  It reads the server's state through ``AdminSource`` (a narrow protocol the
server implements) instead of importing the server, so it can be tested with a fake and the
server can change how it holds its parts.

- ``GET /healthz``: 200 whenever the process answers: a liveness probe must not depend on
  storage, or a slow disk would get a healthy process restarted.
- ``GET /readyz``: 200 when every component reports ready, else 503 naming the ones that are
  not (including ``accepting`` once shutdown has begun, so load balancers stop sending).
- ``GET /metrics``: Prometheus text (see ``_metrics``).
- ``GET /actors``: the same figures as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from quart import Response
from quart_trio import QuartTrio

from ._envelope import ErrorEnvelope, default_error_envelope, install_error_handlers
from ._metrics import actors_document, content_type, render_metrics
from ._middleware import protect, request_body_bytes_max_default


class AdminSource(Protocol):
    """What the admin surface needs from the server."""

    def readiness(self) -> Mapping[str, bool]:
        """Component name -> ready (``storage``, ``actor_system``, ``accepting``...)."""

    def statistics(self) -> dict[str, Any]:
        """``kinds`` (name -> ``KindStatistics``), ``supervisor_restarts``,
        ``supervisor_escalations`` and ``storage`` (``EngineStatistics`` or None)."""


def create_admin_app(
    source: AdminSource,
    *,
    allowed_hosts: Iterable[str] = (),
    request_body_bytes_max: int = request_body_bytes_max_default,
    envelope: ErrorEnvelope = default_error_envelope,
) -> QuartTrio:
    """The admin quart-trio app, already wrapped in the shared middleware."""
    app = QuartTrio("troupe.admin")
    app.config["MAX_CONTENT_LENGTH"] = request_body_bytes_max
    install_error_handlers(app, envelope)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok"}, 200)

    @app.get("/readyz")
    async def readyz() -> Response:
        components = dict(source.readiness())
        not_ready = sorted(name for name, ready in components.items() if not ready)
        if not_ready:
            return _json({"status": "not_ready", "not_ready": not_ready, "components": components}, 503)
        return _json({"status": "ready", "components": components}, 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = render_metrics(**_figures(source))
        return Response(text, status=200, content_type=content_type)

    @app.get("/actors")
    async def actors() -> Response:
        return _json(actors_document(**_figures(source)), 200)

    app.asgi_app = protect(  # type: ignore[method-assign]
        app.asgi_app,
        envelope=envelope,
        allowed_hosts=allowed_hosts,
        request_body_bytes_max=request_body_bytes_max,
    )
    return app


def _figures(source: AdminSource) -> dict[str, Any]:
    figures = source.statistics()
    return {
        "kinds": figures["kinds"],
        "supervisor_restarts": figures["supervisor_restarts"],
        "supervisor_escalations": figures["supervisor_escalations"],
        "storage": figures["storage"],
    }


def _json(document: Any, status: int) -> Response:
    body = json.dumps(document, ensure_ascii=False, sort_keys=True)
    response = Response(body, status=status, content_type="application/json")
    response.headers["Cache-Control"] = "no-store"
    return response


__all__ = ["AdminSource", "create_admin_app"]
