"""``GET /api/v1/notifications?after=&limit=``: the pull side of reminders.

A thin adapter over the read model (``troupe.actors.host._notifications``): validate the two
query parameters, run ``take_notifications`` in one write transaction (scope filtering before
paging and before marking taken; taking is idempotent and never touches a goal), render.
``after`` is the host's own persisted cursor (an integer ≥ 0, default 0; the same cursor may
be fetched again), ``limit`` 1—100 (default 100).  Unknown query parameters are ignored, as
for every other pull route (only ``/events`` refuses them, as the contract asks).
"""

from __future__ import annotations

from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.host import (
    notifications_limit_default,
    notifications_limit_max,
    take_notifications,
)

from ._errors import FieldProblem, HostError, code_invalid_request
from ._gate import admission_of
from ._routes import api_prefix

notifications_path = f"{api_prefix}/notifications"

notifications_after_max = 2**63 - 1
"""``after`` above this is not a SQLite integer."""


def _integer_parameter(name: str, default: int, low: int, high: int) -> int:
    values = request.args.getlist(name)
    if not values:
        return default
    if len(values) > 1:
        raise HostError(400, code_invalid_request, fields=[FieldProblem(f"query.{name}", "查询参数重复")])
    text = values[0].strip()
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise HostError(400, code_invalid_request, fields=[FieldProblem(f"query.{name}", f"须为 {low}—{high} 的整数")])
    return int(text)


def install_notification_routes(app: QuartTrio, dependencies: Any) -> None:
    """Register ``GET /api/v1/notifications`` on the host app."""
    from ._app import _json

    engine, clock = dependencies.engine, dependencies.env.clock

    @app.get(notifications_path)
    async def notifications() -> Response:
        scope = admission_of(request.scope).grant.scope
        after = _integer_parameter("after", 0, 0, notifications_after_max)
        limit = _integer_parameter("limit", notifications_limit_default, 1, notifications_limit_max)
        now = clock.wall()
        page = await engine.write(
            lambda connection: take_notifications(connection, after=after, limit=limit, scope=scope, now=now))
        return _json(page.document())


def notifications_openapi_paths() -> dict[str, Any]:
    from ._openapi import _operation

    zoned = {"type": ["string", "null"], "format": "date-time"}
    item = {"type": "object", "required": [
        "id", "kind", "goal_id", "reminder_kind", "deadline_at", "scheduled_at", "published_at", "content",
        "status", "taken_at", "cancelled_at"], "properties": {
        "id": {"type": "integer", "description": "通知 ID（递增），用于去重和 after 游标"},
        "kind": {"type": "string", "description": "goal_reminder（目标提醒）或 goal_dedup（去重结果）；宿主须忽略未知种类"},
        "goal_id": {"type": "integer", "description": "目标 ID"},
        "reminder_kind": {"type": ["string", "null"], "description": "near（临近）或 due（到期）"},
        "deadline_at": zoned | {"description": "截止时间（角色时区）"},
        "scheduled_at": zoned | {"description": "计划提醒时间（角色时区）"},
        "published_at": zoned | {"description": "发布时间（角色时区）"},
        "content": {"type": "string", "description": "目标正文"},
        "status": {"type": "string", "enum": ["pending", "taken", "cancelled"], "description": "pending 未取走、taken 已取走、cancelled 已取消"},
        "taken_at": zoned | {"description": "首次取走时间（角色时区），重取不改写"},
        "cancelled_at": zoned | {"description": "取消时间（目标完成或放弃；角色时区）"},
    }}
    page = {"type": "object", "required": ["items", "next_cursor", "has_more"], "properties": {
        "items": {"type": "array", "items": item, "description": "通知列表（已按令牌范围过滤）"},
        "next_cursor": {"type": "integer", "description": "下次请求的 after；宿主持久处理后再保存"},
        "has_more": {"type": "boolean", "description": "是否还有更多可见通知"},
    }}
    operation = _operation(
        "拉取通知", "按递增游标取通知，最多 100 条。权限过滤在分页和标记已取走之前完成；同一游标可重取，"
        "重取不改写首次 taken_at；取走不证明已送达，也不完成目标。",
        request=None, success=("200", "通知页", page), errors=("400", "401", "429", "503"))
    operation["parameters"] = [
        {"name": "after", "in": "query", "required": False, "description": "游标：只返回 ID 大于它的通知，默认 0",
         "schema": {"type": "integer", "minimum": 0}},
        {"name": "limit", "in": "query", "required": False, "description": f"最多条数 1—{notifications_limit_max}，默认 {notifications_limit_default}",
         "schema": {"type": "integer", "minimum": 1, "maximum": notifications_limit_max}},
    ]
    return {notifications_path: {"get": operation}}


__all__ = ["install_notification_routes", "notifications_after_max", "notifications_openapi_paths", "notifications_path"]
