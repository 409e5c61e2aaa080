"""The session family's core ``/api`` routes, mapped onto the same actor requests as ``/v2``.

Why separate handlers rather than the /v2 ones under a second prefix: the SDK checks shapes the
/v2 answers do not have (the export is JSON ``{format: "tansr-checkpoint/1", checkpoint,
attachments}``, compaction answers ``compacted`` / ``rejected`` / ``failed``, audio answers a
transcript or audio, errors are the unified envelope); the actors and their requests are
shared, so both prefixes see one session.

Every handler: the gate (``_app_api.ApiGate``) has already checked the unified headers, the
token, the family, the closure fence and the body cap and left an ``ApiAdmission`` in the
scope; the handler validates its body with the /v2 schemas, asks the actor (``SessionsError``
on a refusal, rendered by the app's error handler in the unified envelope) and shapes the reply
with the unified headers.

The ``checkpoint`` flag of compaction (``true`` or ``{label?}``) and of restore (``true``, the
SDK's default): before the history is replaced, a checkpoint of the history as it was is taken
(named by the label, else ``safety_checkpoint_names``), so the change can be undone; its id
travels as ``safetyCheckpointId``.  The actor has no combined request, so it is two asks: when
the replacement is then refused or changes nothing (``turn_running``, too short to compact,
unknown checkpoint) the safety checkpoint is deleted again; a crash between the two asks can
leave it behind (a harmless extra checkpoint, never a lost history).

Checkpoint export: the actor's self-contained CBOR export travels base64 inside the JSON
document (``troupe.export``), next to the readable ``checkpoint`` (meta + ``messages``), so an
import of exactly those bytes is the actor's own import, digest check included.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quart import Response, request

from troupe.actors.sessions import (
    Accepted,
    AnswerPermission,
    AnswerQuestion,
    AnswerTool,
    ChangeCwd,
    CheckpointExport,
    CloseSession,
    Compact,
    CreateCheckpoint,
    DeleteCheckpoint,
    ExportCheckpoint,
    ImportCheckpoint,
    Interrupt,
    ListCheckpoints,
    ListSessions,
    OpenSession,
    PostInput,
    ReadHistory,
    ReadMeta,
    RestoreCheckpoint,
    SessionOpened,
    SessionRefused,
    decode_export,
    end_user_kind_name,
    new_session_id,
    session_kind_name,
    sessions_list_limit_max,
)
from troupe.http.sessions._asking import json_body, make_session_ask, query_integer
from troupe.http.sessions._errors import SessionsError
from troupe.http.sessions._schemas import (
    CheckpointIn,
    CreateSessionIn,
    CwdIn,
    MessageIn,
    PermissionIn,
    QuestionsIn,
    ToolResultIn,
    session_key,
    validate,
)

from ._manifest import api_operations_by_name, quart_rule
from ._transport import ApiRequestHeaders, api_bytes_response, api_empty_response, api_json_response

history_limit_max = 1000
session_list_limit_default = 50
checkpoint_document_format = "tansr-checkpoint/1"
label_characters_max = 120
admission_scope_key = "troupe.api.admission"
compact_instructions_characters_max = 4096
"""The SDK's own bound on compaction ``instructions``."""
safety_checkpoint_names = {"compact": "pre-compact", "restore": "pre-restore"}

assert session_list_limit_default <= sessions_list_limit_max


@dataclass(frozen=True)
class ApiAdmission:
    """What an /api request that passed the gate carries."""

    end_user_id: str
    grant: Any
    operation: str
    headers: ApiRequestHeaders

    via: str = "api"


def api_admission() -> ApiAdmission:
    admission = request.scope.get(admission_scope_key)
    assert isinstance(admission, ApiAdmission), "/api routes run behind ApiGate"
    return admission


make_api_ask = make_session_ask
"""The /api name of the shared ask (``troupe.http.sessions._asking``)."""


