"""ASGI middleware every surface runs behind: final-send shield, Host check, body limit.

Why ASGI middleware rather than quart hooks: each of these must act before (or regardless of)
the framework.  Werkzeug's ``trusted_hosts`` fails inside quart-trio's context set-up with an
exception group instead of a 400; quart's ``MAX_CONTENT_LENGTH`` never sees a chunked body read
with ``async for chunk in request.body``; and the final-send bug lives between quart-trio and
hypercorn.  At the ASGI layer the three are small and framework-independent.

The stack, outermost first (``protect``):

1. ``SendGuard`` runs the final ``http.response.body`` send (the one without ``more_body``)
   inside a shielded cancel scope.  quart-trio cancels its request nursery as soon as the
   response is sent; when the app answered before reading the whole upload (a 413, an early
   401), that cancellation used to interrupt hypercorn's socket close inside the final send,
   so the connection stayed open and hypercorn kept reading and discarding the upload.  The
   shield lets the close finish.  Every send is also bounded by ``send_seconds_max``: a client
   that stopped reading (or vanished without closing) is found by a send that does not
   finish, and ``SendTimeout`` drops it instead of holding a task and a buffer forever.
2. ``HostCheck`` answers 400 ``bad_host`` unless the Host header names this machine's loopback
   (``127.0.0.1``, ``localhost``, ``[::1]``, any port) or a configured extra name.  This is
   the DNS-rebinding defence for listeners on loopback.
3. ``BodyLimit`` counts request body bytes as they stream in and answers 413
   ``payload_too_large`` at the limit, whatever Content-Length says and for chunked bodies too
   (a declared length over the limit is refused before the app runs).  The app is cancelled
   when the limit is crossed; if it had already started its response, the response is cut
   short instead (the status line has gone).  After the 413 is sent, the rest of the upload
   is read and discarded up to ``linger_bytes_max`` bytes (a declared length up to the limit
   plus that budget is absorbed whole) and ``linger_seconds_max`` seconds before the response
   is ended (a *lingering close*, as nginx does): hypercorn closes the socket right after the
   final send, and closing with unread data makes the kernel send a reset, which can destroy
   the 413 in the client's receive buffer before a client that is still writing (httpx,
   curl) reads it.  A slightly-too-large body therefore gets a clean
   413; a huge one is still cut off after the linger budget.

Trade-off: the middleware formats nothing itself; rejections use the surface's
``ErrorEnvelope``, so each contract keeps its own error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import trio

from ._envelope import ErrorBody, ErrorEnvelope, default_error_envelope
from ._exceptions import SendTimeout

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

request_body_bytes_max_default = 1024 * 1024
"""Request bodies above this are refused with 413 unless a surface asks for more."""

send_seconds_max_default = 30.0
"""A single send to the client (headers or one body chunk) may take at most this long."""

send_seconds_scope_key = "troupe.http.send_seconds_max"
"""A streaming handler may put a tighter per-send bound for its own response in the ASGI scope
under this key (an SSE stream: 5 s per frame, then 1 s for the final send); ``SendGuard`` reads
it at every send, so the handler can tighten it just before the final one."""

linger_bytes_max = 1024 * 1024
"""After refusing a body, read and discard at most this much more of it (lingering close)."""

linger_seconds_max = 2.0
"""...and for at most this long."""

loopback_host_names = ("127.0.0.1", "localhost", "[::1]")
"""Host header values (without port) always accepted."""

assert request_body_bytes_max_default > 0
assert send_seconds_max_default > 0
assert linger_bytes_max > 0 and linger_seconds_max > 0


def _error_start(status: int, error: ErrorBody) -> Message:
    """The ``http.response.start`` of an error body made by an ``ErrorEnvelope``."""
    return {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", error.content_type.encode("latin-1")),
            (b"content-length", str(len(error.body)).encode("ascii")),
        ],
    }


async def send_error(send: Send, envelope: ErrorEnvelope, status: int, code: str, message: str) -> None:
    """Send a complete error response built by ``envelope`` and close the exchange."""
    error = envelope(status, code, message)
    await send(_error_start(status, error))
    await send({"type": "http.response.body", "body": error.body, "more_body": False})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


class SendGuard:
    """Shield the final response send and bound every send (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, send_seconds_max: float = send_seconds_max_default) -> None:
        assert send_seconds_max > 0
        self.app = app
        self.send_seconds_max = send_seconds_max

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def guarded_send(message: Message) -> None:
            final = message["type"] == "http.response.body" and not message.get("more_body", False)
            seconds = min(self.send_seconds_max, scope.get(send_seconds_scope_key, self.send_seconds_max))
            # The shield keeps quart-trio's cancellation out; the scope's own deadline still
            # applies, so even the final send cannot hang forever.
            with trio.CancelScope(shield=final, relative_deadline=seconds) as scope_:
                await send(message)
            if scope_.cancelled_caught:
                raise SendTimeout(f"a response send took longer than {seconds}s")

        await self.app(scope, receive, guarded_send)


