"""OpenAPI 3.1 (Chinese summaries) for the knowledge surface, served at ``/openapi.json``.

Why generated from the operation table: the gate, quart's rules and this document list the
same routes and methods.  Request bodies are the pydantic models of ``_schemas`` (the very
models the handlers validate with); every operation documents the error envelope and the
statuses the gate adds to every route (400, 404, 405, 413, 503).  No ``/docs`` page: the
quart-schema pages load assets from public CDNs this machine may not reach.
"""

from __future__ import annotations

import functools
from typing import Any

from troupe.actors.knowledge import api_version

from ._routes import operations
from ._schemas import (
    AgentContextIn,
    ForgetIn,
    LifecycleIn,
    MemoryQueryIn,
    MemoryUpdateIn,
    MemoryWriteIn,
    PreferenceExtractIn,
    PromoteIn,
    RecoverIn,
)

_request_models = {
    "memory_write": MemoryWriteIn,
    "memory_update": MemoryUpdateIn,
    "memory_query": MemoryQueryIn,
    "agent_context": AgentContextIn,
    "agent_lifecycle": LifecycleIn,
    "idempotency_recover": RecoverIn,
    "preference_extract": PreferenceExtractIn,
    "forget": ForgetIn,
    "promote": PromoteIn,
}

_query_parameters = {
    "preferences": [("scope", "string", "作用域过滤，如 shared:home")],
    "conflicts": [("scope", "string", "作用域过滤（可选）")],
    "insights": [("limit", "integer", "1～10，缺省 3")],
    "digest": [("date", "string", "YYYY-MM-DD，缺省为本地今天")],
}

_error_schema = {
    "type": "object",
    "required": ["error", "message", "request_id"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}, "request_id": {"type": "string"}},
}

_gate_statuses = {
    "400": "请求不符合 Schema 或 Host 不被允许（INVALID_REQUEST）",
    "404": "资源或路由不存在（NOT_FOUND）",
    "405": "方法不允许（METHOD_NOT_ALLOWED）",
    "413": "请求体超过该路由上限（PAYLOAD_TOO_LARGE）",
    "500": "后端内部错误（INTERNAL_ERROR）",
    "503": "数据库未就绪（SCHEMA_NOT_READY）或繁忙（OVERLOADED，带 Retry-After）",
}

_extra_statuses = {
    "memory_write": {"409": "IDEMPOTENCY_CONFLICT / IN_PROGRESS / FAILED", "422": "SENSITIVE_SHARED_SCOPE"},
    "memory_update": {"409": "VERSION_CONFLICT / KNOWLEDGE_NOT_ACTIVE / IDEMPOTENCY_*",
                      "422": "SENSITIVE_SHARED_SCOPE"},
    "agent_lifecycle": {"409": "IDEMPOTENCY_CONFLICT / IN_PROGRESS / FAILED"},
    "idempotency_recover": {"409": "IDEMPOTENCY_CONFLICT / IN_PROGRESS / COMPLETED"},
    "forget": {"408": "CONFLICT_TIMEOUT（确认已过期）"},
}


def _error_response(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _operation(operation: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "operationId": operation.name,
        "summary": operation.summary,
        "responses": {"200": {"description": "成功", "content": {"application/json": {"schema": {"type": "object"}}}},
                      **{status: _error_response(text) for status, text in _gate_statuses.items()},
                      **{status: _error_response(text)
                         for status, text in _extra_statuses.get(operation.name, {}).items()}},
    }
    model = _request_models.get(operation.name)
    if model is not None:
        document["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    parameters = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}] \
        if "{id}" in operation.path else []
    parameters += [{"name": name, "in": "query", "required": False, "schema": {"type": kind}, "description": text}
                   for name, kind, text in _query_parameters.get(operation.name, [])]
    if parameters:
        document["parameters"] = parameters
    return document


@functools.cache
def openapi_document() -> dict[str, Any]:
    schemas: dict[str, Any] = {"Error": _error_schema}
    for model in _request_models.values():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    paths: dict[str, Any] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method.lower()] = _operation(operation)
    return {
        "openapi": "3.1.0",
        "info": {"title": "PIXIU 记忆服务 API（troupe knowledge 接口）", "version": api_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


__all__ = ["openapi_document"]
