"""The sessions surface's quart-trio app: /v2 and /api session routes, manifest, probes.

A thin adapter, as every surface is: the gate (``_gate``) has already checked Host,
readiness, the end user's token, the route and the legacy-prefix knob, and bounds the body; a
handler validates the body (``_schemas``), asks the session actor (or the end-user actor for
the list) with a ``troupe.actors.sessions`` request and shapes the reply.  A
``SessionRefused`` reply becomes a ``SessionsError`` with the code's status from the one
table; runtime failures become 503 ``overloaded`` / ``draining`` (Retry-After) or 500
``internal_error``; any other exception in a route is 500 ``internal_error`` and the process
keeps serving.  Every error is rendered in the dialect of the request's prefix.

The stack, outermost first: ``SendGuard`` (final-send shield, bounded sends) → ``SessionsGate``
(Host, readiness, token, route, per-operation ``BodyLimit``) → quart.  Every rule is
registered twice, under ``/v2`` and ``/api``, from the operation table (``_routes``).

Audio: no voice provider is configured in this build, so both audio endpoints answer 503
``upstream_unavailable`` with Retry-After after checking the session (never a fake
transcript).  cwd: without a configured ``cwd_policy`` a create with ``cwd`` and ``POST …/cwd``
are 400 ``cwd_not_allowed``.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed

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
    end_user_kind_name,
    new_session_id,
    session_kind_name,
    sessions_list_limit_max,
)
from troupe.auth import RateBuckets, burst_default
from troupe.http import SendGuard, ShutdownSignal

from ._asking import ask_timeout_seconds, json_body, make_session_ask, query_integer
from ._errors import (
    SessionsError,
    code_method_not_allowed,
    code_not_found,
    draining_retry_after_seconds,
    encode_document,
    retry_after_seconds_default,
)
from ._events import EventStreamSettings, install_event_route
from ._gate import SessionsAdmission, SessionsGate, admission_of, is_unified_path
from ._openapi import docs_page, openapi_document
from ._routes import (
    LegacyPrefixPolicy,
    api_prefix,
    legacy_prefix,
    manifest_document,
    manifest_path,
    operations_by_name,
)
from ._schemas import (
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

logger = logging.getLogger("troupe.sessions")

"""How long a handler waits for a session actor (a resume reads the whole session)."""

session_list_limit_default = 50
history_limit_max = 1000
"""``GET …/history?limit=`` at most this many messages per page."""

body_discard_seconds = 10.0
"""An error answer waits at most this long for the rest of a request body (read and dropped)."""

voice_retry_after_seconds = 60
"""Retry-After of the audio endpoints while no voice provider is configured."""

include_values = frozenset({"applicationPrompt"})
"""``GET /v2/sessions/:id?include=``: the only value the contract allows."""

json_content_type = "application/json"
cbor_content_type = "application/octet-stream"

assert session_list_limit_default <= sessions_list_limit_max


@dataclass(frozen=True)
class SessionsAppDependencies:
    """The running parts the sessions app uses.

    ``readiness()``: the server accepts work; ``shutdown``: set when draining begins (streams
    end with a long ``retry:`` frame).  ``cwd_policy(path) -> bool`` (None = no policy: every
    cwd refused).  ``voice``: a voice provider (None = not configured: audio answers 503
    ``upstream_unavailable``).  ``rate_per_second`` None = no rate limit (the contract's host
    rate seam, off by default).
    """

    env: Any
    engine: Any
    system: Any
    readiness: Callable[[], bool]
    shutdown: ShutdownSignal = field(default_factory=ShutdownSignal)
    allowed_hosts: Iterable[str] = ()
    legacy_policy: LegacyPrefixPolicy = field(default_factory=LegacyPrefixPolicy)
    cwd_policy: Callable[[str], bool] | None = None
    voice: Any = None
    events: EventStreamSettings = field(default_factory=EventStreamSettings)
    rate_per_second: float | None = None
    rate_burst: int = burst_default


def create_sessions_app(dependencies: SessionsAppDependencies) -> QuartTrio:
    """The sessions quart-trio app, already wrapped in its middleware stack."""
    app = QuartTrio("troupe.sessions")
    app.config["MAX_CONTENT_LENGTH"] = None  # the gate's per-operation BodyLimit counts instead
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    _install_errors(app)
    _install_probes(app, dependencies)
    _install_routes(app, dependencies)
    install_event_route(app, dependencies, ask=make_session_ask(dependencies))
    rate_buckets = None
    if dependencies.rate_per_second is not None:
        rate_buckets = RateBuckets(
            dependencies.env.clock.monotonic,
            rate_per_second=dependencies.rate_per_second,
            burst=dependencies.rate_burst,
        )
    gate = SessionsGate(
        app.asgi_app,
        engine=dependencies.engine,
        readiness=dependencies.readiness,
        shutdown=dependencies.shutdown,
        legacy_policy=dependencies.legacy_policy,
        allowed_hosts=dependencies.allowed_hosts,
        rate_buckets=rate_buckets,
    )
    app.asgi_app = SendGuard(gate)  # type: ignore[method-assign]
    # Imported here: the /api package builds on this module's pieces.
    from troupe.http.sessions.api import install_api

    install_api(app, dependencies)
    return app


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    response = Response(body, status=status, content_type=json_content_type)
    response.headers["Cache-Control"] = "no-store"
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def error_response(error: SessionsError, path: str) -> Response:
    document = error.document(unified=is_unified_path(path))
    response = Response(encode_document(document), status=error.status, content_type=json_content_type)
    response.headers["Cache-Control"] = "no-store"
    response.headers.update(error.response_headers())
    return response


async def discard_unread_body() -> None:
    """Read what is left of the request body before an error answer goes out.

    Why: a route that refuses before reading its body (an id troupe never issued, a 404 route
    with an upload) would otherwise answer while the client is still sending; hypercorn then
    closes the connection under the client's upload and the client sees "Server disconnected
    without sending a response" instead of the error.  The gate's ``BodyLimit`` bounds what
    can arrive (a body over the cap is the gate's own 413), and ``body_discard_seconds``
    bounds how long a trickling client can hold the answer back.
    """
    with trio.move_on_after(body_discard_seconds):
        try:
            await request.get_data(cache=False, as_text=False)
        except Exception:  # noqa: BLE001 - over the cap or broken: the gate answers that itself
            pass


def _install_errors(app: QuartTrio) -> None:
    @app.errorhandler(SessionsError)
    async def _sessions_error(error: SessionsError) -> Response:
        await discard_unread_body()
        return error_response(error, request.path)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        await discard_unread_body()
        if isinstance(error, MethodNotAllowed):
            allowed = ", ".join(sorted(error.valid_methods or ()))
            return error_response(SessionsError(code_method_not_allowed, headers={"Allow": allowed}), request.path)
        if error.code == 413:
            return error_response(SessionsError("payload_too_large"), request.path)
        if error.code == 404:
            return error_response(SessionsError(code_not_found), request.path)
        return error_response(SessionsError("internal_error" if (error.code or 500) >= 500 else "validation_failed"),
                              request.path)

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        logger.exception("unhandled error in a sessions request handler", exc_info=error)
        await discard_unread_body()
        return error_response(SessionsError("internal_error"), request.path)


def _install_probes(app: QuartTrio, dependencies: SessionsAppDependencies) -> None:
    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        if dependencies.readiness():
            return json_response({"status": "ready"})
        if dependencies.shutdown.is_set():
            return json_response({"status": "draining"}, 503, {"Retry-After": str(draining_retry_after_seconds)})
        return json_response({"status": "starting"}, 503, {"Retry-After": str(retry_after_seconds_default)})

    @app.get(manifest_path)
    async def manifest() -> Response:
        return json_response(manifest_document(dependencies.legacy_policy))

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return json_response(openapi_document())

    @app.get("/docs")
    async def docs() -> Response:
        return Response(docs_page(), status=200, content_type="text/html; charset=utf-8")


Asker = Callable[[str, str, Any], Any]


def cwd_problem(cwd: str, policy: Callable[[str], bool] | None) -> str | None:
    """The refusal code for ``cwd`` (``cwd_not_allowed`` without a policy), or None."""
    if policy is None:
        return "cwd_not_allowed"
    normal = cwd == "/" or posixpath.normpath(cwd) == cwd.rstrip("/")
    if not cwd.startswith("/") or "\x00" in cwd or not normal:
        return "cwd_invalid"
    if not policy(cwd):
        return "cwd_not_allowed"
    return None


def _install_routes(app: QuartTrio, dependencies: SessionsAppDependencies) -> None:
    ask = make_session_ask(dependencies)
    env = dependencies.env

    def route(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        operation = operations_by_name[name]

        def register(handler: Callable[..., Any]) -> Callable[..., Any]:
            for prefix in (legacy_prefix, api_prefix):
                app.add_url_rule(
                    operation.quart_rule(prefix), f"{name}@{prefix}", handler, methods=[operation.method]
                )
            return handler

        return register

    def who() -> SessionsAdmission:
        return admission_of(request.scope)

    @route("sessions.create")
    async def create_session() -> Response:
        admission = who()
        body = validate(CreateSessionIn, await json_body(empty_as={}))
        if body.end_user is not None and body.end_user.id != admission.end_user_id:
            raise SessionsError("forbidden", detail={"reason": "end_user_mismatch"})
        if body.cwd is not None:
            problem = cwd_problem(body.cwd, dependencies.cwd_policy)
            if problem is not None:
                raise SessionsError(problem)
        options = body.session_options()
        common = {"end_user_id": admission.end_user_id, "via": admission.via, "options": options, "prompt": body.prompt}
        if body.resume is not None:
            key = session_key(body.resume.session_id)
            message = OpenSession(mode="resume", **common)
        elif body.fork is not None:
            session_key(body.fork.session_id)
            key = new_session_id(env)
            message = OpenSession(mode="fork", fork_source_session_id=body.fork.session_id,
                                  fork_checkpoint_id=body.fork.checkpoint_id, **common)
        else:
            key = new_session_id(env)
            message = OpenSession(mode="create", **common)
        reply = await ask(session_kind_name, key, message)
        assert isinstance(reply, SessionOpened), reply
        return json_response(reply.encode(), 201 if reply.created else 200)

    @route("sessions.list")
    async def list_sessions() -> Response:
        admission = who()
        limit = query_integer("limit", session_list_limit_default, 1, sessions_list_limit_max)
        offset = query_integer("offset", 0, 0, None)
        assert limit is not None and offset is not None
        reply = await ask(end_user_kind_name, admission.end_user_id, ListSessions(
            end_user_id=admission.end_user_id, via=admission.via, offset=offset, limit=limit))
        return json_response(reply.encode())

    @route("sessions.get")
    async def get_session(sessionId: str) -> Response:  # noqa: N803 (the contract's name)
        admission = who()
        include = request.args.getlist("include")
        values = {part for item in include for part in item.split(",") if part}
        if include and (not values or values - include_values):
            raise SessionsError("validation_failed", detail={"fields": [{"field": "query.include", "message": "只接受 applicationPrompt"}]})
        reply = await ask(session_kind_name, session_key(sessionId), ReadMeta(
            end_user_id=admission.end_user_id, via=admission.via, include_application_prompt=bool(values)))
        return json_response(reply.encode())

    @route("sessions.close")
    async def close_session(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        reply = await ask(session_kind_name, session_key(sessionId),
                          CloseSession(end_user_id=admission.end_user_id, via=admission.via))
        assert isinstance(reply, Accepted), reply
        return json_response(reply.encode(), 202)

    @route("sessions.messages")
    async def post_message(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(MessageIn, await json_body())
        reply = await ask(session_kind_name, key, PostInput(
            end_user_id=admission.end_user_id, via=admission.via, prompt=body.prompt, blocks=body.input_blocks()))
        assert isinstance(reply, Accepted), reply
        return json_response(reply.encode(), 202)

    @route("sessions.interrupt")
    async def interrupt(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        reply = await ask(session_kind_name, session_key(sessionId),
                          Interrupt(end_user_id=admission.end_user_id, via=admission.via))
        assert isinstance(reply, Accepted), reply
        return json_response(reply.encode(), 202)

    @route("sessions.history")
    async def history(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        offset = query_integer("offset", 0, 0, None)
        limit = query_integer("limit", None, 1, history_limit_max)
        assert offset is not None
        reply = await ask(session_kind_name, key, ReadHistory(
            end_user_id=admission.end_user_id, via=admission.via, offset=offset, limit=limit))
        return json_response(reply.encode())

    @route("sessions.toolResults")
    async def tool_result(sessionId: str, callId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(ToolResultIn, await json_body())
        reply = await ask(session_kind_name, key, AnswerTool(
            end_user_id=admission.end_user_id, via=admission.via, call_id=callId,
            result=body.value(), is_error=body.is_error))
        assert isinstance(reply, Accepted), reply
        return json_response({"accepted": True})

    @route("sessions.permission")
    async def permission(sessionId: str, requestId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(PermissionIn, await json_body())
        reply = await ask(session_kind_name, key, AnswerPermission(
            end_user_id=admission.end_user_id, via=admission.via, request_id=requestId,
            digest=body.digest, verdict=body.verdict))
        assert isinstance(reply, Accepted), reply
        return json_response({"accepted": True})

    @route("sessions.questions")
    async def question(sessionId: str, requestId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(QuestionsIn, await json_body())
        reply = await ask(session_kind_name, key, AnswerQuestion(
            end_user_id=admission.end_user_id, via=admission.via, request_id=requestId,
            answers=tuple(body.answers)))
        assert isinstance(reply, Accepted), reply
        return json_response({"accepted": True})

    @route("sessions.compact")
    async def compact(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        await json_body(empty_as={})
        reply = await ask(session_kind_name, key, Compact(end_user_id=admission.end_user_id, via=admission.via))
        return json_response(reply.encode())

    @route("sessions.checkpoints.list")
    async def list_checkpoints(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        reply = await ask(session_kind_name, session_key(sessionId),
                          ListCheckpoints(end_user_id=admission.end_user_id, via=admission.via))
        return json_response(reply.encode())

    @route("sessions.checkpoints.create")
    async def create_checkpoint(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(CheckpointIn, await json_body(empty_as={}))
        reply = await ask(session_kind_name, key, CreateCheckpoint(
            end_user_id=admission.end_user_id, via=admission.via, name=body.name))
        return json_response(reply.encode(), 201)

    @route("sessions.checkpoints.restore")
    async def restore_checkpoint(sessionId: str, checkpointId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        await json_body(empty_as={})
        reply = await ask(session_kind_name, key, RestoreCheckpoint(
            end_user_id=admission.end_user_id, via=admission.via, checkpoint_id=checkpointId))
        return json_response(reply.encode())

    @route("sessions.checkpoints.delete")
    async def delete_checkpoint(sessionId: str, checkpointId: str) -> Response:  # noqa: N803
        admission = who()
        reply = await ask(session_kind_name, session_key(sessionId), DeleteCheckpoint(
            end_user_id=admission.end_user_id, via=admission.via, checkpoint_id=checkpointId))
        assert isinstance(reply, Accepted), reply
        response = Response(b"", status=204)
        response.headers["Cache-Control"] = "no-store"
        return response

    @route("sessions.checkpoints.export")
    async def export_checkpoint(sessionId: str, checkpointId: str) -> Response:  # noqa: N803
        admission = who()
        reply = await ask(session_kind_name, session_key(sessionId), ExportCheckpoint(
            end_user_id=admission.end_user_id, via=admission.via, checkpoint_id=checkpointId))
        assert isinstance(reply, CheckpointExport), reply
        response = Response(reply.data, status=200, content_type=cbor_content_type)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Content-Disposition"] = f'attachment; filename="{reply.checkpoint_id}.cbor"'
        return response

    @route("sessions.checkpoints.import")
    async def import_checkpoint(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        data = await request.get_data(cache=False, as_text=False)
        if not data:
            raise SessionsError("validation_failed", detail={"fields": [{"field": "body", "message": "需要导出的快照字节"}]})
        reply = await ask(session_kind_name, key, ImportCheckpoint(
            end_user_id=admission.end_user_id, via=admission.via, data=bytes(data)))
        return json_response(reply.encode(), 201)

    @route("sessions.cwd")
    async def change_cwd(sessionId: str) -> Response:  # noqa: N803
        admission = who()
        key = session_key(sessionId)
        body = validate(CwdIn, await json_body())
        problem = cwd_problem(body.cwd, dependencies.cwd_policy)
        if problem is not None:
            raise SessionsError(problem)
        reply = await ask(session_kind_name, key, ChangeCwd(
            end_user_id=admission.end_user_id, via=admission.via, cwd=body.cwd))
        return json_response(reply.encode())

    async def audio(session_id: str) -> Response:
        admission = who()
        key = session_key(session_id)
        await request.get_data(cache=False, as_text=False)  # read whole (bounded by the gate's cap)
        await ask(session_kind_name, key, ReadMeta(end_user_id=admission.end_user_id, via=admission.via))
        if dependencies.voice is None:
            raise SessionsError("upstream_unavailable", detail={"reason": "voice_not_configured"},
                                retry_after_seconds=voice_retry_after_seconds)
        raise SessionsError("upstream_unavailable", retry_after_seconds=voice_retry_after_seconds)

    @route("sessions.audio.transcriptions")
    async def transcriptions(sessionId: str) -> Response:  # noqa: N803
        return await audio(sessionId)

    @route("sessions.audio.speech")
    async def speech(sessionId: str) -> Response:  # noqa: N803
        return await audio(sessionId)


__all__ = [
    "SessionsAppDependencies",
    "ask_timeout_seconds",
    "body_discard_seconds",
    "create_sessions_app",
    "discard_unread_body",
    "cwd_problem",
    "error_response",
    "history_limit_max",
    "include_values",
    "json_response",
    "session_list_limit_default",
    "voice_retry_after_seconds",
]
