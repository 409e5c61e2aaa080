"""The operation table: every route of the sessions surface, under both prefixes.

Why a table rather than only quart's router: the gate must know, before any framework code
runs and before the body is read, which operation a request is (its body cap, whether it is a
write for the legacy-prefix knob, which session it names), and ``/api/manifest`` and the
OpenAPI document list the same operations.  One table keeps the four in step; quart's router
still dispatches, from rules generated from this table.

Paths are written without prefix (``/sessions/{sessionId}/messages``); each operation is
served at ``/v2`` + path (the legacy prefix, subject to ``TANSR_SERVE_LEGACY_PREFIX``) and at
``/api`` + path (the unified facade).  ``/api/manifest`` is facade-only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

mebibyte = 1024 * 1024
default_body_bytes_max = 1 * mebibyte
"""The contract's default body cap."""
large_body_bytes_max = 20 * mebibyte
"""messages and tool-results."""
import_body_bytes_max = 32 * mebibyte
"""Checkpoint (snapshot) import and the two audio endpoints."""

assert default_body_bytes_max < large_body_bytes_max < import_body_bytes_max

legacy_prefix = "/v2"
api_prefix = "/api"
manifest_path = "/api/manifest"
retired_prefixes = ("/v1",)
"""Prefixes of the contract's older surfaces: always 404 here (never mounted)."""

manifest_revision = 7
"""The contract's MANIFEST revision this surface serves (0.15.1 ships revision 7)."""

OperationKind = Literal["read", "write"]


@dataclass(frozen=True)
class Operation:
    """One route: ``name`` (manifest id), HTTP ``method``, prefix-less ``path`` with
    ``{placeholders}``, manifest ``kind`` and the request body cap."""

    name: str
    method: str
    path: str
    kind: OperationKind
    body_bytes_max: int = default_body_bytes_max
    summary: str = ""

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.strip("/").split("/"))

    def quart_rule(self, prefix: str) -> str:
        """``/v2/sessions/<sessionId>/messages`` for quart."""
        parts = [f"<{part[1:-1]}>" if part.startswith("{") else part for part in self.segments]
        return prefix + "/" + "/".join(parts)


operations: tuple[Operation, ...] = (
    Operation("sessions.create", "POST", "/sessions", "write", summary="创建 / attach / resume / fork 会话"),
    Operation("sessions.list", "GET", "/sessions", "read", summary="列出本终端用户的会话"),
    Operation("sessions.get", "GET", "/sessions/{sessionId}", "read", summary="会话元信息与恢复锚"),
    Operation("sessions.close", "DELETE", "/sessions/{sessionId}", "write", summary="关闭会话（store 保留，可 resume）"),
    Operation("sessions.messages", "POST", "/sessions/{sessionId}/messages", "write", large_body_bytes_max, "注入输入"),
    Operation("sessions.events", "GET", "/sessions/{sessionId}/events", "read", summary="SSE 事件流"),
    Operation("sessions.interrupt", "POST", "/sessions/{sessionId}/interrupt", "write", summary="中断当前轮（幂等）"),
    Operation("sessions.history", "GET", "/sessions/{sessionId}/history", "read", summary="治理后历史快照（分页）"),
    Operation("sessions.toolResults", "POST", "/sessions/{sessionId}/tool-results/{callId}", "write",
              large_body_bytes_max, "远程工具应答"),
    Operation("sessions.permission", "POST", "/sessions/{sessionId}/permission/{requestId}", "write", summary="权限应答"),
    Operation("sessions.questions", "POST", "/sessions/{sessionId}/questions/{requestId}", "write", summary="提问应答"),
    Operation("sessions.compact", "POST", "/sessions/{sessionId}/compact", "write", summary="手动压缩（空闲期）"),
    Operation("sessions.checkpoints.list", "GET", "/sessions/{sessionId}/checkpoints", "read", summary="列举快照"),
    Operation("sessions.checkpoints.create", "POST", "/sessions/{sessionId}/checkpoints", "write", summary="手动快照"),
    Operation("sessions.checkpoints.import", "POST", "/sessions/{sessionId}/checkpoints/import", "write",
              import_body_bytes_max, "快照导入（自包含字节）"),
    Operation("sessions.checkpoints.restore", "POST", "/sessions/{sessionId}/checkpoints/{checkpointId}/restore",
              "write", summary="自快照就地换史"),
    Operation("sessions.checkpoints.delete", "DELETE", "/sessions/{sessionId}/checkpoints/{checkpointId}", "write",
              summary="删除快照"),
    Operation("sessions.checkpoints.export", "GET", "/sessions/{sessionId}/checkpoints/{checkpointId}/export", "read",
              summary="快照导出（自包含字节）"),
    Operation("sessions.cwd", "POST", "/sessions/{sessionId}/cwd", "write", summary="切换工作目录（空闲期）"),
    Operation("sessions.audio.transcriptions", "POST", "/sessions/{sessionId}/audio/transcriptions", "write",
              import_body_bytes_max, "语音转写（代打平台语音面）"),
    Operation("sessions.audio.speech", "POST", "/sessions/{sessionId}/audio/speech", "write",
              import_body_bytes_max, "语音合成（代打平台语音面）"),
)

operations_by_name: dict[str, Operation] = {operation.name: operation for operation in operations}
assert len(operations_by_name) == len(operations)

body_caps = tuple(sorted({operation.body_bytes_max for operation in operations}))


