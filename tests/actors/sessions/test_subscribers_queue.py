"""Subscriber's queue of plain frame bytes: opening frames head it, live frames follow, and the
counts stay exact through replay, drop-oldest gaps and a late ``start`` (bench/sessions_sse.py
made the queue hold bytes instead of one object per frame)."""

from __future__ import annotations

import json

from tests.actors.sessions.test_subscribers import FakeClock, drain, frame_of_size, subscriber
from troupe.actors.sessions._frames import gap_frame, retry_frame
from troupe.actors.sessions._subscribers import slow_policy_drop_oldest


def _gap_data(chunk: bytes) -> dict:
    head, _, _ = chunk.partition(b"\n\n")
    assert head.startswith(b"event: server.replay.gap\n")
    return json.loads(head.split(b"data: ", 1)[1])


def test_overflow_drops_the_opening_frames_first_and_the_gap_heads_the_queue() -> None:
    sub = subscriber(FakeClock(), policy=slow_policy_drop_oldest, max_buffer_bytes=1000)
    replay = [frame_of_size(seq, 300) for seq in (1, 2)]
    sub.start([retry_frame(), *replay])
    assert sub.live_bytes == 0
    for seq in (3, 4, 5, 6):
        assert sub.offer(frame_of_size(seq, 300))
    # 1200 live bytes > 1000: the retry frame, both replayed frames and one live frame go.
    statistics = sub.statistics()
    assert statistics.dropped_frames == 3
    assert sub.live_bytes == 900
    gap = gap_frame("s_1", -1, None, 3, None)
    assert sub.queued_bytes == 900 + len(gap)
    chunks = b"".join(drain(sub))
    assert chunks.startswith(gap)
    assert _gap_data(chunks)["droppedEvents"] == 3
    assert chunks[len(gap):] == b"".join(frame_of_size(seq, 300) for seq in (4, 5, 6))
    assert sub.queued_bytes == 0 and sub.live_bytes == 0


def test_a_second_overflow_replaces_the_gap_at_the_head() -> None:
    sub = subscriber(FakeClock(), policy=slow_policy_drop_oldest, max_buffer_bytes=1000)
    sub.start([])
    for seq in range(1, 9):
        sub.offer(frame_of_size(seq, 300))
    gaps = [chunk for chunk in b"".join(drain(sub)).split(b"\n\n") if chunk.startswith(b"event: ")]
    assert len(gaps) == 1
    assert sub.statistics().dropped_frames == 5
    assert sub.queued_bytes == 0 and sub.live_bytes == 0


def test_a_late_start_counts_its_frames_as_live_and_keeps_the_order() -> None:
    sub = subscriber(FakeClock())
    sub.offer(frame_of_size(1, 200))
    sub.start([frame_of_size(2, 200)])
    assert sub.live_bytes == 400 and sub.queued_bytes == 400
    assert drain(sub) == [frame_of_size(1, 200) + frame_of_size(2, 200)]
    assert sub.live_bytes == 0 and sub.queued_bytes == 0
