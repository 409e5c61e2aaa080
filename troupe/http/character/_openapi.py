"""OpenAPI 3.1 (Chinese descriptions) for the character surface, and an offline ``/docs`` page.

Why generated from the operation table: the gate, quart's rules and this document then list
the same routes, methods and body limits.  Request bodies come from the pydantic models in
``_schemas`` and the per-route responses are written here once, next to the statuses the gate
can add to every route (400 Host / name, 403 Origin, 409 limited mode, 413, 503).  The page is
one self-contained HTML document (inline script and style, no external asset) that reads
``/openapi.json`` from the same listener, because the machines this runs on may have no
internet access.
"""

from __future__ import annotations

import functools
from typing import Any

from ._routes import Operation, operations
from ._schemas import HistoryIn, QueryMemoryIn, ReasonIn, RecordSurfacedIn, ReloadIn

_ref = "#/components/schemas/{model}"

_object = {"type": "object"}
_status_error = {"type": "object", "required": ["status", "message"],
                 "properties": {"status": {"const": "error"}, "message": {"type": "string"}}}
_memory_hit = {
    "type": "object",
    "required": ["id", "text", "tier", "entity", "score", "created_at", "event_start_at", "event_end_at"],
    "properties": {
        "id": {"type": "string"},
        "text": {"type": "string"},
        "tier": {"enum": ["fact", "reflection", "fact_archive"]},
        "entity": {"type": ["string", "null"]},
        "score": {"type": ["number", "null"], "description": "仅时间召回时为 null"},
        "created_at": {"type": ["string", "null"], "description": "UTC，无时区后缀，精确到秒"},
        "event_start_at": {"type": ["string", "null"]},
        "event_end_at": {"type": ["string", "null"]},
    },
}

_successes: dict[str, tuple[str, dict[str, Any]]] = {
    "health": ("进程健康与实例 ID", {"type": "object", "required": ["app", "service", "status", "instance_id"],
                                     "properties": {"app": {"const": "N.E.K.O"}, "service": {"const": "memory"},
                                                    "status": {"const": "ok"}, "instance_id": {"type": "string"}}}),
    "shutdown": ("shutdown_signal_received 或 shutdown_disabled",
                 {"type": "object", "properties": {"status": {"enum": ["shutdown_signal_received", "shutdown_disabled"]}}}),
    "storage_continue": ("已退出 limited mode", {"type": "object", "properties": {
        "ok": {"const": True}, "initialized": {"const": True}, "limited_mode": {"const": False},
        "reason": {"type": ["string", "null"]}}}),
    "storage_block": ("已进入 limited mode", {"type": "object", "properties": {
        "ok": {"const": True}, "limited_mode": {"const": True}, "reason": {"type": ["string", "null"]}}}),
    "reset_confirmed_at": ("{ok:true,count} 或 {ok:false,error,count:0}", {"type": "object", "properties": {
        "ok": {"type": "boolean"}, "count": {"type": "integer"}, "error": {"type": "string"}}}),
    "release_character": ("已排空并释放", {"type": "object", "properties": {
        "status": {"const": "success"}, "character_name": {"type": "string"},
        "cancelled_derived_tasks": {"type": "integer"}, "derived_task_claim_token": {"type": "string"}}}),
    "reload": ("{status:success,message} 或 {status:error,message}", {"type": "object", "properties": {
        "status": {"enum": ["success", "error"]}, "message": {"type": "string"}}}),
    "cache": ("{status:cached,count} 或 {status:error,message}", {"oneOf": [
        {"type": "object", "properties": {"status": {"const": "cached"}, "count": {"type": "integer"}}}, _status_error]}),
    "process": ("{status:processed} 或 {status:error,message}", {"oneOf": [
        {"type": "object", "properties": {"status": {"const": "processed"}}}, _status_error]}),
    "renew": ("{status:processed} 或 {status:error,message}", {"oneOf": [
        {"type": "object", "properties": {"status": {"const": "processed"}}}, _status_error]}),
    "settle": ("{status:settled} 或 {status:error,message}", {"oneOf": [
        {"type": "object", "properties": {"status": {"const": "settled"}}}, _status_error]}),
    "get_recent_history": ("本地化历史字符串（JSON 字符串）", {"type": "string"}),
    "query_memory": ("召回结果；失败时为空结果并带 error_code: hybrid_recall_failed", {"type": "object", "properties": {
        "results": {"type": "array", "items": _memory_hit}, "query": {"type": ["string", "null"]},
        "time": {"type": "string", "description": "仅时间召回时回显"},
        "candidates_total": {"type": "integer"}, "elapsed_ms": {"type": "number"},
        "error_code": {"const": "hybrid_recall_failed"}}}),
    "search_for_memory": ("已弃用：本地化占位文本（JSON 字符串）", {"type": "string"}),
    "get_settings": ("渲染后的 persona 与活动反思（JSON 字符串）", {"type": "string"}),
    "get_persona": ("内部 persona 对象（有版本的内部数据）", _object),
    "last_conversation_gap": ("距上次对话的秒数；没有时为 -1", {"type": "object", "properties": {
        "gap_seconds": {"type": "number"}}}),
    "reflect": ("反思合成结果；auto_transitions 恒为 0", {"type": "object", "properties": {
        "reflection": {"type": ["object", "null"]}, "auto_transitions": {"const": 0}}}),
    "followup_topics": ("话题候选（不标记为已展示）", {"type": "object", "properties": {
        "topics": {"type": "array", "items": _object}}}),
    "record_surfaced": ("恒为 {ok:true}", {"type": "object", "properties": {"ok": {"const": True}}}),
    "cancel_correction": ("cancelled 或 no_task", {"type": "object", "properties": {
        "status": {"enum": ["cancelled", "no_task"]}}}),
    "funnel": ("十个状态转换计数", {"type": "object", "properties": {
        "lanlan_name": {"type": "string"}, "since": {"type": "string"}, "until": {"type": "string"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}}}}),
    "openapi": ("本文档", _object),
}

