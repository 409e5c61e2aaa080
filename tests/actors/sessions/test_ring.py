"""EventRing: replay boundaries, gaps, exclusion and the two caps."""

from __future__ import annotations

import json

import pytest

from troupe.actors.sessions._frames import control_frame, gap_frame, kernel_frame
from troupe.actors.sessions._ring import (
    EventRing,
    exclude_prefixes_max,
    is_excluded,
    parse_exclude,
    ring_events_max_default,
)


def event(seq: int, event_type: str = "msg.text.delta") -> dict:
    source = "server" if event_type.startswith("server.") else "kernel"
    return {"type": event_type, "sessionId": "s_1", "seq": seq, "ts": seq, "v": 1, "source": source}


def frame_of(seq: int, event_type: str = "msg.text.delta") -> bytes:
    if event_type.startswith("server."):
        return control_frame(event(seq, event_type))
    return kernel_frame(event(seq, event_type))


def filled(first: int, last: int, **ring_options) -> EventRing:
    ring = EventRing("s_1", epoch_start_seq=first, **ring_options)
    for seq in range(first, last + 1):
        ring.append(seq, "msg.text.delta", frame_of(seq))
    return ring


def gap_data(gap: bytes) -> dict:
    return json.loads(gap.split(b"\ndata: ")[1])


def test_default_size_is_the_contract_1024() -> None:
    assert ring_events_max_default == 1024
    ring = filled(1, 1025)
    assert len(ring) == 1024 and ring.oldest_seq == 2 and ring.dropped_events == 1
    ring = filled(1, 1024)
    assert len(ring) == 1024 and ring.oldest_seq == 1 and ring.dropped_events == 0


def test_everything_retained_for_none_and_minus_one() -> None:
    ring = filled(1, 5, events_max=3)
    expected = [frame_of(seq) for seq in (3, 4, 5)]
    for cursor in (None, -1):
        replay = ring.replay(cursor)
        assert replay.gap is None and replay.frames == expected


def test_exact_replay_at_the_boundaries() -> None:
    ring = filled(1, 10, events_max=5)  # retains 6..10
    assert ring.replay(5).gap is None  # oldest retained - 1: nothing missing
    assert ring.replay(5).frames == [frame_of(seq) for seq in range(6, 11)]
    assert ring.replay(8).frames == [frame_of(9), frame_of(10)]
    last = ring.replay(10)
    assert last.gap is None and last.frames == []


def test_gap_evicted_just_below_the_window() -> None:
    ring = filled(1, 10, events_max=5)  # retains 6..10, 5 evicted
    replay = ring.replay(4)
    assert gap_data(replay.gap) == {
        "type": "server.replay.gap",
        "sessionId": "s_1",
        "requestedAfterSeq": 4,
        "oldestRetainedSeq": 6,
        "droppedEvents": 5,
        "reason": "evicted",
    }
    assert replay.gap == gap_frame("s_1", 4, 6, 5, "evicted")
    assert replay.frames == [frame_of(seq) for seq in range(6, 11)]
    assert replay.all_frames() == [replay.gap, *replay.frames]


def test_gap_ahead_of_log_at_the_next_seq() -> None:
    ring = filled(1, 10)
    assert ring.replay(10).gap is None
    replay = ring.replay(11)
    assert gap_data(replay.gap)["reason"] == "ahead_of_log"
    assert gap_data(replay.gap)["requestedAfterSeq"] == 11
    assert replay.frames == []


def test_cursor_older_than_the_epoch_start_is_evicted() -> None:
    # Resumed at 500 (an unsealed epoch): a cursor from the old epoch gets a gap.
    ring = filled(500, 502)
    replay = ring.replay(120)
    data = gap_data(replay.gap)
    assert data["reason"] == "evicted" and data["oldestRetainedSeq"] == 500
    assert data["droppedEvents"] == 0
    assert replay.frames == [frame_of(seq) for seq in (500, 501, 502)]
    # The sealed watermark itself (epoch start - 1) is an exact, empty-prefixed replay.
    assert ring.replay(499).gap is None


