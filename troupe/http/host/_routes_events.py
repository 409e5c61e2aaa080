"""``GET /api/v1/events`` (SSE) and ``GET /api/v1/events/status``.

Why the stream is a plain ASGI route in front of quart (``EventsRoute``): every rule of the
contract is about sends and waits that quart's streaming generator hides.  A send may wait
5 s and the final one 1 s more (the bound is tightened in the scope for the shared
``SendGuard``, which shields the final send); SIGINT/SIGTERM must end every wait *and* a send
stuck on a slow reader; a client that closes shows up as ``http.disconnect`` on ``receive``,
which a task here watches.  The route still runs behind the whole gate (Host, readiness,
token, rate), so those refusals look like every other route's.  Other methods fall through to
quart, which knows the path (a stand-in GET handler), and answer 400 ``method_not_allowed``.

Before the 200, in order: query parameters (only ``last_event_id``; anything else, a repeat,
a repeated ``Last-Event-ID`` header, a malformed id or a header and query that differ is 400
``invalid_request``), shutdown (503), the connection limits (429 ``event_token_limit`` /
``event_global_limit`` with ``Retry-After: 5``), then one read of the notification id bounds
(a storage failure is 503).  After the 200 no JSON error is ever mixed in: storage trouble,
revocation, idle and age limits, slow sends and shutdown all simply end the body.

One stream (``EventStream``): ``resync`` first when the start asks for it, a ``heartbeat`` at
once, then a loop that polls about once per ``poll_seconds`` (a primary-key range read of at
most 100 rows, from a read snapshot that also re-checks the token, so a revocation ends the
stream at the next poll), sends the deliverable rows as ``reminder`` frames (goal reminders,
not cancelled, in the token's scope), a heartbeat every ``heartbeat_seconds``, and ends after
``idle_seconds`` without a reminder or ``connection_seconds_max`` in all.  Every frame's id
is a cursor (``EventsHub.next_event_id``).  A vanished client (no FIN) is only found by a send
that cannot complete within the bound (``../shared/stack-notes.md``); heartbeats keep sending
so that happens, and the idle end frees its slot at the latest.
"""

from __future__ import annotations

import datetime
import json
import logging
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qsl

import trio
from quart import Response
from quart_trio import QuartTrio

from troupe.actors.host import (
    NotificationRow,
    notification_id_bounds,
    notification_item,
    notification_kind_goal_reminder,
    notification_status_cancelled,
    notification_visible,
    notifications_after,
    poll_notifications_max,
)
from troupe.auth import TokenGrant, bearer_secret, host_audience, token_lookup
from troupe.http import SendTimeout, SseEvent, send_seconds_scope_key
from troupe.storage import StorageError

from ._errors import (
    FieldProblem,
    HostError,
    code_invalid_request,
    code_unavailable,
    error_response_parts,
    retry_after_seconds_unknown,
)
from ._events import (
    EventLimitReached,
    EventSettings,
    EventsHub,
    StreamStart,
    code_event_global_limit,
    code_event_token_limit,
    parse_event_id,
)
from ._gate import admission_of
from ._routes import api_prefix

logger = logging.getLogger("troupe.host")

events_path = f"{api_prefix}/events"
events_status_path = f"{api_prefix}/events/status"
last_event_id_parameter = "last_event_id"
last_event_id_header = b"last-event-id"
resync_pull_url = f"{api_prefix}/notifications"

event_refusals = {
    code_event_token_limit: "该令牌的事件流连接数已达上限",
    code_event_global_limit: "服务的事件流连接总数已达上限",
}
"""The 429 codes of the connection limits and their messages (``rate_limited`` stays the
token's request rate)."""

stream_headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


def _invalid(field: str, message: str) -> HostError:
    return HostError(400, code_invalid_request, fields=[FieldProblem(field, message)])


