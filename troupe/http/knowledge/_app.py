"""The knowledge surface's quart-trio app: the PIXIU memory API routes and ``/events``.

A thin adapter, as every surface is: the gate (``_gate``) has already assigned the request id
and checked Host, the route, schema readiness and the body size; a handler parses the body
(``_schemas``, 400 ``INVALID_REQUEST``), then either asks the scope actor
``("knowledge_scope", scope)`` (writes, updates, lifecycle events, recoveries, promotions: the
one writer of a scope's receipts and versions) or the read side (``_reads``), and answers the
reply's ``encode()``.  A ``KnowledgeRefused`` reply is the contract's error with its status.

Failures: backpressure (a full mailbox, an ask that timed out, a storage error) is 503
``OVERLOADED`` with ``Retry-After``; a crashed actor turn or any exception in a handler is 500
``INTERNAL_ERROR`` with a fixed message: no exception text reaches the client and the process
keeps serving.  Every error body carries the request id, and every response ``X-Request-Id``.

The stack, outermost first: ``SendGuard`` (final-send shield, bounded sends) →
``KnowledgeGate`` (request id, Host, route, schema, per-route ``BodyLimit``) → quart, except
``POST /memory/write``, served outside quart by ``_write_route`` (the hot path).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from troupe.actors.knowledge import (
    BuildDigest,
    GetEvidence,
    GetPreferenceHistory,
    KnowledgeRefused,
    ListConflicts,
    ListInsights,
    ListPreferences,
    RecoverIdempotency,
    insights_limit_default,
    insights_limit_max,
    insights_limit_min,
    scope_kind_name,
    scope_problem,
)
from troupe.http import SendGuard, ShutdownSignal
from troupe.runtime import ActorCrashed, AskTimeout, Overloaded, Unavailable
from troupe.storage import StorageError

from ._errors import (
    KnowledgeError,
    code_internal_error,
    code_invalid_request,
    code_method_not_allowed,
    code_not_found,
    code_schema_not_ready,
    encode_document,
    error_document,
    internal_error_message,
    overloaded,
    request_id_of,
)
from ._events import EventsSettings, serve_events
from ._gate import KnowledgeGate, route_of
from ._handshake import HandshakeSettings, SchemaState, capabilities, health_report, version_info
from ._openapi import openapi_document
from ._reads import KnowledgeReads, local_utc_offset_seconds
from ._routes import events_path, operations_by_name
from ._routes_discovery import install_discovery_routes
from ._routes_monitor import install_monitor_routes
from ._routes_ocr import install_ocr_routes
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
    identifier_characters_max,
    parse_json_body,
    recovery_models,
    validated,
)
from ._write_route import WriteRoute, WriteRouteDispatch

logger = logging.getLogger("troupe.knowledge")

ask_timeout_seconds = 60.0
"""How long a handler waits for a scope actor: a promotion structures its contexts inline."""
json_content_type = "application/json"


@dataclass(frozen=True)
class KnowledgeAppDependencies:
    """The running parts the knowledge app uses."""

    env: Any
    engine: Any
    system: Any
    shutdown: ShutdownSignal = field(default_factory=ShutdownSignal)
    handshake: HandshakeSettings = field(default_factory=HandshakeSettings)
    events: EventsSettings = field(default_factory=EventsSettings)
    allowed_hosts: Iterable[str] = ()


class ActorFailed(Exception):
    """An actor turn crashed: the route answers 500 (never the text)."""


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    response = Response(encode_document(document), status=status, content_type=json_content_type)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def error_response(error: KnowledgeError) -> Response:
    return json_response(error_document(error.code, error.message, request_id_of(request.scope)),
                         error.status, error.headers)


def answered(reply: Any) -> Response:
    """The reply's contract body, or its refusal as the contract's error."""
    if isinstance(reply, KnowledgeRefused):
        raise KnowledgeError.from_refusal(reply)
    return json_response(reply.encode())


def create_knowledge_app(dependencies: KnowledgeAppDependencies) -> QuartTrio:
    """The knowledge quart-trio app, already wrapped in its middleware stack."""
    app = QuartTrio("troupe.knowledge")
    app.config["MAX_CONTENT_LENGTH"] = None  # the gate's per-route BodyLimit counts instead
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    schema = SchemaState(dependencies.engine)
    reads = KnowledgeReads(dependencies.engine, dependencies.env, dependencies.system)
    _install_errors(app)
    _install_handshake(app, dependencies, schema)
    _install_writes(app, _asker(dependencies.system))
    _install_reads(app, dependencies, reads)
    from ._routes_sync import (
        install_sync_routes,  # the sync slice (issue 13); late: it imports this module
    )

    install_sync_routes(app, _asker(dependencies.system), _register)
    install_monitor_routes(app, dependencies)
    install_ocr_routes(app, dependencies)
    install_discovery_routes(app, dependencies)

    @app.websocket(events_path)
    async def events() -> None:
        await serve_events(dependencies.system, dependencies.shutdown, dependencies.events)

    ids = dependencies.env.ids
    hot = WriteRouteDispatch(app.asgi_app, WriteRoute(_asker(dependencies.system), quiet_errors=(ActorFailed,)))
    gate = KnowledgeGate(hot, new_request_id=lambda: ids.new_id("req_"), schema_ready=schema.ready,
                         allowed_hosts=dependencies.allowed_hosts)
    app.asgi_app = SendGuard(gate)  # type: ignore[method-assign]
    return app


Ask = Callable[..., Awaitable[Any]]


def _asker(system: Any) -> Ask:
    async def ask(kind: str, key: str, message: Any, *, timeout: float = ask_timeout_seconds) -> Any:
        """Ask an actor: backpressure is 503 with Retry-After, a crash is ``ActorFailed``."""
        try:
            return await system.ref(kind, key).ask(message, timeout=timeout)
        except (Overloaded, Unavailable) as exc:
            raise overloaded(seconds=math.ceil(exc.retry_after_seconds)) from exc
        except AskTimeout as exc:
            raise overloaded("the request did not finish in time; retry it") from exc
        except ActorCrashed as exc:
            raise ActorFailed(kind) from exc

    return ask


def _install_errors(app: QuartTrio) -> None:
    @app.errorhandler(KnowledgeError)
    async def _knowledge_error(error: KnowledgeError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {404: code_not_found, 405: code_method_not_allowed}.get(
            status, code_internal_error if status >= 500 else code_invalid_request)
        return error_response(KnowledgeError(code, error.name or code, status=status))

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        logger.exception("unhandled error in a knowledge request handler", exc_info=error)
        return error_response(KnowledgeError(code_internal_error, internal_error_message))


Handler = Callable[[], Awaitable[Response]]


def _register(app: QuartTrio, name: str) -> Callable[[Handler], Handler]:
    """Register ``handler`` for operation ``name``; an actor crash or a handler's own
    exception becomes 500 ``INTERNAL_ERROR``, a storage error 503."""
    operation = operations_by_name[name]

    def register(handler: Handler) -> Handler:
        async def guarded(**_: Any) -> Response:
            try:
                return await handler()
            except KnowledgeError as error:
                return error_response(error)
            except StorageError as exc:
                logger.warning("knowledge route %s met a storage error: %s", name, type(exc).__name__)
                return error_response(overloaded("storage is unavailable; retry shortly"))
            except Exception as exc:
                if not isinstance(exc, ActorFailed):
                    logger.exception("knowledge route %s failed", name, exc_info=exc)
                return error_response(KnowledgeError(code_internal_error, internal_error_message))

        app.add_url_rule(operation.quart_rule, name, guarded, methods=[operation.method])
        return handler

    return register


async def _body() -> Any:
    return parse_json_body(await request.get_data(cache=False, as_text=False))


def _path_id() -> str:
    """The route's ``{id}``; one longer than any id we make cannot exist (404)."""
    path_id = route_of(request.scope).path_id
    assert path_id is not None
    if len(path_id) > identifier_characters_max:
        raise KnowledgeError(code_not_found, "no such resource")
    return path_id


