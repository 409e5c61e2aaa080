"""The knowledge surface's operation table: every route, its method and its body limit.

Why a table: the gate (404 / 405 before any handler, the per-route 413), quart's rules and the
OpenAPI document all read the same list, so they never disagree.  Paths are the contract's
(§2); ``/memory/ocr``'s limit is the contract's 20 MB of base64 plus the envelope.

Body limits are named per kind of request: a write carries raw evidence up to the store's
``evidence_raw_bytes_max`` plus its context and provenance; a lifecycle event its data; every
other request is small.  A limit leaves room for JSON whitespace and escapes above what the
store accepts, so a body the store would take is never refused by the gate; the store's own
limits are checked again by the schemas (400 with a message), never by a 500.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from troupe.actors.knowledge import (
    evidence_raw_bytes_max,
    evidence_side_bytes_max,
    lifecycle_data_bytes_max,
)
from troupe.actors.knowledge.ocr import ocr_image_base64_characters_max

json_overhead_bytes_max = 64 * 1024
"""Room for whitespace, escapes and the envelope's small fields above the stored limits."""
write_body_bytes_max = 2 * evidence_raw_bytes_max + 2 * evidence_side_bytes_max + json_overhead_bytes_max
"""``/memory/write``, ``/memory/update`` and ``/agent/idempotency/recover`` (which carries a
whole write).  Twice the raw limit: ``\\uXXXX`` escapes make a body longer than its stored,
compact UTF-8 form."""
lifecycle_body_bytes_max = 2 * lifecycle_data_bytes_max + json_overhead_bytes_max
small_body_bytes_max = 64 * 1024
"""Queries, contexts, forget commands, promotions, preference extraction."""
read_body_bytes_max = 0
"""GET routes take no body."""
ocr_body_bytes_max = ocr_image_base64_characters_max + json_overhead_bytes_max
"""The base64 text plus the envelope: base64 needs no JSON escapes."""

assert write_body_bytes_max > evidence_raw_bytes_max + 2 * evidence_side_bytes_max
assert lifecycle_body_bytes_max > lifecycle_data_bytes_max


@dataclass(frozen=True)
class Operation:
    name: str
    method: str
    path: str
    """The contract's path; ``{id}`` is one path segment."""
    body_bytes_max: int = read_body_bytes_max
    summary: str = ""
    tags: tuple[str, ...] = field(default=())

    @property
    def quart_rule(self) -> str:
        return self.path.replace("{id}", "<path_id>")

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.escape(self.path).replace(re.escape("{id}"), "([^/]+)") + "$")


def sync_operations(small_bytes_max: int) -> tuple[Operation, ...]:
    """The ``/sync/*`` routes of the sync slice (seeds/004 §3.11–3.16, §3.21–3.23) and the
    peer-to-peer routes replication needs (signed by the sending device, not the user's)."""
    from troupe.actors.knowledge.sync import peer_body_bytes_max

    return (
        Operation("sync_token", "POST", "/sync/token", small_bytes_max, "生成配对令牌（QR/PIN）"),
        Operation("sync_pair", "POST", "/sync/pair", small_bytes_max, "设备配对（QR/PIN + 签名令牌）"),
        Operation("sync_peers", "GET", "/sync/peers", summary="节点列表"),
        Operation("sync_pair_request", "POST", "/sync/pair/request", small_bytes_max, "发起确认式配对请求（含 6 位 PIN）"),
        Operation("sync_pair_confirm", "POST", "/sync/pair/confirm", small_bytes_max, "确认/拒绝配对请求"),
        Operation("sync_status", "GET", "/sync/status", summary="同步状态（含运行时开关 enabled/paused）"),
        Operation("sync_settings", "PUT", "/sync/settings", small_bytes_max, "更新同步开关（enabled/paused，热生效）"),
        Operation("sync_state", "GET", "/sync/state/knowledge/{id}", summary="去载荷 CRDT/墓碑状态"),
        Operation("sync_revoke", "POST", "/sync/peers/{id}/revoke", small_bytes_max, "解绑设备"),
        Operation("sync_peer_join", "POST", "/sync/peer/join", small_bytes_max, "设备间：配对入网（设备签名）"),
        Operation("sync_peer_ops", "POST", "/sync/peer/ops", peer_body_bytes_max, "设备间：推送签名操作（gossip）"),
        Operation("sync_peer_digest", "POST", "/sync/peer/digest", peer_body_bytes_max, "设备间：版本向量交换（anti-entropy）"),
    )


