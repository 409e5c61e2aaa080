"""``GET/PUT/PATCH/DELETE /api/v1/state``: the character's global state as hosts report it.

A thin adapter over ``HostStateActor`` (``troupe.actors.host._state``): validate the body here,
let the one state actor apply it in one transaction, render the reply with the Env clock and
the reading token's scope.  Bodies are at most 32768 bytes (the gate's per-route limit).
Validation is hand-written rather than pydantic because the rules hinge on a field being
absent versus ``null`` (a PATCH ``mood: null`` clears the mood, a detail ``null`` deletes it,
an absent field leaves things alone).  Unknown fields are ignored, except that a PATCH naming
``activity`` or ``started_at`` is refused: a PATCH never replaces the activity (use PUT).
"""

from __future__ import annotations

from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.host import (
    EndState,
    PatchState,
    PutState,
    StateRefused,
    StateReply,
    StateUnavailable,
    current_state,
    state_detail_key_characters_max,
    state_details_max,
    state_document,
    state_key,
    state_kind_name,
)
from troupe.auth import entry_id_problem

from ._errors import (
    FieldProblem,
    HostError,
    code_entry_forbidden,
    code_invalid_request,
    code_unavailable,
    retry_after_seconds_unknown,
)
from ._gate import admission_of
from ._routes import api_prefix, state_body_bytes_max
from ._schemas import parse_aware_time

state_path = f"{api_prefix}/state"


def _object(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "需要 JSON 对象")])
    return document


def _details_problems(value: Any) -> list[FieldProblem]:
    if not isinstance(value, dict):
        return [FieldProblem("body.details", "需要 JSON 对象")]
    problems = []
    if len(value) > state_details_max:
        problems.append(FieldProblem("body.details", f"最多 {state_details_max} 项"))
    for key in value:
        if not 1 <= len(key) <= state_detail_key_characters_max or not key.strip():
            problems.append(FieldProblem(f"body.details.{key}", f"键须为 1—{state_detail_key_characters_max} 个字符且不能全为空白"))
    return problems


def _entry_problems(value: Any, allows: Any) -> tuple[list[FieldProblem], bool]:
    """(problems, forbidden) for an optional ``entry_id``."""
    if value is None:
        return [], False
    if not isinstance(value, str):
        return [FieldProblem("body.entry_id", "需要字符串或 null")], False
    problem = entry_id_problem(value)
    if problem is not None:
        return [FieldProblem("body.entry_id", problem)], False
    return [], not allows(value)


def _raise(problems: list[FieldProblem], forbidden: bool) -> None:
    if any(problem.field == "body.entry_id" for problem in problems):
        raise HostError(400, code_invalid_request, fields=problems)
    if forbidden:
        raise HostError(403, code_entry_forbidden, fields=[FieldProblem("body.entry_id", "令牌无权访问该入口")])
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)


def validate_put(document: Any, allows: Any, source: str) -> PutState:
    body = _object(document)
    problems, forbidden = _entry_problems(body.get("entry_id"), allows)
    activity = body.get("activity")
    if not isinstance(activity, str) or not activity.strip():
        message = "缺少必填字段" if activity is None else "需要非空白字符串"
        problems.append(FieldProblem("body.activity", message))
    details = body.get("details")
    if details is not None:
        problems += _details_problems(details)
    mood = body.get("mood")
    if mood is not None and not isinstance(mood, str):
        problems.append(FieldProblem("body.mood", "需要字符串或 null"))
    started_at = body.get("started_at")
    started_at_seconds = None
    if started_at is not None:
        try:
            if not isinstance(started_at, str):
                raise ValueError("需要带时区的 ISO 时间")
            started_at_seconds = parse_aware_time(started_at).timestamp()
        except ValueError as exc:
            problems.append(FieldProblem("body.started_at", str(exc)))
    _raise(problems, forbidden)
    return PutState(activity, dict(details or {}), mood, body.get("entry_id"), started_at_seconds, source)


def validate_patch(document: Any, source: str) -> PatchState:
    body = _object(document)
    problems = [
        FieldProblem(f"body.{name}", "PATCH 不替换活动或开始时间；请使用 PUT")
        for name in ("activity", "started_at") if name in body
    ]
    details = body.get("details")
    if details is not None:
        problems += _details_problems(details)
    mood_given = "mood" in body
    mood = body.get("mood")
    if mood is not None and not isinstance(mood, str):
        problems.append(FieldProblem("body.mood", "需要字符串或 null"))
    _raise(problems, False)
    return PatchState(dict(details or {}), mood_given, mood, source)


