"""The host surface's ASGI gate: readiness, token, rate, entry id and scope, then body limit.

The contract fixes the order of checks: Host (400), readiness (503), token (401), rate (429),
entry scope (403), and only then the body.  The shared ``HostCheck`` runs first (outside this
gate); everything after it happens here, at the ASGI layer, so that no framework code and no
body read happens for a request that will be refused, and so that the body limit can be chosen
per route (the shared ``BodyLimit``, one instance per limit, counts while streaming).
Token lookups go through ``TokenLookups``: concurrent requests share one read (still one
taken after each of them arrived, so a CLI revocation holds from the next request on).

``HostGate`` hands what it learned to the app in the ASGI scope under ``admission_key``
(a ``GateAdmission``: the token grant and the checked entry id), so handlers never parse the
Authorization header or the entry segment again.  Paths outside ``/api/v1`` (``/openapi.json``,
``/docs``) need no token.

A refusal made before the body was read is sent with a *lingering close*, as the shared
``BodyLimit`` does for 413: the error goes out complete, then what the client is still sending
is read and dropped (bounded in bytes and seconds), so the client reads its 401 instead of a
connection reset.

``NoStore`` adds ``Cache-Control: no-store`` to every response (the contract: host responses
and errors are never cacheable), including the shared middleware's rejections.
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
    entry_id_problem,
    host_audience,
    retry_after_whole_seconds,
)
from troupe.http import ASGIApp, BodyLimit, send_lingering
from troupe.storage import StorageError

from ._errors import (
    FieldProblem,
    code_entry_forbidden,
    code_invalid_request,
    code_rate_limited,
    code_unauthorized,
    code_unavailable,
    encode_document,
    error_document,
    host_error_envelope,
    retry_after_seconds_unknown,
    retry_at_text,
)
from ._routes import body_bytes_max_for, body_limits, entry_segment, is_api_path, is_intake_path

admission_key = "troupe.host.admission"
"""Where the gate leaves its ``GateAdmission`` in the ASGI scope."""



@dataclass(frozen=True)
class GateAdmission:
    """What a request that passed the gate carries: who sent it and (if any) which entry."""

    grant: TokenGrant
    entry_id: str | None


def admission_of(scope: Mapping[str, Any]) -> GateAdmission:
    """The gate's admission for this request (API routes only)."""
    admission = scope.get(admission_key)
    assert isinstance(admission, GateAdmission), "API routes run behind HostGate"
    return admission


class NoStore:
    """``Cache-Control: no-store`` on every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def no_store_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", ())
                           if name.lower() != b"cache-control"]
                headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, no_store_send)


class HostGate:
    """See the module docstring.  ``readiness()`` is true when the server accepts work;
    ``monotonic``/``wall`` are the Env clock's (rate buckets and ``retry_at``)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        engine: Any,
        readiness: Callable[[], bool],
        rate_buckets: RateBuckets,
        wall: Callable[[], float],
        audience: str = host_audience,
        intake: ASGIApp | None = None,
    ) -> None:
        self.app = app
        self.engine = engine
        self.readiness = readiness
        self.rate_buckets = rate_buckets
        self.wall = wall
        self.audience = audience
        self.token_lookups = TokenLookups(engine, audience=audience)
        self._limited = {
            limit: BodyLimit(app, request_body_bytes_max=limit, envelope=host_error_envelope)
            for limit in body_limits
        }
        self._intake_limited = None if intake is None else {
            limit: BodyLimit(intake, request_body_bytes_max=limit, envelope=host_error_envelope)
            for limit in body_limits
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if is_api_path(path):
            refusal = await self._admit(scope)
            if refusal is not None:
                status, document, headers = refusal
                await _send_refusal(receive, send, status, document, headers)
                return
            if self._intake_limited is not None and is_intake_path(path):
                await self._intake_limited[body_bytes_max_for(method, path)](scope, receive, send)
                return
        await self._limited[body_bytes_max_for(method, path)](scope, receive, send)

    async def _admit(self, scope: Any) -> tuple[int, dict, Iterable[tuple[str, str]]] | None:
        """None when admitted (the admission is put in the scope), else the refusal."""
        if not self.readiness():
            return self._retry_refusal(503, code_unavailable, retry_after_seconds_unknown)
        values = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
        try:
            grant = await self.token_lookups.authenticate(bearer_secret(values))
        except StorageError:
            return self._retry_refusal(503, code_unavailable, retry_after_seconds_unknown)
        if grant is None:
            return 401, error_document(code_unauthorized), [("www-authenticate", "Bearer")]
        wait_seconds = self.rate_buckets.take(grant.id)
        if wait_seconds > 0:
            return self._retry_refusal(429, code_rate_limited, retry_after_whole_seconds(wait_seconds))
        entry_id = entry_segment(scope["path"])
        if entry_id is not None:
            problem = entry_id_problem(entry_id)
            if problem is not None:
                fields = [FieldProblem("path.entry_id", problem)]
                return 400, error_document(code_invalid_request, fields=fields), []
            if not grant.scope.allows(entry_id):
                return 403, error_document(code_entry_forbidden), []
        scope[admission_key] = GateAdmission(grant, entry_id)
        return None

    def _retry_refusal(self, status: int, code: str, seconds: int) -> tuple[int, dict, list]:
        document = error_document(
            code, retry_after_seconds=seconds, retry_at=retry_at_text(self.wall() + seconds)
        )
        return status, document, [("retry-after", str(seconds))]


async def _send_refusal(
    receive: Any, send: Any, status: int, document: dict, headers: Iterable[tuple[str, str]]
) -> None:
    body = encode_document(document)
    start_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
    ]
    await send_lingering(receive, send, status, start_headers, body)


__all__ = ["GateAdmission", "HostGate", "NoStore", "admission_key", "admission_of"]
