"""The unified ``/api`` app: its ASGI gate, its quart app, and how it sits in front of /v2.

Why a second quart app behind a dispatcher rather than more rules in the /v2 app: the SDK
dialect differs at every layer (request headers checked before the token, a family and a
closure fence, a different error envelope, headers on every answer, different shapes), while
the session actors are the same.  ``install_api(app, dependencies)`` wraps the sessions app's
ASGI callable in ``ApiFacade``: a request under ``/api`` that speaks the SDK dialect (it
carries ``tansr-session-family``, as every tansr-sdk call does) or names a route only the
unified surface has (discovery, inputs) goes to this app; everything else goes on to the /v2
stack unchanged (whose ``/api`` basics keep answering older clients).

The gate (``ApiGate``), outermost first: Host (400), the unified request headers (400 / 408
``deadline_exceeded``), readiness (503 ``capacity_exceeded`` with Retry-After), the end-user
token (401), the route (404 / 405), the session family (404 ``capability_unavailable``
``not_installed`` for a family not served here), the closure fence on writes (412
``precondition_failed`` ``closure_stale``), then the body, counted against the operation's
cap (413); a write with ``Idempotency-Key`` then goes through the replay window (``_replay``).  Every answer, the gate's own included, carries the unified headers.

Input routes (issue 12 part B) register on the same app: ``install_input_routes(app,
dependencies)`` from ``_routes_inputs`` (imported when it exists), using ``api_admission()``,
``make_api_ask(dependencies)`` and the ``_transport`` helpers; their operations
(``session.input.*``) are enabled in the closure only when that module is present.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from troupe.auth import TokenLookups, bearer_secret, sessions_audience
from troupe.http import BodyLimit, ErrorBody, HostCheck, SendGuard, send_lingering
from troupe.http.sessions._errors import SessionsError, statuses
from troupe.http.sessions._routes import (
    default_body_bytes_max,
    import_body_bytes_max,
    large_body_bytes_max,
)
from troupe.storage import StorageError

from ._discovery import (
    closure_document,
    deployment_capabilities,
    ended_writes_kept,
    operation_states,
    session_family_discovery,
)
from ._events import install_api_event_route
from ._manifest import api_operations, input_operation_names, manifest_document, quart_rule
from ._replay import (
    ReplayWindow,
    idempotency_response_bytes_max,
    idempotency_wait_seconds_max,
    read_body,
    replaying_receive,
    request_fingerprint,
)
from ._routes_core import (
    ApiAdmission,
    admission_scope_key,
    api_admission,
    install_core_routes,
    make_api_ask,
)
from ._transport import (
    ApiHeaderError,
    discovery_domain,
    error_document,
    header_session_family,
    parse_headers,
    served_session_families,
    session_domain,
    session_error_response,
    trace_scope_key,
    unified_code_for,
    unified_headers,
)

logger = logging.getLogger("troupe.sessions.api")

api_prefix = "/api"
body_caps_by_operation = {
    "session.message.send": large_body_bytes_max,
    "session.tool.result": large_body_bytes_max,
    "session.input.submit": large_body_bytes_max,
    "session.checkpoint.import": import_body_bytes_max,
    "session.audio.transcribe": import_body_bytes_max,
    "session.audio.speak": import_body_bytes_max,
}
"""Body caps that differ from the contract's 1 MiB default."""
fence_read_seconds_max = 10.0
"""How long the closure fence waits for a session's status before leaving it to the route."""
unified_only_suffixes = ("/capabilities", "/input-capabilities")
unified_only_segments = ("inputs",)


def _matches(template: str, path: str) -> dict[str, str] | None:
    pattern, actual = template.strip("/").split("/"), path.strip("/").split("/")
    if len(pattern) != len(actual):
        return None
    parameters = {}
    for expected, value in zip(pattern, actual, strict=True):
        if expected.startswith(":"):
            if not value:
                return None
            parameters[expected[1:]] = value
        elif expected != value:
            return None
    return parameters