class HostCheck:
    """Refuse requests whose Host header is not loopback or an allowed extra name."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Iterable[str] = (),
        envelope: ErrorEnvelope = default_error_envelope,
    ) -> None:
        self.app = app
        self.allowed_hosts = frozenset(
            _normalize_host_name(name) for name in (*loopback_host_names, *allowed_hosts)
        )
        self.envelope = envelope

    def allows(self, host_header: bytes | None) -> bool:
        """True when ``host_header`` (``name[:port]``) names an allowed host."""
        if not host_header:
            return False
        try:
            text = host_header.decode("ascii")
        except UnicodeDecodeError:
            return False
        name = _host_without_port(text)
        return name is not None and _normalize_host_name(name) in self.allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self.allows(_header(scope, b"host")):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send_error(send, self.envelope, 400, "bad_host", "the Host header is not allowed on this listener")
            return
        await self.app(scope, receive, send)


def _host_without_port(text: str) -> str | None:
    """``"[::1]:8700"`` -> ``"[::1]"``, ``"localhost:80"`` -> ``"localhost"``; None if malformed."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        name, rest = text[: end + 1], text[end + 1 :]
    else:
        name, _, port = text.partition(":")
        rest = f":{port}" if port or text.endswith(":") else ""
    if rest and not (rest.startswith(":") and rest[1:].isdigit() and len(rest) <= 6):
        return None
    return name or None


def _normalize_host_name(name: str) -> str:
    return name.strip().lower().rstrip(".")


class BodyLimit:
    """413 at ``request_body_bytes_max`` bytes of request body, counted while streaming."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        request_body_bytes_max: int = request_body_bytes_max_default,
        envelope: ErrorEnvelope = default_error_envelope,
    ) -> None:
        assert request_body_bytes_max >= 0
        self.app = app
        self.request_body_bytes_max = request_body_bytes_max
        self.envelope = envelope

    @staticmethod
    def _declared_length(scope: Scope) -> int | None:
        declared = _header(scope, b"content-length")
        if declared is None:
            return None
        try:
            return int(declared)
        except ValueError:
            return None  # hypercorn's h11 refuses a malformed Content-Length before us

    async def _reject(self, receive: Receive, send: Send, *, unread_bytes: int | None) -> None:
        """413, then a lingering close: the error body goes out complete (Content-Length) but
        the exchange is only ended after discarding what the client is still sending, within
        the linger budget.  ``unread_bytes``: what the declared length says is still to come
        (None when unknown); beyond the budget there is no point in lingering."""
        limit = self.request_body_bytes_max
        error = self.envelope(413, "payload_too_large", f"the request body exceeds {limit} bytes")
        await send(_error_start(413, error))
        await send({"type": "http.response.body", "body": error.body, "more_body": True})
        if unread_bytes is None or unread_bytes < 0:  # unknown, or the declared length lied
            await discard_request_body(receive, bytes_max=linger_bytes_max)
        elif unread_bytes <= limit + linger_bytes_max:
            # A declared body a little over the limit is absorbed whole, so the client
            # reliably reads its 413; a huge one is not worth reading at all.
            await discard_request_body(receive, bytes_max=unread_bytes)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = self._declared_length(scope)
        if declared is not None and declared > self.request_body_bytes_max:
            await self._reject(receive, send, unread_bytes=declared)
            return
        received_bytes = 0
        exceeded = False
        response_started = False

        with trio.CancelScope() as app_scope:

            async def counted_receive() -> Message:
                nonlocal received_bytes, exceeded
                message = await receive()
                if message["type"] == "http.request":
                    received_bytes += len(message.get("body", b""))
                    if received_bytes > self.request_body_bytes_max:
                        exceeded = True
                        app_scope.cancel()
                        await trio.lowlevel.checkpoint()  # raises Cancelled: the app stops here
                return message

            async def tracked_send(message: Message) -> None:
                nonlocal response_started
                if message["type"] == "http.response.start":
                    response_started = True
                await send(message)

            await self.app(scope, counted_receive, tracked_send)

        if exceeded and not response_started:
            unread = None if declared is None else declared - received_bytes
            await self._reject(receive, send, unread_bytes=unread)


async def discard_request_body(receive: Receive, *, bytes_max: int = linger_bytes_max) -> None:
    """Read and drop the rest of the request body: at most ``bytes_max`` bytes and
    ``linger_seconds_max`` seconds."""
    discarded_bytes = 0
    with trio.move_on_after(linger_seconds_max):
        while discarded_bytes <= bytes_max:
            message = await receive()
            if message["type"] != "http.request":
                return  # http.disconnect: the client has gone
            discarded_bytes += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def send_lingering(
    receive: Receive, send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    """A complete response (``headers`` must carry its Content-Length) sent before the request
    body was read, then a lingering close: the exchange ends only after discarding what the
    client is still sending (bounded), so the client reads the answer instead of a reset.
    What every surface's gate uses for its early refusals."""
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    await discard_request_body(receive)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def protect(
    app: ASGIApp,
    *,
    envelope: ErrorEnvelope = default_error_envelope,
    allowed_hosts: Iterable[str] = (),
    request_body_bytes_max: int = request_body_bytes_max_default,
    send_seconds_max: float = send_seconds_max_default,
) -> ASGIApp:
    """Wrap ``app`` in the full stack: ``SendGuard(HostCheck(BodyLimit(app)))``.

    For a quart app: ``app.asgi_app = protect(app.asgi_app, ...)`` keeps lifespan and the test
    client working (both go through ``asgi_app``).
    """
    limited = BodyLimit(app, request_body_bytes_max=request_body_bytes_max, envelope=envelope)
    checked = HostCheck(limited, allowed_hosts=allowed_hosts, envelope=envelope)
    return SendGuard(checked, send_seconds_max=send_seconds_max)


__all__ = [
    "ASGIApp",
    "BodyLimit",
    "discard_request_body",
    "HostCheck",
    "SendGuard",
    "linger_bytes_max",
    "linger_seconds_max",
    "loopback_host_names",
    "protect",
    "request_body_bytes_max_default",
    "send_error",
    "send_lingering",
    "send_seconds_max_default",
    "send_seconds_scope_key",
]