def requested_event_id(scope: Any) -> str | None:
    """The resume id of a request (``Last-Event-ID`` or ``?last_event_id=``), None for a first
    subscription; ``HostError`` 400 for unknown or repeated parameters, repeated headers, two
    different values or a value that is not ``<instance_id>:<seq>``.  Empty means absent."""
    query = scope.get("query_string", b"").decode("latin-1")
    pairs = parse_qsl(query, keep_blank_values=True)
    for name, _ in pairs:
        if name != last_event_id_parameter:
            raise _invalid(f"query.{name}", "不接受的查询参数；入口范围取自令牌，令牌只能放在 Authorization 头")
    from_query = [value.strip() for name, value in pairs if name == last_event_id_parameter]
    if len(from_query) > 1:
        raise _invalid(f"query.{last_event_id_parameter}", "查询参数重复")
    from_header = [value.decode("latin-1").strip() for name, value in scope.get("headers", ())
                   if name.lower() == last_event_id_header]
    if len(from_header) > 1:
        raise _invalid("header.last-event-id", "Last-Event-ID 请求头重复")
    header = from_header[0] if from_header and from_header[0] else None
    query_value = from_query[0] if from_query and from_query[0] else None
    if header is not None and query_value is not None and header != query_value:
        raise HostError(400, code_invalid_request, fields=[
            FieldProblem("header.last-event-id", "与查询参数 last_event_id 不同"),
            FieldProblem(f"query.{last_event_id_parameter}", "与 Last-Event-ID 请求头不同"),
        ])
    value = header if header is not None else query_value
    if value is not None and parse_event_id(value) is None:
        field = "header.last-event-id" if header is not None else f"query.{last_event_id_parameter}"
        raise _invalid(field, "断点须为本服务发出的事件 ID（<instance_id>:<seq>）")
    return value


def _utc_text(wall_seconds: float) -> str:
    return datetime.datetime.fromtimestamp(int(wall_seconds), tz=datetime.UTC).isoformat(timespec="seconds")


def _deliverable(row: NotificationRow, grant: TokenGrant) -> bool:
    """A row that becomes a ``reminder`` frame: a goal reminder, not cancelled, in scope."""
    return (row.kind == notification_kind_goal_reminder
            and row.status != notification_status_cancelled and row.cancelled_at is None
            and notification_visible(row.entry_id, grant.scope.allows))


class EventStream:
    """One ``/events`` connection after the pre-stream checks (see the module docstring)."""

    def __init__(self, hub: EventsHub, scope: Any, send: Any, grant: TokenGrant, secret: str | None) -> None:
        self.hub = hub
        self.settings: EventSettings = hub.settings
        self.scope = scope
        self.send = send
        self.grant = grant
        self.secret = secret
        self.position = 0
        self.started = False

    def _frame(self, event: str, data: dict[str, Any], watermark: int) -> bytes:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return SseEvent(text, event=event, id=self.hub.next_event_id(self.grant.id, watermark)).encode()

    def _heartbeat(self) -> bytes:
        return self._frame("heartbeat", {"time": _utc_text(self.hub.clock.wall())}, self.position)

    async def _send_body(self, body: bytes) -> bool:
        """One bounded send (``send_seconds_max``, cut at shutdown); False when it did not
        complete (the stream then ends)."""
        completed = False
        try:
            with self.hub.waiting(timeout_seconds=self.settings.send_seconds_max):
                await self.send({"type": "http.response.body", "body": body, "more_body": True})
                completed = True
        except SendTimeout:
            return False
        return completed and not self.hub.is_shut_down()

    async def _start(self) -> bool:
        self.scope[send_seconds_scope_key] = self.settings.send_seconds_max
        try:
            with self.hub.waiting(timeout_seconds=self.settings.send_seconds_max):
                await self.send({"type": "http.response.start", "status": 200, "headers": stream_headers})
                self.started = True
        except SendTimeout:
            return False
        return self.started

    async def _poll(self) -> tuple[list[NotificationRow], Any] | None:
        """One read snapshot: None when the token is no longer valid, else the next rows."""
        secret, token_id, position = self.secret, self.grant.id, self.position

        def read(connection: Any) -> tuple[list[NotificationRow], Any] | None:
            grant = token_lookup(connection, secret, audience=host_audience) if secret else None
            if grant is None or grant.id != token_id:
                return None
            return notifications_after(connection, position, limit=poll_notifications_max)

        return await self.hub.engine.read(read)

    async def run(self, start: StreamStart) -> None:
        """The frames until an end condition; the final send is the caller's."""
        clock, settings = self.hub.clock, self.settings
        self.position = start.position
        # The stream's age and idleness count from before the first send, not after it.
        began = last_reminder = clock.monotonic()
        if not await self._start():
            return
        opening = []
        if start.resync_reason is not None:
            opening.append(self._frame("resync", {"reason": start.resync_reason, "pull_url": resync_pull_url},
                                       self.position))
        opening.append(self._heartbeat())
        if not await self._send_body(b"".join(opening)):
            return
        next_heartbeat = clock.monotonic() + settings.heartbeat_seconds
        next_poll = clock.monotonic()
        while True:
            now = clock.monotonic()
            if now - began >= settings.connection_seconds_max or now - last_reminder >= settings.idle_seconds:
                return
            frames: list[bytes] = []
            reminders = 0
            if now >= next_poll:
                try:
                    polled = await self._poll()
                except StorageError:
                    return  # after the 200 a storage failure ends the stream; the host reconnects
                if polled is None:
                    return  # revoked: renewals get 401 from the gate
                rows, zone = polled
                for row in rows:
                    self.position = row.id
                    if _deliverable(row, self.grant):
                        frames.append(self._frame("reminder", notification_item(row, zone), row.id))
                        reminders += 1
                # A full batch means more is waiting: read again at once instead of in a second.
                next_poll = now if len(rows) == poll_notifications_max else now + settings.poll_seconds
            if now >= next_heartbeat:
                frames.append(self._heartbeat())
                next_heartbeat = now + settings.heartbeat_seconds
            if frames:
                handed_at = clock.monotonic()
                if not await self._send_body(b"".join(frames)):
                    return
                if reminders:
                    self.hub.reminders_pushed += reminders
                    last_reminder = handed_at
            wake = min(next_poll, next_heartbeat, began + settings.connection_seconds_max,
                       last_reminder + settings.idle_seconds)
            with self.hub.waiting(timeout_seconds=max(0.0, wake - clock.monotonic())):
                await trio.sleep_forever()
            if self.hub.is_shut_down():
                return

    async def finish(self) -> None:
        """The final send (the end of the body), bounded by ``final_send_seconds_max``."""
        if not self.started:
            return
        self.scope[send_seconds_scope_key] = self.settings.final_send_seconds_max
        with trio.move_on_after(self.settings.final_send_seconds_max):
            try:
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            except SendTimeout:
                pass