def match_api_operation(method: str, path: str, served: frozenset[str]) -> tuple[Any, dict[str, str], tuple[str, ...]]:
    """(operation or None, parameters, allowed methods when the path exists with others)."""
    candidates = []
    for operation in api_operations:
        if operation.name not in served:
            continue
        parameters = _matches(operation.api_path, path)
        if parameters is not None:
            candidates.append((len(parameters), operation, parameters))
    candidates.sort(key=lambda item: item[0])
    for _, operation, parameters in candidates:
        if operation.method == method:
            return operation, parameters, ()
    if candidates:
        fewest = candidates[0][0]
        return None, {}, tuple(sorted({op.method for count, op, _ in candidates if count == fewest}))
    return None, {}, ()


def is_unified_request(scope: Any) -> bool:
    """True for the requests ``ApiFacade`` sends to this app (see the module docstring)."""
    path = scope.get("path", "")
    if not (path == api_prefix or path.startswith(api_prefix + "/")):
        return False
    if any(name.lower() == header_session_family.encode() for name, _ in scope.get("headers", ())):
        return True
    if path.startswith("/api/capabilities") or path.endswith(unified_only_suffixes):
        return True
    return any(segment in unified_only_segments for segment in path.split("/")[4:5])


def served_operations() -> frozenset[str]:
    names = {operation.name for operation in api_operations}
    if not _input_routes_available():
        names -= input_operation_names
    return frozenset(names)


def _input_routes_available() -> bool:
    try:
        from . import _routes_inputs  # noqa: F401
    except ImportError:
        return False
    return hasattr(_routes_inputs, "install_input_routes")


def current_closure(dependencies: Any, served: frozenset[str], session_status: str | None = None) -> dict[str, Any]:
    """A session's closure: what is served, minus what the deployment's configuration turns
    off, minus (for an ended session) every write but ``ended_writes_kept``.  Nothing else of
    the session goes in (not running / idle, not its turns, checkpoints or epochs), so the id
    stays the same for the whole life of a live session and changes only when it ends."""
    disabled = set()
    if dependencies.cwd_policy is None:
        disabled.add("session.cwd.set")
    if dependencies.voice is None:
        disabled.update({"session.audio.transcribe", "session.audio.speak"})
    if session_status == "ended":
        disabled.update(operation.name for operation in api_operations
                        if operation.kind == "write" and operation.name not in ended_writes_kept)
    return closure_document(operation_states(served=served, disabled=frozenset(disabled)))


