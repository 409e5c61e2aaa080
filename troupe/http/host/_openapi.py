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
import re
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
                    "field": {"type": "string", "description": "兼容字段：消息超过字节上限（413）时第一个超限字段的路径；统一说明见 fields"},
                    "retry_after_seconds": {"type": ["integer", "null"], "minimum": 1},
                    "retry_at": {"type": ["string", "null"], "format": "date-time"},
                },
            }
        },
    }


_error_statuses = {
    "400": "请求格式、字段、入口 ID 或 Host 不合法（bad_host、invalid_request）；不支持的 HTTP 方法返回 400 "
           "method_not_allowed 并带 Allow 头",
    "401": "缺失、无效或已撤销的令牌（带 WWW-Authenticate: Bearer）",
    "403": "令牌无权访问该入口（entry_forbidden）",
    "404": "对象不存在或媒体不可引用",
    "409": "修订冲突（revision_conflict）或目标已合并（goal_merged，附 canonical_id）；重新读取再决定",
    "413": "正文或单条内容超过字节上限",
    "429": "单令牌限流（rate_limited），按整数秒 Retry-After 重试；事件流连接数超限为 event_token_limit／event_global_limit（Retry-After: 5）",
    "500": "服务内部错误（internal_error），不含细节；写请求可用相同去重键重试",
    "503": "启动、关闭或存储暂不可用，按 Retry-After 重试",
}

_always_statuses = ("400", "500")
"""Every operation can answer these: a bad Host or an unsupported method, and our own bugs."""
_gate_statuses = ("401", "429", "503")
"""Every ``/api/v1`` operation passes the gate: token, rate and readiness."""


def _operation(summary: str, description: str, *, request: dict | None, success: tuple[str, str, dict],
               errors: tuple[str, ...]) -> dict[str, Any]:
    """One operation; ``errors`` lists its own error statuses, to which the ones every
    operation (400, 500) and every gated one (401, 429, 503) can answer are added."""
    status, text, schema = success
    statuses = sorted({*errors, *_always_statuses, *_gate_statuses})
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
                for code in statuses
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
    from ._routes_events import events_openapi_paths
    from ._routes_goals import goals_openapi_paths
    from ._routes_learning import learning_openapi_paths
    from ._routes_media import media_openapi_paths
    from ._routes_notifications import notifications_openapi_paths
    from ._routes_recall import recall_openapi_paths
    from ._routes_state import state_openapi_paths

    return {
        **media_openapi_paths(),
        **state_openapi_paths(),
        **recall_openapi_paths(),
        **learning_openapi_paths(),
        **goals_openapi_paths(),
        **notifications_openapi_paths(),
        **events_openapi_paths(),
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


def _nullable(kind: str, description: str, **more: Any) -> dict[str, Any]:
    return {"type": [kind, "null"], "description": description, **more}


def _section_schemas() -> dict[str, Any]:
    """The shapes of prepare's sections, shared with the docs page (component schemas)."""
    time = {"format": "date-time"}
    return {
        "Persona": {
            "type": "object",
            "description": "当前角色描述（运维用 troupe persona set 设置）。尚未设置时所有字段为 null；不是收到的原始消息。",
            "required": ["name", "text", "version", "updated_at", "update_hint"],
            "properties": {
                "name": _nullable("string", "角色名；未设置为 null"),
                "text": _nullable("string", "角色描述正文"),
                "version": _nullable("integer", "版本号，从 1 递增，同一版本号不会对应另一段正文", minimum=1),
                "updated_at": _nullable("string", "本版设置时间（UTC）", **time),
                "update_hint": _nullable("string", "本版在 24 小时内更新过时的提示：宿主应替换缓存的旧描述；否则为 null"),
            },
        },
        "RecentMessage": {
            "type": "object",
            "description": "本入口的一条近期原始消息（按 ID 升序）；不应与记忆当成两次独立经历",
            "properties": {
                "id": {"type": "integer", "description": "消息 ID"},
                "kind": {"type": "string", "enum": ["message", "self_output", "action_result", "event"], "description": "消息类型"},
                "sender": {"type": "string", "description": "发送者显示名"},
                "account_id": _nullable("string", "稳定账号 ID"),
                "content": {"type": "string", "description": "正文（可为空）"},
                "occurred_at": {"type": "string", "format": "date-time", "description": "宿主给出的发生时间（原样）"},
                "quote_author": _nullable("string", "被引用原话的作者"),
                "quote_content": _nullable("string", "被引用的原话"),
                "media_ids": {"type": "array", "items": {"type": "string"}, "description": "引用的媒体对象 ID，保持顺序"},
                "unlearned": {"type": "boolean", "description": "true 表示尚未成功学习（待学习、学习中或学习失败）"},
            },
        },
        "EntryProfile": {
            "type": ["object", "null"],
            "description": "本入口当前已发布画像；关闭、私聊或尚无已发布版时为 null（本版尚无画像生成，始终为 null）",
            "required": ["text", "version", "generated_at", "possibly_stale"],
            "properties": {
                "text": {"type": "string", "description": "画像正文"},
                "version": {"type": "integer", "description": "本入口内的版本号"},
                "generated_at": {"type": "string", "format": "date-time", "description": "生成或管理员编辑／回滚时间"},
                "possibly_stale": {"type": "boolean", "description": "依据已变化，仅作可能过时的背景"},
            },
        },
        "PersonSummary": {
            "type": "object",
            "description": "参与者的已发布人物摘要（本版尚无人物摘要，people 始终为 []）",
            "required": ["subject_id", "name", "text", "version", "generated_at", "possibly_stale"],
            "properties": {
                "subject_id": {"type": "string", "description": "主体 ID"},
                "name": {"type": "string", "description": "显示名（participant_names 可改变）"},
                "text": {"type": "string", "description": "摘要正文，每人至多 250 个估算 token"},
                "version": {"type": "integer", "description": "摘要版本号"},
                "generated_at": {"type": "string", "format": "date-time", "description": "生成时间"},
                "possibly_stale": {"type": "boolean", "description": "依据已变化，可能过时"},
            },
        },
        "Judgment": {
            "type": "object",
            "description": "召回判断是否应用、关闭或降级",
            "required": ["status"],
            "properties": {
                "status": {"type": "string", "enum": ["applied", "disabled", "skipped", "degraded"],
                           "description": "applied 已应用；disabled 由 judge=false 关闭；skipped 无候选或模型不能判断；"
                                          "degraded 模型失败或超时，返回未经判断的记忆并加 hint"},
                "reason": {"type": "string", "description": "skipped／degraded 的原因：no_candidates、no_model、"
                                                            "model_cannot_judge、model_failed、timeout、invalid_answer"},
                "budget_seconds": {"type": "number", "description": "本次判断预算（秒）"},
                "dropped": {"type": "integer", "description": "applied 时被判断为无用而去掉的记忆数"},
            },
        },
        "Hint": {
            "type": "object",
            "description": "运行提示：降级、缺口、其他授权入口的待学习计数；不是事实或新经历。宿主须忽略未知 code",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "judgment_degraded、recall_degraded、other_entries_pending、"
                                                          "people_unavailable 等；可能增加新 code"},
                "message": {"type": "string", "description": "给人看的说明，不要据此做程序判断"},
                "entry_count": {"type": "integer", "description": "other_entries_pending：本令牌范围内另有待学习消息的入口数"},
                "time_from": {"type": "string", "format": "date-time", "description": "other_entries_pending：最早接收时间（UTC）"},
                "time_to": {"type": "string", "format": "date-time", "description": "other_entries_pending：最晚接收时间（UTC）"},
                "time_basis": {"type": "string", "enum": ["received_at"], "description": "时间依据：接收时间"},
            },
        },
    }


