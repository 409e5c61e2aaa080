"""The bytes of the sessions event stream: kernel, control, gap, retry and heartbeat frames.

A session's events are encoded to SSE frames exactly once, when they are published; the ring
buffer, every subscriber's write queue and every replay hold those same bytes.  That is why
this module is the single place that knows the frame shapes (the contract's "SSE 帧形"):

- kernel event: ``id: <seq>`` + ``data: <json>``, no ``event:`` line (clients listen on the
  single ``message`` handler and switch on ``type``);
- control event (the seven ``server.*`` types): ``event: <type>`` + ``id: <seq>`` + ``data``;
  control frames carry ids and live in the ring, because a business round-trip cut by a
  disconnect must be seen again on replay;
- gap frame: ``event: server.replay.gap`` + ``data``, never an id (it is not an event of the
  log and must not move the client's ``Last-Event-ID``);
- ``retry: <ms>`` first, and the ``: hb`` comment every 15 s.

JSON is compact (``separators=(",", ":")``) and keeps non-ASCII text as UTF-8
(``ensure_ascii=False``): Chinese text costs 3 bytes a character instead of 6-12, and the
frame bytes are deterministic for a given event dict.  ``json.dumps`` escapes CR and LF inside
strings, so a data payload is always exactly one line.

``unified_frame`` is the negotiated ``tansr-event-envelope: unified-v1`` view on ``/api``: it
rewrites only the ``data:`` line into the 7-key envelope and leaves every other line (``id:``,
``event:``) byte for byte, so cursors and event names do not change with the envelope.
"""

from __future__ import annotations

import json
from typing import Any

retry_milliseconds_default = 3000
"""The first frame of every stream: the client's reconnect delay."""

heartbeat_interval_seconds = 15.0
"""A ``: hb`` comment frame after this much silence on a stream."""

heartbeat_frame = b": hb\n\n"

assert retry_milliseconds_default > 0
assert heartbeat_interval_seconds > 0

# The seven control event types (source "server"); they carry ids and are kept in the ring.
server_tool_request = "server.tool.request"
server_tool_cancel = "server.tool.cancel"
server_permission_request = "server.permission.request"
server_permission_closed = "server.permission.closed"
server_question_request = "server.question.request"
server_question_closed = "server.question.closed"
server_platform_warning = "server.platform.warning"

control_event_types: frozenset[str] = frozenset(
    {
        server_tool_request,
        server_tool_cancel,
        server_permission_request,
        server_permission_closed,
        server_question_request,
        server_question_closed,
        server_platform_warning,
    }
)

server_replay_gap = "server.replay.gap"
"""The gap frame's event name and ``type``; not an event of the log (no id, no seq)."""

gap_reason_evicted = "evicted"
"""The cursor is older than the ring's oldest retained event or the epoch's start."""
gap_reason_ahead_of_log = "ahead_of_log"
"""The cursor is at or beyond the next seq: forged, out of range, or a restart without store."""
gap_reasons: frozenset[str] = frozenset({gap_reason_evicted, gap_reason_ahead_of_log})

unified_contract = "unified-v1"
unified_domain = "sessions"
"""``domain`` of every unified envelope on this surface: the contract family the event belongs to
(the same word as the ``/api/sessions`` prefix and the unified error's ``domainCode`` layer)."""

unified_terminal_statuses: dict[str, str] = {
    "turn.completed": "completed",
    "turn.aborted": "aborted",
    "turn.error": "failed",
    "session.ended": "ended",
}
"""``terminalStatus`` by event type: the events after which the turn (or session) is over;
every other event, control frame and gap frame has ``terminalStatus: null``."""


def is_control_type(event_type: str) -> bool:
    """True for the seven ``server.*`` control types (never filtered by ``exclude``)."""
    return event_type in control_event_types


