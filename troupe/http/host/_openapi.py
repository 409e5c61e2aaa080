"""OpenAPI 3.1 (Chinese descriptions) for the host surface, and an offline ``/docs`` page.

Why hand-assembled instead of quart-schema: its docs pages load their scripts from public
CDNs, which a machine without internet cannot reach, and the gate (not the framework) owns
auth and body limits, so the interesting parts of the contract would be missing from generated
documents anyway.  Request and response bodies still come from the pydantic models, so the
schemas cannot drift from the validation.  ``/docs`` is one self-contained HTML page (inline
script and style, no external asset) that reads ``/openapi.json`` from the same listener.

Extension point: later routes add their operation with ``_operation(...)`` to ``_paths()``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ._errors import default_messages
from ._routes import api_prefix, messages_body_bytes_max
from ._schemas import MessageIn, MessagesAccepted

_ref = "#/components/schemas/{model}"


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "所有 /api/v1 错误的统一外层对象；按 HTTP 状态和 code 判断，不要依赖 message。",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "fields", "retry_after_seconds", "retry_at"],
                "properties": {
                    "code": {"type": "string", "enum": sorted(default_messages)},
                    "message": {"type": "string"},
                    "fields": {
                        "type": "array",
                        "description": "字段问题，路径如 body.occurred_at、body[3].content、path.entry_id",
                        "items": {
                            "type": "object",
                            "required": ["field", "message"],
                            "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                        },
                    },
                    "retry_after_seconds": {"type": ["integer", "null"], "minimum": 1},
                    "retry_at": {"type": ["string", "null"], "format": "date-time"},
                },
            }
        },
    }


_error_statuses = {
    "400": "请求格式、字段、入口 ID 或 Host 不合法；不支持的方法也返回 400 并带 Allow 头",
    "401": "缺失、无效或已撤销的令牌（带 WWW-Authenticate: Bearer）",
    "403": "令牌无权访问该入口（entry_forbidden）",
    "404": "对象不存在或媒体不可引用",
    "413": "正文或单条内容超过字节上限",
    "429": "单令牌限流（rate_limited），按整数秒 Retry-After 重试",
    "503": "启动、关闭或存储暂不可用，按 Retry-After 重试",
}


def _operation(summary: str, description: str, *, request: dict | None, success: tuple[str, str, dict],
               errors: tuple[str, ...]) -> dict[str, Any]:
    status, text, schema = success
    operation: dict[str, Any] = {
        "summary": summary,
        "description": description,
        "security": [{"bearer": []}],
        "responses": {
            status: {"description": text, "content": {"application/json": {"schema": schema}}},
            **{
                code: {
                    "description": _error_statuses[code],
                    "content": {"application/json": {"schema": {"$ref": _ref.format(model="Error")}}},
                }
                for code in errors
            },
        },
    }
    if request is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
    return operation


def _paths() -> dict[str, Any]:
    entry_parameter = {
        "name": "entry_id",
        "in": "path",
        "required": True,
        "description": "入口 ID：1—200 个字符，区分大小写，不能全为空白，不能含 ?、# 或控制字符",
        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    }
    message = {"$ref": _ref.format(model="Message")}
    # Imported here: those modules import ``_operation`` from this one.
    from ._routes_learning import learning_openapi_paths
    from ._routes_media import media_openapi_paths
    from ._routes_recall import recall_openapi_paths
    from ._routes_state import state_openapi_paths

    return {
        **media_openapi_paths(),
        **state_openapi_paths(),
        **recall_openapi_paths(),
        **learning_openapi_paths(),
        f"{api_prefix}/entries/{{entry_id}}/messages": {
            "parameters": [entry_parameter],
            "post": _operation(
                "接收消息",
                "一条消息对象或 1—1000 条的数组，整批原子提交：任何新消息校验失败则全部不接收。"
                "相同入口的相同 dedupe_key 返回原消息 ID，不覆盖。首次消息自动创建入口，"
                "entry_name、entry_kind、pace 只在创建时使用。content、quote_content 各最多 32768 个"
                f" UTF-8 字节（超出返回 413），整个请求体最多 {messages_body_bytes_max} 字节。",
                request={"oneOf": [message, {"type": "array", "minItems": 1, "maxItems": 1000, "items": message}]},
                success=("200", "已接收；ID 顺序对应输入顺序", {"$ref": _ref.format(model="MessagesAccepted")}),
                errors=("400", "401", "403", "404", "413", "429", "503"),
            ),
        },
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once; it depends only on the code)."""
    schemas: dict[str, Any] = {"Error": _error_schema()}
    for model in (MessageIn, MessagesAccepted):
        schema = model.model_json_schema(ref_template=_ref)
        schemas.update(schema.pop("$defs", {}))
        schemas[schema.get("title", model.__name__)] = schema
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Iris 宿主接口 v1",
            "version": "1",
            "description": "聊天宿主（连接器）向 troupe 发送消息、上传媒体、准备回复上下文的接口。"
            "每个请求带 Authorization: Bearer <宿主令牌>（用 troupe token create 创建）。"
            "检查顺序：Host → 就绪 → 令牌 → 限流 → 入口范围 → 正文。响应和错误均禁止缓存。",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "宿主令牌"}},
        },
        "paths": _paths(),
    }


