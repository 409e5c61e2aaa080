"""The character surface's quart-trio app: the N.E.K.O memory server routes.

A thin adapter, as every surface is: the gate (``_gate``) has already checked Host, Origin,
the route, limited mode and the character name, and bounds the body; a handler parses the
request (``_schemas``), asks the character actor ``("character", name)`` or the lifecycle
actor ``("character_lifecycle", "main")`` with a ``troupe.actors.character`` request and
shapes the reply in the contract's body.

Failures: a domain failure is a reply value and comes out exactly as the contract says
(200 ``status: "error"`` / ``ok: false``, 409 ``status: "cancelled"``, 503 for
``/query_memory`` before the stores are open).  A crashed actor turn, or any exception in a
handler, is the route's "other failure": its documented failure body where the contract
names one (``failure_documents``), otherwise 500 ``{"detail": "Internal Server Error"}``; no
exception text ever reaches the client and the process keeps serving.  Backpressure
(a full mailbox, a draining system, an ask that timed out) is 503 with ``Retry-After`` on
every route: the caller should retry, not record a failure.

The stack, outermost first: ``SendGuard`` (final-send shield, bounded sends) →
``CharacterGate`` (Host, Origin, route, limited mode, name, per-route ``BodyLimit``) → the
history routes' plain ASGI ``HistoryRoute`` (``/cache``, ``/process``, ``/renew``,
``/settle``: the hot path) or quart for every other route.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from troupe.actors.character import (
    CancelCorrection,
    CharacterFailed,
    CharacterReleased,
    ClaimRefused,
    ContextText,
    ConversationGap,
    CorrectionCancelled,
    FollowupTopics,
    Funnel,
    FunnelCounts,
    GetPersona,
    GetSettings,
    Health,
    LastConversationGap,
    LifecycleState,
    MemoryHit,
    MemoryResults,
    MemoryUnavailable,
    NewDialog,
    PersonaDocument,
    QueryMemory,
    RecallLease,
    RecentHistory,
    RecordSurfaced,
    Reflect,
    ReflectResult,
    ReleaseCharacter,
    Reload,
    Reloaded,
    RequestShutdown,
    ResetConfirmedAt,
    ResetDone,
    ShutdownAnswer,
    StartupBlock,
    StartupContinue,
    StartupSwitched,
    SurfacedRecorded,
    Topics,
    ask_waiting,
    character_kind_name,
    character_name_problem,
    lifecycle_key,
    lifecycle_kind_name,
)
from troupe.http import SendGuard
from troupe.runtime import ActorCrashed, AskTimeout, Overloaded, Unavailable

from ._errors import CharacterError, detail_document, encode_document, retry_after_seconds_default
from ._gate import CharacterGate, route_key, route_of
from ._history_route import HistoryRoute, history_requests
from ._openapi import docs_page, openapi_document
from ._routes import operations_by_name
from ._schemas import (
    claim_parameters,
    format_time,
    funnel_window,
    optional_text,
    parse_body,
    query_characters_max,
    reason_of,
    reflection_ids_of,
    reload_request,
)

logger = logging.getLogger("troupe.character")

ask_timeout_seconds = 120.0
"""How long a handler waits for an actor: ``/new_dialog`` waits for a running renew/settle,
whose detailed compression calls the model."""

lifecycle_ask_timeout_seconds = 10.0
"""The limited-mode check and the lifecycle switches are cheap turns."""

search_placeholder_template = "{name}的相关记忆（已弃用的接口）：{query}\n\n（语义记忆已下线，暂无相关记忆片段。请使用 POST /query_memory/{name}。）"
"""``/search_for_memory``: the contract's localised placeholder text; no recall runs."""

json_content_type = "application/json"
text_content_type = "text/plain; charset=utf-8"

waiting_requests = (NewDialog, ReleaseCharacter)
"""Requests a character defers while a renew/settle holds its settle lock (``ReplyDeferred``):
asked with ``ask_waiting`` so the route answers once the settle finished."""

assert ask_timeout_seconds > lifecycle_ask_timeout_seconds > 0


@dataclass(frozen=True)
class CharacterAppDependencies:
    """The running parts the character app uses.  ``request_shutdown``: called after
    ``/shutdown`` was accepted (the lifecycle actor says whether shutdown is enabled); None
    means this process cannot be stopped that way, and ``/shutdown`` answers
    ``shutdown_disabled`` whatever the setting."""

    env: Any
    system: Any
    allowed_hosts: Iterable[str] = ()
    request_shutdown: Callable[[], None] | None = None
    published_lifecycle: Callable[[], LifecycleState | None] = lambda: None
    """The lifecycle actor's published state (``CharacterLifecycleSettings.published_state``):
    the limited-mode gate reads it without a turn; ``None`` asks the actor."""


