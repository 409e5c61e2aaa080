"""The host contract's unified error body, and the codes this surface uses.

Every error on the host listener, including the ones the shared middleware produces before
this surface runs (bad Host, body over the limit) and quart's own (404, 405, a crash), is::

    {"error": {"code": ..., "message": ..., "fields": [{"field", "message"}],
               "retry_after_seconds": ..., "retry_at": ...}}

``fields`` is always an array (paths like ``body.occurred_at``, ``body[3].content``,
``path.entry_id``, ``header.authorization``); the two retry fields are a positive integer and
an aware ISO time on 429/503 and ``null`` otherwise.  A few errors add members the contract
allows: a message over its byte limit keeps the legacy ``field`` (the first offending path,
also listed in ``fields``).  Clients branch on the status and the
code, never on the message (Chinese, for people).

Codes, by status:

====  =====================  ============================================================
400   ``bad_host``           the Host header is not allowed on this listener
400   ``invalid_request``    malformed JSON, a field or an entry id that breaks the rules
400   ``method_not_allowed`` the path exists but not with this method (``Allow`` is set)
400   ``recall_expired``     feedback on a recall older than 24 hours
400   ``memory_not_in_recall`` feedback names a memory this recall did not return
401   ``unauthorized``       missing, unknown, revoked or no-longer-valid token
403   ``entry_forbidden``    the token's scope does not include the entry
403   ``recall_forbidden``   feedback on a recall another token made
404   ``not_found``          no such route or object
404   ``media_not_found``    a ``media_ids`` reference is unknown or not referenceable
404   ``recall_not_found``   feedback on an unknown recall id
409   ``revision_conflict``  a goal PATCH's ``expected_revision`` is not the goal's revision
409   ``goal_merged``        the goal was merged into another (``canonical_id`` names it)
404   ``memory_not_found``   feedback names a memory that has been deleted
413   ``payload_too_large``  the body, or one message's content, is over its byte limit
429   ``rate_limited``       the token's rate bucket is empty
500   ``internal_error``     our bug; nothing about it is shown
503   ``unavailable``        starting, stopping, storage or actors temporarily unavailable
====  =====================  ============================================================
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from troupe.http import ErrorBody

code_bad_host = "bad_host"
code_invalid_request = "invalid_request"
code_method_not_allowed = "method_not_allowed"
code_unauthorized = "unauthorized"
code_entry_forbidden = "entry_forbidden"
code_not_found = "not_found"
code_media_not_found = "media_not_found"
code_revision_conflict = "revision_conflict"
code_goal_merged = "goal_merged"
code_payload_too_large = "payload_too_large"
code_rate_limited = "rate_limited"
code_internal_error = "internal_error"
code_unavailable = "unavailable"

default_messages: dict[str, str] = {
    code_bad_host: "此监听地址不接受该 Host 请求头",
    code_invalid_request: "请求格式或内容不合法",
    code_method_not_allowed: "该路径不支持此 HTTP 方法",
    code_unauthorized: "缺少有效的宿主令牌",
    code_entry_forbidden: "令牌无权访问该入口",
    code_not_found: "对象不存在",
    code_media_not_found: "媒体对象不存在或不可引用",
    code_revision_conflict: "目标已被修改，请重新读取后再决定",
    code_goal_merged: "目标已合并到保留对象，请读取保留对象后明确提交",
    code_payload_too_large: "请求正文或内容超过字节上限",
    code_rate_limited: "请求过于频繁，请稍后重试",
    code_internal_error: "服务内部错误",
    code_unavailable: "服务暂不可用，请稍后重试",
}

_codes_by_status = {
    400: code_invalid_request,
    401: code_unauthorized,
    403: code_entry_forbidden,
    404: code_not_found,
    405: code_method_not_allowed,
    413: code_payload_too_large,
    429: code_rate_limited,
    500: code_internal_error,
    503: code_unavailable,
}

fixed_error_members = ("code", "message", "fields", "retry_after_seconds", "retry_at")
"""The members every error object has (further ones are optional additions)."""

retry_after_seconds_unknown = 1
"""The contract's suggestion when a temporary unavailability cannot be estimated."""


@dataclass(frozen=True)
class FieldProblem:
    field: str
    message: str


@dataclass
class HostError(Exception):
    """Raised by handlers; the app turns it into the unified body with its status/headers."""

    status: int
    code: str
    message: str | None = None
    fields: Sequence[FieldProblem] = ()
    retry_after_seconds: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict)
    """Additional members of the error object (the contract allows some, e.g. the legacy
    ``field`` of a message over its byte limit); never one of the five fixed ones."""

    def __post_init__(self) -> None:
        assert not set(self.extra) & set(fixed_error_members), "extra members never replace fixed ones"
        assert self.retry_after_seconds is None or self.retry_after_seconds >= 1
        super().__init__(self.code)


def retry_at_text(wall_seconds: float) -> str:
    """An aware ISO 8601 time (UTC) for ``retry_at``."""
    moment = datetime.datetime.fromtimestamp(wall_seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="seconds")


def error_document(
    code: str,
    message: str | None = None,
    fields: Iterable[FieldProblem] = (),
    *,
    retry_after_seconds: int | None = None,
    retry_at: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> dict:
    return {
        "error": {
            "code": code,
            "message": message or default_messages.get(code, default_messages[code_invalid_request]),
            "fields": [{"field": problem.field, "message": problem.message} for problem in fields],
            "retry_after_seconds": retry_after_seconds,
            "retry_at": retry_at,
            **(extra or {}),
        }
    }


def error_response_parts(error: HostError, wall_seconds: float) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of ``error`` (``wall_seconds`` now, for ``retry_at``): the one
    rendering used by the quart error handler and by the raw intake route."""
    retry_at = None
    headers = dict(error.headers)
    if error.retry_after_seconds is not None:
        retry_at = retry_at_text(wall_seconds + error.retry_after_seconds)
        headers["Retry-After"] = str(error.retry_after_seconds)
    document = error_document(
        error.code, error.message, error.fields,
        retry_after_seconds=error.retry_after_seconds, retry_at=retry_at, extra=error.extra,
    )
    return error.status, headers, encode_document(document)


def encode_document(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def host_error_envelope(status: int, code: str, message: str) -> ErrorBody:
    """The ``ErrorEnvelope`` handed to the shared middleware: its English messages become the
    contract's Chinese ones (by code) and the shape becomes the unified body."""
    del message
    code = code if code in default_messages else _codes_by_status.get(status, code_internal_error)
    return ErrorBody(encode_document(error_document(code)))


def code_for_status(status: int) -> str:
    return _codes_by_status.get(status, code_internal_error if status >= 500 else code_invalid_request)


__all__ = [
    "FieldProblem",
    "HostError",
    "code_bad_host",
    "code_entry_forbidden",
    "code_for_status",
    "code_goal_merged",
    "code_internal_error",
    "code_invalid_request",
    "code_media_not_found",
    "code_method_not_allowed",
    "code_not_found",
    "code_payload_too_large",
    "code_rate_limited",
    "code_revision_conflict",
    "code_unauthorized",
    "code_unavailable",
    "default_messages",
    "encode_document",
    "error_document",
    "fixed_error_members",
    "host_error_envelope",
    "retry_after_seconds_unknown",
    "retry_at_text",
]
