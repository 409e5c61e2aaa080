"""An in-process ASGI 3 driver that streams: the simulator's (and tests') HTTP client side.

Why our own driver: ``httpx.ASGITransport`` buffers the whole response before the caller sees a
byte, so an SSE stream whose frames are sent a simulated second apart would arrive as one chunk
at the end, and a stream that never ends would never arrive.  The simulator needs what a socket
gives: each ``http.response.body`` chunk handed to the client when the app sends it, at the
simulated time it is sent, and a client that can hang up mid-stream.  Everything is plain trio
(memory channels, events, cancel scopes): no sockets, no threads, so it runs on the MockClock
and is as deterministic as the rest of the simulation.

What it mimics from hypercorn, so an app behaves here as it does behind ``troupe serve``:

- the request body is delivered as ``http.request`` messages (``more_body`` while chunks
  remain); after it, ``receive()`` blocks until the exchange is over and then returns
  ``http.disconnect``;
- an app that raises before starting its response gets a 500 with an empty body (hypercorn
  logs and answers 500); the error is counted in ``AsgiDriver.app_errors`` so a workload can
  treat it as a bug; sends after the client hung up are dropped;
- lifespan: ``startup``/``shutdown`` exchange ``lifespan.*`` messages with a task that lives
  in a nursery the caller provides (quart-trio keeps ``app.nursery`` open inside it); an app
  that fails the lifespan scope itself runs without lifespan, as under hypercorn.

Bounds: a response body cap (``response_body_bytes_max``), a time limit for a whole buffered
request and for the response start of a stream (``request_seconds_max``), a bounded queue of
response messages (an app streaming to a client that does not read is back-pressured, as by a
full socket), and a grace period after a hang-up after which an app that ignores
``http.disconnect`` is cancelled.

``AsgiTransport`` adapts a driver to ``httpx.AsyncBaseTransport`` (streaming, unlike
``httpx.ASGITransport``), so a workload can use an ordinary ``httpx.AsyncClient``.  Its
exchanges outlive ``handle_async_request`` (the body is read later), so they run in a nursery
given to the transport.

Trade-off: HTTP/1.1 semantics only (no trailers, pushes or websockets), and headers are passed
as given (no h11 validation); the apps under test are ours.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable, AsyncIterator, Iterable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import trio

response_body_bytes_max_default = 16 * 1024 * 1024
"""A response body longer than this fails the request with ``ResponseTooLarge``."""

request_seconds_max_default = 60.0
"""A buffered request, or a stream's response start, must arrive within this (simulated) time."""

response_messages_buffered = 16
"""Response messages queued between app and client before the app's ``send`` waits."""

disconnect_grace_seconds = 5.0
"""After the client hangs up, the app has this long to finish before it is cancelled."""

lifespan_seconds_max = 60.0
"""Lifespan startup or shutdown must complete within this (simulated) time."""

server_address = ("127.0.0.1", 8700)
client_address = ("127.0.0.1", 50000)
"""What the ``server`` and ``client`` scope entries say: fixed, so traces do not vary."""

assert response_body_bytes_max_default > 0
assert request_seconds_max_default > 0 and lifespan_seconds_max > 0
assert response_messages_buffered > 0 and disconnect_grace_seconds > 0

Message = MutableMapping[str, Any]
RequestBody = bytes | Iterable[bytes] | AsyncIterable[bytes]
"""A whole body, or chunks sent one ``http.request`` message each (``more_body`` between)."""


class AsgiError(Exception):
    """The exchange with the app failed (base class of the driver's errors)."""


class AsgiTimeout(AsgiError):
    """The response (or its start, for a stream) did not arrive within the time limit."""


class ResponseTooLarge(AsgiError):
    """The response body exceeded the driver's cap."""


class IncompleteResponse(AsgiError):
    """The app returned after starting a response without finishing it."""


class LifespanFailed(AsgiError):
    """The app reported ``lifespan.startup.failed`` or ``lifespan.shutdown.failed``."""