def encode_json(value: Any) -> str:
    """Compact JSON with non-ASCII text kept as is: the one encoding of the stream."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def kernel_frame(event: dict[str, Any]) -> bytes:
    """``id: <seq>\\ndata: <json>\\n\\n`` for a kernel event (no ``event:`` line)."""
    seq = event["seq"]
    assert isinstance(seq, int) and not isinstance(seq, bool), "seq is an integer"
    assert not is_control_type(event["type"]), "control events use control_frame"
    return f"id: {seq}\ndata: {encode_json(event)}\n\n".encode()


def control_frame(event: dict[str, Any]) -> bytes:
    """``event: <type>\\nid: <seq>\\ndata: <json>\\n\\n`` for one of the seven control types."""
    seq = event["seq"]
    event_type = event["type"]
    assert isinstance(seq, int) and not isinstance(seq, bool), "seq is an integer"
    assert is_control_type(event_type), f"not a control event type: {event_type!r}"
    return f"event: {event_type}\nid: {seq}\ndata: {encode_json(event)}\n\n".encode()


def event_frame(event: dict[str, Any]) -> bytes:
    """``control_frame`` for the seven control types, else ``kernel_frame``."""
    if is_control_type(event["type"]):
        return control_frame(event)
    return kernel_frame(event)


def gap_data(
    session_id: str,
    requested_after_seq: int,
    oldest_retained_seq: int | None,
    dropped_events: int,
    reason: str | None,
) -> dict[str, Any]:
    """The gap notice ``{type, sessionId, requestedAfterSeq, oldestRetainedSeq?,
    droppedEvents, reason?}``; absent optional keys are left out, never null."""
    assert dropped_events >= 0
    assert reason is None or reason in gap_reasons, f"unknown gap reason {reason!r}"
    data: dict[str, Any] = {
        "type": server_replay_gap,
        "sessionId": session_id,
        "requestedAfterSeq": requested_after_seq,
    }
    if oldest_retained_seq is not None:
        data["oldestRetainedSeq"] = oldest_retained_seq
    data["droppedEvents"] = dropped_events
    if reason is not None:
        data["reason"] = reason
    return data


def gap_frame(
    session_id: str,
    requested_after_seq: int,
    oldest_retained_seq: int | None,
    dropped_events: int,
    reason: str | None,
) -> bytes:
    """``event: server.replay.gap\\ndata: <json>\\n\\n``: no id line.

    ``dropped_events`` is the cumulative eviction count of the buffer the gap is about (the
    ring, or one connection's write queue for the drop-oldest policy), not the size of this
    hole; the hole is ``oldestRetainedSeq - requestedAfterSeq - 1`` when both are known.
    """
    data = gap_data(session_id, requested_after_seq, oldest_retained_seq, dropped_events, reason)
    return f"event: {server_replay_gap}\ndata: {encode_json(data)}\n\n".encode()


def retry_frame(milliseconds: int = retry_milliseconds_default) -> bytes:
    """``retry: <ms>\\n\\n``: the first frame of a stream, and the long one at shutdown."""
    assert milliseconds >= 0
    return f"retry: {int(milliseconds)}\n\n".encode()


def unified_envelope(event_id: str | None, raw: dict[str, Any]) -> dict[str, Any]:
    """The 7-key ``unified-v1`` envelope around one raw event (or gap notice).

    - ``eventId``: the frame's ``id:`` text (the seq as a string), ``null`` for gap frames;
    - ``domain``: ``"sessions"``;
    - ``type``: the raw event's ``type``;
    - ``cursorSet``: what a client stores to resume, ``{"sessionId", "lastEventId"}`` (send
      ``lastEventId`` as ``Last-Event-ID`` on that session's stream); ``null`` for gap frames,
      which must not move a cursor;
    - ``terminalStatus``: ``completed`` / ``aborted`` / ``failed`` / ``ended`` for
      ``turn.completed`` / ``turn.aborted`` / ``turn.error`` / ``session.ended``, else ``null``;
    - ``raw``: the event object exactly as ``/v2`` sends it.
    """
    event_type = raw.get("type")
    cursor_set = None
    if event_id is not None:
        cursor_set = {"sessionId": raw.get("sessionId"), "lastEventId": event_id}
    return {
        "contract": unified_contract,
        "eventId": event_id,
        "domain": unified_domain,
        "type": event_type,
        "cursorSet": cursor_set,
        "terminalStatus": unified_terminal_statuses.get(event_type) if event_type else None,
        "raw": raw,
    }


def unified_frame(frame: bytes) -> bytes:
    """The same frame with its ``data:`` line rewritten into the unified-v1 envelope.

    Frames without a ``data:`` line (``retry:``, ``: hb``) come back unchanged.  Only one frame
    per call: the caller rewrites frames before they are queued, not chunks of a queue.
    """
    assert frame.endswith(b"\n\n") and frame.count(b"\n\n") == 1, "exactly one frame"
    lines = frame[:-2].split(b"\n")
    event_id: str | None = None
    data_index: int | None = None
    for index, line in enumerate(lines):
        if line.startswith(b"id: "):
            event_id = line[4:].decode()
        elif line.startswith(b"data: "):
            assert data_index is None, "our frames have one data line"
            data_index = index
    if data_index is None:
        return frame
    raw = json.loads(lines[data_index][6:])
    envelope = unified_envelope(event_id, raw)
    lines[data_index] = b"data: " + encode_json(envelope).encode()
    return b"\n".join(lines) + b"\n\n"


__all__ = [
    "control_event_types",
    "control_frame",
    "encode_json",
    "event_frame",
    "gap_data",
    "gap_frame",
    "gap_reason_ahead_of_log",
    "gap_reason_evicted",
    "gap_reasons",
    "heartbeat_frame",
    "heartbeat_interval_seconds",
    "is_control_type",
    "kernel_frame",
    "retry_frame",
    "retry_milliseconds_default",
    "server_permission_closed",
    "server_permission_request",
    "server_platform_warning",
    "server_question_closed",
    "server_question_request",
    "server_replay_gap",
    "server_tool_cancel",
    "server_tool_request",
    "unified_contract",
    "unified_domain",
    "unified_envelope",
    "unified_frame",
    "unified_terminal_statuses",
]
