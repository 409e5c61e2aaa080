"""The knowledge surface's one error shape and its request ids.

Why one module: the contract (§5) wants ``{"error", "message", "request_id"}`` on EVERY error
and ``X-Request-Id`` on every response, including the refusals the gate makes before any
handler runs (a bad Host, an unknown route, a body over its limit).  So the gate, the
handlers and the error handlers all render errors here, from a code, a message and the
request's id.

Request ids: a valid incoming ``X-Request-Id`` (1 to ``request_id_characters_max`` letters,
digits and ``. _ : -``) is echoed, so an agent can follow its own id through our logs;
otherwise the server makes one from the Env's ids (``req_...``).  Messages never carry
exception text from inside the process: a crash is 500 ``INTERNAL_ERROR`` with a fixed
message.

Codes beyond the contract's §5 table, for statuses the table does not name (the contract's
FastAPI middleware answers those with the status's own name): ``METHOD_NOT_ALLOWED`` (405),
``PAYLOAD_TOO_LARGE`` (413), ``OVERLOADED`` (503 with ``Retry-After``: a full mailbox, a
storage error, an actor that did not answer in time).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from troupe.actors.knowledge import KnowledgeRefused, error_statuses
from troupe.http import ErrorBody

request_id_header = "X-Request-Id"
request_id_key = "troupe.knowledge.request_id"
"""Where the gate leaves the request's id in the ASGI scope."""
request_id_characters_max = 128
request_id_pattern = re.compile(r"[A-Za-z0-9._:-]{1,128}")
request_id_prefix = "req_"
retry_after_seconds_default = 1

assert request_id_pattern.pattern.endswith(f",{request_id_characters_max}}}")

code_invalid_request = "INVALID_REQUEST"
code_not_found = "NOT_FOUND"
code_method_not_allowed = "METHOD_NOT_ALLOWED"
code_payload_too_large = "PAYLOAD_TOO_LARGE"
code_overloaded = "OVERLOADED"
code_internal_error = "INTERNAL_ERROR"
code_schema_not_ready = "SCHEMA_NOT_READY"

statuses: dict[str, int] = {
    **error_statuses,
    code_method_not_allowed: 405,
    code_payload_too_large: 413,
}
"""Every code this surface answers with, and its status."""

internal_error_message = "internal error"

json_content_type = "application/json"


class KnowledgeError(Exception):
    """An error answer: raised by handlers, rendered by the app's error handler."""

    def __init__(self, code: str, message: str, *, status: int | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        assert code in statuses, code
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = statuses[code] if status is None else status
        self.headers = dict(headers or {})

    @classmethod
    def from_refusal(cls, refusal: KnowledgeRefused) -> KnowledgeError:
        headers = {"Retry-After": str(retry_after_seconds_default)} if refusal.status == 503 else None
        return cls(refusal.code, refusal.message, status=refusal.status, headers=headers)


def overloaded(message: str = "the server is busy; retry shortly", seconds: int = retry_after_seconds_default
               ) -> KnowledgeError:
    return KnowledgeError(code_overloaded, message, headers={"Retry-After": str(max(1, seconds))})


def encode_document(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def error_document(code: str, message: str, request_id: str) -> dict[str, str]:
    return {"error": code, "message": message, "request_id": request_id}


def error_body(code: str, message: str, request_id: str) -> bytes:
    return encode_document(error_document(code, message, request_id))


_middleware_codes = {
    "bad_host": code_invalid_request,
    "payload_too_large": code_payload_too_large,
}


def envelope_for(request_id: str):  # noqa: ANN201 - an ErrorEnvelope
    """The shared middleware's ``ErrorEnvelope`` for one request: its snake_case codes become
    this contract's codes, and the body carries the request id."""

    def envelope(status: int, code: str, message: str) -> ErrorBody:
        mapped = _middleware_codes.get(code)
        if mapped is None:
            mapped = code_internal_error if status >= 500 else code.upper()
            if mapped not in statuses:
                mapped = code_invalid_request
        return ErrorBody(error_body(mapped, message, request_id))

    return envelope


def valid_request_id(value: bytes | str | None) -> str | None:
    """The incoming id when it is one we echo, else None."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value if request_id_pattern.fullmatch(value) else None


def request_id_of(scope: Mapping[str, Any]) -> str:
    request_id = scope.get(request_id_key)
    assert isinstance(request_id, str), "knowledge routes run behind KnowledgeGate"
    return request_id


__all__ = [
    "KnowledgeError",
    "code_internal_error",
    "code_invalid_request",
    "code_method_not_allowed",
    "code_not_found",
    "code_overloaded",
    "code_payload_too_large",
    "code_schema_not_ready",
    "encode_document",
    "envelope_for",
    "error_body",
    "error_document",
    "internal_error_message",
    "overloaded",
    "request_id_characters_max",
    "request_id_header",
    "request_id_key",
    "request_id_of",
    "request_id_pattern",
    "retry_after_seconds_default",
    "statuses",
    "valid_request_id",
]
