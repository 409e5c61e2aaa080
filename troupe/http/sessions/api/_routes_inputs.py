"""The ``/api`` strict input routes: input capabilities, submit with a receipt, input status.

Why these routes are thin: the session actor owns the receipts (``troupe.actors.sessions.
_inputs``), so idempotency, conflicts, late and stale targets are decided in one place, one
message at a time; this module checks shapes and bounds (nothing reaches the actor that the
contract refuses) and renders the actor's answers in the unified dialect.

Operations (the SDK's manifest, revision 7):

- ``GET /api/sessions/:id/input-capabilities`` → ``{version, text, textBlocks, image,
  memoryAck, durableAck, receiptRetention, historyEpoch, target, limits}``; ``target`` is the
  running turn's ``{historyEpoch, turnId}`` or null.
- ``POST /api/sessions/:id/inputs`` with ``{inputId, target: {historyEpoch, turnId}, content:
  {text} | {blocks: [{t: "text", text}]}, ack?}`` → 202 ``{outcome: "accepted", receipt}``.
- ``GET /api/sessions/:id/inputs/:inputId?historyEpoch=&turnId=`` → ``{receipt}``.

The input refusals in the unified envelope (``detail.domainCode`` is the actor's code):
``input_conflict`` → 409 ``conflict``; ``input_target_stale`` → 409 ``stale_generation``
(``rebind``: read the capabilities again); ``input_target_closed`` (late) → 409 ``conflict``;
``input_not_found`` → 404 ``not_found``; ``input_limit_exceeded`` → 422 ``rejected``;
``capability_disabled`` (``durable`` without ``durableAck``) → 404 ``capability_unavailable``.
A malformed body is 400 ``invalid_request`` (``validation_failed``) and reaches no actor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from quart import Response, request

from troupe.actors.sessions import (
    InputTarget,
    ReadInputCapabilities,
    ReadInputStatus,
    SubmitInput,
    input_blocks_max,
    input_id_characters_max,
    input_text_characters_max,
    session_kind_name,
)
from troupe.actors.sessions._inputs import durabilities
from troupe.http.sessions._errors import SessionsError
from troupe.http.sessions._schemas import parse_json, session_key

from ._manifest import quart_rule
from ._routes_core import api_admission, make_api_ask
from ._transport import api_error_response, api_json_response, session_error_detail

input_refusals: dict[str, tuple[int, str, str]] = {
    # actor code: (HTTP status, unified code, retryAction)
    "input_conflict": (409, "conflict", "none"),
    "input_target_stale": (409, "stale_generation", "rebind"),
    "input_target_closed": (409, "conflict", "none"),
    "input_not_found": (404, "not_found", "none"),
    "input_limit_exceeded": (422, "rejected", "none"),
    "capability_disabled": (404, "capability_unavailable", "none"),
}
"""How the actor's input refusals travel in the unified envelope."""


def _invalid(field: str, message: str) -> SessionsError:
    return SessionsError("validation_failed", detail={"fields": [{"field": field, "message": message}]})