_requests: dict[str, Any] = {
    "storage_continue": ReasonIn, "storage_block": ReasonIn, "reload": ReloadIn,
    "cache": HistoryIn, "process": HistoryIn, "renew": HistoryIn, "settle": HistoryIn,
    "query_memory": QueryMemoryIn, "record_surfaced": RecordSurfacedIn,
}
_required_bodies = frozenset({"cache", "process", "renew", "settle"})

_own_errors: dict[str, dict[str, str]] = {
    "release_character": {"400": "缺少或非法的 claim 参数、非法名称", "409": "claim 已撤销或重放：status: cancelled",
                          "500": "其他失败"},
    "query_memory": {"503": "fact/reflection 存储尚未初始化"},
    "last_conversation_gap": {"500": "意外失败：{gap_seconds:-1,error:server_error}"},
    "funnel": {"400": "since/until 非法，或 since > until"},
    "reload": {"400": "请求体字段非法"},
}

_gate_errors = {
    "400": "Host 头不是环回地址，或 {lanlan_name} / 请求体非法（{detail}）",
    "403": "Origin 头不是环回来源",
    "405": "路径存在但方法不支持（带 Allow 头）",
    "409": "limited mode：{ok:false,error_code:storage_startup_blocked,blocking_reason,limited_mode:true,error}",
    "413": "请求体超过该路由上限",
    "500": "内部错误（{detail}），不含细节",
    "503": "actor 过载或正在关闭，按 Retry-After 重试",
}


def _operation(operation: Operation) -> dict[str, Any]:
    description, schema = _successes.get(operation.name, ("text/plain 上下文", {"type": "string"}))
    content_type = "text/plain" if operation.name == "new_dialog" else "application/json"
    if operation.name == "docs":
        content_type, schema = "text/html", {"type": "string"}
    responses: dict[str, Any] = {"200": {"description": description, "content": {content_type: {"schema": schema}}}}
    statuses = {**_gate_errors, **_own_errors.get(operation.name, {})}
    if not operation.limited:
        statuses.pop("409")
    for status in sorted(statuses):
        responses[status] = {"description": statuses[status]}
    document: dict[str, Any] = {
        "operationId": operation.name,
        "summary": operation.summary,
        "description": f"请求体上限 {operation.body_bytes_max} 字节。"
        + ("" if operation.limited else " limited mode 下仍可调用。"),
        "responses": responses,
    }
    parameters = [_path_parameter(part[1:-1]) for part in operation.segments if part.startswith("{")]
    if operation.name == "release_character":
        parameters += _claim_parameters()
    if operation.name == "funnel":
        parameters += [
            {"name": "since", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"},
             "description": "默认 until 前七天；无时区视为 UTC"},
            {"name": "until", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"},
             "description": "默认当前时间"},
        ]
    if parameters:
        document["parameters"] = parameters
    model = _requests.get(operation.name)
    if model is not None:
        document["requestBody"] = {
            "required": operation.name in _required_bodies,
            "content": {"application/json": {"schema": {"$ref": _ref.format(model=model.__name__)}}},
        }
    return document


