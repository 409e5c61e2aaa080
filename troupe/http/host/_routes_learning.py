"""``POST /api/v1/entries/{entry_id}/learn`` and ``GET /api/v1/status``.

``/learn`` takes no body (one sent anyway is ignored, within the gate's 256 KiB limit): the
entry actor closes the entry's pending messages into a batch now and answers how many
messages are still unlearned and whether the model is paused.  Accepted is not learned: the
host watches the batch in ``/status``.

``/status`` is one read-only snapshot (``troupe.actors.host._status``) filtered by the token's
scope; it asks no actor, so it still answers while an entry is busy.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response
from quart_trio import QuartTrio

from troupe.actors.host import (
    LearnAccepted,
    LearnNow,
    StorageUnavailable,
    entry_kind_name,
    image_understanding_budget_seconds,
)
from troupe.actors.host._learning import (
    model_call_timeout_seconds,
    pause_retry_seconds,
    retry_backoff_seconds,
)
from troupe.actors.host._status import finished_batches_per_entry, status_document
from troupe.storage import StorageError

from ._errors import HostError, code_unavailable, retry_after_seconds_unknown
from ._gate import admission_of
from ._routes import api_prefix

learn_path = f"{api_prefix}/entries/<entry:entry_id>/learn"
status_path = f"{api_prefix}/status"


def _json(document: Any) -> Response:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=200, content_type="application/json")


def _timeouts(ask_timeout_seconds: float) -> dict[str, float]:
    return {
        "request": ask_timeout_seconds,
        "model_call": model_call_timeout_seconds,
        "image_understanding_per_batch": image_understanding_budget_seconds,
        "learning_retry": retry_backoff_seconds,
        "model_pause_retry": pause_retry_seconds,
    }


def install_learning_routes(app: QuartTrio, dependencies: Any) -> None:
    from ._app import ask_actor, ask_timeout_seconds  # _app imports this module

    system = dependencies.system
    engine = dependencies.engine
    env = dependencies.env

    @app.post(learn_path)
    async def post_learn(entry_id: str) -> Response:
        admission = admission_of(_scope())
        assert admission.entry_id == entry_id, "the gate and the router read the same segment"
        reply = await ask_actor(system, entry_kind_name, entry_id, LearnNow())
        if isinstance(reply, StorageUnavailable):
            raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
        assert isinstance(reply, LearnAccepted)
        return _json({"accepted": True, "pending_count": reply.pending_count, "paused": reply.paused,
                      "reason": reply.reason})

    @app.get(status_path)
    async def get_status() -> Response:
        grant = admission_of(_scope()).grant
        now = env.clock.wall()
        model_name = getattr(env.model, "name", None) or "local"
        timeouts = _timeouts(ask_timeout_seconds)
        try:
            document = await engine.read(lambda connection: status_document(
                connection, grant.scope, now, model_name=model_name, timeouts_seconds=timeouts))
        except StorageError as exc:
            raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown) from exc
        return _json(document)


def _scope() -> Any:
    from quart import request

    return request.scope


_batch_schema = {
    "type": "object",
    "description": "学习批次：state 为 waiting、running、succeeded、abandoned、refused；result 是实际产出",
    "properties": {
        "id": {"type": "integer"},
        "entry_id": {"type": "string"},
        "state": {"type": "string", "enum": ["waiting", "running", "succeeded", "abandoned", "refused"]},
        "trigger": {"type": "string", "enum": ["count", "idle", "max_wait", "learn"],
                    "description": "成批原因：条数、空闲、最长等待或 /learn"},
        "message_count": {"type": "integer"},
        "first_message_id": {"type": "integer"},
        "last_message_id": {"type": "integer"},
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "attempts": {"type": "integer"},
        "reason": {"type": ["string", "null"], "description": "最近一次失败、暂停或拒绝的原因"},
        "result": {"type": ["object", "null"], "description": "memory_ids、memories_created，失败时含 error"},
    },
}


def learning_openapi_paths() -> dict[str, Any]:
    from ._openapi import _operation

    entry_parameter = {
        "name": "entry_id", "in": "path", "required": True,
        "description": "入口 ID：1—200 个字符，区分大小写，不能全为空白，不能含 ?、# 或控制字符",
        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
    }
    learn_reply = {
        "type": "object",
        "required": ["accepted", "pending_count", "paused", "reason"],
        "properties": {
            "accepted": {"type": "boolean", "const": True},
            "pending_count": {"type": "integer", "description": "本入口 pending / batched 消息数"},
            "paused": {"type": "boolean", "description": "模型暂停：批次等待，恢复后补学"},
            "reason": {"type": ["string", "null"], "description": "暂停原因"},
        },
    }
    status_reply = {
        "type": "object",
        "required": ["health", "model_health", "usage", "timeouts_seconds", "entries", "backlog", "batches"],
        "properties": {
            "health": {"type": "string", "enum": ["ok", "degraded"]},
            "model_health": {"type": "object", "description": "模型名称、是否暂停、最近错误与成功时间"},
            "usage": {"type": "object", "description": "近 24 小时全局模型调用次数、失败次数与延迟（秒）"},
            "timeouts_seconds": {"type": "object", "description": "各项超时与预算（秒）"},
            "entries": {"type": "array", "description": "令牌范围内的入口积压，含 current_batch / latest_batch"},
            "backlog": {"type": "object", "description": "令牌范围内的积压汇总（按接收时间）"},
            "batches": {"type": "array", "items": _batch_schema,
                        "description": f"全部 waiting／running 批次，以及每个入口按 ID 倒序选取的最近 "
                                       f"{finished_batches_per_entry} 个已结束批次，按 ID 升序返回"},
        },
    }
    return {
        f"{api_prefix}/entries/{{entry_id}}/learn": {
            "parameters": [entry_parameter],
            "post": _operation(
                "立即学习",
                "无需正文：把本入口当前待学习消息立即成批。模型暂停时也接受，恢复后处理；"
                "调用后到 /status 观察批次状态，不能据此宣布已记住。",
                request=None,
                success=("200", "已接受", learn_reply),
                errors=("400", "401", "403", "429", "503"),
            ),
        },
        status_path: {
            "get": _operation(
                "运行状态",
                "健康状态、近 24 小时用量、超时、令牌范围内的入口积压与批次结果。状态轮询不会变成召回，也不强化记忆。",
                request=None,
                success=("200", "状态快照", status_reply),
                errors=("401", "429", "503"),
            ),
        },
    }


__all__ = ["install_learning_routes", "learning_openapi_paths"]