class ApiGate:
    """See the module docstring.  ``tokens_allowed`` False refuses every token (401): the
    fixture's "authentication off" control."""

    def __init__(self, app: Any, dependencies: Any, served: frozenset[str]) -> None:
        self.app = app
        self.dependencies = dependencies
        self.served = served
        self.tokens_allowed = True
        self.host_check = HostCheck(app, allowed_hosts=dependencies.allowed_hosts)
        self.token_lookups = TokenLookups(dependencies.engine, audience=sessions_audience)
        caps = {default_body_bytes_max, *body_caps_by_operation.values()}
        self._limited = {cap: BodyLimit(app, request_body_bytes_max=cap, envelope=_body_limit_envelope)
                         for cap in caps}
        self.replay_window = ReplayWindow(dependencies.env.clock.monotonic)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path, method = scope["path"], scope["method"]
        domain = discovery_domain if (path in ("/api/manifest", "/api/capabilities")
                                      or (path.endswith("/capabilities") and path.startswith("/api/sessions/"))) \
            else session_domain
        send = _with_unified_headers(send, domain)
        scope[trace_scope_key] = "tr_" + self.dependencies.env.ids.new_id()
        refusal = await self._admit(scope, method, path)
        if refusal is not None:
            status, document, headers = refusal
            await _send_json(receive, send, status, document, headers)
            return
        admission = scope[admission_scope_key]
        cap = body_caps_by_operation.get(admission.operation, default_body_bytes_max)
        key = admission.headers.idempotency_key
        if key is None:
            await self._limited[cap](scope, receive, send)
            return
        await self._keyed_write(scope, receive, send, admission, key, cap)

    async def _keyed_write(self, scope: Any, receive: Any, send: Any, admission: ApiAdmission, key: str,
                           cap: int) -> None:
        """A write with ``Idempotency-Key``: run once, answer duplicates from the window (``_replay``)."""
        trace = scope[trace_scope_key]
        body, over, gone = await read_body(receive, cap)
        if gone:
            return
        if over:
            document = error_document(413, "payload_too_large", "request body too large", request_id=key,
                                      trace_id=trace, detail={"domainCode": "payload_too_large", "domainStatus": 413,
                                                              "reason": "header_body_limit", "limitBytes": cap})
            await _send_json(receive, send, 413, document, {})
            return
        fingerprint = request_fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        owner = admission.end_user_id
        drained = replaying_receive(b"", receive)  # the body is read: nothing left to linger over
        with trio.move_on_after(idempotency_wait_seconds_max):
            while True:
                decision, receipt = self.replay_window.begin(owner, key, fingerprint)
                if decision != "wait":
                    break
                assert receipt is not None
                await receipt.done.wait()
        if decision == "wait":  # the first arrival is still running after the longest wait
            decision, receipt = "full", None
        if decision in ("reused", "full"):
            status, code, reason = (409, "conflict", "idempotency_key_reused") if decision == "reused" \
                else (503, "capacity_exceeded", "receipt_window_full")
            document = error_document(status, code, reason.replace("_", " "), request_id=key, trace_id=trace,
                                      detail={"reason": reason, "header": "idempotency-key"},
                                      retry_after_ms=1000 if status == 503 else None)
            await _send_json(drained, send, status, document, {"Retry-After": "1"} if status == 503 else {})
            return
        assert receipt is not None
        if decision == "replay":
            assert receipt.status is not None
            headers = [*receipt.headers, (b"idempotent-replayed", b"true")]
            await send_lingering(drained, send, receipt.status, headers, receipt.body)
            return
        captured: dict[str, Any] = {"status": None, "headers": [], "body": bytearray(), "complete": False}

        async def capturing_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                captured["status"] = message["status"]
                captured["headers"] = [(bytes(name), bytes(value)) for name, value in message.get("headers", ())]
            elif message["type"] == "http.response.body":
                if len(captured["body"]) <= idempotency_response_bytes_max:
                    captured["body"] += message.get("body", b"")
                captured["complete"] = not message.get("more_body", False)
            await send(message)

        try:
            await self._limited[cap](scope, replaying_receive(body, receive), capturing_send)
        finally:
            complete = captured["complete"]
            self.replay_window.finish(owner, key, receipt, captured["status"] if complete else None,
                                      captured["headers"], bytes(captured["body"]))

    async def _admit(self, scope: Any, method: str, path: str) -> tuple[int, dict, dict] | None:
        trace = scope[trace_scope_key]
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", ())}
        key = headers.get("idempotency-key")

        def refuse(status: int, code: str, message: str, detail: dict | None = None,
                   retry_after: int | None = None, extra: dict | None = None) -> tuple[int, dict, dict]:
            document = error_document(status, code, message, detail=detail, request_id=key, trace_id=trace,
                                      retry_after_ms=None if retry_after is None else retry_after * 1000)
            response_headers = dict(extra or {})
            if retry_after is not None:
                response_headers["Retry-After"] = str(retry_after)
            if status == 401:
                response_headers["WWW-Authenticate"] = "Bearer"
            return status, document, response_headers

        if not self.host_check.allows(headers.get("host", "").encode("latin-1") or None):
            return refuse(400, "invalid_request", "Host not allowed", {"domainCode": "bad_host"})
        try:
            parsed = parse_headers(headers)
        except ApiHeaderError as error:
            return refuse(error.status, error.code, error.message, error.detail())
        dependencies = self.dependencies
        if not dependencies.readiness():
            return refuse(503, "capacity_exceeded", "server not ready", {"domainCode": "draining"
                          if dependencies.shutdown.is_set() else "overloaded", "domainStatus": 503}, 5)
        if parsed.deadline_ms is not None and parsed.deadline_ms <= int(dependencies.env.clock.wall() * 1000):
            return refuse(408, "invalid_request", "deadline exceeded", {"reason": "deadline_exceeded"})
        grant = None
        if self.tokens_allowed:
            try:
                grant = await self.token_lookups.authenticate(bearer_secret(
                    [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]))
            except StorageError:
                return refuse(503, "capacity_exceeded", "storage busy", {"domainCode": "overloaded"}, 1)
        if grant is None or grant.scope.kind != "end_user":
            return refuse(401, "unauthorized", "missing or invalid end-user token", {"domainCode": "unauthorized"})
        operation, _, allowed = match_api_operation(method, path, self.served)
        if operation is None:
            if allowed:
                return refuse(405, "method_not_allowed", "method not allowed", None, None, {"Allow": ", ".join(allowed)})
            return refuse(404, "not_found", "no such route", {"domainCode": "not_found"})
        if parsed.idempotency_key is not None and operation.kind != "write":
            return refuse(400, "invalid_request", "Idempotency-Key applies to writes only",
                          {"reason": "idempotency_key_not_applicable", "header": "idempotency-key"})
        if operation.family is not None and parsed.family not in served_session_families:
            # The family discovery too: a client of a family not installed here learns it from a
            # 404 before it writes anything (the SDK's own integration flow expects that 404).
            return refuse(404, "capability_unavailable", "session family not installed",
                          {"reason": "not_installed", "header": header_session_family})
        if parsed.closure_id is not None:
            if operation.kind != "write" or not operation.api_path.startswith("/api/sessions/:id/"):
                return refuse(400, "invalid_request", "closure id on an unfenced request",
                              {"header": "tansr-closure-id"})
            status = await self._session_status(grant.scope.end_user_id, path)
            current = current_closure(dependencies, self.served, status)
            if parsed.closure_id != current["closureId"]:
                return refuse(412, "precondition_failed", "capability closure is stale",
                              {"domainCode": "closure_stale", "closureId": current["closureId"],
                               "operation": operation.name}, None, {"tansr-closure-id": current["closureId"]})
            if current["operations"].get(operation.name) != "enabled":
                state = current["operations"].get(operation.name, "unavailable")
                return refuse(403 if state == "disabled" else 404, "capability_unavailable",
                              "operation outside the closure", {"reason": "outside_closure", "state": state,
                                                                "operation": operation.name})
        scope[admission_scope_key] = ApiAdmission(grant.scope.end_user_id, grant, operation.name, parsed)
        return None

    async def _session_status(self, end_user_id: str, path: str) -> str | None:
        """The status of the session a fenced write names, or None when the actor refuses
        (unknown, foreign, busy): the route then answers that refusal itself."""
        from troupe.actors.sessions import ReadMeta, SessionMeta, session_kind_name
        from troupe.http.sessions._schemas import session_key

        try:
            session_id = session_key(path.split("/")[3])
        except SessionsError:
            return None  # malformed: the route refuses it without waking an actor
        try:
            reply = await self.dependencies.system.ref(session_kind_name, session_id).ask(
                ReadMeta(end_user_id=end_user_id, via="api"), timeout=fence_read_seconds_max)
        except Exception:  # noqa: BLE001 - any failure leaves the decision to the route
            return None
        return reply.status if isinstance(reply, SessionMeta) else None