def test_empty_epoch() -> None:
    ring = EventRing("s_1", epoch_start_seq=500)
    assert ring.replay(499).gap is None and ring.replay(499).frames == []
    assert ring.replay(None).frames == []
    evicted = gap_data(ring.replay(498).gap)
    assert evicted["reason"] == "evicted" and "oldestRetainedSeq" not in evicted
    assert gap_data(ring.replay(500).gap)["reason"] == "ahead_of_log"


def test_exclude_filters_kernel_types_by_prefix_and_keeps_seq() -> None:
    ring = EventRing("s_1")
    types = ["msg.text.delta", "hook.fired", "mcp.call", "server.tool.request", "hooks.other"]
    for seq, event_type in enumerate(types, start=1):
        ring.append(seq, event_type, frame_of(seq, event_type))
    replay = ring.replay(None, ("hook", "mcp"))
    assert replay.frames == [
        frame_of(1),
        frame_of(4, "server.tool.request"),
        frame_of(5, "hooks.other"),
    ]
    # A cursor on a filtered event still replays exactly (filtered events keep their seq).
    assert ring.replay(2, ("hook", "mcp")).gap is None
    assert ring.replay(2, ("hook", "mcp")).frames == replay.frames[1:]


def test_control_and_gap_frames_are_never_excluded() -> None:
    ring = EventRing("s_1", events_max=2)
    for seq in (1, 2, 3):
        ring.append(seq, "server.permission.request", frame_of(seq, "server.permission.request"))
    replay = ring.replay(0, ("server", "server.permission"))
    assert replay.gap is not None  # the gap is never filtered
    assert len(replay.frames) == 2
    assert not is_excluded("server.tool.cancel", ("server",))


def test_is_excluded_matches_whole_segments() -> None:
    assert is_excluded("hook", ("hook",))
    assert is_excluded("hook.started", ("hook",))
    assert is_excluded("hook.started", ("hook.",))
    assert not is_excluded("hooks.started", ("hook",))
    assert not is_excluded("msg.text.delta", ())


def test_parse_exclude() -> None:
    assert parse_exclude(None) == ()
    assert parse_exclude("") == ()
    assert parse_exclude(" hook, mcp.,,hook ") == ("hook", "mcp")
    many = ",".join(f"p{index}" for index in range(exclude_prefixes_max + 1))
    assert len(parse_exclude(many)) == exclude_prefixes_max


def test_byte_cap_evicts_oldest_at_and_over_the_boundary() -> None:
    frames = [frame_of(seq) for seq in (1, 2, 3)]
    cap = sum(len(frame) for frame in frames)
    at_cap = EventRing("s_1", bytes_max=cap)
    for seq, frame in enumerate(frames, start=1):
        at_cap.append(seq, "msg.text.delta", frame)
    assert len(at_cap) == 3 and at_cap.dropped_events == 0
    assert at_cap.statistics().bytes == cap

    over_cap = EventRing("s_1", bytes_max=cap - 1)
    for seq, frame in enumerate(frames, start=1):
        over_cap.append(seq, "msg.text.delta", frame)
    assert len(over_cap) == 2 and over_cap.dropped_events == 1 and over_cap.oldest_seq == 2
    assert over_cap.statistics().bytes == cap - len(frames[0])
    assert gap_data(over_cap.replay(0).gap)["droppedEvents"] == 1


def test_byte_cap_keeps_the_newest_frame_even_when_larger() -> None:
    ring = EventRing("s_1", bytes_max=10)
    ring.append(1, "msg.text.delta", frame_of(1))
    ring.append(2, "msg.text.delta", frame_of(2))
    assert len(ring) == 1 and ring.oldest_seq == 2 and ring.dropped_events == 1


def test_seq_must_increase() -> None:
    ring = filled(1, 3)
    with pytest.raises(AssertionError):
        ring.append(3, "msg.text.delta", frame_of(3))
    ring.append(7, "msg.text.delta", frame_of(7))  # jumps are allowed (epochs)
    assert ring.next_seq == 8 and ring.last_seq == 7