@dataclass(frozen=True)
class AsgiResponse:
    """A whole (buffered) response."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        return _find_header(self.headers, name)

    def json(self) -> Any:
        import json

        return json.loads(self.body)


def _find_header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers:
        if key == wanted:
            return value
    return None


class _Exchange:
    """One request/response between the driver and the app, seen from both sides."""

    def __init__(self, driver: AsgiDriver, scope: Message, body: RequestBody) -> None:
        self._driver = driver
        self.scope = scope
        self._chunks = _ChunkSource(body)
        self._body_done = False
        self.hung_up = trio.Event()
        self.finished = trio.Event()
        self._response_started = False
        self._response_done = False
        self._to_client, self._from_app = trio.open_memory_channel[Message](response_messages_buffered)

    # ------------------------------------------------------------------ the app's side
    async def receive(self) -> Message:
        if not self._body_done and not self.hung_up.is_set():
            chunk = await self._chunks.next()
            if chunk is None:
                self._body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return {"type": "http.request", "body": chunk, "more_body": True}
        await self.hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.hung_up.is_set() or self._response_done:
            return  # like hypercorn: the app may finish after the client has gone
        kind = message["type"]
        if kind == "http.response.start":
            assert not self._response_started, "http.response.start sent twice"
            self._response_started = True
        elif kind == "http.response.body":
            assert self._response_started, "http.response.body before http.response.start"
            self._response_done = not message.get("more_body", False)
        else:
            raise AsgiError(f"unexpected ASGI message {kind!r}")
        try:
            await self._to_client.send(dict(message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the client stopped reading and hung up meanwhile

    async def run(self, app: Any) -> None:
        """Run the app for this exchange; bounded after a hang-up by the disconnect grace."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_app, app, nursery.cancel_scope)
                nursery.start_soon(self._cancel_after_grace, nursery.cancel_scope)
        finally:
            self._to_client.close()
            self.finished.set()

    async def _run_app(self, app: Any, scope: trio.CancelScope) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except Exception as error:  # noqa: BLE001 - the app's bug becomes a 500, as in hypercorn
            self._driver.app_errors.append(f"{self.scope['method']} {self.scope['path']}: {error!r}")
            if not self._response_started:
                await self.send({"type": "http.response.start", "status": 500, "headers": [(b"content-length", b"0")]})
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        scope.cancel()

    async def _cancel_after_grace(self, scope: trio.CancelScope) -> None:
        await self.hung_up.wait()
        await trio.sleep(disconnect_grace_seconds)
        scope.cancel()

    # ------------------------------------------------------------------ the client's side
    def hang_up(self) -> None:
        """The client is gone (or done): the app's next ``receive`` is ``http.disconnect``."""
        self.hung_up.set()
        self._from_app.close()

    async def read_start(self) -> tuple[int, tuple[tuple[str, str], ...]]:
        try:
            message = await self._from_app.receive()
        except trio.EndOfChannel:
            raise IncompleteResponse("the app returned without sending a response") from None
        assert message["type"] == "http.response.start"
        headers = tuple(
            (bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
            for name, value in message.get("headers", ())
        )
        return int(message["status"]), headers

    async def read_chunks(self, body_bytes_max: int) -> AsyncIterator[bytes]:
        received_bytes = 0
        while True:
            try:
                message = await self._from_app.receive()
            except trio.EndOfChannel:
                raise IncompleteResponse("the app returned in the middle of its response body") from None
            except trio.ClosedResourceError:
                return  # closed by our own hang-up
            chunk = bytes(message.get("body", b""))
            received_bytes += len(chunk)
            if received_bytes > body_bytes_max:
                self.hang_up()
                raise ResponseTooLarge(f"the response body exceeds {body_bytes_max} bytes")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                self.hang_up()  # the exchange is over: the app now sees http.disconnect
                return


class _ChunkSource:
    """The request body as successive chunks, whatever form it was given in."""

    def __init__(self, body: RequestBody) -> None:
        if isinstance(body, (bytes, bytearray, memoryview)):
            self._sync: Iterable[bytes] | None = iter([bytes(body)] if body else [])
            self._async = None
        elif isinstance(body, AsyncIterable):
            self._sync, self._async = None, body.__aiter__()
        else:
            self._sync, self._async = iter(body), None

    async def next(self) -> bytes | None:
        """The next non-empty chunk, or None at the end."""
        while True:
            if self._async is not None:
                try:
                    chunk = await self._async.__anext__()
                except StopAsyncIteration:
                    return None
            else:
                await trio.lowlevel.checkpoint()
                chunk = next(self._sync, None)  # type: ignore[call-overload]
                if chunk is None:
                    return None
            if chunk:
                return bytes(chunk)


class AsgiStream:
    """A response being received: ``status`` and ``headers`` now, the body chunk by chunk.

    ``async for chunk in stream`` yields each non-empty body chunk when the app sends it.
    """

    def __init__(self, exchange: _Exchange, status: int, headers: tuple[tuple[str, str], ...], body_bytes_max: int) -> None:
        self._exchange = exchange
        self.status = status
        self.headers = headers
        self._chunks = exchange.read_chunks(body_bytes_max)

    def header(self, name: str) -> str | None:
        return _find_header(self.headers, name)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def read(self) -> bytes:
        """The rest of the body."""
        return b"".join([chunk async for chunk in self._chunks])

    async def aclose(self) -> None:
        self._exchange.hang_up()
        await self._chunks.aclose()


class AsgiDriver:
    """Speak ASGI 3 to ``app`` in-process (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        response_body_bytes_max: int = response_body_bytes_max_default,
        request_seconds_max: float = request_seconds_max_default,
        app_errors_kept_max: int = 100,
    ) -> None:
        assert response_body_bytes_max > 0 and request_seconds_max > 0
        self.app = app
        self.response_body_bytes_max = response_body_bytes_max
        self.request_seconds_max = request_seconds_max
        self.app_errors: list[str] = []
        """What the app raised (it got a 500); a workload may treat any entry as a bug."""
        self.requests = 0
        self.state: dict[str, Any] = {}
        self._lifespan_send: trio.MemorySendChannel[Message] | None = None
        self._lifespan_started = trio.Event()
        self._lifespan_stopped = trio.Event()
        self._lifespan_failure: str | None = None
        self._lifespan_supported = True

    # ------------------------------------------------------------------ requests
    def _scope(self, method: str, path: str, headers: Iterable[tuple[str, str]], body: RequestBody, host: str) -> Message:
        raw_path, _, query = path.partition("?")
        header_list = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
        names = {name for name, _ in header_list}
        if b"host" not in names:
            header_list.insert(0, (b"host", host.encode("latin-1")))
        if isinstance(body, (bytes, bytearray, memoryview)):
            if body and b"content-length" not in names:
                header_list.append((b"content-length", str(len(body)).encode("ascii")))
        elif b"content-length" not in names and b"transfer-encoding" not in names:
            header_list.append((b"transfer-encoding", b"chunked"))
        self.requests += 1
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method.upper(),
            "scheme": "http",
            "path": raw_path,
            "raw_path": raw_path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": header_list,
            "client": client_address,
            "server": server_address,
            "state": dict(self.state),
            "extensions": {},
        }

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        body: RequestBody = b"",
        host: str = "127.0.0.1",
        start_seconds_max: float | None = None,
    ) -> AsyncIterator[AsgiStream]:
        """Send a request and hand over the response as soon as its start arrives.

        Leaving the block hangs up: an app still streaming sees ``http.disconnect`` (quart-trio
        cancels its response generator) and the block waits for the app to finish, at most
        ``disconnect_grace_seconds``.  ``start_seconds_max`` bounds only the wait for the
        status line; bound the body yourself (streams may be endless).
        """
        exchange = _Exchange(self, self._scope(method, path, headers, body, host), body)
        limit = self.request_seconds_max if start_seconds_max is None else start_seconds_max
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(exchange.run, self.app)
                try:
                    with trio.move_on_after(limit) as start_scope:
                        status, response_headers = await exchange.read_start()
                    if start_scope.cancelled_caught:
                        raise AsgiTimeout(f"{method} {path}: no response within {limit}s")
                    response = AsgiStream(exchange, status, response_headers, self.response_body_bytes_max)
                    try:
                        yield response
                    finally:
                        await response.aclose()
                finally:
                    exchange.hang_up()
                    await exchange.finished.wait()
        except BaseExceptionGroup as group:
            # The exchange task never raises (the app's errors become a 500), so a group here
            # wraps the caller's own exception: hand it back unwrapped.
            if len(group.exceptions) == 1 and not isinstance(group.exceptions[0], BaseExceptionGroup):
                raise group.exceptions[0] from None
            raise

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Iterable[tuple[str, str]] = (),
        body: RequestBody = b"",
        host: str = "127.0.0.1",
        seconds_max: float | None = None,
    ) -> AsgiResponse:
        """Send a request and read the whole response, within ``seconds_max``
        (default ``request_seconds_max``)."""
        limit = self.request_seconds_max if seconds_max is None else seconds_max
        with trio.move_on_after(limit) as scope:
            async with self.stream(method, path, headers=headers, body=body, host=host, start_seconds_max=math.inf) as response:
                content = await response.read()
                return AsgiResponse(response.status, response.headers, content)
        assert scope.cancelled_caught
        raise AsgiTimeout(f"{method} {path}: no complete response within {limit}s")

    # ------------------------------------------------------------------ lifespan
    async def startup(self, nursery: trio.Nursery) -> None:
        """Start the lifespan task in ``nursery`` and wait for ``lifespan.startup.complete``.

        The task lives until ``shutdown()`` (or until ``nursery`` is cancelled, as at a
        simulated crash)."""
        assert self._lifespan_send is None, "startup() called twice"
        send, receive = trio.open_memory_channel[Message](2)
        self._lifespan_send = send
        nursery.start_soon(self._run_lifespan, receive)
        await send.send({"type": "lifespan.startup"})
        await self._wait_lifespan(self._lifespan_started, "startup")

    async def shutdown(self) -> None:
        """Ask for ``lifespan.shutdown`` and wait for it to complete."""
        if self._lifespan_send is None or not self._lifespan_supported:
            return
        if not self._lifespan_stopped.is_set():
            try:
                await self._lifespan_send.send({"type": "lifespan.shutdown"})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the lifespan task has already ended
        await self._wait_lifespan(self._lifespan_stopped, "shutdown")

    async def _wait_lifespan(self, event: trio.Event, phase: str) -> None:
        with trio.move_on_after(lifespan_seconds_max) as scope:
            await event.wait()
        if scope.cancelled_caught:
            raise AsgiTimeout(f"lifespan {phase} did not complete within {lifespan_seconds_max}s")
        if self._lifespan_failure is not None:
            raise LifespanFailed(self._lifespan_failure)

    async def _run_lifespan(self, receive_channel: trio.MemoryReceiveChannel[Message]) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": self.state}

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                self._lifespan_started.set()
            elif kind == "lifespan.shutdown.complete":
                self._lifespan_stopped.set()
            elif kind in ("lifespan.startup.failed", "lifespan.shutdown.failed"):
                self._lifespan_failure = f"{kind}: {message.get('message', '')}"
                self._lifespan_started.set()
                self._lifespan_stopped.set()
            else:
                raise AsgiError(f"unexpected lifespan message {kind!r}")

        try:
            await self.app(scope, receive_channel.receive, send)
        except Exception:  # noqa: BLE001 - like hypercorn: an app without lifespan support
            if not self._lifespan_started.is_set():
                self._lifespan_supported = False
        finally:
            self._lifespan_started.set()
            self._lifespan_stopped.set()
            receive_channel.close()

    # ------------------------------------------------------------------ httpx
    def transport(self, nursery: trio.Nursery) -> AsgiTransport:
        """An httpx transport over this driver whose exchanges run in ``nursery``."""
        return AsgiTransport(self, nursery)


class _ResponseBody(httpx.AsyncByteStream):
    def __init__(self, exchange: _Exchange, body_bytes_max: int) -> None:
        self._exchange = exchange
        self._chunks = exchange.read_chunks(body_bytes_max)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except IncompleteResponse as error:
            raise httpx.RemoteProtocolError(str(error)) from error
        except ResponseTooLarge as error:
            raise httpx.ReadError(str(error)) from error

    async def aclose(self) -> None:
        # Hanging up never waits: httpx may close a response from a cancelled task.
        self._exchange.hang_up()
        await self._chunks.aclose()


class AsgiTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncBaseTransport`` over an ``AsgiDriver``: bodies stream as the app sends.

    The URL's host only fills the Host header; every request goes to the driver's app.  A
    response-start timeout comes from the request's httpx ``read`` timeout when set.
    """

    def __init__(self, driver: AsgiDriver, nursery: trio.Nursery) -> None:
        self.driver = driver
        self._nursery = nursery

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        driver = self.driver
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw]
        body: RequestBody = request.stream if isinstance(request.stream, AsyncIterable) else b""
        target = request.url.raw_path.decode("ascii")
        exchange = _Exchange(driver, driver._scope(request.method, target, headers, body, request.url.netloc.decode("ascii")), body)
        self._nursery.start_soon(exchange.run, driver.app)
        read_timeout = (request.extensions.get("timeout") or {}).get("read")
        limit = driver.request_seconds_max if read_timeout is None else read_timeout
        with trio.move_on_after(limit) as scope:
            try:
                status, response_headers = await exchange.read_start()
            except IncompleteResponse as error:
                exchange.hang_up()
                raise httpx.RemoteProtocolError(str(error), request=request) from error
        if scope.cancelled_caught:
            exchange.hang_up()
            raise httpx.ReadTimeout(f"no response within {limit}s", request=request)
        return httpx.Response(
            status,
            headers=list(response_headers),
            stream=_ResponseBody(exchange, driver.response_body_bytes_max),
            extensions={"http_version": b"HTTP/1.1"},
        )


__all__ = [
    "AsgiDriver",
    "AsgiError",
    "AsgiResponse",
    "AsgiStream",
    "AsgiTimeout",
    "AsgiTransport",
    "IncompleteResponse",
    "LifespanFailed",
    "ResponseTooLarge",
    "disconnect_grace_seconds",
    "lifespan_seconds_max",
    "request_seconds_max_default",
    "response_body_bytes_max_default",
    "response_messages_buffered",
]