def _body_limit_envelope(status: int, code: str, message: str) -> ErrorBody:
    del message
    unified, status = unified_code_for(code if code in statuses else "payload_too_large", status)
    import json

    document = error_document(status, unified, code, detail={"domainCode": "payload_too_large",
                                                             "domainStatus": 413, "reason": "header_body_limit"})
    return ErrorBody(json.dumps(document, separators=(",", ":")).encode())


def _with_unified_headers(send: Any, domain: str) -> Any:
    extra = [(name.encode(), value.encode()) for name, value in unified_headers(domain).items()]

    async def unified_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", ())}
            headers = [*message.get("headers", ())]
            headers.extend(item for item in extra if item[0] not in present)
            message = {**message, "headers": headers}
        await send(message)

    return unified_send


async def _send_json(receive: Any, send: Any, status: int, document: dict, headers: dict[str, str]) -> None:
    import json

    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
             (b"cache-control", b"no-store"),
             *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items())]
    await send_lingering(receive, send, status, start, body)


def create_api_app(dependencies: Any) -> tuple[QuartTrio, ApiGate]:
    """The /api quart app behind its gate: (app, gate); serve ``gate``."""
    app = QuartTrio("troupe.sessions.api")
    app.config["MAX_CONTENT_LENGTH"] = None
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False
    ask = make_api_ask(dependencies)
    served = served_operations()
    _install_error_handlers(app)
    _install_discovery(app, dependencies, ask, served)
    install_core_routes(app, dependencies, ask=ask)
    install_api_event_route(app, dependencies, ask=ask, admission=api_admission,
                            rule=quart_rule("/api/sessions/:id/events"))
    if "session.input.submit" in served:
        from ._routes_inputs import install_input_routes

        install_input_routes(app, dependencies)
    gate = ApiGate(app.asgi_app, dependencies, served)
    return app, gate