def _path_parameter(name: str) -> dict[str, Any]:
    text = "URL 编码的角色名：1—64 个字符，不含控制字符、/、\\、..，首尾无空格" if name == "lanlan_name" else "查询文本（已忽略）"
    return {"name": name, "in": "path", "required": True, "description": text, "schema": {"type": "string"}}


def _claim_parameters() -> list[dict[str, Any]]:
    return [
        {"name": "derived_task_claim_token", "in": "query", "required": True,
         "schema": {"type": "string", "minLength": 1}, "description": "每次操作生成的 opaque token，重试时复用"},
        {"name": "derived_task_claim_generation", "in": "query", "required": True,
         "schema": {"type": "integer", "minimum": 0}, "description": "调用方捕获的当前身份 generation"},
        {"name": "hold_derived_task_admission", "in": "query", "required": False,
         "schema": {"type": "boolean", "default": False}},
    ]


@functools.cache
def openapi_document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
    schemas = {model.__name__: model.model_json_schema() for model in set(_requests.values())}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "N.E.K.O 记忆服务器 API",
            "version": "1",
            "description": "主服务器、聊天运行时、主动聊天流程使用的内部环回服务（默认 127.0.0.1:48912）。"
            "检查顺序：Host → Origin → 路由 → limited mode → 角色名 → 请求体上限。"
            "真实 HTTP 错误的正文为 {\"detail\": ...}；部分处理器以 200 + status:error / ok:false 表示运行失败。",
        },
        "servers": [{"url": "/"}],
        "components": {"schemas": schemas},
        "paths": paths,
    }


_page = """<!doctype html>
<html lang="zh"><head><meta charset="utf-8"><title>N.E.K.O 记忆服务器 API</title>
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
pre{font-family:ui-monospace,monospace;background:#f4f4f4;border-radius:4px;padding:.6rem;overflow:auto}
.op{border:1px solid #ddd;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}
.method{font-weight:bold;text-transform:uppercase;margin-right:.5rem} td{padding:.2rem .6rem;vertical-align:top}
</style></head><body>
<h1 id="title">N.E.K.O 记忆服务器 API</h1><p id="description"></p>
<p>机器可读文档：<a href="/openapi.json">/openapi.json</a>（OpenAPI 3.1）。本页不依赖外部资源。</p>
<div id="operations">正在读取 /openapi.json …</div>
<script>
function element(tag, text){const node=document.createElement(tag); if(text!==undefined) node.textContent=text; return node;}
fetch("/openapi.json").then(r=>r.json()).then(spec=>{
  document.getElementById("title").textContent=spec.info.title;
  document.getElementById("description").textContent=spec.info.description;
  const operations=document.getElementById("operations"); operations.textContent="";
  for(const [path, item] of Object.entries(spec.paths)){
    for(const [method, op] of Object.entries(item)){
      const box=element("div"); box.className="op";
      const head=element("h3"); const m=element("span", method); m.className="method";
      head.append(m, element("code", path), " ", op.summary||""); box.append(head, element("p", op.description||""));
      const table=element("table");
      for(const [status, response] of Object.entries(op.responses)){const row=element("tr"); row.append(element("td", status), element("td", response.description)); table.append(row);}
      box.append(table); operations.append(box);
    }
  }
}).catch(error=>{document.getElementById("operations").textContent="无法读取 /openapi.json："+error;});
</script></body></html>
"""


def docs_page() -> str:
    """The self-contained documentation page (no external scripts, styles or fonts)."""
    return _page


__all__ = ["docs_page", "openapi_document"]
