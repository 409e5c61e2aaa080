"""The knowledge surface's ASGI gate: request id, Host, route, schema readiness, body limit.

The listener is loopback-only and the contract has no authentication (the desktop agent and
the local UI call it), so the gate keeps the rest of the machine's web content out (DNS
rebinding through the Host header) and refuses early what needs no handler.  In order:

1. the request id: a valid incoming ``X-Request-Id`` or a new ``req_...`` from the Env, left
   in the scope (``request_id_key``) and added to EVERY response's headers, the gate's own
   refusals included;
2. Host (400 ``INVALID_REQUEST``): loopback names, any port, plus the configured extra names;
3. route (404 ``NOT_FOUND``, 405 ``METHOD_NOT_ALLOWED`` with ``Allow``), matched on the raw
   path (``_routes``); ``/events`` without a WebSocket upgrade is 400;
4. schema readiness (503 ``SCHEMA_NOT_READY``) for everything but the handshake routes, while
   the database lags the code's migrations;
5. the route's body limit (413 ``PAYLOAD_TOO_LARGE``), counted while the body streams, chunked
   bodies included (the shared ``BodyLimit`` with this contract's envelope).

A WebSocket handshake goes through 1, 2 and 3 too: a refused one is closed before it is
accepted (hypercorn answers it 403).

Everything happens at the ASGI layer, so no framework code runs and no body is read for a
request that will be refused; each early refusal reads and drops what the client is still
sending, within a budget (``send_lingering``), so the client reads its answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from troupe.http import ASGIApp, BodyLimit, HostCheck, send_lingering
from troupe.storage import StorageError

from ._errors import (
    KnowledgeError,
    code_invalid_request,
    code_method_not_allowed,
    code_not_found,
    code_schema_not_ready,
    envelope_for,
    error_body,
    overloaded,
    request_id_key,
    valid_request_id,
)
from ._routes import RouteMatch, events_path, handshake_operations, match_route

route_key = "troupe.knowledge.route"
"""Where the gate leaves the request's ``RouteMatch`` in the ASGI scope."""

request_id_header_bytes = b"x-request-id"
websocket_policy_violation = 1008

SchemaReady = Callable[[], Awaitable[bool]]
NewRequestId = Callable[[], str]


def route_of(scope: Mapping[str, Any]) -> RouteMatch:
    route = scope.get(route_key)
    assert isinstance(route, RouteMatch), "knowledge routes run behind KnowledgeGate"
    return route


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class KnowledgeGate:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, *, new_request_id: NewRequestId, schema_ready: SchemaReady,
                 allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.new_request_id = new_request_id
        self.schema_ready = schema_ready
        self.host_check = HostCheck(app, allowed_hosts=allowed_hosts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = valid_request_id(_header(scope, request_id_header_bytes)) or self.new_request_id()
        scope[request_id_key] = request_id
        if kind == "websocket":
            await self._websocket(scope, receive, send)
            return
        send = _with_request_id(send, request_id)
        refusal, route = await self._admit(scope)
        if refusal is not None:
            await _send_refusal(receive, send, refusal, request_id)
            return
        assert route is not None and route.operation is not None
        scope[route_key] = route
        limit = BodyLimit(self.app, request_body_bytes_max=route.operation.body_bytes_max,
                          envelope=envelope_for(request_id))
        await limit(scope, receive, send)

    async def _admit(self, scope: Any) -> tuple[KnowledgeError | None, RouteMatch | None]:
        if not self.host_check.allows(_header(scope, b"host")):
            return KnowledgeError(code_invalid_request, "the Host header is not allowed on this listener"), None
        route = match_route(scope["method"], scope["path"])
        if route is None:
            return KnowledgeError(code_not_found, "no such route"), None
        if route.operation is None:
            return KnowledgeError(code_method_not_allowed, "method not allowed",
                                  headers={"Allow": ", ".join(route.allowed_methods)}), None
        if route.operation.path == events_path:
            return KnowledgeError(code_invalid_request, "connect to /events with a WebSocket upgrade"), None
        if route.operation.name in handshake_operations:
            return None, route
        try:
            ready = await self.schema_ready()
        except StorageError:
            # The routes answer a storage error 503 with Retry-After; so does the gate.
            return overloaded("storage is unavailable; retry shortly"), None
        if not ready:
            return KnowledgeError(code_schema_not_ready, "the database schema is not migrated to this version",
                                  headers={"Retry-After": "5"}), None
        return None, route

    async def _websocket(self, scope: Any, receive: Any, send: Any) -> None:
        if (not self.host_check.allows(_header(scope, b"host")) or scope["path"] != events_path
                or not await self._schema_ready()):
            await send({"type": "websocket.close", "code": websocket_policy_violation})
            return
        await self.app(scope, receive, send)

    async def _schema_ready(self) -> bool:
        """Whether the schema is migrated; a storage error reading it refuses the handshake."""
        try:
            return await self.schema_ready()
        except StorageError:
            return False


def _with_request_id(send: Any, request_id: str) -> Any:
    header = (request_id_header_bytes, request_id.encode("ascii"))

    async def send_with_id(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = [pair for pair in message.get("headers", ()) if pair[0].lower() != request_id_header_bytes]
            message = {**message, "headers": [*headers, header]}
        await send(message)

    return send_with_id


async def _send_refusal(receive: Any, send: Any, error: KnowledgeError, request_id: str) -> None:
    body = error_body(error.code, error.message, request_id)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()),
    ]
    await send_lingering(receive, send, error.status, headers, body)


__all__ = ["KnowledgeGate", "route_key", "route_of"]
