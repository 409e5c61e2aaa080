"""OpenAPI 3.1 (Chinese descriptions) for the sessions surface, and an offline ``/docs`` page.

Built from the operation table (``_routes``) and the pydantic request models, so paths, body
caps and request schemas cannot drift from what the gate and the handlers enforce.  Each
operation is documented once under ``/api`` (the facade new clients should use) and once under
``/v2`` (marked deprecated).  ``/docs`` is one self-contained HTML page (no external asset:
the machine may have no internet) that lists the operations from ``/openapi.json``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ._errors import default_messages, retry_actions, statuses, unified_codes_by_status
from ._routes import Operation, api_prefix, legacy_prefix, manifest_revision, operations
from ._schemas import (
    CheckpointIn,
    CreateSessionIn,
    CwdIn,
    MessageIn,
    PermissionIn,
    QuestionsIn,
    ToolResultIn,
)

_request_models = {
    "sessions.create": CreateSessionIn,
    "sessions.messages": MessageIn,
    "sessions.toolResults": ToolResultIn,
    "sessions.permission": PermissionIn,
    "sessions.questions": QuestionsIn,
    "sessions.checkpoints.create": CheckpointIn,
    "sessions.cwd": CwdIn,
}

_success = {
    "sessions.create": ("201", "新建 / resume / fork：{sessionId, resumed, lastSeq}；attach 活跃会话时 200"),
    "sessions.messages": ("202", "{sessionId, accepted: true}"),
    "sessions.events": ("200", "text/event-stream：首帧 retry: 3000，内核帧 id+data，控制帧 event+id+data，gap 帧无 id"),
    "sessions.interrupt": ("202", "{sessionId, accepted: true}（幂等）"),
    "sessions.close": ("202", "{sessionId, accepted: true}"),
    "sessions.get": ("200", "{sessionId, endUserId, status, live, lastSeq, createdAt, lastActivityAt, title?}"),
    "sessions.list": ("200", "{sessions: [...], total}"),
    "sessions.history": ("200", "{sessionId, lastSeq, messages, total, offset, nextOffset?}"),
    "sessions.toolResults": ("200", "{accepted: true}"),
    "sessions.permission": ("200", "{accepted: true}"),
    "sessions.questions": ("200", "{accepted: true}"),
    "sessions.compact": ("200", "CompactResult"),
    "sessions.checkpoints.list": ("200", "{checkpoints: [CheckpointMeta]}"),
    "sessions.checkpoints.create": ("201", "CheckpointMeta"),
    "sessions.checkpoints.import": ("201", "CheckpointMeta"),
    "sessions.checkpoints.restore": ("200", "{status: 'restored', fromMessages, toMessages}"),
    "sessions.checkpoints.delete": ("204", "已删除"),
    "sessions.checkpoints.export": ("200", "application/octet-stream：自包含 CBOR 字节"),
    "sessions.cwd": ("200", "{cwd, from}"),
    "sessions.audio.transcriptions": ("503", "未配置语音服务：upstream_unavailable（携 Retry-After）"),
    "sessions.audio.speech": ("503", "未配置语音服务：upstream_unavailable（携 Retry-After）"),
}

assert set(_success) == {operation.name for operation in operations}


def _parameters(operation: Operation) -> list[dict[str, Any]]:
    names = [segment[1:-1] for segment in operation.segments if segment.startswith("{")]
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in names
    ]
    if operation.name == "sessions.events":
        parameters += [
            {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "integer", "minimum": -1},
             "description": "最后消费的 seq；缺省或 -1 = 自缓冲最早处全量重放"},
            {"name": "exclude", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "按前缀过滤内核事件，如 hook,mcp（被滤事件仍占 seq）"},
            {"name": "tansr-event-envelope", "in": "header", "required": False,
             "schema": {"type": "string", "enum": ["unified-v1"]}, "description": "仅 /api：协商统一事件包络"},
        ]
    if operation.name in ("sessions.list", "sessions.history"):
        parameters += [
            {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
            {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
        ]
    if operation.name == "sessions.get":
        parameters.append({"name": "include", "in": "query", "required": False,
                           "schema": {"type": "string", "enum": ["applicationPrompt"]}})
    return parameters


def _operation(operation: Operation, prefix: str) -> dict[str, Any]:
    status, description = _success[operation.name]
    document: dict[str, Any] = {
        "operationId": f"{operation.name}{'' if prefix == api_prefix else '.legacy'}",
        "summary": operation.summary,
        "description": f"manifest kind: {operation.kind}；请求体上限 {operation.body_bytes_max} 字节（超限 413 payload_too_large）",
        "parameters": _parameters(operation),
        "responses": {
            status: {"description": description},
            "default": {"description": "错误：/v2 为 {error:{code,message,detail?}}，/api 为 unified-v1 统一信封",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/"
                                                                            + ("UnifiedError" if prefix == api_prefix else "V2Error")}}}},
        },
        "security": [{"bearer": []}],
    }
    if prefix == legacy_prefix:
        document["deprecated"] = True
    model = _request_models.get(operation.name)
    if model is not None:
        document["requestBody"] = {
            "required": operation.name not in ("sessions.create", "sessions.checkpoints.create"),
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    elif operation.name in ("sessions.checkpoints.import", "sessions.audio.transcriptions", "sessions.audio.speech"):
        document["requestBody"] = {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
    return document


@functools.cache
def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for prefix in (api_prefix, legacy_prefix):
        for operation in operations:
            paths.setdefault(prefix + operation.path, {})[operation.method.lower()] = _operation(operation, prefix)
    paths["/api/manifest"] = {"get": {"operationId": "manifest", "summary": f"统一调用面清单（revision {manifest_revision}）",
                                      "security": [{"bearer": []}], "responses": {"200": {"description": "{revision, operations}"}}}}
    for probe, text in (("/healthz", "存活探针（免 Bearer）"), ("/readyz", "就绪探针（免 Bearer）；未就绪 503 携 Retry-After")):
        paths[probe] = {"get": {"operationId": probe.strip("/"), "summary": text, "responses": {"200": {"description": "ok"}}}}
    schemas: dict[str, Any] = {}
    for model in _request_models.values():
        schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas["V2Error"] = {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "string", "enum": sorted(code for code in statuses if code != "gone")},
            "message": {"type": "string", "description": "本地化文案，不承诺字面"},
            "detail": {"type": "object"}}}},
    }
    schemas["UnifiedError"] = {
        "type": "object", "required": ["contract", "code", "status", "retryAction", "detail"],
        "properties": {
            "contract": {"const": "unified-v1"},
            "code": {"type": "string", "enum": sorted(set(unified_codes_by_status.values()))},
            "status": {"type": "integer"},
            "retryAction": {"type": "string", "enum": list(retry_actions)},
            "message": {"type": "string"},
            "detail": {"type": "object", "required": ["domainCode", "domainStatus"], "properties": {
                "domainCode": {"type": "string", "enum": sorted({*default_messages, "legacy_prefix_retired"})},
                "domainStatus": {"type": "integer"}}},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "troupe sessions（tansr /v2 与 /api/sessions）", "version": f"manifest-{manifest_revision}",
                 "description": "移动端 agent 会话：SSE 下行、POST 上行。Bearer 令牌绑定终端用户。"},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def docs_page() -> str:
    """A self-contained page listing every operation (reads /openapi.json, no external asset)."""
    document = json.dumps(openapi_document(), ensure_ascii=False).replace("</", "<\\/")
    return (
        "<!doctype html><html lang=zh><meta charset=utf-8><title>troupe sessions API</title>"
        "<style>body{font:14px system-ui;margin:2em}code{background:#eee;padding:0 .3em}li{margin:.3em 0}</style>"
        "<h1>troupe sessions API</h1><ul id=ops></ul><script>"
        f"const doc={document};const ul=document.getElementById('ops');"
        "for(const[p,ms]of Object.entries(doc.paths))for(const[m,o]of Object.entries(ms)){"
        "const li=document.createElement('li');li.textContent=`${m.toUpperCase()} ${p} — ${o.summary||''}${o.deprecated?' (deprecated)':''}`;ul.appendChild(li)}"
        "</script></html>"
    )


__all__ = ["docs_page", "openapi_document"]