def _identifier(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= input_id_characters_max:
        raise _invalid(field, f"须为 1–{input_id_characters_max} 个字符的字符串")
    return value


def _target(value: Any, field: str = "target") -> InputTarget:
    if not isinstance(value, Mapping):
        raise _invalid(field, "须为对象 {historyEpoch, turnId}")
    return InputTarget(_identifier(value.get("historyEpoch"), f"{field}.historyEpoch"),
                       _identifier(value.get("turnId"), f"{field}.turnId"))


def _content(value: Any) -> tuple[str, bool]:
    """(text, came as blocks) from ``content``: exactly one of ``text`` and ``blocks``."""
    if not isinstance(value, Mapping) or (("text" in value) == ("blocks" in value)):
        raise _invalid("content", "须且只须有 text 或 blocks 之一")
    if "text" in value:
        text = value["text"]
        if not isinstance(text, str) or not text:
            raise _invalid("content.text", "须为非空字符串")
        blocks = False
    else:
        items = value["blocks"]
        if not isinstance(items, list) or not 1 <= len(items) <= input_blocks_max:
            raise _invalid("content.blocks", f"须为 1–{input_blocks_max} 个文本块")
        parts = []
        for index, block in enumerate(items):
            part = block.get("text") if isinstance(block, Mapping) else None
            if not isinstance(block, Mapping) or block.get("t") != "text" or not isinstance(part, str) or not part:
                raise _invalid(f"content.blocks[{index}]", "只接受 {t: 'text', text} 文本块")
            parts.append(part)
        text, blocks = "\n".join(parts), True
    if len(text) > input_text_characters_max:
        raise _invalid("content", f"文本至多 {input_text_characters_max} 个字符")
    return text, blocks


def parse_submission(document: Any, *, end_user_id: str) -> SubmitInput:
    """The ``SubmitInput`` for a request body, or ``SessionsError`` (400) naming the field."""
    if not isinstance(document, Mapping):
        raise _invalid("body", "正文须为 JSON 对象")
    input_id = _identifier(document.get("inputId"), "inputId")
    target = _target(document.get("target"))
    text, blocks = _content(document.get("content"))
    ack = document.get("ack", "memory")
    if ack is None:
        ack = "memory"
    if ack not in durabilities:
        raise _invalid("ack", "须为 memory 或 durable")
    return SubmitInput(end_user_id=end_user_id, via="api", input_id=input_id, target=target, text=text,
                       blocks=blocks, durability=ack)


def _refusal_response(error: SessionsError) -> Response | None:
    mapped = input_refusals.get(error.code)
    if mapped is None:
        return None
    status, code, action = mapped
    return api_error_response(status, code, error.message or error.code, retry_action=action,
                              detail=session_error_detail(error.code, error.status, error.detail))


def install_input_routes(app: Any, dependencies: Any, *, ask: Callable[..., Any] | None = None) -> None:
    """Register the three input routes on the /api quart app (``_app_api.create_api_app``)."""
    asker = ask or make_api_ask(dependencies)

    async def ask_rendered(key: str, message: Any) -> Any:
        try:
            return await asker(session_kind_name, key, message)
        except SessionsError as error:
            response = _refusal_response(error)
            if response is None:
                raise
            return response

    async def capabilities(id: str) -> Response:  # noqa: A002 - the manifest's parameter name
        who = api_admission()
        reply = await ask_rendered(session_key(id), ReadInputCapabilities(end_user_id=who.end_user_id, via="api"))
        return reply if isinstance(reply, Response) else api_json_response(reply.encode())

    async def submit(id: str) -> Response:  # noqa: A002
        who = api_admission()
        key = session_key(id)
        message = parse_submission(parse_json(await request.get_data(cache=False, as_text=False)),
                                   end_user_id=who.end_user_id)
        reply = await ask_rendered(key, message)
        return reply if isinstance(reply, Response) else api_json_response(reply.encode(), 202)

    async def status(id: str, targetId: str) -> Response:  # noqa: A002, N803
        who = api_admission()
        key = session_key(id)
        _identifier(targetId, "targetId")
        target = _target({"historyEpoch": request.args.get("historyEpoch"), "turnId": request.args.get("turnId")},
                         "query")
        reply = await ask_rendered(key, ReadInputStatus(end_user_id=who.end_user_id, via="api",
                                                        input_id=targetId, target=target))
        return reply if isinstance(reply, Response) else api_json_response(reply.encode())

    app.add_url_rule(quart_rule("/api/sessions/:id/input-capabilities"), "session.input.capabilities",
                     capabilities, methods=["GET"])
    app.add_url_rule(quart_rule("/api/sessions/:id/inputs"), "session.input.submit", submit, methods=["POST"])
    app.add_url_rule(quart_rule("/api/sessions/:id/inputs/:targetId"), "session.input.status", status,
                     methods=["GET"])


__all__ = ["input_refusals", "install_input_routes", "parse_submission"]