def _optional_scope() -> str | None:
    scope = request.args.get("scope")
    if scope is None or scope == "":
        return None
    problem = scope_problem(scope)
    if problem is not None:
        raise KnowledgeError(code_invalid_request, f"field 'scope': {problem}")
    return scope


def insights_limit(text: str | None) -> int:
    """``limit`` strictly as decimal digits in ``insights_limit_min..insights_limit_max``."""
    if text is None:
        return insights_limit_default
    if not text.isascii() or not text.isdigit() or len(text) > 3 or not (
            insights_limit_min <= int(text) <= insights_limit_max):
        raise KnowledgeError(code_invalid_request,
                             f"field 'limit' must be an integer from {insights_limit_min} to {insights_limit_max}")
    return int(text)


def digest_date(text: str | None) -> str | None:
    from troupe.actors.knowledge._delivery import parse_digest_date

    if text is None:
        return None
    if parse_digest_date(text) is None:
        raise KnowledgeError(code_invalid_request, "field 'date' must be a real calendar day as YYYY-MM-DD")
    return text


def _install_handshake(app: QuartTrio, dependencies: KnowledgeAppDependencies, schema: SchemaState) -> None:
    settings = dependencies.handshake

    @_register(app, "version")
    async def version() -> Response:
        return json_response(version_info(settings, await schema.version()).encode())

    @_register(app, "health")
    async def health() -> Response:
        applied = await schema.version()
        if applied < schema.required:
            raise KnowledgeError(code_schema_not_ready,
                                 f"the database schema is at {applied}; this version needs {schema.required}",
                                 headers={"Retry-After": "5"})
        return json_response(health_report(settings, applied).encode())

    @_register(app, "capabilities")
    async def capabilities_route() -> Response:
        return json_response(capabilities(settings, getattr(dependencies.env, "embedder", None)).encode())

    @_register(app, "openapi")
    async def openapi() -> Response:
        return json_response(openapi_document())