def _install_error_handlers(app: QuartTrio) -> None:
    @app.errorhandler(SessionsError)
    async def _sessions_error(error: SessionsError) -> Response:
        await _discard_body()
        return session_error_response(error.domain_code or error.code, error.message or "",
                                      domain_status=error.status, detail=error.detail,
                                      retry_after_seconds=error.retry_after_seconds)

    @app.errorhandler(HTTPException)
    async def _http_error(error: HTTPException) -> Response:
        await _discard_body()
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            error.code or 500, "internal_error" if (error.code or 500) >= 500 else "validation_failed")
        return session_error_response(code, domain_status=error.code or 500)

    @app.errorhandler(Exception)
    async def _crash(error: Exception) -> Response:
        logger.exception("unhandled error in an /api request handler", exc_info=error)
        await _discard_body()
        return session_error_response("internal_error")


async def _discard_body() -> None:
    from troupe.http.sessions._app import discard_unread_body

    await discard_unread_body()


def _install_discovery(app: QuartTrio, dependencies: Any, ask: Callable[..., Any], served: frozenset[str]) -> None:
    from troupe.actors.sessions import ReadMeta, session_kind_name
    from troupe.http.sessions._schemas import session_key

    from ._transport import api_json_response

    @app.get("/api/manifest")
    async def manifest() -> Response:
        return api_json_response(manifest_document(served), domain=discovery_domain)

    @app.get("/api/capabilities")
    async def capabilities() -> Response:
        return api_json_response(deployment_capabilities(), domain=discovery_domain)

    @app.get("/api/capabilities/sessions")
    async def family_discovery() -> Response:
        protocol = request.args.get("protocol", "sdk2-ext-v1")
        return api_json_response(session_family_discovery(protocol))

    @app.get("/api/sessions/<id>/capabilities")
    async def session_capabilities(id: str) -> Response:  # noqa: A002
        who = api_admission()
        meta = await ask(session_kind_name, session_key(id), ReadMeta(end_user_id=who.end_user_id, via="api"))
        closure = current_closure(dependencies, served, meta.status)
        return api_json_response(closure, domain=discovery_domain, closure_id=closure["closureId"])


class ApiFacade:
    """The dispatcher ``install_api`` puts in front of the sessions app (module docstring)."""

    def __init__(self, legacy: Any, unified: Any) -> None:
        self.legacy = legacy
        self.unified = unified

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and is_unified_request(scope):
            await self.unified(scope, receive, send)
        else:
            await self.legacy(scope, receive, send)


def install_api(app: QuartTrio, dependencies: Any) -> ApiFacade:
    """Put the unified /api app in front of the sessions app ``app`` (after its stack is built)."""
    _, gate = create_api_app(dependencies)
    facade = ApiFacade(app.asgi_app, SendGuard(gate))
    app.asgi_app = facade  # type: ignore[method-assign]
    return facade


__all__ = [
    "ApiFacade",
    "ApiGate",
    "body_caps_by_operation",
    "create_api_app",
    "current_closure",
    "install_api",
    "is_unified_request",
    "match_api_operation",
    "served_operations",
]
