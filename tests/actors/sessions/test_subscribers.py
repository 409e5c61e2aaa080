"""Subscriber: exact byte counting, split writes, and both slow-consumer policies."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from troupe.actors.sessions._frames import (
    control_frame,
    gap_frame,
    kernel_frame,
    retry_frame,
    unified_frame,
)
from troupe.actors.sessions._subscribers import (
    Subscriber,
    SubscriberClosed,
    max_subscriber_buffer_bytes_default,
    slow_subscriber_grace_seconds_default,
)

mebibyte = 1024 * 1024


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame(seq: int, text_bytes: int = 10, event_type: str = "msg.text.delta") -> bytes:
    event = {"type": event_type, "sessionId": "s_1", "seq": seq, "v": 1, "text": "x" * text_bytes}
    if event_type.startswith("server."):
        return control_frame(event)
    return kernel_frame(event)


def frame_of_size(seq: int, size: int) -> bytes:
    base = len(frame(seq, 0))
    result = frame(seq, size - base)
    assert len(result) == size
    return result


def subscriber(clock: FakeClock, **options) -> Subscriber:
    return Subscriber("s_1", clock=clock, **options)


def drain(sub: Subscriber) -> list[bytes]:
    chunks = []
    while (chunk := sub.next_chunk_nowait()) is not None:
        chunks.append(chunk)
    return chunks


def gap_data(chunk: bytes) -> dict:
    assert chunk.startswith(b"event: server.replay.gap\ndata: ")
    return json.loads(chunk.split(b"\n\n")[0].split(b"\ndata: ")[1])


def test_contract_defaults() -> None:
    assert max_subscriber_buffer_bytes_default == 2 * mebibyte
    assert slow_subscriber_grace_seconds_default == 10.0


async def test_five_mebibyte_replay_is_split_into_capped_writes() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    frames = [retry_frame()] + [frame(seq, 52_000 + seq * 37) for seq in range(1, 101)]
    total = sum(len(item) for item in frames)
    assert total > 5 * mebibyte
    sub.start(frames)
    assert sub.queued_bytes == total and sub.live_bytes == 0
    chunks = []
    while sub.queued_bytes:
        chunks.append(await sub.next_chunk())
    assert len(chunks) == 3
    assert all(len(chunk) <= 2 * mebibyte for chunk in chunks)
    assert b"".join(chunks) == b"".join(frames)
    # Chunks end on frame boundaries: frames are never cut.
    boundaries = set()
    offset = 0
    for item in frames:
        offset += len(item)
        boundaries.add(offset)
    offset = 0
    for chunk in chunks:
        offset += len(chunk)
        assert offset in boundaries
    assert sub.statistics().chunks_delivered == 3


def test_a_frame_larger_than_the_cap_is_delivered_alone() -> None:
    clock = FakeClock()
    sub = subscriber(clock, max_buffer_bytes=1000)
    small, large = frame(1), frame_of_size(2, 5000)
    sub.start([small])
    assert sub.offer(large)  # one live frame alone never overflows
    assert drain(sub) == [small, large]
    assert sub.offer(frame(3))
    assert not sub.offer(large)  # two live frames over the cap do overflow


def test_queued_bytes_are_exact() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    sub.start([retry_frame()])
    sub.offer(frame(1))
    sub.offer(frame(2, 300))
    assert sub.queued_bytes == len(retry_frame()) + len(frame(1)) + len(frame(2, 300))
    assert sub.live_bytes == len(frame(1)) + len(frame(2, 300))
    drain(sub)
    assert sub.queued_bytes == 0 and sub.live_bytes == 0


def test_disconnect_at_and_just_over_the_byte_cap() -> None:
    clock = FakeClock()
    at_cap = subscriber(clock, max_buffer_bytes=300)
    assert at_cap.offer(frame_of_size(1, 150))
    assert at_cap.offer(frame_of_size(2, 150))  # exactly at the cap: kept
    assert at_cap.live_bytes == 300 and not at_cap.closed

    sub = subscriber(clock, max_buffer_bytes=299)
    assert sub.offer(frame_of_size(1, 150))
    assert not sub.offer(frame_of_size(2, 150))  # one byte over: closed
    assert sub.closed_reason == "slow_consumer"
    assert sub.queued_bytes == 0
    assert not sub.offer(frame(4))
    with pytest.raises(SubscriberClosed) as caught:
        sub.next_chunk_nowait()
    assert caught.value.reason == "slow_consumer"


def test_replay_bytes_do_not_count_against_the_live_cap() -> None:
    clock = FakeClock()
    sub = subscriber(clock, max_buffer_bytes=300)
    sub.start([frame_of_size(seq, 200) for seq in range(1, 6)])
    assert sub.offer(frame_of_size(6, 150))
    assert sub.offer(frame_of_size(7, 150))
    assert sub.live_bytes == 300 and not sub.closed


def test_drop_oldest_on_overflow_puts_one_gap_in_front() -> None:
    clock = FakeClock()
    sub = subscriber(clock, max_buffer_bytes=300, policy="drop-oldest")
    frames = [frame_of_size(seq, 100) for seq in range(1, 5)]
    for item in frames[:3]:
        assert sub.offer(item)
    assert sub.offer(frames[3])  # 400 > 300: drop the oldest one
    assert not sub.closed
    assert sub.live_bytes == 300 and sub.dropped_frames == 1
    chunks = drain(sub)
    body = b"".join(chunks)
    gap = gap_frame("s_1", -1, None, 1, None)
    assert body == gap + frames[1] + frames[2] + frames[3]
    assert gap_data(body) == {
        "type": "server.replay.gap",
        "sessionId": "s_1",
        "requestedAfterSeq": -1,
        "droppedEvents": 1,
    }


def test_drop_oldest_merges_consecutive_drops_into_one_gap() -> None:
    clock = FakeClock()
    sub = subscriber(clock, max_buffer_bytes=200, policy="drop-oldest")
    for seq in range(1, 7):
        assert sub.offer(frame_of_size(seq, 100))
    body = b"".join(drain(sub))
    assert body == gap_frame("s_1", -1, None, 4, None) + frame_of_size(5, 100) + frame_of_size(
        6, 100
    )
    # After the client caught up, a new drop gets a new gap with the cumulative count.
    for seq in range(7, 10):
        sub.offer(frame_of_size(seq, 100))
    assert gap_data(drain(sub)[0])["droppedEvents"] == 5


def test_disconnect_after_the_pause_grace() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    assert sub.offer(frame(1))
    clock.now += 10.0  # exactly the grace: still fine
    assert sub.offer(frame(2))
    assert sub.check_pause()
    clock.now += 0.001
    assert not sub.offer(frame(3))
    assert sub.closed_reason == "slow_consumer"


def test_check_pause_finds_a_paused_connection_without_new_events() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    sub.offer(frame(1))
    clock.now += 10.5
    assert not sub.check_pause()
    assert sub.closed


def test_taking_chunks_is_progress() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    for seq in range(1, 30):
        clock.now += 4.0
        assert sub.offer(frame(seq))
        assert sub.next_chunk_nowait() == frame(seq)
    assert not sub.closed


def test_drop_oldest_after_the_pause_grace_drops_the_queue() -> None:
    clock = FakeClock()
    sub = subscriber(clock, policy="drop-oldest")
    sub.start([retry_frame()])
    sub.offer(frame(1))
    sub.offer(frame(2))
    clock.now += 10.5
    assert sub.offer(frame(3))  # pause detected: everything queued so far is dropped
    assert sub.dropped_frames == 3  # the retry frame is not an event
    body = b"".join(drain(sub))
    assert body == gap_frame("s_1", -1, None, 3, None)
    # A new grace period started with the drop.
    clock.now += 5.0
    assert sub.offer(frame(4))
    assert drain(sub) == [frame(4)]


async def test_a_waiting_connection_is_never_paused() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    received = []

    async def reader() -> None:
        received.append(await sub.next_chunk())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        clock.now += 60.0
        assert sub.check_pause()
        assert sub.offer(frame(1))
    assert received == [frame(1)]


async def test_a_heartbeat_timeout_does_not_count_as_pause() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    async with trio.open_nursery() as nursery:
        heartbeat_wait = trio.CancelScope()

        async def writer() -> None:
            with heartbeat_wait:
                await sub.next_chunk()

        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        clock.now += 15.0  # 15 s of silence: the HTTP layer stops waiting to write ": hb"
        heartbeat_wait.cancel()
    assert sub.offer(frame(1))
    assert await sub.next_chunk() == frame(1)


async def test_close_wakes_the_writer() -> None:
    clock = FakeClock()
    sub = subscriber(clock)
    sub.offer(frame(1))
    assert await sub.next_chunk() == frame(1)
    reasons = []

    async def writer() -> None:
        try:
            await sub.next_chunk()
        except SubscriberClosed as closed:
            reasons.append(closed.reason)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        sub.close("shutdown")
    assert reasons == ["shutdown"]
    assert not sub.offer(frame(2))


def test_exclude_applies_to_live_kernel_frames_only() -> None:
    clock = FakeClock()
    sub = subscriber(clock, exclude_prefixes=("hook",))
    assert sub.offer(frame(1, event_type="hook.fired"))  # read from the frame
    assert sub.offer(frame(2), "msg.text.delta")
    assert sub.offer(frame(3, event_type="hook.done"), "hook.done")
    assert sub.offer(frame(4, event_type="server.tool.request"))
    assert b"".join(drain(sub)) == frame(2) + frame(4, event_type="server.tool.request")


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(AssertionError):
        subscriber(FakeClock(), policy="drop-newest")


def test_frame_transform_is_applied_before_counting() -> None:
    clock = FakeClock()
    sub = subscriber(clock, frame_transform=unified_frame, policy="drop-oldest")
    sub.start([retry_frame(), frame(1)])
    sub.offer(frame(2))
    expected = [retry_frame(), unified_frame(frame(1)), unified_frame(frame(2))]
    assert sub.queued_bytes == sum(len(item) for item in expected)
    assert b"".join(drain(sub)) == b"".join(expected)
    sub.offer(frame(3))
    clock.now += 11.0
    sub.check_pause()
    gap = drain(sub)[0]
    assert gap == unified_frame(gap_frame("s_1", -1, None, 1, None))


def test_package_exports_the_streams_names() -> None:
    import troupe.actors.sessions as sessions

    for name in (
        "EventRing",
        "Replay",
        "Subscriber",
        "SubscriberClosed",
        "kernel_frame",
        "control_frame",
        "gap_frame",
        "retry_frame",
        "heartbeat_frame",
        "unified_frame",
        "parse_exclude",
        "slow_policy_drop_oldest",
    ):
        assert name in sessions.__all__ and hasattr(sessions, name)
