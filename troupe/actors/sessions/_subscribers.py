"""One SSE connection's bounded write queue and the slow-consumer policies.

The session actor publishes every event to every live subscriber with ``offer`` (synchronous,
never blocking: one slow phone must not stall the actor or the other subscribers); the
connection's streaming task pulls with ``await next_chunk()`` and writes what it gets to the
socket.  Between the two sits a queue of whole frames whose bytes are counted exactly.

``max_buffer_bytes`` (the contract's ``maxSubscriberBufferBytes``, 2 MiB) bounds two things:

- the live backlog: when the bytes queued by ``offer`` exceed it, the connection is slow
  (one queued frame alone never is: a frame larger than the cap is simply delivered alone);
- each write: ``next_chunk`` joins queued frames up to that many bytes, so a large replay goes
  out in several writes with its frames' bytes and order unchanged (a single frame larger than
  the cap is delivered alone, whole: frames are never split).

The replay given to ``start`` is not counted against the live backlog: it is bounded by the
ring's own caps, and charging it would disconnect every client that reconnects after a busy
minute.  The pause grace still covers it.  Neither does the drop-oldest gap frame count.

A connection is paused while it is not waiting in ``next_chunk`` (it is writing the last
chunk, or has not come back for the next one); paused longer than ``grace_seconds`` (10 s)
is slow too.  ``offer`` checks both conditions and the actor may call ``check_pause`` from a
timer so that a paused connection is found even when no event is published.  Time comes from
the ``clock`` callable (the Env's monotonic clock), never from the wall.

Policies for a slow connection:

- ``disconnect`` (the default): the subscriber is closed with reason ``slow_consumer``; its
  queue is discarded, ``next_chunk`` raises ``SubscriberClosed`` and ``offer`` returns False
  so the actor drops it.  The client reconnects with ``Last-Event-ID`` (L1).
- ``drop-oldest``: the connection is kept; its oldest queued frames are dropped (on overflow,
  until the live backlog fits again; on a pause, all of them) and one in-band gap frame
  ``requestedAfterSeq: -1`` (no ``oldestRetainedSeq``, no ``reason``) stands where they were,
  carrying ``droppedEvents``: this connection's cumulative dropped frames.  Frames already
  handed to the connection are never taken back, and consecutive drops merge into one gap.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from ._frames import gap_frame
from ._ring import is_excluded

max_subscriber_buffer_bytes_default = 2 * 1024 * 1024
"""The contract's ``maxSubscriberBufferBytes``: the live backlog cap and the per-write cap."""

slow_subscriber_grace_seconds_default = 10.0
"""The contract's ``slowSubscriberGraceMs`` (10 s), in seconds."""

slow_policy_disconnect = "disconnect"
slow_policy_drop_oldest = "drop-oldest"
slow_policies: frozenset[str] = frozenset({slow_policy_disconnect, slow_policy_drop_oldest})
slow_policy_default = slow_policy_disconnect

close_reason_slow_consumer = "slow_consumer"
close_reason_shutdown = "shutdown"

assert max_subscriber_buffer_bytes_default >= 1
assert slow_subscriber_grace_seconds_default > 0
assert slow_policy_default in slow_policies


class SubscriberClosed(Exception):
    """``next_chunk`` on a closed subscriber; ``reason`` says why (``slow_consumer``, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SubscriberStatistics:
    queued_frames: int
    queued_bytes: int
    live_bytes: int
    dropped_frames: int
    chunks_delivered: int
    closed_reason: str | None


def _kernel_frame_type(frame: bytes) -> str | None:
    """The ``type`` of a kernel frame's event; None for frames with an ``event:`` line."""
    if not frame.startswith(b"id: "):
        return None
    _, _, data = frame.partition(b"\ndata: ")
    event_type = json.loads(data).get("type")
    return event_type if isinstance(event_type, str) else None


def _is_event_frame(frame: bytes) -> bool:
    """True for frames with an ``id:`` line (events of the log, counted when dropped)."""
    head = frame.split(b"\ndata: ", 1)[0]
    return head.startswith(b"id: ") or b"\nid: " in head