operations: tuple[Operation, ...] = (
    Operation("version", "GET", "/version", summary="产品、组件、API 兼容级别和 schema 版本"),
    Operation("health", "GET", "/health", summary="数据库迁移及后端组件就绪状态"),
    Operation("capabilities", "GET", "/capabilities", summary="平台与 Embedding/向量引擎的配置与实际运行能力"),
    Operation("memory_write", "POST", "/memory/write", write_body_bytes_max, "写入一条记忆（证据落盘后 ACK，结构化异步）"),
    Operation("memory_update", "POST", "/memory/update", write_body_bytes_max, "乐观锁更新既有记忆并重建图/向量"),
    Operation("memory_query", "POST", "/memory/query", small_body_bytes_max, "混合检索（BM25+ANN+Graph）"),
    Operation("agent_context", "POST", "/agent/context", small_body_bytes_max, "Agent 轮次的预算化、可追溯安全上下文"),
    Operation("agent_lifecycle", "POST", "/agent/lifecycle", lifecycle_body_bytes_max, "持久化 Agent 生命周期短/中期上下文"),
    Operation("idempotency_recover", "POST", "/agent/idempotency/recover", write_body_bytes_max,
              "人工核验后授权失败请求重试一次"),
    Operation("evidence", "GET", "/evidence/{id}", summary="证据详情（查看原文）"),
    Operation("preference_extract", "POST", "/preference/extract", small_body_bytes_max, "触发偏好提取"),
    Operation("preferences", "GET", "/preferences", summary="偏好列表（支持 scope 过滤）"),
    Operation("preference_history", "GET", "/preference/{id}/history", summary="偏好版本回溯"),
    Operation("forget", "POST", "/forget", small_body_bytes_max, "自然语言遗忘（先确认后执行）"),
    Operation("conflicts", "GET", "/conflicts", summary="冲突审计列表"),
    Operation("promote", "POST", "/memory/flow/promote", small_body_bytes_max, "短/中期→长期流转"),
    Operation("insights", "GET", "/delivery/insights", summary="洞察流（最近 24h 高质量记忆）"),
    Operation("digest", "GET", "/delivery/digest", summary="按日简报（仅计数）"),
    Operation("monitor_config", "GET", "/monitor/config", summary="读取监控配置"),
    Operation("monitor_config_put", "PUT", "/monitor/config", small_body_bytes_max, "写入监控配置（全量提交，热生效）"),
    Operation("monitor_log", "GET", "/monitor/log", summary="监控活动日志（分页，最新在前）"),
    Operation("memory_ocr", "POST", "/memory/ocr", ocr_body_bytes_max, "图片文字识别（无 OCR 引擎时 503 OCR_UNAVAILABLE）"),
    Operation("sync_discover", "GET", "/sync/discover", summary="发现局域网设备（含未配对）"),
    # The sync slice's routes (troupe/http/knowledge/_routes_sync.py installs them).
    *sync_operations(small_body_bytes_max),
    Operation("openapi", "GET", "/openapi.json", summary="本接口的 OpenAPI 3.1 文档"),
    Operation("events", "GET", "/events", summary="WebSocket 事件推送（需 WebSocket 升级）"),
)

operations_by_name = {operation.name: operation for operation in operations}
events_path = operations_by_name["events"].path
handshake_operations = frozenset({"version", "health", "capabilities", "openapi"})
"""Answered even while the schema lags (the rest answer 503 ``SCHEMA_NOT_READY``)."""

assert len(operations_by_name) == len(operations)


@dataclass(frozen=True)
class RouteMatch:
    """``operation`` is None when the path exists with other methods (``allowed_methods``)."""

    operation: Operation | None
    path_id: str | None = None
    allowed_methods: tuple[str, ...] = ()


_exact = {(operation.method, operation.path): operation for operation in operations if "{" not in operation.path}
_paths_methods: dict[str, list[str]] = {}
for _operation in operations:
    _paths_methods.setdefault(_operation.path, []).append(_operation.method)
_templated = [operation for operation in operations if "{" in operation.path]


def match_route(method: str, path: str) -> RouteMatch | None:
    """The operation for ``method path``; a ``RouteMatch`` without operation when only the
    method is wrong (405); None for an unknown path (404)."""
    operation = _exact.get((method, path))
    if operation is not None:
        return RouteMatch(operation)
    if path in _paths_methods:
        return RouteMatch(None, allowed_methods=tuple(_paths_methods[path]))
    for candidate in _templated:
        found = candidate.pattern.match(path)
        if found is None:
            continue
        if candidate.method == method:
            return RouteMatch(candidate, found.group(1))
        return RouteMatch(None, allowed_methods=tuple(_paths_methods[candidate.path]))
    return None


__all__ = [
    "Operation",
    "RouteMatch",
    "events_path",
    "handshake_operations",
    "json_overhead_bytes_max",
    "lifecycle_body_bytes_max",
    "match_route",
    "ocr_body_bytes_max",
    "operations",
    "operations_by_name",
    "read_body_bytes_max",
    "small_body_bytes_max",
    "sync_operations",
    "write_body_bytes_max",
]
