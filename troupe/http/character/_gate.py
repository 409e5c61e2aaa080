"""The character surface's ASGI gate: Host, Origin, route, limited mode, name, body limit.

The listener is loopback-only and the contract calls it an internal service, so nothing here
authenticates: the gate's job is to keep the rest of the machine's web content out (DNS
rebinding through the Host header, a browser page posting through ``Origin``), to refuse
early what the contract refuses (limited mode, an invalid name) and to bound bodies.  The
order:

1. Host (400 ``{"detail": "Invalid host header"}``): loopback names, any port, plus the
   configured extra names;
2. Origin (403 ``{"detail": "Origin not allowed"}``): when present it must be an ``http`` or
   ``https`` origin on a loopback name (or an extra name); ``Origin: null`` is refused;
3. route (404 / 405 with ``Allow``), matched on the raw path (``_routes``);
4. limited mode (409, the contract's ``storage_startup_blocked`` body) for every route but
   ``/health``, ``/shutdown`` and the two ``/internal/storage/startup/*`` ones; the state is
   the lifecycle actor's, asked once per request;
5. ``{lanlan_name}`` (400 ``{"detail": "Invalid lanlan_name: ..."}``) with
   ``character_name_problem``;
6. the route's body limit (413), counted while the body streams, chunked bodies included.

Everything happens at the ASGI layer, so no framework code runs and no body is read for a
request that will be refused; each early refusal reads and drops what the client is still
sending, within a budget, so the client reads its answer instead of a connection reset.
A request that passes carries its ``RouteMatch`` in the scope under ``route_key``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import trio

from troupe.actors.character import character_name_problem
from troupe.http import ASGIApp, BodyLimit, HostCheck

from ._errors import CharacterError, detail_document, detail_error_envelope, encode_document
from ._routes import RouteMatch, match_route, operations

route_key = "troupe.character.route"
"""Where the gate leaves the request's ``RouteMatch`` in the ASGI scope."""

linger_bytes_max = 1024 * 1024
linger_seconds_max = 2.0
"""After an early refusal, read and drop at most this much of the unread body, this long."""

assert linger_bytes_max > 0 and linger_seconds_max > 0

origin_schemes = frozenset({"http", "https"})

LimitedModeCheck = Callable[[], Awaitable[dict[str, Any] | None]]
"""``await check()`` -> the 409 body while limited mode is on, else None; raises
``CharacterError`` (503) when the state cannot be read."""


def route_of(scope: Mapping[str, Any]) -> RouteMatch:
    route = scope.get(route_key)
    assert isinstance(route, RouteMatch), "character routes run behind CharacterGate"
    return route


class CharacterGate:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limited_mode: LimitedModeCheck,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.limited_mode = limited_mode
        self.host_check = HostCheck(app, allowed_hosts=allowed_hosts)
        self._limited = {
            cap: BodyLimit(app, request_body_bytes_max=cap, envelope=detail_error_envelope)
            for cap in {operation.body_bytes_max for operation in operations}
        }

    def origin_allowed(self, origin: bytes | None) -> bool:
        """No Origin (a non-browser client) or a loopback / allowed-name origin."""
        if origin is None:
            return True
        try:
            parts = urlsplit(origin.decode("ascii"))
            host_and_port = parts.netloc
        except (UnicodeDecodeError, ValueError):
            return False
        if parts.scheme not in origin_schemes or parts.path or parts.query or "@" in host_and_port:
            return False
        return self.host_check.allows(host_and_port.encode("ascii"))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            route = await self._admit(scope)
        except CharacterError as refusal:
            await send_refusal(receive, send, refusal)
            return
        scope[route_key] = route
        assert route.operation is not None
        await self._limited[route.operation.body_bytes_max](scope, receive, send)

    async def _admit(self, scope: Any) -> RouteMatch:
        """The route this request may run, or ``CharacterError`` with the refusal."""
        if not self.host_check.allows(_header(scope, b"host")):
            raise CharacterError(400, detail_document(400, "Invalid host header"))
        if not self.origin_allowed(_header(scope, b"origin")):
            raise CharacterError(403, detail_document(403, "Origin not allowed"))
        route = match_route(scope["method"], _raw_path(scope))
        if route is None:
            raise CharacterError(404)
        if route.operation is None:
            raise CharacterError(405, headers={"Allow": ", ".join(route.allowed_methods)})
        if route.operation.limited:
            blocked = await self.limited_mode()
            if blocked is not None:
                raise CharacterError(409, blocked)
        name = route.character_name
        if name is not None:
            problem = character_name_problem(name)
            if problem is not None:
                raise CharacterError(400, detail_document(400, f"Invalid lanlan_name: {problem}"))
        return route


def _raw_path(scope: Mapping[str, Any]) -> str:
    raw = scope.get("raw_path")
    if not raw:
        return str(scope["path"])
    return bytes(raw).split(b"?", 1)[0].decode("latin-1")


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


async def send_refusal(receive: Any, send: Any, error: CharacterError) -> None:
    """Send ``error`` whole, then linger: read and drop the unread body within the budget."""
    body = encode_document(error.document)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await _discard_body(receive)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _discard_body(receive: Any) -> None:
    discarded_bytes = 0
    with trio.move_on_after(linger_seconds_max):
        while discarded_bytes <= linger_bytes_max:
            message = await receive()
            if message["type"] != "http.request":
                return
            discarded_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


__all__ = [
    "CharacterGate",
    "LimitedModeCheck",
    "linger_bytes_max",
    "linger_seconds_max",
    "route_key",
    "route_of",
    "send_refusal",
]
