"""The host surface's quart-trio app (Iris host API v1) and its middleware stack.

A thin adapter, as every surface is: the gate (``_gate``) has already checked Host,
readiness, token, rate, entry id and scope and bounded the body; a handler validates the body
(pydantic, ``_schemas``), asks the entry actor and shapes the reply.  Errors of every origin
come out in the unified body (``_errors``), with ``Allow`` on an unsupported method (answered
400, as the contract asks) and ``Retry-After`` on 429/503.

The stack, outermost first: ``SendGuard`` (final-send shield, bounded sends) → ``NoStore`` →
``HostCheck`` (shared, loopback + allowed names) → ``HostGate`` → ``BodyLimit`` chosen per
route → quart.  No CORS headers are ever added and forwarded headers are never read.

``HostAppDependencies`` is what the app needs from a running server; ``host_surface`` (in
``__init__``) builds it from the ``SurfaceContext``, and tests build it directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import BaseConverter

from troupe.auth import RateBuckets, burst_default, rate_per_second_default
from troupe.http import HostCheck, SendGuard
from troupe.runtime import ActorCrashed, AskTimeout, Overloaded, Unavailable
from troupe.storage import StorageError

from ._errors import (
    HostError,
    code_for_status,
    code_internal_error,
    code_method_not_allowed,
    code_unavailable,
    error_document,
    error_response_parts,
    host_error_envelope,
    retry_after_seconds_unknown,
)
from ._gate import HostGate, NoStore
from ._intake_route import IntakeRoute
from ._openapi import docs_page, openapi_document
from ._routes_events import EventsRoute, install_event_routes
from ._routes_goals import install_goal_routes
from ._routes_learning import install_learning_routes
from ._routes_media import install_media_routes
from ._routes_notifications import install_notification_routes
from ._routes_recall import install_recall_routes
from ._routes_state import install_state_routes
from ._schemas import decode_json_body

ask_timeout_seconds = 60.0
"""How long a handler waits for the entry actor (a 1000-message batch is one transaction)."""

json_content_type = "application/json"


@dataclass(frozen=True)
class HostAppDependencies:
    """The running parts the host app uses."""

    env: Any
    engine: Any
    system: Any
    readiness: Callable[[], bool]
    allowed_hosts: Iterable[str] = ()
    rate_per_second: float = rate_per_second_default
    rate_burst: int = burst_default
    shutdown: Any = None
    """The server's ``ShutdownSignal`` (SIGINT/SIGTERM end every events stream first); None
    for an embedded app, which calls ``app.state.events.shutdown()`` itself."""
    event_settings: Any = None
    """``EventSettings`` for ``/events`` (None: the contract's limits)."""


class EntryIdConverter(BaseConverter):
    """Matches the whole entry segment (slashes included); the gate has validated it."""

    regex = ".*"
    part_isolating = False


def create_host_app(dependencies: HostAppDependencies) -> QuartTrio:
    """The host quart-trio app, already wrapped in its middleware stack."""
    app = QuartTrio("troupe.host")
    app.config["MAX_CONTENT_LENGTH"] = None  # the gate's per-route BodyLimit counts instead
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False  # no CORS pre-flight answers
    app.url_map.converters["entry"] = EntryIdConverter
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    _install_errors(app, dependencies)
    _install_routes(app, dependencies)
    rate_buckets = RateBuckets(
        dependencies.env.clock.monotonic,
        rate_per_second=dependencies.rate_per_second,
        burst=dependencies.rate_burst,
    )
    intake = IntakeRoute(system=dependencies.system, ask=ask_actor, wall=dependencies.env.clock.wall)
    gate = HostGate(
        EventsRoute(app.asgi_app, app.state.events),
        intake=intake,
        engine=dependencies.engine,
        readiness=dependencies.readiness,
        rate_buckets=rate_buckets,
        wall=dependencies.env.clock.wall,
    )
    checked = HostCheck(gate, allowed_hosts=dependencies.allowed_hosts, envelope=host_error_envelope)
    app.asgi_app = SendGuard(NoStore(checked))  # type: ignore[method-assign]
    return app


def _json(document: Any, status: int = 200) -> Response:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, content_type=json_content_type)


def _install_errors(app: QuartTrio, dependencies: HostAppDependencies) -> None:
    wall = dependencies.env.clock.wall

    @app.errorhandler(HostError)
    async def _host_error(error: HostError) -> Response:
        status, headers, body = error_response_parts(error, wall())
        response = Response(body, status=status, content_type=json_content_type)
        response.headers.update(headers)
        return response

    @app.errorhandler(StorageError)
    async def _storage_error(error: StorageError) -> Response:
        # Storage that cannot be read or written right now (I/O error, full disk, closing) is
        # the client's 503 with Retry-After, whichever route met it: retrying is the answer.
        return await _host_error(HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown))

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if isinstance(error, MethodNotAllowed):
            response = _json(error_document(code_method_not_allowed), 400)
            response.headers["Allow"] = ", ".join(sorted(error.valid_methods or ()))
            return response
        return _json(error_document(code_for_status(status)), status)

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        app.logger.exception("unhandled error in a host request handler", exc_info=error)
        return _json(error_document(code_internal_error), 500)


async def _json_body() -> Any:
    """The request body as JSON, or ``HostError`` 400 (content type, encoding, syntax)."""
    data = await request.get_data(cache=False, as_text=False)
    return decode_json_body(request.mimetype, data)


async def ask_actor(system: Any, kind: str, key: str, message: Any) -> Any:
    """Ask an actor, turning runtime failures into the contract's statuses (503 / 500)."""
    try:
        return await system.ref(kind, key).ask(message, timeout=ask_timeout_seconds)
    except (Overloaded, Unavailable) as exc:
        seconds = max(retry_after_seconds_unknown, round(exc.retry_after_seconds + 0.5))
        raise HostError(503, code_unavailable, retry_after_seconds=seconds) from exc
    except AskTimeout as exc:
        # The write may still commit: the client retries with the same dedupe keys.
        raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown) from exc
    except ActorCrashed as exc:
        raise HostError(500, code_internal_error) from exc


def _install_routes(app: QuartTrio, dependencies: HostAppDependencies) -> None:
    install_media_routes(app, dependencies)
    install_state_routes(app, dependencies)
    install_recall_routes(app, dependencies)
    install_learning_routes(app, dependencies)
    install_goal_routes(app, dependencies)
    install_notification_routes(app, dependencies)
    install_event_routes(app, dependencies)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return _json(openapi_document())

    @app.get("/docs")
    async def docs() -> Response:
        return Response(docs_page(), status=200, content_type="text/html; charset=utf-8")


__all__ = ["EntryIdConverter", "HostAppDependencies", "ask_actor", "create_host_app"]
