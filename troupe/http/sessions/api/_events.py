"""``GET /api/sessions/:id/events`` in the negotiated unified event envelope.

Why not the /v2 stream's rewrite: the SDK validates every frame against its ``EventEnvelope``
schema and reduces the turn from it, so the envelope must be exactly its 7 keys in wire order,
``contract, eventId, domain, type, cursorSet, terminalStatus, raw``:

- ``eventId`` = the frame's ``id:`` (the seq as a decimal string), null for a gap frame;
- ``domain`` = ``session``; ``type`` = the raw event's ``type`` (an ``event:`` line, when a
  frame has one, equals it; ours have none);
- ``cursorSet`` = the five cursors ``eventCursor`` (= eventId, what ``Last-Event-ID`` resumes
  from), ``archiveCoverage``, ``outputWatermark``, ``materialConsumed``, ``ackReceipt`` (null:
  those belong to other domains);
- ``terminalStatus``: ``completed`` for ``turn.completed`` and ``session.ended``, ``aborted``
  for ``turn.aborted`` and for a ``turn.error`` that is not recoverable, else null (the SDK's
  ``TurnTracker`` reads exactly these pairs; a recoverable error does not end the turn);
- ``raw`` = the kernel or control event object exactly as /v2 sends it.

The stream itself is the /v2 machinery: a ``Subscriber`` handed to the session actor with
``Subscribe`` (replay then live in one actor turn, gap frames first), ``retry:`` first,
``: hb`` heartbeats, the shutdown ``retry:``; this module only rewrites frames and adds the
unified headers.  ``Last-Event-ID`` absent or -1 = everything retained.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from quart import Response, request

from troupe.actors.sessions import (
    Subscribe,
    Subscribed,
    Subscriber,
    Unsubscribe,
    session_kind_name,
)
from troupe.http.sessions._events import (
    EventStreamSettings,
    event_stream_frames,
    exclude_of,
    last_event_id_of,
)
from troupe.http.sessions._schemas import session_key
from troupe.runtime import ActorError

from ._transport import contract_name, header_event_envelope, session_domain, unified_headers

cursor_names = ("eventCursor", "archiveCoverage", "outputWatermark", "materialConsumed", "ackReceipt")
envelope_keys = ("contract", "eventId", "domain", "type", "cursorSet", "terminalStatus", "raw")
close_reason_client_gone = "client_gone"


def terminal_status(raw: dict[str, Any]) -> str | None:
    """The envelope's ``terminalStatus`` for one raw event (see the module docstring)."""
    kind = raw.get("type")
    if kind in ("turn.completed", "session.ended"):
        return "completed"
    if kind == "turn.aborted":
        return "aborted"
    if kind == "turn.error" and raw.get("recoverable") is False:
        return "aborted"
    return None


def event_envelope(event_id: str | None, raw: dict[str, Any]) -> dict[str, Any]:
    kind = raw.get("type")
    cursors: dict[str, Any] = dict.fromkeys(cursor_names)
    cursors["eventCursor"] = event_id
    return {
        "contract": contract_name,
        "eventId": event_id,
        "domain": session_domain,
        "type": kind if isinstance(kind, str) and kind else None,
        "cursorSet": cursors,
        "terminalStatus": terminal_status(raw),
        "raw": raw,
    }


def envelope_frame(frame: bytes) -> bytes:
    """One SSE frame with its ``data:`` line wrapped; frames without data pass unchanged."""
    lines = frame[:-2].split(b"\n")
    event_id: str | None = None
    data_index: int | None = None
    for index, line in enumerate(lines):
        if line.startswith(b"id: "):
            event_id = line[4:].decode()
        elif line.startswith(b"data: "):
            data_index = index
    if data_index is None:
        return frame
    raw = json.loads(lines[data_index][6:])
    envelope = event_envelope(event_id, raw)
    lines[data_index] = b"data: " + json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()
    return b"\n".join(lines) + b"\n\n"


def envelope_chunk(chunk: bytes) -> bytes:
    frames = chunk.split(b"\n\n")
    assert frames[-1] == b"", "chunks hold whole frames"
    return b"".join(envelope_frame(frame + b"\n\n") for frame in frames[:-1])


def install_api_event_route(app: Any, dependencies: Any, *, ask: Callable[..., Any],
                            admission: Callable[[], Any], rule: str) -> None:
    settings: EventStreamSettings = dependencies.events
    shutdown = dependencies.shutdown
    system = dependencies.system
    clock = dependencies.env.clock

    async def events(id: str) -> Response:  # noqa: A002 (the template's name)
        who = admission()
        key = session_key(id)
        last_event_id = last_event_id_of(request.headers.get("Last-Event-ID"))
        exclude = exclude_of(request.args.getlist("exclude"))
        negotiated = request.headers.get(header_event_envelope, "").strip().lower() == contract_name
        subscriber = Subscriber(
            key, clock=clock.monotonic, exclude_prefixes=exclude, policy=settings.slow_policy,
            max_buffer_bytes=settings.max_buffer_bytes, grace_seconds=settings.grace_seconds,
        )
        reply = await ask(session_kind_name, key, Subscribe(
            end_user_id=who.end_user_id, via="api", last_event_id=last_event_id, exclude=exclude,
            subscriber=subscriber))
        assert isinstance(reply, Subscribed), reply

        def unsubscribe() -> None:
            subscriber.close(close_reason_client_gone)
            try:
                system.ref(session_kind_name, key).tell(
                    Unsubscribe(end_user_id=who.end_user_id, via="api", subscriber=subscriber))
            except ActorError:
                pass  # closed locally: the actor drops it at its next offer anyway

        frames = event_stream_frames(subscriber, settings, shutdown,
                                     rewrite=envelope_chunk if negotiated else None, on_end=unsubscribe)
        response = Response(frames, status=200, content_type="text/event-stream; charset=utf-8")
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Accel-Buffering"] = "no"
        response.headers.update(unified_headers())
        if negotiated:
            response.headers[header_event_envelope] = contract_name
        response.timeout = None
        return response

    app.add_url_rule(rule, "api.session.events.observe", events, methods=["GET"])


__all__ = [
    "cursor_names",
    "envelope_chunk",
    "envelope_frame",
    "envelope_keys",
    "event_envelope",
    "install_api_event_route",
    "terminal_status",
]