_page = """<!doctype html>
<html lang="zh"><head><meta charset="utf-8"><title>Iris 宿主接口 v1</title>
<style>
body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
code,pre{font-family:ui-monospace,monospace;background:#f4f4f4;border-radius:4px}
pre{padding:.6rem;overflow:auto} .op{border:1px solid #ddd;border-radius:6px;margin:1rem 0;padding:.5rem 1rem}
.method{font-weight:bold;text-transform:uppercase;margin-right:.5rem} td,th{padding:.2rem .6rem;text-align:left;vertical-align:top}
</style></head><body>
<h1 id="title">Iris 宿主接口 v1</h1><p id="description"></p>
<p>机器可读文档：<a href="/openapi.json">/openapi.json</a>（OpenAPI 3.1）。本页不依赖外部资源。</p>
<div id="operations">正在读取 /openapi.json …</div>
<h2>数据结构</h2><div id="schemas"></div>
<script>
function element(tag, text){const node=document.createElement(tag); if(text!==undefined) node.textContent=text; return node;}
function block(value){return element("pre", JSON.stringify(value, null, 2));}
fetch("/openapi.json").then(r=>r.json()).then(spec=>{
  document.getElementById("title").textContent=spec.info.title;
  document.getElementById("description").textContent=spec.info.description;
  const operations=document.getElementById("operations"); operations.textContent="";
  for(const [path, item] of Object.entries(spec.paths)){
    for(const [method, op] of Object.entries(item)){
      if(method==="parameters") continue;
      const box=element("div"); box.className="op";
      const head=element("h3"); const m=element("span", method); m.className="method"; head.append(m, element("code", path), " ", op.summary||"");
      box.append(head, element("p", op.description||""));
      const table=element("table"); table.append(element("tr")); table.firstChild.append(element("th","状态"), element("th","说明"));
      for(const [status, response] of Object.entries(op.responses)){const row=element("tr"); row.append(element("td", status), element("td", response.description)); table.append(row);}
      box.append(table);
      if(op.requestBody){box.append(element("h4","请求正文"), block(op.requestBody.content["application/json"].schema));}
      operations.append(box);
    }
  }
  const schemas=document.getElementById("schemas");
  for(const [name, schema] of Object.entries(spec.components.schemas)){schemas.append(element("h3", name), block(schema));}
}).catch(error=>{document.getElementById("operations").textContent="无法读取 /openapi.json："+error;});
</script></body></html>
"""


def docs_page() -> str:
    """The self-contained documentation page (no external scripts, styles or fonts)."""
    return _page


def openapi_json() -> str:
    return json.dumps(openapi_document(), ensure_ascii=False)


__all__ = ["docs_page", "openapi_document", "openapi_json"]