@dataclass(frozen=True)
class RouteMatch:
    """A request resolved against the table: ``operation`` None = the path names nothing here
    (404), ``allowed_methods`` non-empty = the path exists with other methods (405)."""

    prefix: str
    operation: Operation | None
    parameters: Mapping[str, str]
    allowed_methods: tuple[str, ...] = ()

    @property
    def via(self) -> str:
        return "api" if self.prefix == api_prefix else "v2"


def _match_segments(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    parameters: dict[str, str] = {}
    for expected, actual in zip(pattern, segments, strict=True):
        if expected.startswith("{"):
            if not actual:
                return None
            parameters[expected[1:-1]] = actual
        elif expected != actual:
            return None
    return parameters


def match_route(method: str, path: str) -> RouteMatch | None:
    """The operation of ``method path`` under ``/v2`` or ``/api``; None when the path is not
    under either (or is the manifest, which the caller handles)."""
    for prefix in (legacy_prefix, api_prefix):
        if path.startswith(prefix + "/"):
            break
    else:
        return None
    segments = path[len(prefix) + 1:].split("/")
    # Literal segments win over placeholders (``checkpoints/import`` is not a checkpoint id).
    candidates: list[tuple[int, Operation, dict[str, str]]] = []
    for operation in operations:
        parameters = _match_segments(operation.segments, segments)
        if parameters is not None:
            candidates.append((len(parameters), operation, parameters))
    candidates.sort(key=lambda candidate: candidate[0])
    for _, operation, parameters in candidates:
        if operation.method == method:
            return RouteMatch(prefix, operation, parameters)
    if candidates:
        fewest = candidates[0][0]
        methods = sorted({operation.method for count, operation, _ in candidates if count == fewest})
        return RouteMatch(prefix, None, {}, tuple(methods))
    return RouteMatch(prefix, None, {})


def is_retired_path(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in retired_prefixes)


# --- the legacy-prefix knob --------------------------------------------------------------------

legacy_prefix_variable = "TANSR_SERVE_LEGACY_PREFIX"
legacy_sunset_variable = "TANSR_SERVE_LEGACY_SUNSET"
LegacyPrefixMode = Literal["readwrite", "readonly", "off"]
legacy_prefix_modes: tuple[LegacyPrefixMode, ...] = ("readwrite", "readonly", "off")

deprecation_header_value = "@1790900340"
"""The contract's ``Deprecation`` value on every /v2 response while /api is mounted."""
deprecation_link_value = '</api/manifest>; rel="deprecation"'


@dataclass(frozen=True)
class LegacyPrefixPolicy:
    """``mode``: readwrite (default) serves /v2 fully, readonly answers its writes 410 gone,
    off answers all of /v2 404.  ``sunset``: the ``Sunset`` header value, when configured."""

    mode: LegacyPrefixMode = "readwrite"
    sunset: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> LegacyPrefixPolicy:
        """Read the two variables; an unknown mode is a configuration error (ValueError):
        silently serving writes an operator meant to retire would be worse than not starting."""
        mode = environ.get(legacy_prefix_variable, "").strip().lower() or "readwrite"
        if mode not in legacy_prefix_modes:
            raise ValueError(f"{legacy_prefix_variable} must be one of {', '.join(legacy_prefix_modes)}, got {mode!r}")
        sunset = environ.get(legacy_sunset_variable, "").strip() or None
        return cls(mode, sunset)  # type: ignore[arg-type]

    def legacy_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"deprecation", deprecation_header_value.encode("ascii")),
                   (b"link", deprecation_link_value.encode("ascii"))]
        if self.sunset is not None:
            headers.append((b"sunset", self.sunset.encode("latin-1", "replace")))
        return headers


def manifest_document(policy: LegacyPrefixPolicy) -> dict:
    """``GET /api/manifest``: the revision and every operation with its kind and paths.

    ``legacyPath`` is present while the legacy prefix serves the operation (absent when the
    knob is ``off``; with ``readonly`` only reads keep it)."""
    entries = []
    for operation in operations:
        entry: dict = {
            "id": operation.name,
            "method": operation.method,
            "path": api_prefix + operation.path,
            "kind": operation.kind,
            "bodyBytesMax": operation.body_bytes_max,
            "summary": operation.summary,
        }
        if policy.mode == "readwrite" or (policy.mode == "readonly" and operation.kind == "read"):
            entry["legacyPath"] = legacy_prefix + operation.path
        entries.append(entry)
    return {
        "contract": "unified-v1",
        "revision": manifest_revision,
        "operations": entries,
        "legacyPrefixes": {"mode": policy.mode, "prefixes": [legacy_prefix] if policy.mode != "off" else []},
        "eventEnvelopes": ["unified-v1"],
    }


def default_legacy_policy() -> LegacyPrefixPolicy:
    return LegacyPrefixPolicy.from_environ(os.environ)


__all__ = [
    "LegacyPrefixMode",
    "LegacyPrefixPolicy",
    "Operation",
    "OperationKind",
    "RouteMatch",
    "api_prefix",
    "body_caps",
    "default_body_bytes_max",
    "default_legacy_policy",
    "deprecation_header_value",
    "deprecation_link_value",
    "import_body_bytes_max",
    "is_retired_path",
    "large_body_bytes_max",
    "legacy_prefix",
    "legacy_prefix_modes",
    "legacy_prefix_variable",
    "legacy_sunset_variable",
    "manifest_document",
    "manifest_path",
    "manifest_revision",
    "match_route",
    "operations",
    "operations_by_name",
    "retired_prefixes",
]
