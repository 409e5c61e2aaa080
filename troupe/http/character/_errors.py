"""The character surface's error bodies: FastAPI's ``{"detail": ...}`` and the contract's own.

Why FastAPI's shape: the contract describes a memory server whose callers (the companion app's
main server, its chat runtime, its plugins) were written against a FastAPI app, so a real HTTP
error they already handle looks like ``{"detail": "Not Found"}``; answering in that shape keeps
their error paths working.  The contract names a few bodies of its own, and those are used
exactly where it names them:

- 409 limited mode (``LifecycleState.blocked_body()`` of the actor protocol): ``{"ok": false,
  "error_code": "storage_startup_blocked", "blocking_reason", "limited_mode": true, "error"}``;
- 409 a revoked or replayed claim on ``/release_character``: ``{"status": "cancelled", ...}``;
- 500 ``/last_conversation_gap``: ``{"gap_seconds": -1, "error": "server_error"}``;
- 200 with ``status: "error"`` / ``ok: false`` for the handlers the contract says fail that way
  (built in the routes, not here: they are successful HTTP exchanges).

Statuses of real HTTP errors, in the order the gate checks them:

====  ==========================================================================
400   the Host header is not loopback (or a configured extra name)
403   an ``Origin`` header that is not a loopback origin (a browser page elsewhere)
404   no such route
405   the route exists with another method (``Allow`` is set)
409   limited mode (every route but the four the contract exempts)
400   an invalid ``{lanlan_name}``, a missing claim parameter, a bad funnel window or body
413   the body is over its route's limit
503   the actors are overloaded or shutting down (``Retry-After``), or ``/query_memory``
      before the fact/reflection stores are initialised
500   a handler failed where the contract names no failure body; no detail is shown
====  ==========================================================================
"""

from __future__ import annotations

import json
from typing import Any

from troupe.http import ErrorBody

retry_after_seconds_default = 1
"""``Retry-After`` on a 503 when the runtime gives no better figure."""

assert retry_after_seconds_default >= 1

detail_messages = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
"""FastAPI's (Starlette's) default ``detail`` per status."""


class CharacterError(Exception):
    """A real HTTP error raised by a handler: ``status`` and the body ``document``
    (``{"detail": ...}`` unless the contract names another), plus response headers."""

    def __init__(self, status: int, document: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.document = detail_document(status) if document is None else document
        self.headers = dict(headers or {})


def detail_document(status: int, detail: Any = None) -> dict[str, Any]:
    """``{"detail": detail}``, with the status's default text when ``detail`` is None."""
    return {"detail": detail_messages.get(status, "Error") if detail is None else detail}


def encode_document(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def detail_error_envelope(status: int, code: str, message: str) -> ErrorBody:
    """The ``ErrorEnvelope`` the shared middleware uses here (413 from ``BodyLimit``)."""
    del code  # FastAPI's shape carries no code: the status says it
    return ErrorBody(encode_document(detail_document(status, message or None)))


__all__ = [
    "CharacterError",
    "detail_document",
    "detail_error_envelope",
    "detail_messages",
    "encode_document",
    "retry_after_seconds_default",
]