def install_state_routes(app: QuartTrio, dependencies: Any) -> None:
    """Register ``/api/v1/state`` (GET, PUT, PATCH, DELETE) on the host app."""
    # Imported here: ``_app`` imports this module to register the routes.
    from ._app import _json, _json_body, ask_actor

    system, engine, clock = dependencies.system, dependencies.engine, dependencies.env.clock

    async def ask(command: Any) -> Response:
        reply = await ask_actor(system, state_kind_name, state_key, command)
        if isinstance(reply, StateUnavailable):
            raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
        if isinstance(reply, StateRefused):
            problem = FieldProblem("body.details", f"状态最多保存 {state_details_max} 项细节（本次合并后为 {reply.detail_count} 项）")
            raise HostError(400, code_invalid_request, fields=[problem])
        assert isinstance(reply, StateReply)
        if isinstance(command, EndState):
            return _json({})
        allows = admission_of(request.scope).grant.scope.allows
        return _json(state_document(reply.state, now=clock.wall(), allows=allows))

    @app.get(state_path)
    async def get_state() -> Response:
        allows = admission_of(request.scope).grant.scope.allows
        return _json(await current_state(engine, now=clock.wall(), allows=allows))

    @app.put(state_path)
    async def put_state() -> Response:
        grant = admission_of(request.scope).grant
        return await ask(validate_put(await _json_body(), grant.scope.allows, grant.name))

    @app.patch(state_path)
    async def patch_state() -> Response:
        grant = admission_of(request.scope).grant
        return await ask(validate_patch(await _json_body(), grant.name))

    @app.delete(state_path)
    async def delete_state() -> Response:
        grant = admission_of(request.scope).grant
        entry_id = None
        if await _has_body():
            body = _object(await _json_body())
            problems, forbidden = _entry_problems(body.get("entry_id"), grant.scope.allows)
            _raise(problems, forbidden)
            entry_id = body.get("entry_id")
        return await ask(EndState(entry_id, grant.name))


async def _has_body() -> bool:
    """Whether a DELETE carries a body (it may come with none at all)."""
    if request.headers.get("content-length") not in (None, "0"):
        return True
    return "chunked" in request.headers.get("transfer-encoding", "").lower()


def state_openapi_paths() -> dict[str, Any]:
    """The OpenAPI path item of ``/state`` (merged into the surface's document)."""
    from ._openapi import _operation

    detail = {"type": "object", "required": ["value", "updated_at"], "properties": {
        "value": {"description": "宿主报告的值"},
        "updated_at": {"type": "string", "format": "date-time", "description": "该项的更新时间"},
    }}
    state_schema = {
        "type": "object",
        "description": "当前状态；无活动时为 {}（此时下列字段均不出现）",
        "properties": {
            "activity": {"type": "string"},
            "details": {"type": "object", "additionalProperties": detail, "description": "每个细节有自己的更新时间"},
            "mood": {"type": ["string", "null"]},
            "entry_id": {"type": ["string", "null"], "description": "报告入口；不在本令牌范围内时为 null"},
            "started_at": {"type": "string", "format": "date-time"},
            "start_time_basis": {"type": "string", "enum": ["first_report", "host"], "description": "host：宿主提供；first_report：首次报告该活动的时间"},
            "updated_at": {"type": "string", "format": "date-time", "description": "最近一次报告（含心跳）"},
            "duration_seconds": {"type": "integer", "minimum": 0},
            "possibly_stale": {"type": "boolean", "description": "超过 30 分钟没有任何报告或心跳"},
        },
    }
    put_request = {"type": "object", "required": ["activity"], "properties": {
        "activity": {"type": "string", "description": "当前活动（不能全为空白）"},
        "details": {"type": ["object", "null"], "description": f"细节，最多 {state_details_max} 项"},
        "mood": {"type": ["string", "null"]},
        "entry_id": {"type": ["string", "null"], "description": "报告入口；须在令牌范围内"},
        "started_at": {"type": ["string", "null"], "format": "date-time", "description": "带时区的开始时间；省略时相同活动保留原开始时间"},
    }}
    patch_request = {"type": "object", "properties": {
        "details": {"type": ["object", "null"], "description": "局部更新；值为 null 删除该项"},
        "mood": {"type": ["string", "null"], "description": "给出时替换情绪；null 清除"},
    }}
    delete_request = {"type": "object", "properties": {
        "entry_id": {"type": ["string", "null"], "description": "结束活动的入口；须在令牌范围内"}}}
    errors = ("400", "401", "403", "413", "429", "503")
    limit = f"正文最多 {state_body_bytes_max} 字节。"
    return {
        state_path: {
            "get": _operation("读取状态", "角色全局状态（宿主共享），可能过时；无活动时为 {}。", request=None,
                              success=("200", "当前状态或 {}", state_schema), errors=("400", "401", "429", "503")),
            "put": _operation("开始或替换活动", "相同活动保留开始时间；省略 started_at 时 start_time_basis=first_report，"
                              "宿主显式提供时为 host。" + limit, request=put_request,
                              success=("200", "开始或替换后的状态", state_schema), errors=errors),
            "patch": _operation("更新细节或情绪", "局部更新；{} 为心跳，不替换活动；细节值 null 删除该项。无活动时返回 {}。" + limit,
                                request=patch_request, success=("200", "更新后的状态或 {}", state_schema), errors=errors),
            "delete": _operation("结束活动", "结束当前活动，保留报告历史；可无正文或提供 entry_id。" + limit,
                                 request=None, success=("200", "已结束活动（或本来无活动），返回 {}", {"type": "object", "description": "总是 {}"}), errors=errors)
            | {"requestBody": {"required": False, "content": {"application/json": {"schema": delete_request}}}},
        },
    }


__all__ = ["install_state_routes", "state_openapi_paths", "state_path", "validate_patch", "validate_put"]