class ActorFailed(Exception):
    """An actor turn crashed: the route answers its documented failure (never the text)."""


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = Response(encode_document(document), status=status, content_type=json_content_type)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def error_response(error: CharacterError) -> Response:
    return json_response(error.document, error.status, error.headers)


failure_documents: dict[str, tuple[int, Any]] = {
    "cache": (200, {"status": "error", "message": "internal error"}),
    "process": (200, {"status": "error", "message": "internal error"}),
    "renew": (200, {"status": "error", "message": "internal error"}),
    "settle": (200, {"status": "error", "message": "internal error"}),
    "reload": (200, {"status": "error", "message": "internal error"}),
    "reset_confirmed_at": (200, {"ok": False, "error": "internal error", "count": 0}),
    "record_surfaced": (200, {"ok": True}),
    "last_conversation_gap": (500, {"gap_seconds": -1, "error": "server_error"}),
}
"""The "other failure" body of the routes whose contract names one (``/query_memory``'s
degraded answer is built per request: it echoes the query)."""


def create_character_app(dependencies: CharacterAppDependencies) -> QuartTrio:
    """The character quart-trio app, already wrapped in its middleware stack."""
    app = QuartTrio("troupe.character")
    app.config["MAX_CONTENT_LENGTH"] = None  # the gate's per-route BodyLimit counts instead
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    ask = _asker(dependencies.system)
    # Numbers every Health request (see ``Health.request_number``): one per app, never global.
    health_numbers = itertools.count(1)
    _install_errors(app)
    _install_lifecycle_routes(app, dependencies, ask, health_numbers)
    _install_character_routes(app, dependencies, ask)

    async def limited_mode() -> dict[str, Any] | None:
        # Published by the lifecycle actor, so a request does not queue in that one actor's
        # mailbox behind every other request (the process's busiest mailbox otherwise).
        state = dependencies.published_lifecycle()
        if state is None:
            state = await ask(lifecycle_kind_name, lifecycle_key, Health(request_number=next(health_numbers)),
                              timeout=lifecycle_ask_timeout_seconds)
        assert isinstance(state, LifecycleState)
        return state.blocked_body() if state.limited_mode else None

    history = HistoryRoute(ask=ask, actor_failed=ActorFailed, failures=failure_documents)
    routed = _history_first(history, app.asgi_app)
    gate = CharacterGate(routed, limited_mode=_crash_as(500, limited_mode), allowed_hosts=dependencies.allowed_hosts)
    app.asgi_app = SendGuard(gate)  # type: ignore[method-assign]
    return app


def _history_first(history: HistoryRoute, framework: Any) -> Any:
    """Behind the gate: the history routes go to their plain ASGI route (``_history_route``
    says why), everything else to quart."""

    async def routed(scope: Any, receive: Any, send: Any) -> None:
        route = scope.get(route_key)
        if route is not None and route.operation is not None and route.operation.name in history_requests:
            await history(scope, receive, send)
        else:
            await framework(scope, receive, send)

    return routed


