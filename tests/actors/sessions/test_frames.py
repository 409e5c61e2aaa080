"""Frame bytes of the sessions event stream, exactly as the wire carries them."""

from __future__ import annotations

import json

import pytest

from troupe.actors.sessions import _frames
from troupe.actors.sessions._frames import (
    control_event_types,
    control_frame,
    event_frame,
    gap_frame,
    heartbeat_frame,
    kernel_frame,
    retry_frame,
    unified_frame,
)


def kernel_event(seq: int = 7, **payload) -> dict:
    return {
        "type": "msg.text.delta",
        "sessionId": "s_1",
        "turnId": "t_1",
        "seq": seq,
        "ts": 1_700_000_000_123,
        "v": 1,
        "source": "kernel",
        **payload,
    }


def test_kernel_frame_bytes_exact() -> None:
    frame = kernel_frame(kernel_event(text="你好\nworld"))
    assert frame == (
        b"id: 7\n"
        b'data: {"type":"msg.text.delta","sessionId":"s_1","turnId":"t_1","seq":7,'
        b'"ts":1700000000123,"v":1,"source":"kernel","text":"' + "你好".encode() + b'\\nworld"}\n\n'
    )


def test_control_frame_bytes_exact() -> None:
    event = {
        "type": "server.tool.request",
        "sessionId": "s_1",
        "seq": 9,
        "ts": 5,
        "v": 1,
        "source": "server",
        "callId": "c_1",
    }
    assert control_frame(event) == (
        b"event: server.tool.request\nid: 9\n"
        b'data: {"type":"server.tool.request","sessionId":"s_1","seq":9,"ts":5,"v":1,'
        b'"source":"server","callId":"c_1"}\n\n'
    )
    assert event_frame(event) == control_frame(event)
    assert event_frame(kernel_event()) == kernel_frame(kernel_event())


def test_seven_control_types() -> None:
    assert control_event_types == {
        "server.tool.request",
        "server.tool.cancel",
        "server.permission.request",
        "server.permission.closed",
        "server.question.request",
        "server.question.closed",
        "server.platform.warning",
    }
    assert "server.replay.gap" not in control_event_types


def test_kernel_and_control_frames_refuse_each_others_types() -> None:
    with pytest.raises(AssertionError):
        kernel_frame(kernel_event(type="server.tool.cancel"))
    with pytest.raises(AssertionError):
        control_frame(kernel_event())


def test_gap_frame_bytes_exact_without_id() -> None:
    assert gap_frame("s_1", 3, 10, 12, "evicted") == (
        b"event: server.replay.gap\n"
        b'data: {"type":"server.replay.gap","sessionId":"s_1","requestedAfterSeq":3,'
        b'"oldestRetainedSeq":10,"droppedEvents":12,"reason":"evicted"}\n\n'
    )
    # Optional keys are absent, never null (the drop-oldest in-band gap).
    assert gap_frame("s_1", -1, None, 4, None) == (
        b"event: server.replay.gap\n"
        b'data: {"type":"server.replay.gap","sessionId":"s_1","requestedAfterSeq":-1,'
        b'"droppedEvents":4}\n\n'
    )
    assert b"\nid:" not in gap_frame("s_1", 50, None, 0, "ahead_of_log")
    with pytest.raises(AssertionError):
        gap_frame("s_1", 1, None, 0, "lost")


def test_retry_and_heartbeat_frames() -> None:
    assert retry_frame() == b"retry: 3000\n\n"
    assert retry_frame(60_000) == b"retry: 60000\n\n"
    assert heartbeat_frame == b": hb\n\n"
    assert _frames.heartbeat_interval_seconds == 15.0


def test_unified_frame_kernel_rewrites_only_the_data_line() -> None:
    frame = kernel_frame(kernel_event(seq=42, type="turn.completed"))
    rewritten = unified_frame(frame)
    lines = rewritten.split(b"\n")
    assert lines[0] == b"id: 42"
    assert rewritten.endswith(b"\n\n") and len(lines) == 4
    envelope = json.loads(lines[1].removeprefix(b"data: "))
    assert list(envelope) == [
        "contract",
        "eventId",
        "domain",
        "type",
        "cursorSet",
        "terminalStatus",
        "raw",
    ]
    assert envelope == {
        "contract": "unified-v1",
        "eventId": "42",
        "domain": "sessions",
        "type": "turn.completed",
        "cursorSet": {"sessionId": "s_1", "lastEventId": "42"},
        "terminalStatus": "completed",
        "raw": kernel_event(seq=42, type="turn.completed"),
    }
    # Compact JSON, UTF-8 kept.
    assert b'"contract":"unified-v1","eventId":"42"' in rewritten


def test_unified_frame_control_and_gap() -> None:
    event = {"type": "server.question.request", "sessionId": "s_1", "seq": 5, "source": "server"}
    rewritten = unified_frame(control_frame(event))
    assert rewritten.startswith(b"event: server.question.request\nid: 5\ndata: ")
    envelope = json.loads(rewritten.split(b"\n")[2].removeprefix(b"data: "))
    assert envelope["eventId"] == "5" and envelope["terminalStatus"] is None
    assert envelope["raw"] == event

    gap = unified_frame(gap_frame("s_1", 3, 10, 12, "evicted"))
    assert gap.startswith(b"event: server.replay.gap\ndata: ")
    envelope = json.loads(gap.split(b"\n")[1].removeprefix(b"data: "))
    assert envelope["eventId"] is None and envelope["cursorSet"] is None
    assert envelope["type"] == "server.replay.gap"
    assert envelope["raw"]["oldestRetainedSeq"] == 10


@pytest.mark.parametrize(
    ("event_type", "status"),
    [
        ("turn.completed", "completed"),
        ("turn.aborted", "aborted"),
        ("turn.error", "failed"),
        ("session.ended", "ended"),
        ("msg.text.delta", None),
    ],
)
def test_unified_terminal_status(event_type: str, status: str | None) -> None:
    rewritten = unified_frame(kernel_frame(kernel_event(type=event_type)))
    envelope = json.loads(rewritten.split(b"\n")[1].removeprefix(b"data: "))
    assert envelope["terminalStatus"] == status


def test_unified_frame_leaves_frames_without_data_alone() -> None:
    assert unified_frame(retry_frame()) == retry_frame()
    assert unified_frame(heartbeat_frame) == heartbeat_frame