_field_glossary = {
    "id": "编号", "entry_id": "入口 ID", "content": "正文", "kind": "类型", "stance": "立场",
    "lifecycle": "生命周期", "people": "涉及的人物", "occurred_at": "发生时间", "forgotten": "是否已遗忘",
    "reason": "原因", "sources": "来源条目", "subject_annotations": "可能同一人与虚构扮演的标注（本版为空数组）",
    "message_id": "来源消息 ID", "code": "错误代码或提示代码，按它判断", "message": "给人看的说明，不要据此做程序判断",
    "field": "字段路径", "fields": "字段问题列表", "retry_after_seconds": "建议等待的整数秒（仅 429／503）",
    "retry_at": "预计可再次尝试的时间（仅 429／503）", "error": "错误对象", "memories": "记忆列表",
    "hints": "运行提示列表", "recall_id": "召回标识，用于 POST /feedback", "content_type": "MIME 类型",
    "size_bytes": "解码后的字节数", "understanding_text": "理解文本", "last_error": "最近一次理解失败的原因",
    "activity": "当前活动", "mood": "情绪", "started_at": "开始时间", "duration_seconds": "持续秒数",
    "accepted": "是否接受", "health": "整体健康：ok 或 degraded", "state": "状态",
    "message_count": "批次消息数", "first_message_id": "批次第一条消息 ID", "last_message_id": "批次最后一条消息 ID",
    "created_at": "创建时间", "finished_at": "结束时间", "attempts": "已尝试次数",
}
"""Chinese descriptions for property names that mean the same thing on every route, used
where a schema gives none (every property of the document ends up described)."""

_cjk = re.compile(r"[\u4e00-\u9fff]")


def _describe_properties(node: Any) -> None:
    """Fill in missing property descriptions from ``_field_glossary`` (in place)."""
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            if isinstance(prop, dict) and "$ref" not in prop and not _cjk.search(prop.get("description", "")):
                glossed = _field_glossary.get(name)
                if glossed is not None:
                    prop["description"] = glossed
        for value in node.values():
            _describe_properties(value)
    elif isinstance(node, list):
        for value in node:
            _describe_properties(value)


