"""``GET/POST /api/v1/goals`` and ``PATCH /api/v1/goals/{goal_id}``: the character's goals.

A thin adapter over the goals actor (``troupe.actors.host._goals_actor``): validate here,
let the one goals actor apply the write in one transaction (dedup, reminders, receipts), and
read lists straight from committed storage.  Validation is hand-written, as for ``/state``,
because PATCH distinguishes an absent ``deadline`` (unchanged) from ``null`` (cleared), and
because a PATCH naming a field it cannot change (``content`` above all: the contract has no
content editing) must be refused rather than ignored.  Unknown POST fields are ignored.

Scope: every token sees global goals and its own entries' goals; writing a global goal (or
merging into one) needs an all-entries token, else 403 ``entry_forbidden`` with nothing
changed.  Bodies are at most 32768 bytes (the gate's per-route limit).
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.host import (
    CreateGoal,
    Deadline,
    GoalFilter,
    GoalRefused,
    GoalReply,
    GoalsUnavailable,
    PatchGoal,
    due_states,
    goal_content_characters_max,
    goal_kinds,
    goal_list_limit_default,
    goal_list_limit_max,
    goal_list_offset_max,
    goal_people_max,
    goal_person_characters_max,
    goal_status_abandoned,
    goal_status_completed,
    goal_statuses,
    goals_key,
    goals_kind_name,
    host_key_characters_max,
    list_goals,
    reminder_minutes_max,
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
from ._routes import api_prefix, goal_body_bytes_max

goals_path = f"{api_prefix}/goals"
goal_path = f"{goals_path}/<goal_id>"
goal_id_max = 2**63 - 1

patch_statuses = (goal_status_completed, goal_status_abandoned)
patch_fields = frozenset({"status", "deadline", "reminder_minutes", "expected_revision"})
"""What a PATCH may name; any other field (content, kind, people, entry_id...) is refused."""

_date = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _object(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "需要 JSON 对象")])
    return document


def _strict_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text_problem(value: Any, characters_max: int) -> str | None:
    if not isinstance(value, str):
        return "需要字符串"
    if not value.strip():
        return "不能为空或全为空白"
    if len(value) > characters_max:
        return f"最多 {characters_max} 个字符"
    return None


def parse_deadline(value: Any) -> Deadline:
    """``YYYY-MM-DD`` (end of that day in the character's time zone) or an aware ISO time;
    ``ValueError`` with a Chinese message otherwise."""
    if not isinstance(value, str):
        raise ValueError("需要日期（YYYY-MM-DD）或带时区的 ISO 时间")
    if _date.match(value):
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            raise ValueError("日期不存在") from None
        return Deadline(date=value)
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("需要日期（YYYY-MM-DD）或带时区的 ISO 时间") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("时间须带时区；只给日期时按角色时区当天末尾解释")
    return Deadline(seconds=moment.timestamp())


def _reminder_minutes_problem(value: Any) -> str | None:
    if not _strict_int(value) or not 0 <= value <= reminder_minutes_max:
        return f"需要 0—{reminder_minutes_max} 的整数"
    return None


def validate_create(document: Any, grant: Any) -> CreateGoal:
    body = _object(document)
    problems: list[FieldProblem] = []
    forbidden = False
    entry_id = body.get("entry_id")
    if entry_id is not None:
        problem = "需要字符串或 null" if not isinstance(entry_id, str) else entry_id_problem(entry_id)
        if problem is not None:
            raise HostError(400, code_invalid_request, fields=[FieldProblem("body.entry_id", problem)])
        forbidden = not grant.scope.allows(entry_id)
    if "content" not in body:
        problems.append(FieldProblem("body.content", "缺少必填字段"))
    else:
        problem = _text_problem(body["content"], goal_content_characters_max)
        if problem is not None:
            problems.append(FieldProblem("body.content", problem))
    kind = body.get("kind", "normal")
    if kind not in goal_kinds:
        problems.append(FieldProblem("body.kind", "只能是 normal 或 question"))
    people = body.get("people")
    if people is None:
        people = []
    elif not isinstance(people, list):
        problems.append(FieldProblem("body.people", "需要字符串数组"))
        people = []
    elif len(people) > goal_people_max:
        problems.append(FieldProblem("body.people", f"最多 {goal_people_max} 项"))
    else:
        for index, person in enumerate(people):
            problem = _text_problem(person, goal_person_characters_max)
            if problem is not None:
                problems.append(FieldProblem(f"body.people[{index}]", problem))
    deadline = None
    if body.get("deadline") is not None:
        try:
            deadline = parse_deadline(body["deadline"])
        except ValueError as exc:
            problems.append(FieldProblem("body.deadline", str(exc)))
    minutes = body.get("reminder_minutes")
    if minutes is not None and (problem := _reminder_minutes_problem(minutes)) is not None:
        problems.append(FieldProblem("body.reminder_minutes", problem))
    host_key = body.get("host_key")
    if host_key is not None and (problem := _text_problem(host_key, host_key_characters_max)) is not None:
        problems.append(FieldProblem("body.host_key", problem))
    if forbidden:
        raise HostError(403, code_entry_forbidden, fields=[FieldProblem("body.entry_id", "令牌无权访问该入口")])
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)
    return CreateGoal(
        content=body["content"], kind=kind, people=tuple(dict.fromkeys(people)), entry_id=entry_id,
        deadline=deadline, reminder_minutes=minutes, host_key=host_key, source=grant.name,
        all_scope=grant.scope.kind == "all", allows=grant.scope.allows,
    )


def parse_goal_id(text: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= goal_id_max:
        raise HostError(400, code_invalid_request, fields=[FieldProblem("path.goal_id", "需要正整数目标 ID")])
    return int(text)


def validate_patch(goal_id: int, document: Any, grant: Any) -> PatchGoal:
    body = _object(document)
    problems = [
        FieldProblem(f"body.{name}", "不能修改此字段；修改不包含编辑目标正文、类型、人物或入口")
        for name in sorted(set(body) - patch_fields)
    ]
    status = body.get("status")
    if status is not None and status not in patch_statuses:
        problems.append(FieldProblem("body.status", "只能是 completed 或 abandoned"))
    deadline = None
    if body.get("deadline") is not None:
        try:
            deadline = parse_deadline(body["deadline"])
        except ValueError as exc:
            problems.append(FieldProblem("body.deadline", str(exc)))
    minutes = body.get("reminder_minutes")
    if minutes is not None and (problem := _reminder_minutes_problem(minutes)) is not None:
        problems.append(FieldProblem("body.reminder_minutes", problem))
    expected = body.get("expected_revision")
    if expected is not None and (not _strict_int(expected) or expected < 1):
        problems.append(FieldProblem("body.expected_revision", "需要正整数"))
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)
    return PatchGoal(
        goal_id=goal_id, status=status, deadline_given="deadline" in body, deadline=deadline,
        reminder_minutes=minutes, expected_revision=expected, source=grant.name,
        all_scope=grant.scope.kind == "all", allows=grant.scope.allows,
    )


def validate_filter(arguments: Any, allows: Any) -> GoalFilter:
    problems: list[FieldProblem] = []
    values: dict[str, Any] = {}
    for name, allowed in (("status", goal_statuses), ("kind", goal_kinds), ("due", due_states)):
        value = arguments.get(name)
        if value is not None:
            if value not in allowed:
                problems.append(FieldProblem(f"query.{name}", f"只能是 {'、'.join(allowed)}"))
            values[name] = value
    for name, low, high, default in (("limit", 1, goal_list_limit_max, goal_list_limit_default),
                                     ("offset", 0, goal_list_offset_max, 0)):
        text = arguments.get(name)
        if text is None:
            values[name] = default
        elif not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            problems.append(FieldProblem(f"query.{name}", f"需要 {low}—{high} 的整数"))
        else:
            values[name] = int(text)
    entry_id = arguments.get("entry_id")
    if entry_id is not None:
        problem = entry_id_problem(entry_id)
        if problem is not None:
            problems.append(FieldProblem("query.entry_id", problem))
        values["entry_id"] = entry_id
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)
    if entry_id is not None and not allows(entry_id):
        raise HostError(403, code_entry_forbidden, fields=[FieldProblem("query.entry_id", "令牌无权访问该入口")])
    return GoalFilter(**values)


def _reply(reply: Any) -> tuple[dict[str, Any], int]:
    if isinstance(reply, GoalsUnavailable):
        raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
    if isinstance(reply, GoalRefused):
        fields = [] if reply.field_path is None else [FieldProblem(reply.field_path, reply.message or reply.code)]
        raise HostError(reply.status, reply.code, message=reply.message if reply.field_path is None else None,
                        fields=fields, extra=reply.extra)
    assert isinstance(reply, GoalReply)
    return reply.document, 201 if reply.created else 200


def install_goal_routes(app: QuartTrio, dependencies: Any) -> None:
    """Register ``/api/v1/goals`` (GET, POST) and ``/api/v1/goals/{goal_id}`` (PATCH)."""
    # Imported here: ``_app`` imports this module to register the routes.
    from ._app import _json, _json_body, ask_actor

    system, engine, clock = dependencies.system, dependencies.engine, dependencies.env.clock

    @app.get(goals_path)
    async def get_goals() -> Response:
        allows = admission_of(request.scope).grant.scope.allows
        query = validate_filter(request.args, allows)
        now = clock.wall()
        return _json(await engine.read(lambda connection: list_goals(connection, query, now=now, allows=allows)))

    @app.post(goals_path)
    async def post_goal() -> Response:
        grant = admission_of(request.scope).grant
        command = validate_create(await _json_body(), grant)
        document, status = _reply(await ask_actor(system, goals_kind_name, goals_key, command))
        return _json(document, 201 if status in (200, 201) else status)

    @app.patch(goal_path)
    async def patch_goal(goal_id: str) -> Response:
        grant = admission_of(request.scope).grant
        command = validate_patch(parse_goal_id(goal_id), await _json_body(), grant)
        document, _ = _reply(await ask_actor(system, goals_kind_name, goals_key, command))
        return _json(document)


def goals_openapi_paths() -> dict[str, Any]:
    """The OpenAPI path items of ``/goals`` and ``/goals/{goal_id}``."""
    from ._openapi import _operation

    time = {"type": ["string", "null"], "format": "date-time"}
    goal = {
        "type": "object",
        "description": "目标（时间均为角色时区的 ISO 格式）",
        "properties": {
            "id": {"type": "integer", "description": "目标 ID"},
            "content": {"type": "string", "description": "目标正文（不能修改）"},
            "kind": {"type": "string", "enum": list(goal_kinds), "description": "normal 目标或 question 询问"},
            "people": {"type": "array", "items": {"type": "string"}, "description": "相关人物"},
            "entry_id": {"type": ["string", "null"], "description": "所属入口；null 为全局目标"},
            "deadline_at": time | {"description": "截止时间；日期型截止为角色时区当天末尾"},
            "deadline_is_date": {"type": "boolean", "description": "截止以日期给出"},
            "reminder_minutes": {"type": "integer", "description": "临近提醒提前分钟数；0 不发临近提醒"},
            "near_at": time | {"description": "临近提醒时刻；无截止、提前量为 0 或询问时为 null"},
            "due_state": {"type": "string", "enum": list(due_states), "description": "到期情况：none、upcoming、near、overdue"},
            "status": {"type": "string", "enum": list(goal_statuses), "description": "状态：active 进行中、completed 已完成、abandoned 已放弃、merged 已合并"},
            "revision": {"type": "integer", "description": "修订号，每次修改加 1；PATCH 的 expected_revision 与之比较"},
            "canonical_id": {"type": ["integer", "null"], "description": "已合并时为保留对象 ID"},
            "source": {"type": "string", "description": "创建它的令牌来源名称"},
            "created_at": time | {"description": "创建时间"},
            "updated_at": time | {"description": "最近修改时间"},
            "completed_at": time | {"description": "完成时间"},
            "abandoned_at": time | {"description": "放弃时间"},
            "dedup_pending": {"type": "boolean", "description": "仍待去重复核"},
            "dedup_injectable": {"type": "boolean", "description": "当前可注入 prepare/search 并发布提醒"},
            "dedup_fallback_at": time | {"description": "去重兜底时刻（角色时区）；不待复核时为 null"},
        },
    }
    create_request = {"type": "object", "required": ["content"], "properties": {
        "content": {"type": "string", "description": f"目标正文，1—{goal_content_characters_max} 个字符"},
        "kind": {"type": "string", "enum": list(goal_kinds), "description": "默认 normal；question 没有截止提醒"},
        "people": {"type": ["array", "null"], "items": {"type": "string"}, "description": f"相关人物，最多 {goal_people_max} 项"},
        "entry_id": {"type": ["string", "null"], "description": "所属入口；省略为全局目标（需要 all 范围令牌）"},
        "deadline": {"type": ["string", "null"], "description": "YYYY-MM-DD（角色时区当天末尾）或带时区的 ISO 时间"},
        "reminder_minutes": {"type": ["integer", "null"], "description": f"临近提醒提前量，0—{reminder_minutes_max}，默认 60"},
        "host_key": {"type": ["string", "null"], "description": f"宿主幂等键，最多 {host_key_characters_max} 个字符；相同绑定宿主重试返回最初回执"},
    }}
    receipt = {"type": "object", "required": ["goal", "submitted_id", "dedup"], "properties": {
        "goal": goal | {"description": "去重后保留的目标"},
        "submitted_id": {"type": "integer", "description": "本次提交的对象 ID（合并时为被合并对象）"},
        "dedup": {"type": "object", "description": "去重情况", "properties": {
            "result": {"type": "string", "enum": ["created", "merged", "possible_duplicate"], "description": "新建、合并或可能重复"},
            "canonical_id": {"type": ["integer", "null"], "description": "合并到的保留对象"},
            "candidate_id": {"type": ["integer", "null"], "description": "可能重复的已有目标"},
            "judgement": {"type": "string", "enum": ["not_needed", "pending", "disabled"], "description": "后台判断情况"},
            "fallback_at": time | {"description": "兜底注入时刻（角色时区）"},
        }},
    }}
    patch_request = {"type": "object", "properties": {
        "status": {"type": ["string", "null"], "enum": [*patch_statuses, None], "description": "completed 完成或 abandoned 放弃"},
        "deadline": {"type": ["string", "null"], "description": "新截止；null 清除截止"},
        "reminder_minutes": {"type": ["integer", "null"], "description": "新提醒提前量"},
        "expected_revision": {"type": ["integer", "null"], "description": "期望修订号；不一致返回 409 revision_conflict"},
    }}
    listing = {"type": "object", "required": ["items", "total", "limit", "offset"], "properties": {
        "items": {"type": "array", "items": goal, "description": "本页目标，按 ID 升序"},
        "total": {"type": "integer", "description": "符合筛选的总数"},
        "limit": {"type": "integer", "description": "本页上限"},
        "offset": {"type": "integer", "description": "起始偏移"},
    }}

    def query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}

    limit = f"正文最多 {goal_body_bytes_max} 字节。"
    return {
        goals_path: {
            "get": _operation("列出目标", "全局目标及令牌范围内入口的目标，可按状态、类型、到期情况和入口筛选并分页。",
                              request=None, success=("200", "目标列表", listing), errors=("400", "401", "403", "429", "503"))
            | {"parameters": [
                query("status", "状态筛选", {"type": "string", "enum": list(goal_statuses)}),
                query("kind", "类型筛选", {"type": "string", "enum": list(goal_kinds)}),
                query("due", "到期情况筛选", {"type": "string", "enum": list(due_states)}),
                query("entry_id", "入口筛选（须在令牌范围内）", {"type": "string"}),
                query("limit", f"每页条数，默认 {goal_list_limit_default}，最多 {goal_list_limit_max}", {"type": "integer"}),
                query("offset", "起始偏移，默认 0", {"type": "integer"}),
            ]},
            "post": _operation("创建目标", "创建目标或询问并去重；相同内容的已有目标直接合并，相似目标待后台复核，"
                               "待复核期间不注入、不提醒，首次入队 30 分钟后带待复核标记恢复注入。" + limit,
                               request=create_request, success=("201", "回执：保留的目标、提交 ID 与去重情况", receipt),
                               errors=("400", "401", "403", "413", "429", "503")),
        },
        f"{goals_path}/{{goal_id}}": {
            "parameters": [{"name": "goal_id", "in": "path", "required": True, "description": "目标 ID",
                            "schema": {"type": "integer", "minimum": 1}}],
            "patch": _operation("修改目标", "完成、放弃、修改截止时间与提醒提前量；不能编辑正文。完成或放弃会取消未发布的提醒。" + limit,
                                request=patch_request, success=("200", "修改后的目标", goal),
                                errors=("400", "401", "403", "404", "409", "413", "429", "503")),
        },
    }


__all__ = [
    "goal_path",
    "goals_openapi_paths",
    "goals_path",
    "install_goal_routes",
    "parse_deadline",
    "parse_goal_id",
    "validate_create",
    "validate_filter",
    "validate_patch",
]
