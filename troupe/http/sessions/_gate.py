"""The sessions surface's ASGI gate: Host, prefix, readiness, bearer, route, body cap.

The order is the issue's: the Host check (400 ``bad_host``), then readiness (503
``overloaded`` while starting, ``draining`` once shutdown began, both with Retry-After), then
the end-user bearer token (401 ``unauthorized``), then the route (404 / 405, and 410 ``gone``
for a write on /v2 when ``TANSR_SERVE_LEGACY_PREFIX=readonly``), and only then the body, counted
while it streams against the operation's cap (413 ``payload_too_large``).  Everything happens
at the ASGI layer, so no framework code runs and no body is read for a request that will be
refused, and each refusal is rendered in the dialect of its prefix (``_errors``).

Paths that need no token: ``/healthz``, ``/readyz`` (the contract's probes), ``/openapi.json``
and ``/docs``.  Paths of the contract's retired surface (``/v1/**``) and paths outside
``/v2`` and ``/api`` answer 404 without looking at the token, as if nothing were mounted
there; so does all of ``/v2`` when the legacy knob is ``off``.

Every /v2 response (errors and SSE included) carries ``Deprecation`` and ``Link`` (and
``Sunset`` when configured): /api is always mounted here.

The gate leaves a ``SessionsAdmission`` (the end user, the token and the matched route) in the
ASGI scope under ``admission_key``; handlers never parse the Authorization header again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from troupe.auth import (
    RateBuckets,
    TokenGrant,
    TokenLookups,
    bearer_secret,
    retry_after_whole_seconds,
    sessions_audience,
)
from troupe.http import ASGIApp, BodyLimit, HostCheck, ShutdownSignal, send_lingering
from troupe.storage import StorageError

from ._errors import (
    SessionsError,
    code_bad_host,
    code_gone,
    code_legacy_prefix_retired,
    code_method_not_allowed,
    code_not_found,
    draining_retry_after_seconds,
    encode_document,
    unified_error_envelope,
    v2_error_envelope,
)
from ._routes import (
    LegacyPrefixPolicy,
    Operation,
    RouteMatch,
    api_prefix,
    body_caps,
    default_body_bytes_max,
    is_retired_path,
    legacy_prefix,
    manifest_path,
    match_route,
)

admission_key = "troupe.sessions.admission"
"""Where the gate leaves its ``SessionsAdmission`` in the ASGI scope."""

open_paths = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs"})
"""Paths answered without a token (probes and documentation)."""

manifest_operation = Operation("manifest", "GET", "/manifest", "read", summary="统一调用面清单")


@dataclass(frozen=True)
class SessionsAdmission:
    """What a request that passed the gate carries."""

    end_user_id: str
    grant: TokenGrant
    route: RouteMatch

    @property
    def via(self) -> str:
        return self.route.via

    @property
    def unified(self) -> bool:
        return self.route.prefix == api_prefix


def admission_of(scope: Mapping[str, Any]) -> SessionsAdmission:
    admission = scope.get(admission_key)
    assert isinstance(admission, SessionsAdmission), "sessions routes run behind SessionsGate"
    return admission


def is_unified_path(path: str) -> bool:
    return path == api_prefix or path.startswith(api_prefix + "/")


class SessionsGate:
    """See the module docstring.  ``readiness()`` is true when the server accepts work;
    ``shutdown`` tells draining from starting."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        engine: Any,
        readiness: Callable[[], bool],
        shutdown: ShutdownSignal,
        legacy_policy: LegacyPrefixPolicy,
        allowed_hosts: Iterable[str] = (),
        rate_buckets: RateBuckets | None = None,
    ) -> None:
        self.app = app
        self.readiness = readiness
        self.shutdown = shutdown
        self.legacy_policy = legacy_policy
        self.rate_buckets = rate_buckets
        self.host_check = HostCheck(app, allowed_hosts=allowed_hosts)
        self.token_lookups = TokenLookups(engine, audience=sessions_audience)
        self._limited = {
            (cap, unified): BodyLimit(
                app, request_body_bytes_max=cap,
                envelope=unified_error_envelope if unified else v2_error_envelope,
            )
            for cap in body_caps for unified in (False, True)
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        unified = is_unified_path(path)
        if not self.host_check.allows(_header(scope, b"host")):
            await _send_refusal(receive, send, SessionsError(code_bad_host), unified=unified)
            return
        if path in open_paths:
            await self._limited[(default_body_bytes_max, False)](scope, receive, send)
            return
        route = self._route(method, path)
        if route is None:
            await _send_refusal(receive, send, SessionsError(code_not_found), unified=unified)
            return
        if route.prefix == legacy_prefix:
            send = self._with_legacy_headers(send)
        refusal = await self._admit(scope, route)
        if refusal is not None:
            await _send_refusal(receive, send, refusal, unified=unified)
            return
        assert route.operation is not None
        await self._limited[(route.operation.body_bytes_max, unified)](scope, receive, send)

    def _route(self, method: str, path: str) -> RouteMatch | None:
        """The matched route, or None for a 404 answered before the token is looked at."""
        if is_retired_path(path):
            return None
        if path == manifest_path:
            if method != "GET":
                return RouteMatch(api_prefix, None, {}, ("GET",))
            return RouteMatch(api_prefix, manifest_operation, {})
        route = match_route(method, path)
        if route is None:
            return None
        if route.prefix == legacy_prefix and self.legacy_policy.mode == "off":
            return None
        return route

    async def _admit(self, scope: Any, route: RouteMatch) -> SessionsError | None:
        """None when admitted (the admission is put in the scope), else the refusal."""
        if not self.readiness():
            if self.shutdown.is_set():
                return SessionsError("draining", retry_after_seconds=draining_retry_after_seconds)
            return SessionsError("overloaded")
        values = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
        try:
            grant = await self.token_lookups.authenticate(bearer_secret(values))
        except StorageError:
            return SessionsError("overloaded")
        if grant is None or grant.scope.kind != "end_user":
            return SessionsError("unauthorized")
        if self.rate_buckets is not None:
            wait_seconds = self.rate_buckets.take(grant.id)
            if wait_seconds > 0:
                return SessionsError("rate_limited", retry_after_seconds=retry_after_whole_seconds(wait_seconds))
        if route.operation is None:
            if route.allowed_methods:
                return SessionsError(code_method_not_allowed, headers={"Allow": ", ".join(route.allowed_methods)})
            return SessionsError(code_not_found)
        if (route.prefix == legacy_prefix and self.legacy_policy.mode == "readonly"
                and route.operation.kind == "write"):
            return SessionsError(code_gone, domain_code=code_legacy_prefix_retired)
        scope[admission_key] = SessionsAdmission(grant.scope.end_user_id, grant, route)
        return None

    def _with_legacy_headers(self, send: Any) -> Any:
        extra = self.legacy_policy.legacy_headers()

        async def legacy_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        return legacy_send


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def _send_refusal(receive: Any, send: Any, error: SessionsError, *, unified: bool) -> None:
    body = encode_document(error.document(unified=unified))
    start_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"cache-control", b"no-store"),
        *((name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.response_headers().items()),
    ]
    await send_lingering(receive, send, error.status, start_headers, body)


__all__ = [
    "SessionsAdmission",
    "SessionsGate",
    "admission_key",
    "admission_of",
    "is_unified_path",
    "manifest_operation",
    "open_paths",
]
