"""The unified ``/api`` transport: the headers every response carries, the one error envelope,
and the request headers the tansr SDK sends.

Why a module of its own: the ``/api`` surface is a second transport in front of the same
session actors as ``/v2``, and the real client (``tansr-sdk`` 0.1.0, ``api/client.py``) refuses
any response that does not carry its unified headers or whose error is not its envelope, before
it looks at the body.  Every ``/api`` route (the core routes, the input routes, discovery) goes
through the helpers here, so the facts below live in one place.

Facts taken from the SDK's source (revision 7 of the unified contract):

- Response headers, on every response, errors and the SSE stream included:
  ``tansr-contract: unified-v1``, ``tansr-manifest-revision: 7``, ``tansr-domain`` (a name of
  the Domain enum: ``session`` or ``discovery``), ``tansr-schema-hash: sha256:<64 hex>`` (the
  frozen catalogue's hash); ``tansr-closure-id`` (64 hex) on the capability-closure answer and
  on the 412 of a stale closure; ``tansr-event-envelope: unified-v1`` echoed on a negotiated
  stream.  None of them may repeat, and none carries an end user, a session id or a token.
- Error envelope (``UnifiedError``, no other key allowed): ``contract`` ``unified-v1``,
  ``traceId`` (``[A-Za-z0-9._-]{1,128}``), ``requestId`` (the request's ``Idempotency-Key``,
  else null), ``code`` from the closed set ``unified_codes`` with a status that set allows,
  ``status`` equal to the HTTP status, ``retryAction`` one of ``none``, ``same-request``,
  ``query-status``, ``rebind``, ``refresh``, ``rediscover``, ``message`` (1-1024 characters),
  optional ``retryAfterMs`` and ``detail`` (``domain``, ``family``, ``domainCode``,
  ``domainStatus``, ``domainRetryAction`` null for the session family, ``reason``, ...).
  ``Retry-After`` is a positive whole number of seconds or absent.
- Request headers the SDK sends: ``tansr-session-family`` (``sdk1`` | ``sdk2-offload-v1``) on
  every call, ``deadline`` (RFC 3339 UTC with milliseconds; past → 408 ``invalid_request``
  ``deadline_exceeded``), ``tansr-closure-id`` on fenced writes (stale → 412
  ``precondition_failed``, ``closure_stale``, ``rediscover``), ``last-event-id`` on streams,
  ``tansr-event-envelope: unified-v1`` on streams, ``idempotency-key`` on keyed writes.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quart import Response, request

from troupe.actors.sessions import refusal_statuses

contract_name = "unified-v1"
manifest_revision = 7
"""The unified contract's manifest revision tansr-sdk 0.1.0 is frozen at."""
schema_hash_hex = "b60e77ffcbf08d985a993dbdbd4cf610f12f7c7e70f090aee5ff8d523f70bb57"
"""The frozen catalogue's schema hash (manifest ``schemaHash``; header ``sha256:<hex>``)."""
schema_hash_header_value = "sha256:" + schema_hash_hex

session_domain = "session"
discovery_domain = "discovery"
session_contract_family = "agent-session-v1"

header_contract = "tansr-contract"
header_manifest_revision = "tansr-manifest-revision"
header_domain = "tansr-domain"
header_schema_hash = "tansr-schema-hash"
header_closure_id = "tansr-closure-id"
header_event_envelope = "tansr-event-envelope"
header_session_family = "tansr-session-family"
header_deadline = "deadline"
header_idempotency_key = "idempotency-key"
header_request_id = "x-request-id"

session_families = ("sdk1", "sdk2-offload-v1")
session_family_default = "sdk1"
served_session_families = ("sdk1",)
"""The families this server runs sessions for; ``sdk2-offload-v1`` needs an archive source."""

retry_actions = ("none", "same-request", "query-status", "rebind", "refresh", "rediscover")

unified_codes: dict[str, tuple[int, ...]] = {
    # code: allowed statuses, the default first.
    "invalid_request": (400, 408, 422),
    "protocol_mismatch": (400,),
    "unauthorized": (401,),
    "forbidden": (403,),
    "not_found": (404,),
    "method_not_allowed": (405,),
    "gone": (410,),
    "conflict": (409, 412),
    "stale_generation": (409,),
    "gap": (409, 410),
    "capability_unavailable": (404, 403),
    "capacity_exceeded": (429, 503),
    "payload_too_large": (413,),
    "upstream_unavailable": (503,),
    "result_unknown": (503,),
    "rejected": (422,),
    "internal_error": (500,),
    "precondition_failed": (412,),
    "not_canonical": (400,),
}
"""The closed set of unified codes and the statuses each may travel with."""

