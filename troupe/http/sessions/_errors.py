"""The sessions surface's two error envelopes and the one code → status table.

The contract speaks two dialects of the same errors:

- ``/v2`` (the legacy prefix): ``{"error": {"code", "message", "detail"?}}``; ``detail`` is
  present only when there is something structured to say;
- ``/api`` (the unified facade): ``{"contract": "unified-v1", "code", "status",
  "retryAction", "message", "detail": {"domainCode", "domainStatus", ...}}``; the /v2 code
  travels in ``detail.domainCode`` and its status in ``detail.domainStatus``, so a client
  that learnt the /v2 table can still branch on it.

One ``SessionsError`` (raised by handlers, or built from an actor's ``SessionRefused``) is
rendered in whichever dialect the request's prefix speaks; the middleware's own rejections
(bad Host, body over its cap) go through the same two renderers.  The /v2 statuses come from
the actors' ``refusal_statuses`` plus the few codes only the HTTP layer produces.

The unified ``code`` is a coarse category per status and ``retryAction`` says what a client
should do next (both documented in docs/sessions.md):

=================  ====================================================================
retryAction        meaning
=================  ====================================================================
``none``           retrying the same request cannot help (fix it, or give up)
``reauthenticate`` get a valid end-user token, then retry
``retry_after``    wait the whole seconds of ``Retry-After``, then retry the same request
``wait_idle``      the session is running a turn; retry once it is idle (no queueing)
``backoff``        retry with exponential backoff and jitter (5xx without Retry-After)
``rediscover``     read ``/api/manifest`` and use the ``/api`` operation instead
``resume``         the session is not live here: ``POST /api/sessions {resume}`` (L3)
=================  ====================================================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from troupe.actors.sessions import SessionRefused, refusal_statuses
from troupe.http import ErrorBody

unified_contract = "unified-v1"

code_bad_host = "bad_host"
code_not_found = "not_found"
code_method_not_allowed = "method_not_allowed"
code_gone = "gone"
code_legacy_prefix_retired = "legacy_prefix_retired"

statuses: dict[str, int] = {
    **refusal_statuses,
    code_bad_host: 400,
    code_not_found: 404,
    code_method_not_allowed: 405,
    code_gone: 410,
}
"""Every code this surface answers with, and its HTTP status."""

retry_after_statuses = frozenset({429, 503})
"""Statuses that always carry ``Retry-After``."""

retry_after_seconds_default = 1
"""``Retry-After`` when a 429/503 cannot estimate its wait."""

draining_retry_after_seconds = 5
"""``Retry-After`` while the server drains: by then another instance (or this one, restarted)
should answer."""

assert retry_after_seconds_default >= 1 and draining_retry_after_seconds >= 1

default_messages: dict[str, str] = {
    "unauthorized": "缺少有效的终端用户令牌",
    "forbidden": "无权访问该会话",
    "session_not_found": "会话不存在",
    "session_ended": "会话已结束",
    "session_limit_exceeded": "该终端用户的活跃会话已达上限",
    "resume_unavailable": "服务端未接存储，无法恢复",
    "create_failed": "会话装配失败",
    "validation_failed": "请求字段不合法",
    "invalid_json": "请求正文不是合法的 JSON",
    "payload_too_large": "请求正文超过字节上限",
    "turn_running": "当前轮进行中，请空闲后重试",
    "checkpoints_not_wired": "快照功能未启用",
    "checkpoint_not_found": "快照不存在",
    "session_mismatch": "快照不属于该会话",
    "cwd_not_allowed": "工作目录被策略拒绝",
    "cwd_invalid": "工作目录形态非法",
    "cwd_unavailable": "工作目录已不可用",
    "overloaded": "服务繁忙，请稍后重试",
    "draining": "服务正在关闭，请稍后重试",
    "upstream_unavailable": "上游服务暂不可用",
    "rate_limited": "请求过于频繁，请稍后重试",
    "internal_error": "服务内部错误",
    "store_corrupted": "会话存储已损坏",
    "midturn_blocks_rejected": "运行中不接受 blocks 输入",
    "request_not_found": "请求不存在或已过期",
    "request_already_answered": "该请求已有应答",
    "request_cancelled": "该请求已取消",
    "digest_mismatch": "digest 与请求不符",
    "input_conflict": "同一 inputId 的内容或目标不同",
    "input_target_stale": "历史纪元已变化，请重新读取 input-capabilities",
    "input_target_closed": "目标轮已结束",
    "input_not_found": "没有这条输入的回执",
    "input_limit_exceeded": "本轮输入已达上限",
    "capability_disabled": "此能力未开启",
    code_bad_host: "此监听地址不接受该 Host 请求头",
    code_not_found: "路径不存在",
    code_method_not_allowed: "该路径不支持此 HTTP 方法",
    code_gone: "旧前缀已退役，请改走 /api",
}

unified_codes_by_status: dict[int, str] = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    422: "unprocessable",
    429: "rate_limited",
    500: "internal",
    503: "unavailable",
}
"""The unified envelope's ``code``: one category per status (the /v2 code is in detail)."""