class Subscriber:
    """One connection's queue between the session actor (``offer``) and its writer task."""

    def __init__(
        self,
        session_id: str,
        *,
        clock: Callable[[], float],
        exclude_prefixes: Sequence[str] = (),
        policy: str = slow_policy_default,
        max_buffer_bytes: int = max_subscriber_buffer_bytes_default,
        grace_seconds: float = slow_subscriber_grace_seconds_default,
        frame_transform: Callable[[bytes], bytes] | None = None,
    ) -> None:
        assert policy in slow_policies, f"unknown slow-consumer policy {policy!r}"
        assert max_buffer_bytes >= 1 and grace_seconds > 0
        self.session_id = session_id
        self.exclude_prefixes = tuple(exclude_prefixes)
        self.policy = policy
        self.max_buffer_bytes = max_buffer_bytes
        self.grace_seconds = grace_seconds
        self.closed_reason: str | None = None
        self.dropped_frames = 0
        """Frames this connection lost to drop-oldest (cumulative; the gap's droppedEvents)."""
        self._frame_transform = frame_transform
        """Applied to every frame as it is queued (``unified_frame`` for a negotiated
        ``unified-v1`` connection), so the caps count the bytes that are really written."""
        self._clock = clock
        self._queue: deque[bytes] = deque()
        """Frame bytes only, no object per frame: a published event is queued once per
        subscriber, and the garbage collector, which tracks such objects (bytes it does not),
        took a large share of the server's CPU in bench/sessions_sse.py's fan-out.  The queue
        is the opening frames (``start``'s, or the drop-oldest gap) followed by the live frames
        of ``offer``; ``_opening_frames`` counts the former."""
        self._opening_frames = 0
        self._gap_at_head = False
        """The first queued frame is the drop-oldest gap frame this queue made itself."""
        self._queued_bytes = 0
        self._live_bytes = 0
        self._live_frames = 0
        self._waiting = False
        self._progress_at = clock()
        self._chunks_delivered = 0
        self._wakeup = trio.Event()

    # ---- the actor's side -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    @property
    def queued_bytes(self) -> int:
        """Exact bytes of all frames queued and not yet handed to the connection."""
        return self._queued_bytes

    @property
    def live_bytes(self) -> int:
        """Queued bytes that came from ``offer`` (the part bounded by ``max_buffer_bytes``)."""
        return self._live_bytes

    def statistics(self) -> SubscriberStatistics:
        return SubscriberStatistics(
            queued_frames=len(self._queue),
            queued_bytes=self._queued_bytes,
            live_bytes=self.live_bytes,
            dropped_frames=self.dropped_frames,
            chunks_delivered=self._chunks_delivered,
            closed_reason=self.closed_reason,
        )

    def wants(self, event_type: str) -> bool:
        """False for kernel events this connection excluded with ``?exclude=``."""
        return not (self.exclude_prefixes and is_excluded(event_type, self.exclude_prefixes))

    def start(self, frames: Iterable[bytes]) -> None:
        """Queue the opening frames (``retry:``, a replay's gap and frames) outside the live
        cap; call once, before the first ``offer``, in the same actor turn as the replay."""
        # Opening frames head the queue.  Should ``start`` come after live frames were queued
        # (a Subscribe retried against a restarted actor), its frames are counted as live.
        live = self._live_frames > 0
        for frame in frames:
            self._push(frame, live=live)
        self._wake()

    def offer(self, frame: bytes, event_type: str | None = None) -> bool:
        """Queue one published frame; never blocks.

        The connection's exclude filter applies to kernel frames (a filtered frame is not
        queued and the call returns True); pass ``event_type`` to spare reading it from the
        frame.  Returns False when the subscriber is closed, before
        or because of this frame: the actor then forgets it.
        """
        if self.closed:
            return False
        if self.exclude_prefixes:
            if event_type is None:
                event_type = _kernel_frame_type(frame)
            if event_type is not None and not self.wants(event_type):
                return True
        self._push(frame, live=True)
        if self._overflowing():
            self._on_slow(overflow=True)
        elif self._paused_too_long():
            self._on_slow(overflow=False)
        self._wake()
        return not self.closed

    def check_pause(self) -> bool:
        """Apply the policy if the connection has been paused too long; False when closed."""
        if self.closed:
            return False
        if self._paused_too_long():
            self._on_slow(overflow=False)
            self._wake()
        return not self.closed

    def close(self, reason: str) -> None:
        """End the subscription (slow consumer, shutdown, session ended): the queue is
        discarded and the writer's ``next_chunk`` raises ``SubscriberClosed(reason)``; at
        shutdown the HTTP layer then writes a long ``retry:`` frame and ends the response."""
        if self.closed:
            return
        self.closed_reason = reason
        self._queue.clear()
        self._opening_frames = 0
        self._gap_at_head = False
        self._queued_bytes = 0
        self._live_bytes = 0
        self._live_frames = 0
        self._wake()

    # ---- the connection's side ------------------------------------------------------------

    async def next_chunk(self) -> bytes:
        """Wait for queued frames and take up to ``max_buffer_bytes`` of them as one write.

        Calling it again means the previous chunk was written (the connection made progress).
        Cancellation-safe: nothing is taken off the queue until the wait is over.  Raises
        ``SubscriberClosed`` once the subscriber is closed.
        """
        self._waiting = True
        self._progress_at = self._clock()
        try:
            while not self._queue and not self.closed:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
        finally:
            # Leaving the wait (a chunk, a heartbeat timeout, a cancel) starts the pause clock.
            self._waiting = False
            self._progress_at = self._clock()
        if self.closed:
            raise SubscriberClosed(self.closed_reason or "closed")
        chunk = self._take_chunk()
        self._chunks_delivered += 1
        return chunk

    def next_chunk_nowait(self) -> bytes | None:
        """The next chunk if frames are queued, else None (for tests and drivers)."""
        if self.closed:
            raise SubscriberClosed(self.closed_reason or "closed")
        if not self._queue:
            return None
        chunk = self._take_chunk()
        self._progress_at = self._clock()
        self._chunks_delivered += 1
        return chunk

    # ---- internals ---------------------------------------------------------------------

    def _push(self, frame: bytes, *, live: bool) -> None:
        if self._frame_transform is not None:
            frame = self._frame_transform(frame)
        self._queue.append(frame)
        self._queued_bytes += len(frame)
        if live:
            self._live_bytes += len(frame)
            self._live_frames += 1
        else:
            assert self._live_frames == 0, "opening frames precede live ones"
            self._opening_frames += 1

    def _pop(self) -> bytes:
        frame = self._queue.popleft()
        self._queued_bytes -= len(frame)
        if self._opening_frames:
            self._opening_frames -= 1
            self._gap_at_head = False
        else:
            self._live_bytes -= len(frame)
            self._live_frames -= 1
        return frame

    def _overflowing(self) -> bool:
        # One live frame alone never overflows: a frame larger than the cap is delivered alone.
        return self._live_bytes > self.max_buffer_bytes and self._live_frames > 1

    def _take_chunk(self) -> bytes:
        # At least one frame, whole; then more while the chunk stays within the cap.
        parts = [self._pop()]
        size = len(parts[0])
        while self._queue and size + len(self._queue[0]) <= self.max_buffer_bytes:
            frame = self._pop()
            parts.append(frame)
            size += len(frame)
        return b"".join(parts)

    def _wake(self) -> None:
        self._wakeup.set()

    def _paused_too_long(self) -> bool:
        return not self._waiting and self._clock() - self._progress_at > self.grace_seconds

    def _on_slow(self, *, overflow: bool) -> None:
        if self.policy == slow_policy_disconnect:
            self.close(close_reason_slow_consumer)
            return
        self._drop_oldest(overflow=overflow)
        if not overflow:
            # A new grace period: the drop itself is the remedy for this pause.
            self._progress_at = self._clock()

    def _drop_oldest(self, *, overflow: bool) -> None:
        """Drop oldest non-gap frames (all of them on a pause) and put one gap in front."""
        kept_gap = self._gap_at_head
        if kept_gap:
            self._pop()
        dropped = 0
        while self._queue and (not overflow or self._overflowing()):
            if _is_event_frame(self._pop()):
                dropped += 1
        if dropped == 0 and not kept_gap:
            return
        self.dropped_frames += dropped
        gap = gap_frame(self.session_id, -1, None, self.dropped_frames, None)
        if self._frame_transform is not None:
            gap = self._frame_transform(gap)
        # Every opening frame was dropped before any live one, so the gap heads the opening part.
        self._queue.appendleft(gap)
        self._queued_bytes += len(gap)
        self._opening_frames += 1
        self._gap_at_head = True


__all__ = [
    "Subscriber",
    "SubscriberClosed",
    "SubscriberStatistics",
    "close_reason_shutdown",
    "close_reason_slow_consumer",
    "max_subscriber_buffer_bytes_default",
    "slow_policies",
    "slow_policy_default",
    "slow_policy_disconnect",
    "slow_policy_drop_oldest",
    "slow_subscriber_grace_seconds_default",
]