default_retry_actions: dict[str, str] = {
    "capacity_exceeded": "same-request",
    "upstream_unavailable": "same-request",
    "result_unknown": "query-status",
    "stale_generation": "rebind",
    "precondition_failed": "rediscover",
}
"""retryAction by unified code when the caller gives none (every other code: ``none``)."""

domain_code_map: dict[str, str] = {
    "call_already_resolved": "conflict", "call_expired": "gone", "call_not_found": "not_found",
    "capability_disabled": "capability_unavailable", "checkpoint_import_invalid": "invalid_request",
    "checkpoint_not_found": "not_found", "checkpoints_not_wired": "capability_unavailable",
    "create_failed": "internal_error", "cwd_invalid": "invalid_request", "cwd_not_allowed": "forbidden",
    "cwd_switch_unsupported": "capability_unavailable", "cwd_unavailable": "conflict",
    "digest_mismatch": "conflict", "draining": "capacity_exceeded", "forbidden": "forbidden",
    "fork_source_not_found": "not_found", "internal_error": "internal_error", "invalid_json": "invalid_request",
    "method_not_allowed": "method_not_allowed", "midturn_blocks_rejected": "invalid_request",
    "not_found": "not_found", "overloaded": "capacity_exceeded", "payload_too_large": "payload_too_large",
    "platform_unavailable": "capability_unavailable", "rate_limited": "capacity_exceeded",
    "request_already_resolved": "conflict", "request_already_answered": "conflict",
    "request_expired": "gone", "request_cancelled": "gone", "request_not_found": "not_found",
    "resume_unavailable": "conflict", "session_ended": "gone", "session_limit_exceeded": "capacity_exceeded",
    "session_mismatch": "conflict", "session_not_found": "not_found", "store_corrupted": "internal_error",
    "turn_running": "conflict", "unauthorized": "unauthorized", "upstream_unavailable": "upstream_unavailable",
    "validation_failed": "invalid_request", "bad_host": "invalid_request", "gone": "gone",
}
"""The session family's (/v2) codes → the unified code (the SDK's error map, revision 3)."""

detail_reasons = frozenset({
    "not_installed", "outside_closure", "idempotency_key_invalid", "idempotency_key_not_applicable",
    "idempotency_key_reused", "idempotency_key_mismatch", "receipt_not_retained", "receipt_window_full",
    "if_match_invalid", "if_match_not_applicable", "if_match_body_mismatch", "if_match_stale",
    "deadline_invalid", "deadline_exceeded", "header_body_limit", "header_body_not_canonical",
    "header_processing_failed",
})
"""The closed set ``detail.reason`` may take in the SDK's schema; a session-family reason outside
it (``option_not_offered``, ``end_user_mismatch``, ...) travels as ``detail.domainReason``."""
message_characters_max = 1024
trace_id_pattern = re.compile(r"[A-Za-z0-9._-]{1,128}")
idempotency_key_pattern = re.compile(r"[\x21-\x7e]{1,128}")
closure_id_pattern = re.compile(r"[0-9a-f]{64}")
deadline_pattern = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})")
trace_scope_key = "troupe.api.trace_id"
"""Where the facade leaves the request's trace id (from the Env's ids) in the ASGI scope."""

assert all(code in unified_codes for code in domain_code_map.values())
assert all(action in retry_actions for action in default_retry_actions.values())


def unified_headers(domain: str = session_domain, closure_id: str | None = None) -> dict[str, str]:
    """The four headers every /api response carries (plus the closure id when given)."""
    headers = {
        header_contract: contract_name,
        header_manifest_revision: str(manifest_revision),
        header_domain: domain,
        header_schema_hash: schema_hash_header_value,
    }
    if closure_id is not None:
        assert closure_id_pattern.fullmatch(closure_id), closure_id
        headers[header_closure_id] = closure_id
    return headers


def unified_code_for(domain_code: str, status: int | None = None) -> tuple[str, int]:
    """The unified code and the HTTP status for a session-family code (and its /v2 status)."""
    code = domain_code_map.get(domain_code)
    if code is None:
        code = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 409: "conflict", 410: "gone", 413: "payload_too_large",
                422: "invalid_request", 429: "capacity_exceeded", 503: "upstream_unavailable"}.get(
                    status or 500, "internal_error")
    allowed = unified_codes[code]
    return code, (status if status in allowed else allowed[0])


