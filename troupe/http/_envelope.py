"""Error envelopes: every surface answers errors in its own contract's shape.

The shared middleware rejects requests before any surface code runs (a bad Host header, a body
over the limit), yet the client must still get the body its contract promises.  So the
middleware does not format errors itself: it calls the surface's ``ErrorEnvelope`` with an
HTTP status, a machine-readable code and a human message, and sends what comes back.

``install_error_handlers`` wires the same envelope into a quart app for what quart raises
itself (404, 405, a handler that crashed), so one function decides the shape of every error a
surface can produce.  The trade-off: the envelope sees only ``(status, code, message)``;
surfaces whose contracts need more (a request id, a Retry-After) add it in their handlers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from quart import Quart, Response
from werkzeug.exceptions import HTTPException


@dataclass(frozen=True)
class ErrorBody:
    """What an envelope produces: the encoded body and its content type."""

    body: bytes
    content_type: str = "application/json"


ErrorEnvelope = Callable[[int, str, str], ErrorBody]
"""``envelope(status, code, message) -> ErrorBody``."""


def default_error_envelope(status: int, code: str, message: str) -> ErrorBody:
    """``{"error": {"code": ..., "message": ...}}``: troupe's own shape (admin surface)."""
    del status  # the status travels in the status line
    document = {"error": {"code": code, "message": message}}
    return ErrorBody(json.dumps(document, ensure_ascii=False).encode("utf-8"))


def error_code_for_status(status: int) -> str:
    """A stable snake_case code for an HTTP status (``404`` -> ``not_found``)."""
    return _codes.get(status, "internal_error" if status >= 500 else "bad_request")


_codes = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "unprocessable_entity",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


def envelope_response(envelope: ErrorEnvelope, status: int, code: str, message: str) -> Response:
    """A quart ``Response`` carrying ``envelope``'s body for this error."""
    error = envelope(status, code, message)
    return Response(error.body, status=status, content_type=error.content_type)


def install_error_handlers(app: Quart, envelope: ErrorEnvelope = default_error_envelope) -> None:
    """Make quart's own errors (404, 405, 413, a crashed handler -> 500) use ``envelope``.

    A crashed handler's exception is logged by quart; the client sees only
    ``internal_error``, never a traceback.
    """

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        return envelope_response(envelope, status, error_code_for_status(status), error.description or "")

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        app.logger.exception("unhandled error in a request handler", exc_info=error)
        return envelope_response(envelope, 500, "internal_error", "internal error")


__all__ = [
    "ErrorBody",
    "ErrorEnvelope",
    "default_error_envelope",
    "envelope_response",
    "error_code_for_status",
    "install_error_handlers",
]
