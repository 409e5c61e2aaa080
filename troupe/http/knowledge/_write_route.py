"""``POST /memory/write`` as a plain ASGI route, outside quart.

Why not a quart route like the others: a desktop agent writes every conversation turn and
tool result here, and issue 10's targets (1,000 writes/s with receipts, p99 20 ms) are set on
this route alone.  Quart's per-request machinery (request and app contexts, URL adapter,
before/after hooks, the response object) is a fixed cost every write paid for nothing the
write needs; the host surface's intake route left quart for the same reason
(``troupe.http.host._intake_route``).  This route does only what a write needs: read the body,
validate it with the same schema (``MemoryWriteIn``: 400 ``INVALID_REQUEST`` naming the
field), ask the scope actor, answer its reply or its refusal.

It runs behind the same ``KnowledgeGate`` (request id, Host, route and method, schema
readiness, the route's ``BodyLimit``) and renders errors with the same ``error_body``, so
nothing a client can observe differs from the quart routes: the same statuses, codes, bodies,
``Retry-After`` on 503 and ``X-Request-Id`` (the gate adds it).  The one quart behaviour
reproduced by hand is the crash boundary: an unexpected exception is logged and answered 500
``INTERNAL_ERROR`` with the fixed message; the process goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from troupe.actors.knowledge import KnowledgeRefused, scope_kind_name
from troupe.http import read_request_body, send_answer
from troupe.storage import StorageError

from ._errors import (
    KnowledgeError,
    code_internal_error,
    encode_document,
    error_body,
    internal_error_message,
    json_content_type,
    overloaded,
    request_id_of,
)
from ._gate import route_key
from ._schemas import MemoryWriteIn, parse_json_body, validated

logger = logging.getLogger("troupe.knowledge")

write_operation_name = "memory_write"
"""The operation (``_routes``) this route serves."""

Ask = Callable[..., Awaitable[Any]]
"""The app's ``ask(kind, key, message)``: backpressure raises a 503 ``KnowledgeError``, a
crashed turn the app's ``ActorFailed``."""


class WriteRoute:
    """The ASGI app of ``POST /memory/write`` (see the module docstring)."""

    def __init__(self, ask: Ask, *, quiet_errors: tuple[type[BaseException], ...] = ()) -> None:
        self.ask = ask
        self.quiet_errors = quiet_errors
        """Errors answered 500 without a log line here (a crashed turn: its supervisor logs it)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            data = await read_request_body(receive)
            if data is None:
                return  # the client went away before its body arrived: nobody to answer
            status, headers, body = 200, {}, await self._write(data)
        except KnowledgeError as error:
            status, headers, body = error.status, error.headers, error_body(
                error.code, error.message, request_id_of(scope))
        except StorageError as exc:
            logger.warning("knowledge route %s met a storage error: %s", write_operation_name, type(exc).__name__)
            error = overloaded("storage is unavailable; retry shortly")
            status, headers, body = error.status, error.headers, error_body(
                error.code, error.message, request_id_of(scope))
        except Exception as exc:
            if not isinstance(exc, self.quiet_errors):
                logger.exception("knowledge route %s failed", write_operation_name, exc_info=exc)
            status, headers, body = 500, {}, error_body(code_internal_error, internal_error_message,
                                                        request_id_of(scope))
        await send_answer(send, status, body, content_type=json_content_type, headers=headers)

    async def _write(self, data: bytes) -> bytes:
        write = validated(MemoryWriteIn, parse_json_body(data)).to_request()
        reply = await self.ask(scope_kind_name, write.scope, write)
        if isinstance(reply, KnowledgeRefused):
            raise KnowledgeError.from_refusal(reply)
        return encode_document(reply.encode())


class WriteRouteDispatch:
    """Sends ``POST /memory/write`` (as the gate matched it) to ``WriteRoute`` and everything
    else to ``app`` (quart): the gate wraps this, so both sides get the same admission."""

    def __init__(self, app: Any, write_route: WriteRoute) -> None:
        self.app = app
        self.write_route = write_route

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = scope.get(route_key) if scope["type"] == "http" else None
        if route is not None and route.operation is not None and route.operation.name == write_operation_name:
            await self.write_route(scope, receive, send)
            return
        await self.app(scope, receive, send)


__all__ = ["WriteRoute", "WriteRouteDispatch", "write_operation_name"]