def error_document(status: int, code: str, message: str, *, retry_action: str | None = None,
                   detail: Mapping[str, Any] | None = None, request_id: str | None = None,
                   trace_id: str = "troupe", retry_after_ms: int | None = None) -> dict[str, Any]:
    """The ``UnifiedError`` object (see the module docstring)."""
    assert code in unified_codes and status in unified_codes[code], (code, status)
    action = retry_action or default_retry_actions.get(code, "none")
    assert action in retry_actions, action
    document: dict[str, Any] = {
        "contract": contract_name,
        "traceId": trace_id if trace_id_pattern.fullmatch(trace_id) else "troupe",
        "requestId": request_id if request_id and idempotency_key_pattern.fullmatch(request_id) else None,
        "code": code,
        "status": status,
        "retryAction": action,
        "message": (message or code)[:message_characters_max],
    }
    if retry_after_ms is not None:
        document["retryAfterMs"] = max(1, int(retry_after_ms))
    if detail:
        document["detail"] = unified_detail(detail)
    return document


def unified_detail(detail: Mapping[str, Any]) -> dict[str, Any]:
    """``detail`` as the SDK's schema accepts it: a ``reason`` outside ``detail_reasons`` is
    kept as ``domainReason`` (the open object allows any other key)."""
    result = dict(detail)
    reason = result.get("reason")
    if reason is not None and reason not in detail_reasons:
        del result["reason"]
        result.setdefault("domainReason", reason)
    return result