def _crash_as(status: int, check: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    async def checked() -> Any:
        try:
            return await check()
        except ActorFailed as exc:
            raise CharacterError(status) from exc

    return checked


Ask = Callable[..., Awaitable[Any]]


def _asker(system: Any) -> Ask:
    async def ask(kind: str, key: str, message: Any, *, timeout: float = ask_timeout_seconds,
                  waiting: bool = False) -> Any:
        """Ask an actor: backpressure is 503 with Retry-After, a crash is ``ActorFailed``.
        ``waiting``: the request may be deferred behind the settle lock (``NewDialog``,
        ``ReleaseCharacter``); wait for its final reply (``ask_waiting``)."""
        try:
            if waiting:
                return await ask_waiting(system.ref(kind, key), message, timeout_seconds=timeout)
            return await system.ref(kind, key).ask(message, timeout=timeout)
        except (Overloaded, Unavailable) as exc:
            seconds = max(retry_after_seconds_default, round(exc.retry_after_seconds + 0.5))
            raise CharacterError(503, headers={"Retry-After": str(seconds)}) from exc
        except AskTimeout as exc:
            raise CharacterError(503, headers={"Retry-After": str(retry_after_seconds_default)}) from exc
        except ActorCrashed as exc:
            raise ActorFailed(kind) from exc

    return ask


def _install_errors(app: QuartTrio) -> None:
    @app.errorhandler(CharacterError)
    async def _character_error(error: CharacterError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        return json_response(detail_document(error.code or 500), error.code or 500)

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        logger.exception("unhandled error in a character request handler", exc_info=error)
        return json_response(detail_document(500), 500)


Handler = Callable[..., Awaitable[Response]]


def _register(app: QuartTrio, name: str) -> Callable[[Handler], Handler]:
    """Register ``handler`` for operation ``name``; a crash (an actor's or the handler's own)
    becomes the operation's documented failure, or 500."""
    operation = operations_by_name[name]

    def register(handler: Handler) -> Handler:
        async def guarded(**_: Any) -> Response:
            try:
                return await handler()
            except CharacterError:
                raise
            except Exception as exc:
                if not isinstance(exc, ActorFailed):
                    logger.exception("character route %s failed", name, exc_info=exc)
                failure = failure_documents.get(name)
                if failure is None:
                    return json_response(detail_document(500), 500)
                return json_response(failure[1], failure[0])

        app.add_url_rule(operation.quart_rule, name, guarded, methods=[operation.method])
        return handler

    return register


async def _body(*, required: bool = False) -> dict[str, Any]:
    return parse_body(await request.get_data(cache=False, as_text=False), required=required)


def _name() -> str:
    name = route_of(request.scope).character_name
    assert name is not None
    return name


def _install_lifecycle_routes(app: QuartTrio, dependencies: CharacterAppDependencies, ask: Ask,
                              health_numbers: Iterator[int]) -> None:
    async def lifecycle(message: Any) -> Any:
        return await ask(lifecycle_kind_name, lifecycle_key, message, timeout=lifecycle_ask_timeout_seconds)

    @_register(app, "health")
    async def health() -> Response:
        state = await lifecycle(Health(request_number=next(health_numbers)))
        assert isinstance(state, LifecycleState)
        return json_response(state.health())

    @_register(app, "shutdown")
    async def shutdown() -> Response:
        answer = await lifecycle(RequestShutdown())
        assert isinstance(answer, ShutdownAnswer)
        if not answer.accepted or dependencies.request_shutdown is None:
            return json_response({"status": "shutdown_disabled", "message": "当前模式不允许响应退出请求"})
        dependencies.request_shutdown()
        return json_response(answer.encode())

    @_register(app, "storage_continue")
    async def storage_continue() -> Response:
        switched = await lifecycle(StartupContinue(reason=reason_of(await _body())))
        assert isinstance(switched, StartupSwitched)
        return json_response(switched.encode())

    @_register(app, "storage_block")
    async def storage_block() -> Response:
        switched = await lifecycle(StartupBlock(reason=reason_of(await _body())))
        assert isinstance(switched, StartupSwitched)
        return json_response(switched.encode())

    @_register(app, "reset_confirmed_at")
    async def reset_confirmed_at() -> Response:
        reply = await lifecycle(ResetConfirmedAt())
        if isinstance(reply, CharacterFailed):
            return json_response({"ok": False, "error": reply.message, "count": 0})
        assert isinstance(reply, ResetDone)
        return json_response(reply.encode())

    @_register(app, "reload")
    async def reload() -> Response:
        names, generations, release = reload_request(await _body(), character_name_problem)
        reply = await ask(lifecycle_kind_name, lifecycle_key,
                          Reload(resume_names=names, resume_generations=generations, release_claims=release))
        if isinstance(reply, CharacterFailed):
            return json_response(reply.encode())
        assert isinstance(reply, Reloaded)
        return json_response(reply.encode())

    @_register(app, "openapi")
    async def openapi() -> Response:
        return json_response(openapi_document())

    @_register(app, "docs")
    async def docs() -> Response:
        return Response(docs_page(), status=200, content_type="text/html; charset=utf-8")


def _install_character_routes(app: QuartTrio, dependencies: CharacterAppDependencies, ask: Ask) -> None:
    async def character(message: Any) -> Any:
        return await ask(character_kind_name, _name(), message, waiting=isinstance(message, waiting_requests))

    @_register(app, "release_character")
    async def release_character() -> Response:
        token, generation, hold = claim_parameters(request.args)
        reply = await character(ReleaseCharacter(claim_token=token, claim_generation=generation, hold_admission=hold))
        if isinstance(reply, ClaimRefused):
            return json_response(reply.encode(), 409)
        if not isinstance(reply, CharacterReleased):
            return json_response(detail_document(500), 500)
        return json_response(reply.encode())

    @_register(app, "new_dialog")
    async def new_dialog() -> Response:
        reply = await character(NewDialog())
        assert isinstance(reply, ContextText)
        return Response(reply.text, status=200, content_type=text_content_type)

    @_register(app, "get_recent_history")
    async def get_recent_history() -> Response:
        reply = await character(RecentHistory())
        assert isinstance(reply, ContextText)
        return json_response(reply.text)

    @_register(app, "get_settings")
    async def get_settings() -> Response:
        reply = await character(GetSettings())
        assert isinstance(reply, ContextText)
        return json_response(reply.text)

    @_register(app, "get_persona")
    async def get_persona() -> Response:
        reply = await character(GetPersona())
        assert isinstance(reply, PersonaDocument)
        return json_response(reply.encode())

    @_register(app, "search_for_memory")
    async def search_for_memory() -> Response:
        values = route_of(request.scope).values
        return json_response(search_placeholder_template.format(name=_name(), query=values.get("query", "")))

    @_register(app, "query_memory")
    async def query_memory() -> Response:
        body = await _body()
        query = optional_text(body, "query", query_characters_max)
        time = optional_text(body, "time", query_characters_max)
        clock = dependencies.env.clock
        started = clock.monotonic()
        try:
            # The turn only admits the query and lends the recall handle (``RecallLease``):
            # the recall runs here, outside the actor's turn, so one character's queries
            # overlap and its mailbox keeps moving.
            reply = await character(QueryMemory(query=query, time=time, leased=True))
        except ActorFailed:
            reply = None
        if isinstance(reply, RecallLease):
            reply = await reply.query(query, time, clock=clock)
        if isinstance(reply, MemoryUnavailable):
            retry_after = max(retry_after_seconds_default, math.ceil(reply.retry_after_seconds or 0))
            return json_response(detail_document(503, reply.message), 503, {"Retry-After": str(retry_after)})
        if not isinstance(reply, MemoryResults):
            elapsed_ms = round((clock.monotonic() - started) * 1000, 3)
            return json_response({"results": [], "query": query, "candidates_total": 0, "elapsed_ms": elapsed_ms,
                                  "error_code": "hybrid_recall_failed"})
        return json_response(memory_results_document(reply))

    @_register(app, "last_conversation_gap")
    async def last_conversation_gap() -> Response:
        reply = await character(LastConversationGap())
        assert isinstance(reply, ConversationGap)
        return json_response(reply.encode())

    @_register(app, "reflect")
    async def reflect() -> Response:
        reply = await character(Reflect())
        assert isinstance(reply, ReflectResult)
        return json_response(reply.encode())

    @_register(app, "followup_topics")
    async def followup_topics() -> Response:
        reply = await character(FollowupTopics())
        assert isinstance(reply, Topics)
        return json_response(reply.encode())

    @_register(app, "record_surfaced")
    async def record_surfaced() -> Response:
        identifiers = reflection_ids_of(await _body())
        if not identifiers:  # empty or missing: the contract's no-op
            return json_response({"ok": True})
        try:
            reply = await character(RecordSurfaced(reflection_ids=identifiers))
        except (CharacterError, ActorFailed) as exc:
            # The contract's stable answer: a failed cooldown write is logged, never the
            # caller's failure (it only makes a topic come back sooner).
            logger.warning("record_surfaced for %r was not persisted: %r", _name(), exc)
            reply = None
        assert reply is None or isinstance(reply, SurfacedRecorded)
        return json_response({"ok": True})

    @_register(app, "cancel_correction")
    async def cancel_correction() -> Response:
        reply = await character(CancelCorrection())
        assert isinstance(reply, CorrectionCancelled)
        return json_response(reply.encode())

    @_register(app, "funnel")
    async def funnel() -> Response:
        since, until = funnel_window(request.args, dependencies.env.clock.wall())
        reply = await character(Funnel(since=since, until=until))
        assert isinstance(reply, FunnelCounts)
        return json_response({
            "lanlan_name": reply.character_name,
            "since": format_time(reply.since),
            "until": format_time(reply.until),
            "counts": dict(reply.counts),
        })


def memory_hit_document(hit: MemoryHit) -> dict[str, Any]:
    return {
        "id": hit.id,
        "text": hit.text,
        "tier": hit.tier,
        "entity": hit.entity,
        "score": None if hit.score is None else round(hit.score, 6),
        "created_at": format_time(hit.created_at),
        "event_start_at": format_time(hit.event_start_at),
        "event_end_at": format_time(hit.event_end_at),
    }


def memory_results_document(results: MemoryResults) -> dict[str, Any]:
    """The contract's ``/query_memory`` body: ``time`` only for time-only recall,
    ``error_code`` only for the degraded answer."""
    document: dict[str, Any] = {
        "results": [memory_hit_document(hit) for hit in results.results],
        "query": results.query,
        "candidates_total": results.candidates_total,
        "elapsed_ms": round(results.elapsed_ms, 3),
    }
    if results.time is not None:
        document["time"] = results.time
    if results.error_code is not None:
        document["error_code"] = results.error_code
    return document


__all__ = [
    "ActorFailed",
    "CharacterAppDependencies",
    "ask_timeout_seconds",
    "create_character_app",
    "error_response",
    "failure_documents",
    "json_response",
    "lifecycle_ask_timeout_seconds",
    "memory_hit_document",
    "memory_results_document",
    "search_placeholder_template",
]
