"""``GET …/events``: one SSE connection to a session, replay first, then live frames.

The connection owns a ``Subscriber`` (the streams slice's bounded write queue) and hands it to
the session actor with ``Subscribe``: the actor queues the replay (a gap frame first when the
cursor is older than the ring or the epoch, or ahead of the log) and registers the subscriber
in the same turn, so no live frame slips between replay and live.  This module then only
writes: the first frame ``retry: 3000``, each chunk ``next_chunk`` hands over (at most
``maxSubscriberBufferBytes`` per write; frames are never split), and ``: hb`` after 15 s of
silence.  The slow-consumer policy lives in the subscriber; when it closes the subscriber
(``disconnect``) the response simply ends and the client reconnects with ``Last-Event-ID``.

Cursor: the ``Last-Event-ID`` header (absent or ``-1`` = everything retained; a value that is
not an integer is 400 ``validation_failed``).  The contract names no query-string cursor, so
none is read.  ``?exclude=hook,mcp`` filters kernel events by type prefix (they keep their
seq; control and gap frames are never filtered).

Unified envelope: only on ``/api`` and only when the request carries
``tansr-event-envelope: unified-v1``; the header is echoed and each frame's ``data:`` line is
rewritten by ``unified_frame``.  Chunks are cut back into frames at ``\\n\\n`` for that (our
frames' JSON never contains a raw newline).  ``/v2`` is never rewritten.

Shutdown: waiting happens inside ``ShutdownSignal.scope()``; when the server starts draining
(or the actor closes the subscriber with reason ``shutdown``) the stream writes a long
``retry:`` frame and ends cleanly, before hypercorn's grace period would cut it.  However the
stream ends, the actor is told ``Unsubscribe`` (best effort: the subscriber is closed locally
first, so the actor drops it at its next offer even if the message cannot be queued).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.sessions import (
    Subscribe,
    Subscribed,
    Subscriber,
    SubscriberClosed,
    Unsubscribe,
    close_reason_shutdown,
    heartbeat_frame,
    heartbeat_interval_seconds,
    max_subscriber_buffer_bytes_default,
    retry_frame,
    retry_milliseconds_default,
    session_kind_name,
    slow_policies,
    slow_policy_default,
    slow_subscriber_grace_seconds_default,
    unified_frame,
)
from troupe.runtime import ActorError

from ._errors import SessionsError
from ._gate import admission_of
from ._routes import api_prefix, legacy_prefix, operations_by_name
from ._schemas import session_key

logger = logging.getLogger("troupe.sessions")

envelope_header = "tansr-event-envelope"
unified_envelope_value = "unified-v1"

exclude_prefixes_max = 16
"""``?exclude=`` names at most this many prefixes."""
exclude_prefix_characters_max = 64

shutdown_retry_milliseconds = 30_000
"""The long ``retry:`` sent to live streams when the server drains: long enough for a restart."""

close_reason_client_gone = "client_gone"

assert shutdown_retry_milliseconds > retry_milliseconds_default


slow_policy_variable = "TANSR_SERVE_SLOW_SUBSCRIBER_POLICY"
max_buffer_bytes_variable = "TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES"
grace_milliseconds_variable = "TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS"

max_buffer_bytes_floor = 1024
"""``TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES`` below this is refused: smaller than one busy
frame, every connection would be slow."""
grace_milliseconds_floor = 10
"""``TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS`` below this is refused (a scheduling hiccup)."""


@dataclass(frozen=True)
class EventStreamSettings:
    """Per-deployment stream settings: the slow-consumer policy (``disconnect`` or
    ``drop-oldest``), ``maxSubscriberBufferBytes``, the pause grace and the heartbeat."""

    slow_policy: str = slow_policy_default
    max_buffer_bytes: int = max_subscriber_buffer_bytes_default
    grace_seconds: float = slow_subscriber_grace_seconds_default
    heartbeat_seconds: float = heartbeat_interval_seconds
    retry_milliseconds: int = retry_milliseconds_default

    def __post_init__(self) -> None:
        assert self.slow_policy in slow_policies, self.slow_policy
        assert self.max_buffer_bytes >= 1 and self.grace_seconds > 0 and self.heartbeat_seconds > 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> EventStreamSettings:
        """The slow-consumer knobs of ``tansr serve``'s deployment: policy
        (``disconnect`` | ``drop-oldest``), ``maxSubscriberBufferBytes`` and
        ``slowSubscriberGraceMs``; unset = the contract's defaults.  A bad value is a
        configuration error (ValueError): the operator asked for a policy we would not apply."""
        policy = environ.get(slow_policy_variable, "").strip().lower() or slow_policy_default
        if policy not in slow_policies:
            raise ValueError(f"{slow_policy_variable} must be one of {', '.join(sorted(slow_policies))}, got {policy!r}")
        buffer_bytes = _integer_variable(environ, max_buffer_bytes_variable, max_subscriber_buffer_bytes_default,
                                         max_buffer_bytes_floor)
        grace_ms = _integer_variable(environ, grace_milliseconds_variable,
                                     round(slow_subscriber_grace_seconds_default * 1000), grace_milliseconds_floor)
        return cls(slow_policy=policy, max_buffer_bytes=buffer_bytes, grace_seconds=grace_ms / 1000)


def _integer_variable(environ: Mapping[str, str], name: str, default: int, floor: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None
    if value < floor:
        raise ValueError(f"{name} must be at least {floor}, got {value}")
    return value


def last_event_id_of(header: str | None) -> int | None:
    """The cursor of a ``Last-Event-ID`` header: None when absent, empty or -1."""
    if header is None or header.strip() == "":
        return None
    try:
        value = int(header.strip())
    except ValueError:
        raise SessionsError("validation_failed", detail={
            "fields": [{"field": "header.last-event-id", "message": "须为整数 seq"}]}) from None
    if value < -1:
        raise SessionsError("validation_failed", detail={
            "fields": [{"field": "header.last-event-id", "message": "须 >= -1"}]})
    return None if value == -1 else value


def exclude_of(values: list[str]) -> tuple[str, ...]:
    """``?exclude=hook,mcp`` (repeatable) as prefixes, bounded in count and length."""
    prefixes = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if len(prefixes) > exclude_prefixes_max or any(len(prefix) > exclude_prefix_characters_max for prefix in prefixes):
        raise SessionsError("validation_failed", detail={"fields": [{"field": "query.exclude", "message":
            f"至多 {exclude_prefixes_max} 个前缀，每个至多 {exclude_prefix_characters_max} 字符"}]})
    return tuple(dict.fromkeys(prefixes))


def rewrite_unified(chunk: bytes) -> bytes:
    """Each frame of ``chunk`` through ``unified_frame``."""
    frames = chunk.split(b"\n\n")
    assert frames[-1] == b"", "chunks hold whole frames"
    return b"".join(unified_frame(frame + b"\n\n") for frame in frames[:-1])


def install_event_route(app: QuartTrio, dependencies: Any, *, ask: Callable[..., Any]) -> None:
    """Register ``GET {/v2,/api}/sessions/<sessionId>/events``."""
    settings: EventStreamSettings = dependencies.events
    shutdown = dependencies.shutdown
    system = dependencies.system
    clock = dependencies.env.clock
    operation = operations_by_name["sessions.events"]

    async def events(sessionId: str) -> Response:  # noqa: N803 (the contract's name)
        admission = admission_of(request.scope)
        key = session_key(sessionId)
        last_event_id = last_event_id_of(request.headers.get("Last-Event-ID"))
        exclude = exclude_of(request.args.getlist("exclude"))
        unified = (admission.unified
                   and request.headers.get(envelope_header, "").strip().lower() == unified_envelope_value)
        subscriber = Subscriber(
            key, clock=clock.monotonic, exclude_prefixes=exclude, policy=settings.slow_policy,
            max_buffer_bytes=settings.max_buffer_bytes, grace_seconds=settings.grace_seconds,
        )
        reply = await ask(session_kind_name, key, Subscribe(
            end_user_id=admission.end_user_id, via=admission.via,
            last_event_id=last_event_id, exclude=exclude, subscriber=subscriber))
        assert isinstance(reply, Subscribed), reply

        def unsubscribe() -> None:
            subscriber.close(close_reason_client_gone)
            try:
                system.ref(session_kind_name, key).tell(
                    Unsubscribe(end_user_id=admission.end_user_id, via=admission.via, subscriber=subscriber))
            except ActorError:
                pass  # closed locally: the actor drops it at its next offer anyway

        response = Response(
            event_stream_frames(subscriber, settings, shutdown, rewrite=rewrite_unified if unified else None,
                                on_end=unsubscribe),
            status=200, content_type="text/event-stream; charset=utf-8",
        )
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Accel-Buffering"] = "no"
        if unified:
            response.headers[envelope_header] = unified_envelope_value
        response.timeout = None
        return response

    for prefix in (legacy_prefix, api_prefix):
        app.add_url_rule(operation.quart_rule(prefix), f"{operation.name}@{prefix}", events, methods=["GET"])


async def event_stream_frames(
    subscriber: Subscriber,
    settings: EventStreamSettings,
    shutdown: Any,
    *,
    rewrite: Callable[[bytes], bytes] | None,
    on_end: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The body of an event stream, shared by /v2 and /api (``api._events``): ``retry:`` first,
    the subscriber's chunks (each through ``rewrite`` when given), ``: hb`` after
    ``heartbeat_seconds`` of quiet, the shutdown ``retry:`` at a drain; ``on_end`` runs however
    the stream ends (the client gone included)."""
    try:
        yield retry_frame(settings.retry_milliseconds)
        while True:
            chunk: bytes | None = None
            closed_reason: str | None = None
            if not shutdown.is_set():
                # Frames queued while the last chunk was written: take them without a wait, a
                # cancel scope and a wakeup (with hundreds of busy streams these were a good
                # part of each write's cost; bench/sessions_sse.py).
                try:
                    chunk = subscriber.next_chunk_nowait()
                except SubscriberClosed as exc:
                    closed_reason = exc.reason
            if chunk is None and closed_reason is None:
                with shutdown.scope(timeout_seconds=settings.heartbeat_seconds):
                    try:
                        chunk = await subscriber.next_chunk()
                    except SubscriberClosed as exc:
                        closed_reason = exc.reason
            if chunk is not None:
                yield rewrite(chunk) if rewrite is not None else chunk
            elif closed_reason is not None or shutdown.is_set():
                if closed_reason == close_reason_shutdown or shutdown.is_set():
                    yield retry_frame(shutdown_retry_milliseconds)
                return
            else:
                yield heartbeat_frame
    finally:
        on_end()


__all__ = [
    "EventStreamSettings",
    "close_reason_client_gone",
    "envelope_header",
    "event_stream_frames",
    "exclude_of",
    "exclude_prefix_characters_max",
    "exclude_prefixes_max",
    "grace_milliseconds_floor",
    "grace_milliseconds_variable",
    "install_event_route",
    "last_event_id_of",
    "max_buffer_bytes_floor",
    "max_buffer_bytes_variable",
    "rewrite_unified",
    "shutdown_retry_milliseconds",
    "slow_policy_variable",
    "unified_envelope_value",
]