def export_document(data: bytes) -> bytes:
    """The actor's CBOR export as the SDK's JSON checkpoint document (see the module docstring)."""
    decoded = decode_export(data)
    assert not isinstance(decoded, SessionRefused), decoded
    meta, texts = decoded
    messages = []
    for text in texts:
        try:
            messages.append(json.loads(text))
        except ValueError:
            messages.append(text)
    document = {
        "format": checkpoint_document_format,
        "checkpoint": {**meta.encode(), "messages": messages},
        "attachments": [],
        "troupe": {"export": base64.b64encode(data).decode("ascii"),
                   "sha256": hashlib.sha256(data).hexdigest()},
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def import_bytes(data: bytes) -> bytes:
    """The actor's CBOR export inside an SDK checkpoint document; ``SessionsError`` otherwise."""
    refused = SessionsError("validation_failed", "快照字节不是可导入的 tansr-checkpoint/1 文档",
                            detail={"reason": "checkpoint_import_invalid"})
    try:
        document = json.loads(data)
        export = base64.b64decode(document["troupe"]["export"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise refused from None
    if document.get("format") != checkpoint_document_format or not export:
        raise refused
    return export


def checkpoint_flag(body: Any, operation: str) -> tuple[bool, str | None]:
    """(take a safety checkpoint?, its label) from a compact / restore body; ``SessionsError``
    (400) for a body the SDK would never send.  Restore defaults to true (the SDK's default),
    compaction to false."""
    if not isinstance(body, dict):
        raise SessionsError("validation_failed", detail={"fields": [{"field": "body"}]})
    allowed = {"compact": {"instructions", "checkpoint"}, "restore": {"checkpoint"}}[operation]
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise SessionsError("validation_failed", detail={"fields": [{"field": name} for name in unknown]})
    instructions = body.get("instructions")
    if instructions is not None and (not isinstance(instructions, str)
                                     or len(instructions) > compact_instructions_characters_max):
        raise SessionsError("validation_failed", detail={"fields": [{"field": "instructions"}]})
    flag = body.get("checkpoint", operation == "restore")
    if isinstance(flag, bool):
        return flag, None
    if operation == "compact" and isinstance(flag, dict) and set(flag) <= {"label"}:
        label = flag.get("label")
        if label is None or (isinstance(label, str) and 0 < len(label) <= label_characters_max):
            return True, label
    raise SessionsError("validation_failed", detail={"fields": [{"field": "checkpoint"}]})


application_prompt_sources = {"default": "none", "platform": "platform", "sdk": "sdk"}
"""The actor's summary ``source`` → the SDK's.  ``default`` means the platform segment came from
``SessionSettings.platform_default``, which no deployment configures (it is empty): no
application prompt at all, the SDK's ``none``."""


def application_prompt_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The /api ``applicationPrompt``: exactly ``{policy, source}`` (the SDK's shape, no text);
    /v2 keeps the actor's longer summary."""
    source = summary.get("source")
    return {"policy": summary.get("strategy"), "source": application_prompt_sources.get(source, source)}


def compact_answer(result: dict[str, Any], session_id: str) -> dict[str, Any]:
    """The actor's compaction result in the SDK's three outcomes."""
    if result.get("status") == "compacted":
        before, after = int(result.get("fromMessages", 0)), int(result.get("toMessages", 0))
        removed = max(0, before - after)
        digest = hashlib.sha256(f"{session_id}:{before}:{after}".encode()).hexdigest()[:16]
        return {**result, "status": "compacted", "compactionId": f"cmp_{digest}",
                "removedRange": [0, max(0, removed)]}
    return {"status": "rejected", "reason": "empty_history", "detail": result}


def install_core_routes(app: Any, dependencies: Any, *, ask: Callable[..., Any]) -> None:
    env = dependencies.env

    def route(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        operation = api_operations_by_name[name]

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            app.add_url_rule(quart_rule(operation.api_path), f"api.{name}", handler, methods=[operation.method])
            return handler

        return register

    def common() -> dict[str, str]:
        who = api_admission()
        return {"end_user_id": who.end_user_id, "via": "api"}

    @route("session.create")
    async def create_session() -> Response:
        who = api_admission()
        body = validate(CreateSessionIn, await json_body(empty_as={}))
        if body.end_user is not None and body.end_user.id != who.end_user_id:
            raise SessionsError("forbidden", detail={"reason": "end_user_mismatch"})
        if body.cwd is not None:
            raise SessionsError("cwd_not_allowed")
        shared = {**common(), "options": body.session_options(), "prompt": body.prompt}
        if body.resume is not None:
            key = session_key(body.resume.session_id)
            message = OpenSession(mode="resume", **shared)
        elif body.fork is not None:
            session_key(body.fork.session_id)
            key = new_session_id(env)
            message = OpenSession(mode="fork", fork_source_session_id=body.fork.session_id,
                                  fork_checkpoint_id=body.fork.checkpoint_id, **shared)
        else:
            key = new_session_id(env)
            message = OpenSession(mode="create", **shared)
        reply = await ask(session_kind_name, key, message)
        assert isinstance(reply, SessionOpened), reply
        return api_json_response({**reply.encode(), "contract": "sdk1"}, 201 if reply.created else 200)

    @route("session.list")
    async def list_sessions() -> Response:
        who = api_admission()
        limit = query_integer("limit", session_list_limit_default, 1, sessions_list_limit_max, explain=False)
        offset = query_integer("offset", 0, 0, None, explain=False)
        reply = await ask(end_user_kind_name, who.end_user_id, ListSessions(
            end_user_id=who.end_user_id, via="api", offset=offset or 0, limit=limit or 1))
        return api_json_response(reply.encode())

    @route("session.get")
    async def get_session(id: str) -> Response:  # noqa: A002
        values = {part for item in request.args.getlist("include") for part in item.split(",") if part}
        if values - {"applicationPrompt"}:
            raise SessionsError("validation_failed", detail={"fields": [{"field": "query.include"}]})
        reply = await ask(session_kind_name, session_key(id), ReadMeta(
            **common(), include_application_prompt=bool(values)))
        document = reply.encode()
        if "applicationPrompt" in document:
            document["applicationPrompt"] = application_prompt_summary(document["applicationPrompt"])
        return api_json_response(document)

    @route("session.close")
    async def close_session(id: str) -> Response:  # noqa: A002
        reply = await ask(session_kind_name, session_key(id), CloseSession(**common()))
        assert isinstance(reply, Accepted), reply
        return api_json_response(reply.encode(), 202)

    @route("session.message.send")
    async def post_message(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        body = validate(MessageIn, await json_body())
        reply = await ask(session_kind_name, key, PostInput(**common(), prompt=body.prompt,
                                                            blocks=body.input_blocks()))
        return api_json_response(reply.encode(), 202)

    @route("session.interrupt")
    async def interrupt(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        await json_body(empty_as={})
        reply = await ask(session_kind_name, key, Interrupt(**common()))
        return api_json_response(reply.encode(), 202)

    @route("session.history.read")
    async def history(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        offset = query_integer("offset", 0, 0, None, explain=False) or 0
        limit = query_integer("limit", None, 0, history_limit_max, explain=False)
        if limit == 0:
            # Count only: the page is empty, the total is the history's (the SDK's zero semantics).
            page = await ask(session_kind_name, key, ReadHistory(**common(), offset=offset, limit=1))
            document = {**page.encode(), "messages": []}
            document.pop("nextOffset", None)
            return api_json_response(document)
        reply = await ask(session_kind_name, key, ReadHistory(**common(), offset=offset, limit=limit))
        return api_json_response(reply.encode())

    @route("session.tool.result")
    async def tool_result(id: str, targetId: str) -> Response:  # noqa: A002, N803
        key = session_key(id)
        body = validate(ToolResultIn, await json_body())
        await ask(session_kind_name, key, AnswerTool(**common(), call_id=targetId, result=body.value(),
                                                     is_error=body.is_error))
        return api_json_response({"accepted": True})

    @route("session.permission.decide")
    async def permission(id: str, ticketId: str) -> Response:  # noqa: A002, N803
        key = session_key(id)
        body = validate(PermissionIn, await json_body())
        await ask(session_kind_name, key, AnswerPermission(**common(), request_id=ticketId, digest=body.digest,
                                                           verdict=body.verdict))
        return api_json_response({"accepted": True})

    @route("session.question.answer")
    async def question(id: str, ticketId: str) -> Response:  # noqa: A002, N803
        key = session_key(id)
        body = validate(QuestionsIn, await json_body())
        await ask(session_kind_name, key, AnswerQuestion(**common(), request_id=ticketId,
                                                         answers=tuple(body.answers)))
        return api_json_response({"accepted": True})

    async def with_safety_checkpoint(key: str, wanted: bool, label: str | None, operation: str,
                                     replace_history: Any) -> tuple[Any, str | None]:
        """Run ``replace_history()`` after a safety checkpoint when ``wanted`` (module docstring);
        the checkpoint is deleted again when the replacement is refused or changes nothing."""
        if not wanted:
            return await replace_history(), None
        meta = await ask(session_kind_name, key, CreateCheckpoint(
            **common(), name=label or safety_checkpoint_names[operation]))
        safety_id = meta.checkpoint_id
        try:
            reply = await replace_history()
        except BaseException:
            await _forget_checkpoint(key, safety_id)
            raise
        if operation == "compact" and reply.encode().get("status") != "compacted":
            await _forget_checkpoint(key, safety_id)
            return reply, None
        return reply, safety_id

    async def _forget_checkpoint(key: str, checkpoint_id: str) -> None:
        try:
            await ask(session_kind_name, key, DeleteCheckpoint(**common(), checkpoint_id=checkpoint_id))
        except SessionsError:
            pass  # already gone (restored over, evicted): nothing left to undo

    @route("session.compact")
    async def compact(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        wanted, label = checkpoint_flag(await json_body(empty_as={}), "compact")
        reply, safety_id = await with_safety_checkpoint(
            key, wanted, label, "compact", lambda: ask(session_kind_name, key, Compact(**common())))
        answer = compact_answer(reply.encode(), id)
        if safety_id is not None:
            answer["safetyCheckpointId"] = safety_id
        return api_json_response(answer)

    @route("session.checkpoint.list")
    async def list_checkpoints(id: str) -> Response:  # noqa: A002
        reply = await ask(session_kind_name, session_key(id), ListCheckpoints(**common()))
        return api_json_response(reply.encode())

    @route("session.checkpoint.create")
    async def create_checkpoint(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        raw = await json_body(empty_as={})
        if isinstance(raw, dict) and raw.get("label") == "":
            raw = {name: value for name, value in raw.items() if name != "label"}
        body = validate(CheckpointIn, raw)
        reply = await ask(session_kind_name, key, CreateCheckpoint(**common(), name=body.name))
        return api_json_response(reply.encode(), 201)

    @route("session.checkpoint.restore")
    async def restore_checkpoint(id: str, targetId: str) -> Response:  # noqa: A002, N803
        key = session_key(id)
        wanted, _ = checkpoint_flag(await json_body(empty_as={}), "restore")
        reply, safety_id = await with_safety_checkpoint(
            key, wanted, None, "restore",
            lambda: ask(session_kind_name, key, RestoreCheckpoint(**common(), checkpoint_id=targetId)))
        answer = reply.encode()
        if safety_id is not None:
            answer["safetyCheckpointId"] = safety_id
        return api_json_response(answer)

    @route("session.checkpoint.delete")
    async def delete_checkpoint(id: str, targetId: str) -> Response:  # noqa: A002, N803
        await ask(session_kind_name, session_key(id), DeleteCheckpoint(**common(), checkpoint_id=targetId))
        return api_empty_response(204)

    @route("session.checkpoint.export")
    async def export_checkpoint(id: str, targetId: str) -> Response:  # noqa: A002, N803
        reply = await ask(session_kind_name, session_key(id), ExportCheckpoint(**common(), checkpoint_id=targetId))
        assert isinstance(reply, CheckpointExport), reply
        return api_bytes_response(export_document(reply.data))

    @route("session.checkpoint.import")
    async def import_checkpoint(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        label = request.args.get("label", "")
        if len(label) > label_characters_max:
            raise SessionsError("validation_failed", detail={"fields": [{"field": "query.label"}]})
        data = await request.get_data(cache=False, as_text=False)
        reply = await ask(session_kind_name, key, ImportCheckpoint(**common(), data=import_bytes(bytes(data))))
        return api_json_response(reply.encode(), 201)

    @route("session.cwd.set")
    async def change_cwd(id: str) -> Response:  # noqa: A002
        key = session_key(id)
        body = validate(CwdIn, await json_body())
        from troupe.http.sessions._app import cwd_problem  # the one cwd rule both prefixes apply

        problem = cwd_problem(body.cwd, dependencies.cwd_policy)
        if problem is not None:
            raise SessionsError(problem)
        reply = await ask(session_kind_name, key, ChangeCwd(**common(), cwd=body.cwd))
        return api_json_response(reply.encode())

    async def audio(session_id: str, kind: str) -> Response:
        key = session_key(session_id)
        body = await json_body()
        if not isinstance(body, dict):
            raise SessionsError("validation_failed")
        await ask(session_kind_name, key, ReadMeta(**common()))
        voice = dependencies.voice
        if voice is None:
            raise SessionsError("upstream_unavailable", detail={"reason": "voice_not_configured"},
                                retry_after_seconds=60)
        answer = await (voice.transcribe(body) if kind == "transcribe" else voice.speak(body))
        return api_json_response(answer)

    @route("session.audio.transcribe")
    async def transcribe(id: str) -> Response:  # noqa: A002
        return await audio(id, "transcribe")

    @route("session.audio.speak")
    async def speak(id: str) -> Response:  # noqa: A002
        return await audio(id, "speak")


__all__ = [
    "ApiAdmission",
    "admission_scope_key",
    "api_admission",
    "checkpoint_document_format",
    "checkpoint_flag",
    "compact_answer",
    "export_document",
    "import_bytes",
    "install_core_routes",
    "make_api_ask",
]