def _use_section_schemas(paths: dict[str, Any]) -> None:
    """Point prepare's sections (and search's memories and hints) at the shared schemas."""
    prepare = paths.get(f"{api_prefix}/entries/{{entry_id}}/prepare", {}).get("post")
    if prepare is None:
        return
    schema = prepare["responses"]["200"]["content"]["application/json"]["schema"]
    properties = schema.setdefault("properties", {})
    properties["persona"] = {"$ref": _ref.format(model="Persona")}
    properties["recent_messages"] = {"type": "array", "items": {"$ref": _ref.format(model="RecentMessage")},
                                     "description": "仅本入口近期原始消息，按顺序；unlearned 标明尚未成功学习"}
    properties["entry_profile"] = {"$ref": _ref.format(model="EntryProfile")}
    properties["people"] = {"type": "array", "items": {"$ref": _ref.format(model="PersonSummary")},
                            "description": "当前参与者的已发布人物摘要；关闭或无可返回摘要时为 []（本版始终为 []）"}
    properties["judgment"] = {"$ref": _ref.format(model="Judgment")}
    schema["required"] = ["persona", "memories", "recent_messages", "state", "goals", "hints",
                          "entry_profile", "people", "judgment", "recall_id"]
    for path in (f"{api_prefix}/entries/{{entry_id}}/prepare", f"{api_prefix}/memories/search"):
        response = paths[path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        hints = response.get("properties", {}).get("hints")
        if hints is not None:
            hints["items"] = {"$ref": _ref.format(model="Hint")}
            hints["description"] = "运行提示列表；宿主须忽略未知 code"


def error_codes() -> list[str]:
    """Every ``error.code`` this surface can answer."""
    from ._routes_events import event_refusals
    from ._routes_recall import refusal_statuses

    return sorted({*default_messages, *refusal_statuses, *event_refusals})


def _documentation_paths() -> dict[str, Any]:
    """``/openapi.json`` and ``/docs``: no token needed (still Host-checked, never cached)."""
    errors = {
        code: {"description": _error_statuses[code],
               "content": {"application/json": {"schema": {"$ref": _ref.format(model="Error")}}}}
        for code in _always_statuses
    }
    return {
        "/openapi.json": {"get": {
            "summary": "OpenAPI 文档", "description": "本接口的 OpenAPI 3.1 文档（中文说明），无需令牌。",
            "security": [],
            "responses": {"200": {"description": "OpenAPI 3.1 文档（JSON）",
                                  "content": {"application/json": {"schema": {"type": "object"}}}}, **errors},
        }},
        "/docs": {"get": {
            "summary": "交互文档页面", "description": "读取 /openapi.json 的自包含页面，不依赖任何外部资源，离线可用；无需令牌。",
            "security": [],
            "responses": {"200": {"description": "自包含的 HTML 文档页面", "content": {"text/html": {"schema": {"type": "string"}}}},
                          **errors},
        }},
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (built once; it depends only on the code)."""
    schemas: dict[str, Any] = {"Error": _error_schema(), **_section_schemas()}
    schemas["Error"]["properties"]["error"]["properties"]["code"]["enum"] = error_codes()
    for model in (MessageIn, MessagesAccepted):
        schema = model.model_json_schema(ref_template=_ref)
        schemas.update(schema.pop("$defs", {}))
        schemas[schema.get("title", model.__name__)] = schema
    paths = {**_paths(), **_documentation_paths()}
    _use_section_schemas(paths)
    _describe_properties(paths)
    _describe_properties(schemas)
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
        "paths": paths,
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
<p><label>宿主令牌（仅保存在本页内存中，用于下方“发送”）：<input id="token" type="password" size="50" autocomplete="off"></label></p>
<div id="operations">正在读取 /openapi.json …</div>
<h2>数据结构</h2><div id="schemas"></div>
<script>
function element(tag, text){const node=document.createElement(tag); if(text!==undefined) node.textContent=text; return node;}
function block(value){return element("pre", JSON.stringify(value, null, 2));}
function tryForm(method, path, op){
  const form=element("div"); const target=element("input"); target.value=path; target.size=60;
  const body=element("textarea"); body.rows=4; body.cols=70; body.value=op.requestBody?"{}":"";
  const send=element("button", "发送"); const output=element("pre", "");
  send.onclick=async()=>{
    const headers={}; const token=document.getElementById("token").value;
    if(token) headers["Authorization"]="Bearer "+token;
    const init={method: method.toUpperCase(), headers};
    if(op.requestBody && body.value.trim()){headers["Content-Type"]="application/json"; init.body=body.value;}
    try{const response=await fetch(target.value, init); output.textContent=response.status+"\\n"+await response.text();}
    catch(error){output.textContent=String(error);}
  };
  form.append(element("h4","试用"), target, element("br"));
  if(op.requestBody) form.append(body, element("br"));
  form.append(send, output);
  return form;
}
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
      box.append(tryForm(method, path, op));
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


__all__ = ["docs_page", "error_codes", "openapi_document", "openapi_json"]
