"""The operation table: every route of the character surface, matched on the raw path.

Why a table rather than only quart's router: the gate must know which operation a request is
before any framework code runs (404 / 405, whether limited mode applies, the body limit, the
character it names), and the OpenAPI document lists the same operations.  quart still
dispatches, from rules generated from this table.

Why the raw path: ``{lanlan_name}`` is URL-encoded and a name may contain an encoded ``/``
(``a%2Fb``), which the server has already decoded in ``scope["path"]``.  Matching the raw
path segment by segment and decoding each segment afterwards keeps the contract's rule
exact: a literal extra ``/`` is another (unknown) path, 404; an encoded one belongs to the
name, which is then invalid, 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

kibibyte = 1024
mebibyte = 1024 * kibibyte

history_body_bytes_max = 4 * mebibyte
"""``/cache``, ``/process``, ``/renew``, ``/settle``: the dialogue, JSON inside JSON."""
control_body_bytes_max = 64 * kibibyte
"""Every other route: a query, a reason, claim lists, reflection ids."""

assert control_body_bytes_max < history_body_bytes_max

name_parameter = "lanlan_name"


@dataclass(frozen=True)
class Operation:
    """One route: ``name``, HTTP ``method``, ``path`` with ``{placeholders}``; ``limited``:
    refused in limited mode (all but four); ``body_bytes_max``: the request body limit."""

    name: str
    method: str
    path: str
    summary: str
    limited: bool = True
    body_bytes_max: int = control_body_bytes_max

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.strip("/").split("/"))

    @property
    def quart_rule(self) -> str:
        """``/cache/<path:lanlan_name>``: the name may hold ``/`` once decoded; the gate has
        matched the raw path already, so quart only needs to reach the handler."""
        parts = [f"<path:{part[1:-1]}>" if part.startswith("{") else part for part in self.segments]
        if self.name == "search_for_memory":
            parts = [*parts[:-2], "<path:rest>"]
        return "/" + "/".join(parts)


def _history(name: str, summary: str) -> Operation:
    return Operation(name, "POST", f"/{name}/{{{name_parameter}}}", summary, body_bytes_max=history_body_bytes_max)


operations: tuple[Operation, ...] = (
    Operation("health", "GET", "/health", "健康检查与进程实例 ID", limited=False),
    Operation("shutdown", "POST", "/shutdown", "关闭独立进程（需启用）", limited=False),
    Operation("storage_continue", "POST", "/internal/storage/startup/continue", "存储就绪：退出 limited mode",
              limited=False),
    Operation("storage_block", "POST", "/internal/storage/startup/block", "上游启动失败：进入 limited mode",
              limited=False),
    Operation("reset_confirmed_at", "POST", "/internal/memory/reset_confirmed_at", "强力记忆 ON → OFF 迁移"),
    Operation("release_character", "POST", "/release_character/{lanlan_name}", "排空派生任务并释放角色存储句柄"),
    Operation("reload", "POST", "/reload", "重建记忆组件、释放 claim、发布 generation"),
    _history("cache", "轮次结束：追加近期历史、写时间索引、登记轮后任务"),
    _history("process", "处理新增对话历史"),
    _history("renew", "会话续接后的首段历史（持 settle lock 详细压缩）"),
    _history("settle", "结算已缓存的对话"),
    Operation("new_dialog", "GET", "/new_dialog/{lanlan_name}", "新模型会话的 text/plain 上下文"),
    Operation("get_recent_history", "GET", "/get_recent_history/{lanlan_name}", "格式化近期历史字符串"),
    Operation("query_memory", "POST", "/query_memory/{lanlan_name}", "facts / reflections / 归档 facts 的结构化召回"),
    Operation("search_for_memory", "GET", "/search_for_memory/{lanlan_name}/{query}", "已弃用：占位文本"),
    Operation("get_settings", "GET", "/get_settings/{lanlan_name}", "渲染后的 persona 与活动反思"),
    Operation("get_persona", "GET", "/get_persona/{lanlan_name}", "完整内部 persona JSON"),
    Operation("last_conversation_gap", "GET", "/last_conversation_gap/{lanlan_name}", "距上次对话的秒数"),
    Operation("reflect", "POST", "/reflect/{lanlan_name}", "请求反思合成"),
    Operation("followup_topics", "GET", "/followup_topics/{lanlan_name}", "主动聊天话题候选（不标记已展示）"),
    Operation("record_surfaced", "POST", "/record_surfaced/{lanlan_name}", "记录已展示的反思并刷新冷却"),
    Operation("cancel_correction", "POST", "/cancel_correction/{lanlan_name}", "取消正在执行的近期记忆修正任务"),
    Operation("funnel", "GET", "/api/memory/funnel/{lanlan_name}", "状态转换计数（证据分析）"),
    Operation("openapi", "GET", "/openapi.json", "本服务的 OpenAPI 3.1 文档"),
    Operation("docs", "GET", "/docs", "离线 API 文档页"),
)

operations_by_name: Mapping[str, Operation] = {operation.name: operation for operation in operations}


@dataclass(frozen=True)
class RouteMatch:
    """What the raw path names: the operation (None when only the method is wrong, see
    ``allowed_methods``) and the decoded placeholder values."""

    operation: Operation | None
    values: Mapping[str, str] = field(default_factory=dict)
    allowed_methods: tuple[str, ...] = ()

    @property
    def character_name(self) -> str | None:
        return self.values.get(name_parameter)


def _decode(segment: str) -> str | None:
    """Percent-decode one raw segment as UTF-8; None when the escapes are not UTF-8."""
    try:
        return unquote(segment, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        return None


def _match(operation: Operation, segments: list[str]) -> dict[str, str] | None:
    if len(segments) != len(operation.segments):
        return None
    values: dict[str, str] = {}
    for pattern, segment in zip(operation.segments, segments, strict=True):
        if pattern.startswith("{"):
            decoded = _decode(segment)
            values[pattern[1:-1]] = "\x00" if decoded is None else decoded  # an invalid name, 400
        elif pattern != segment:
            return None
    return values


def match_route(method: str, raw_path: str) -> RouteMatch | None:
    """The route ``method`` + ``raw_path`` (still percent-encoded, no query) names; None for
    an unknown path (404).  An empty placeholder segment still matches (the name is then
    invalid: 400, as the contract says, rather than 404)."""
    segments = raw_path.strip("/").split("/") if raw_path.strip("/") else []
    if raw_path.endswith("/") and raw_path != "/":
        segments.append("")  # "/cache/" names the empty character
    allowed: list[str] = []
    for operation in operations:
        values = _match(operation, segments)
        if values is None:
            continue
        if operation.method == method or (method == "HEAD" and operation.method == "GET"):
            return RouteMatch(operation, values)
        allowed.append(operation.method)
    if allowed:
        return RouteMatch(None, {}, tuple(sorted(set(allowed))))
    return None


__all__ = [
    "Operation",
    "RouteMatch",
    "control_body_bytes_max",
    "history_body_bytes_max",
    "match_route",
    "name_parameter",
    "operations",
    "operations_by_name",
]