def _install_writes(app: QuartTrio, ask: Ask) -> None:
    async def scope_actor(message: Any, scope: str) -> Response:
        return answered(await ask(scope_kind_name, scope, message))

    @_register(app, "memory_write")
    async def memory_write() -> Response:
        write = validated(MemoryWriteIn, await _body()).to_request()
        return await scope_actor(write, write.scope)

    @_register(app, "memory_update")
    async def memory_update() -> Response:
        update = validated(MemoryUpdateIn, await _body()).to_request()
        return await scope_actor(update, update.scope)

    @_register(app, "agent_lifecycle")
    async def agent_lifecycle() -> Response:
        event = validated(LifecycleIn, await _body()).to_request()
        return await scope_actor(event, event.scope)

    @_register(app, "promote")
    async def promote() -> Response:
        promotion = validated(PromoteIn, await _body()).to_request()
        return await scope_actor(promotion, promotion.scope)

    @_register(app, "idempotency_recover")
    async def idempotency_recover() -> Response:
        recovery = validated(RecoverIn, await _body())
        original_document = recovery.original_request
        if original_document.get("idempotency_key") is None:
            raise KnowledgeError("IDEMPOTENCY_KEY_REQUIRED", "the original request has no idempotency_key")
        model = recovery_models[recovery.operation]
        original = validated(model, original_document, code="INVALID_RECOVERY_REQUEST").to_request()
        return await scope_actor(RecoverIdempotency(original=original, reason=recovery.reason), original.scope)


def _install_reads(app: QuartTrio, dependencies: KnowledgeAppDependencies, reads: KnowledgeReads) -> None:
    @_register(app, "memory_query")
    async def memory_query() -> Response:
        return answered(await reads.answer(validated(MemoryQueryIn, await _body()).to_request()))

    @_register(app, "agent_context")
    async def agent_context() -> Response:
        return answered(await reads.answer(validated(AgentContextIn, await _body()).to_request()))

    @_register(app, "evidence")
    async def evidence() -> Response:
        return answered(await reads.answer(GetEvidence(evidence_id=_path_id())))

    @_register(app, "preference_extract")
    async def preference_extract() -> Response:
        return answered(await reads.answer(validated(PreferenceExtractIn, await _body()).to_request()))

    @_register(app, "preferences")
    async def preferences() -> Response:
        return answered(await reads.answer(ListPreferences(scope=_optional_scope())))

    @_register(app, "preference_history")
    async def preference_history() -> Response:
        return answered(await reads.answer(GetPreferenceHistory(preference_id=_path_id())))

    @_register(app, "forget")
    async def forget() -> Response:
        return answered(await reads.answer(validated(ForgetIn, await _body()).to_request()))

    @_register(app, "conflicts")
    async def conflicts() -> Response:
        return answered(await reads.answer(ListConflicts(scope=_optional_scope())))

    @_register(app, "insights")
    async def insights() -> Response:
        return answered(await reads.answer(ListInsights(limit=insights_limit(request.args.get("limit")))))

    @_register(app, "digest")
    async def digest() -> Response:
        day = digest_date(request.args.get("date"))
        offset = local_utc_offset_seconds(dependencies.env.clock.wall())
        return answered(await reads.answer(BuildDigest(date=day, utc_offset_seconds=offset)))


__all__ = [
    "ActorFailed",
    "KnowledgeAppDependencies",
    "answered",
    "ask_timeout_seconds",
    "create_knowledge_app",
    "digest_date",
    "error_response",
    "insights_limit",
    "json_response",
]