def session_error_detail(domain_code: str, domain_status: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``detail`` for an error of the session family: the /v2 code and status kept."""
    detail: dict[str, Any] = {"domain": session_domain, "family": session_contract_family,
                              "domainCode": domain_code, "domainStatus": domain_status,
                              "domainRetryAction": None}
    for key, value in (extra or {}).items():
        detail.setdefault(key, value)
    return detail


def _request_context() -> tuple[str, str | None]:
    """(trace id, idempotency key) of the current quart request, if there is one."""
    try:
        scope = request.scope
        headers = request.headers
    except RuntimeError:  # outside a request context
        return "troupe", None
    trace = scope.get(trace_scope_key) or headers.get(header_request_id) or "troupe"
    return str(trace), headers.get(header_idempotency_key)


def api_error_response(status: int, code: str, message: str, *, retry_action: str | None = None,
                       detail: Mapping[str, Any] | None = None, request_id: str | None = None,
                       retry_after_seconds: int | None = None, domain: str = session_domain,
                       closure_id: str | None = None) -> Response:
    """A unified error response; ``request_id`` defaults to the request's Idempotency-Key."""
    trace_id, key = _request_context()
    document = error_document(status, code, message, retry_action=retry_action, detail=detail,
                              request_id=request_id if request_id is not None else key, trace_id=trace_id,
                              retry_after_ms=None if retry_after_seconds is None else retry_after_seconds * 1000)
    response = api_json_response(document, status, domain=domain, closure_id=closure_id)
    if retry_after_seconds is not None:
        response.headers["Retry-After"] = str(max(1, int(retry_after_seconds)))
    return response


def session_error_response(domain_code: str, message: str = "", *, domain_status: int | None = None,
                           detail: Mapping[str, Any] | None = None, retry_after_seconds: int | None = None,
                           closure_id: str | None = None) -> Response:
    """An error of the session family (a /v2 code such as ``turn_running``) in the unified envelope."""
    v2_status = domain_status or refusal_statuses.get(domain_code, 500)
    code, status = unified_code_for(domain_code, v2_status)
    if code == "capacity_exceeded" and retry_after_seconds is None:
        retry_after_seconds = 1
    if code == "upstream_unavailable" and retry_after_seconds is None:
        retry_after_seconds = 1
    return api_error_response(status, code, message or domain_code,
                              detail=session_error_detail(domain_code, v2_status, detail),
                              retry_after_seconds=retry_after_seconds, closure_id=closure_id)


def api_json_response(payload: Any, status: int = 200, *, domain: str = session_domain,
                      closure_id: str | None = None) -> Response:
    """JSON with the unified headers (``Cache-Control: no-store``)."""
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    response = Response(body, status=status, content_type="application/json")
    response.headers["Cache-Control"] = "no-store"
    response.headers.update(unified_headers(domain, closure_id))
    return response


def api_bytes_response(data: bytes, status: int = 200, *, content_type: str = "application/octet-stream") -> Response:
    response = Response(data, status=status, content_type=content_type)
    response.headers["Cache-Control"] = "no-store"
    response.headers.update(unified_headers())
    return response


def api_empty_response(status: int = 204) -> Response:
    response = Response(b"", status=status)
    response.headers["Cache-Control"] = "no-store"
    response.headers.update(unified_headers())
    return response


class ApiHeaderError(Exception):
    """A request header the unified contract refuses: ``status``, unified ``code``, ``reason``."""

    def __init__(self, status: int, code: str, message: str, *, header: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.header, self.reason = status, code, message, header, reason

    def detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {"header": self.header}
        if self.reason is not None:
            detail["reason"] = self.reason
        return detail


@dataclass(frozen=True)
class ApiRequestHeaders:
    """What the unified request headers say (already checked for shape)."""

    family: str = session_family_default
    family_explicit: bool = False
    deadline_ms: int | None = None
    last_event_id: str | None = None
    closure_id: str | None = None
    idempotency_key: str | None = None
    event_envelope: str | None = None


def parse_deadline_ms(text: str) -> int:
    """RFC 3339 → epoch milliseconds; ValueError when it is not one."""
    text = text.strip()
    if not deadline_pattern.fullmatch(text):
        raise ValueError(text)
    value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(value.timestamp() * 1000)


def parse_headers(headers: Mapping[str, str]) -> ApiRequestHeaders:
    """Check the unified request headers; ``ApiHeaderError`` for a malformed one.

    ``headers`` maps lower-case names to values (a quart ``Headers`` works too).  Whether a
    deadline has passed, a closure is stale or a family is served is for the caller to decide
    (it has the clock and the session); this only reads shapes."""
    family = headers.get(header_session_family)
    if family is not None and family.strip() not in session_families:
        raise ApiHeaderError(400, "invalid_request", "unknown session family", header=header_session_family)
    deadline_ms = None
    deadline = headers.get(header_deadline)
    if deadline is not None:
        try:
            deadline_ms = parse_deadline_ms(deadline)
        except ValueError:
            raise ApiHeaderError(400, "invalid_request", "deadline is not RFC 3339", header=header_deadline,
                                 reason="deadline_invalid") from None
    closure = headers.get(header_closure_id)
    if closure is not None and not closure_id_pattern.fullmatch(closure.strip()):
        raise ApiHeaderError(400, "invalid_request", "malformed closure id", header=header_closure_id)
    key = headers.get(header_idempotency_key)
    if key is not None and not idempotency_key_pattern.fullmatch(key):
        raise ApiHeaderError(400, "invalid_request", "malformed idempotency key", header=header_idempotency_key,
                             reason="idempotency_key_invalid")
    envelope = headers.get(header_event_envelope)
    if envelope is not None and envelope.strip().lower() != contract_name:
        raise ApiHeaderError(400, "invalid_request", "unknown event envelope", header=header_event_envelope)
    return ApiRequestHeaders(
        family=(family or session_family_default).strip(), family_explicit=family is not None,
        deadline_ms=deadline_ms, last_event_id=headers.get("last-event-id"),
        closure_id=None if closure is None else closure.strip(), idempotency_key=key,
        event_envelope=None if envelope is None else contract_name,
    )


def parse_api_request_headers(quart_request: Any = None) -> ApiRequestHeaders:
    """``parse_headers`` of the current (or the given) quart request."""
    source = quart_request if quart_request is not None else request
    return parse_headers({name.lower(): value for name, value in source.headers.items()})


__all__ = [
    "ApiHeaderError",
    "ApiRequestHeaders",
    "api_bytes_response",
    "api_empty_response",
    "api_error_response",
    "api_json_response",
    "contract_name",
    "default_retry_actions",
    "detail_reasons",
    "discovery_domain",
    "domain_code_map",
    "error_document",
    "header_closure_id",
    "header_contract",
    "header_deadline",
    "header_domain",
    "header_event_envelope",
    "header_idempotency_key",
    "header_manifest_revision",
    "header_schema_hash",
    "header_session_family",
    "manifest_revision",
    "parse_api_request_headers",
    "parse_deadline_ms",
    "parse_headers",
    "retry_actions",
    "schema_hash_header_value",
    "schema_hash_hex",
    "served_session_families",
    "session_contract_family",
    "session_domain",
    "session_error_detail",
    "session_error_response",
    "session_families",
    "trace_scope_key",
    "unified_code_for",
    "unified_codes",
    "unified_detail",
    "unified_headers",
]