retry_actions = ("none", "reauthenticate", "retry_after", "wait_idle", "backoff", "rediscover", "resume")

_retry_action_by_code = {
    "unauthorized": "reauthenticate",
    "turn_running": "wait_idle",
    "internal_error": "backoff",
    "session_not_found": "resume",
    code_gone: "rediscover",
    code_legacy_prefix_retired: "rediscover",
}

assert set(default_messages) == set(statuses), set(default_messages) ^ set(statuses)
assert set(statuses.values()) <= set(unified_codes_by_status)


def retry_action_for(code: str, status: int) -> str:
    """What a client should do after this error (see the module docstring)."""
    action = _retry_action_by_code.get(code)
    if action is not None:
        return action
    if status in retry_after_statuses:
        return "retry_after"
    return "none"


@dataclass
class SessionsError(Exception):
    """Raised by handlers and the gate; rendered in the request's dialect.

    ``code`` is a key of ``statuses`` (``gone`` only ever in the unified dialect).
    """

    code: str
    message: str | None = None
    detail: Mapping[str, Any] | None = None
    retry_after_seconds: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    domain_code: str | None = None
    """For ``gone``: the reason (``legacy_prefix_retired``) put in ``detail.domainCode``."""

    def __post_init__(self) -> None:
        assert self.code in statuses, self.code
        if self.status in retry_after_statuses and self.retry_after_seconds is None:
            self.retry_after_seconds = retry_after_seconds_default
        super().__init__(self.code)

    @property
    def status(self) -> int:
        return statuses[self.code]

    @classmethod
    def from_refusal(cls, refusal: SessionRefused) -> SessionsError:
        seconds = None
        if refusal.retry_after_seconds is not None:
            seconds = max(1, math.ceil(refusal.retry_after_seconds))
        return cls(refusal.code, refusal.message or None, refusal.detail, seconds)

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.retry_after_seconds is not None:
            headers["Retry-After"] = str(self.retry_after_seconds)
        if self.status == 401:
            headers.setdefault("WWW-Authenticate", "Bearer")
        return headers

    def document(self, *, unified: bool) -> dict[str, Any]:
        message = self.message or default_messages[self.code]
        if unified or self.code == code_gone:
            return unified_document(
                self.code, message, self.detail,
                retry_after_seconds=self.retry_after_seconds, domain_code=self.domain_code,
            )
        return v2_document(self.code, message, self.detail)


def v2_document(code: str, message: str | None = None, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"error": {"code", "message", "detail"?}}`` (``detail`` only when present)."""
    error: dict[str, Any] = {"code": code, "message": message or default_messages.get(code, "")}
    if detail:
        error["detail"] = dict(detail)
    return {"error": error}


def unified_document(
    code: str,
    message: str | None = None,
    detail: Mapping[str, Any] | None = None,
    *,
    retry_after_seconds: int | None = None,
    domain_code: str | None = None,
) -> dict[str, Any]:
    """The unified envelope for the /v2 ``code`` (see the module docstring)."""
    status = statuses.get(code, 500)
    domain = domain_code or code
    document_detail: dict[str, Any] = {"domainCode": domain, "domainStatus": status}
    for key, value in (detail or {}).items():
        if key not in document_detail:
            document_detail[key] = value
    if retry_after_seconds is not None:
        document_detail["retryAfterSeconds"] = retry_after_seconds
    return {
        "contract": unified_contract,
        "code": unified_codes_by_status.get(status, "internal"),
        "status": status,
        "retryAction": retry_action_for(domain, status),
        "message": message or default_messages.get(domain, default_messages.get(code, "")),
        "detail": document_detail,
    }


def encode_document(document: object) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _known_code(status: int, code: str) -> str:
    if code in statuses:
        return code
    return {400: "validation_failed", 404: code_not_found, 413: "payload_too_large"}.get(
        status, "internal_error" if status >= 500 else "validation_failed")


def v2_error_envelope(status: int, code: str, message: str) -> ErrorBody:
    """The shared middleware's ``ErrorEnvelope`` for /v2 paths (and paths of no prefix)."""
    del message  # the middleware's English; the contract's messages are Chinese, by code
    return ErrorBody(encode_document(v2_document(_known_code(status, code))))


def unified_error_envelope(status: int, code: str, message: str) -> ErrorBody:
    """The shared middleware's ``ErrorEnvelope`` for /api paths."""
    del message
    return ErrorBody(encode_document(unified_document(_known_code(status, code))))


__all__ = [
    "SessionsError",
    "code_bad_host",
    "code_gone",
    "code_legacy_prefix_retired",
    "code_method_not_allowed",
    "code_not_found",
    "default_messages",
    "draining_retry_after_seconds",
    "encode_document",
    "retry_action_for",
    "retry_actions",
    "retry_after_seconds_default",
    "retry_after_statuses",
    "statuses",
    "unified_codes_by_status",
    "unified_contract",
    "unified_document",
    "unified_error_envelope",
    "v2_document",
    "v2_error_envelope",
]