async def _watch_disconnect(receive: Any, cancel_scope: trio.CancelScope) -> None:
    """Cancel the stream when the client closes its connection."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel_scope.cancel()
            return


class EventsRoute:
    """ASGI: ``GET``/``HEAD /api/v1/events`` here, everything else to ``app`` (quart)."""

    def __init__(self, app: Any, hub: EventsHub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != events_path or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        grant = admission_of(scope).grant
        try:
            resume = requested_event_id(scope)
            if self.hub.is_shut_down():
                raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
            if scope["method"] == "HEAD":
                await send({"type": "http.response.start", "status": 200, "headers": stream_headers})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            try:
                self.hub.admit(grant.id)
            except EventLimitReached as limit:
                raise HostError(429, limit.code, message=event_refusals[limit.code],
                                retry_after_seconds=self.hub.settings.limit_retry_after_seconds) from None
        except HostError as error:
            await self._refuse(send, error)
            return
        try:
            await self._serve(scope, receive, send, grant, resume)
        finally:
            self.hub.release(grant.id)

    async def _serve(self, scope: Any, receive: Any, send: Any, grant: TokenGrant, resume: str | None) -> None:
        try:
            bounds = await self.hub.engine.read(notification_id_bounds)
        except StorageError:
            await self._refuse(send, HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown))
            return
        start = self.hub.start_of(resume, grant.id, bounds)
        secret = bearer_secret([value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"])
        stream = EventStream(self.hub, scope, send, grant, secret)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_disconnect, receive, nursery.cancel_scope)
                try:
                    await stream.run(start)
                except Exception:
                    logger.exception("the host events stream failed")
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await stream.finish()

    async def _refuse(self, send: Any, error: HostError) -> None:
        status, headers, body = error_response_parts(error, self.hub.clock.wall())
        start_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode("ascii")),
            *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": start_headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def install_event_routes(app: QuartTrio, dependencies: Any) -> EventsHub:
    """Create the app's ``EventsHub`` (``app.state.events``), register ``/events/status`` and
    the stand-in ``/events`` route, and end every stream when the app stops serving (the
    fallback for embedders that never call ``app.state.events.shutdown()``)."""
    from ._app import _json

    hub = EventsHub(
        engine=dependencies.engine,
        clock=dependencies.env.clock,
        random=dependencies.env.random,
        settings=getattr(dependencies, "event_settings", None),
        server_shutdown=getattr(dependencies, "shutdown", None),
    )
    state = getattr(app, "state", None) or SimpleNamespace()
    state.events = hub
    app.state = state  # type: ignore[attr-defined]

    @app.get(events_path)
    async def events_stand_in() -> Response:
        # ``EventsRoute`` answers GET and HEAD before quart; this only gives the router the
        # path, so other methods answer 400 method_not_allowed with ``Allow``.
        raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)

    @app.get(events_status_path)
    async def events_status() -> Response:
        return _json(hub.status_document())

    @app.after_serving
    async def stop_streams() -> None:
        hub.shutdown()

    return hub


def events_openapi_paths() -> dict[str, Any]:
    """The OpenAPI path items of ``/events`` and ``/events/status``."""
    from ._openapi import _operation

    number = {"type": "number"}
    status_schema = {"type": "object", "required": [
        "instance_id", "connections", "reminders_pushed", "per_token_limit", "global_limit", "poll_seconds",
        "heartbeat_seconds", "idle_seconds", "max_seconds", "replay_seconds", "cursor_limit", "notification_window",
    ], "properties": {
        "instance_id": {"type": "string", "description": "服务实例标识（每次启动重新生成），事件 ID 的前半部分"},
        "connections": {"type": "integer", "description": "当前事件流连接数（进程级，重启归零）"},
        "reminders_pushed": {"type": "integer", "description": "已交给 ASGI 响应链的 reminder 帧累计数（含重放）；不证明网络接收或送达"},
        "per_token_limit": {"type": "integer", "description": "每个令牌的同时连接上限"},
        "global_limit": {"type": "integer", "description": "全服务同时连接上限"},
        "poll_seconds": number | {"description": "每条活跃连接的数据查询间隔（秒）"},
        "heartbeat_seconds": number | {"description": "心跳间隔（秒），建立后立即发送一次"},
        "idle_seconds": number | {"description": "多久未推送提醒即结束连接（秒）；心跳不重置"},
        "max_seconds": number | {"description": "单条连接最长时长（秒）"},
        "replay_seconds": number | {"description": "断点保留时长（秒）"},
        "cursor_limit": {"type": "integer", "description": "全服务最多保留的帧断点数（含心跳）"},
        "notification_window": {"type": "integer", "description": "只补发最近这么多个通知 ID 范围内的提醒"},
        "send_seconds": number | {"description": "单次发送最多等待（秒）"},
        "final_send_seconds": number | {"description": "结束帧最多再等待（秒）"},
    }}
    stream = _operation(
        "订阅提醒事件流（SSE）",
        "text/event-stream；每帧 id、event、单行 JSON data，空行分隔。reminder：与 /notifications 提醒项相同字段与角色时区投影，"
        "只推送 goal_reminder，排除已取消项，只读不标记取走；heartbeat：建立后立即一次，此后约每 15 秒，data 为 UTC 时间；"
        "resync：cursor_unavailable 或 window_exceeded，收到后从自己持久保存的拉取游标调用 /notifications 直到 has_more=false。"
        "事件 ID 为 <instance_id>:<seq>，须当作不透明字符串保存。续订用 Last-Event-ID 请求头或 ?last_event_id=（两处都给时必须相同）。"
        "连接上限：每令牌 2 条、全服务 32 条（429 event_token_limit／event_global_limit，Retry-After: 5）。"
        "流开始后不会混入 JSON 错误：撤销、空闲 5 分钟、最长 1 小时、慢客户端、存储故障或关闭都只结束流。",
        request=None,
        success=("200", "事件流", {"type": "string"}),
        errors=("400", "401", "429", "503"),
    )
    stream["responses"]["200"]["content"] = {"text/event-stream": {"schema": {
        "type": "string", "description": "SSE 帧：id: <instance_id>:<seq> / event: reminder|heartbeat|resync / data: <单行 JSON>"}}}
    stream["responses"]["200"]["headers"] = {
        "Cache-Control": {"description": "no-store", "schema": {"type": "string"}},
        "X-Accel-Buffering": {"description": "no", "schema": {"type": "string"}},
    }
    stream["parameters"] = [
        {"name": last_event_id_parameter, "in": "query", "required": False,
         "description": "续订断点（上一帧的 id）；与 Last-Event-ID 请求头都提供时必须相同", "schema": {"type": "string"}},
        {"name": "Last-Event-ID", "in": "header", "required": False,
         "description": "续订断点（上一帧的 id）；首次订阅省略", "schema": {"type": "string"}},
    ]
    return {
        events_path: {"get": stream},
        events_status_path: {"get": _operation(
            "事件流状态", "实例标识、当前连接数、累计推送的 reminder 帧数和各项限额／时长；不含提醒正文、宿主名或令牌。",
            request=None, success=("200", "事件流状态", status_schema), errors=("400", "401", "429", "503"))},
    }


__all__ = [
    "EventStream",
    "EventsRoute",
    "event_refusals",
    "events_openapi_paths",
    "events_path",
    "events_status_path",
    "install_event_routes",
    "requested_event_id",
    "resync_pull_url",
]
