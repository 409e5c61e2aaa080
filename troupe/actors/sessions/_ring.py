"""The session's replay window: the last events of this epoch, as frame bytes.

Reconnecting clients send ``Last-Event-ID`` (level L1 of the contract's recovery chain) and
must get either an exact replay of what they missed or an explicit gap frame first, never a
silent hole and never a duplicate.  The ring keeps the already-encoded frames of kernel AND
control events (a tool or permission request cut by a disconnect must be seen again), bounded
twice: ``events_max`` (the contract's 1024) and ``bytes_max`` (the contract's optional byte
cap, so a burst of large tool outputs cannot hold unbounded memory).  The newest frame is
always kept, even when it alone is larger than ``bytes_max``: a reconnect must be able to see
the latest event.

The ring belongs to one session actor and starts empty with each epoch (a resume after a crash
or passivation).  ``epoch_start_seq`` is the first seq of the epoch; a cursor older than what
the ring can show (the oldest retained event, or the epoch start when nothing was evicted)
gets a gap ``evicted`` and then everything retained; a cursor at or past the next seq is
``ahead_of_log`` (forged, or the client saw a previous epoch's log that the store lost).

``exclude`` filters kernel events by type prefix for one connection; filtered events keep
their seq (the client's cursor simply skips them), and control and gap frames are never
filtered.  It is plain synchronous code: the actor calls it inside its turn, which is what
makes "replay, then register the subscriber" atomic with respect to new events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ._frames import gap_frame, gap_reason_ahead_of_log, gap_reason_evicted, is_control_type

ring_events_max_default = 1024
"""The contract's ring size, in events (kernel and control)."""

ring_bytes_max_default = 8 * 1024 * 1024
"""The byte cap on the frames a ring holds (the contract lets a deployment add one)."""

exclude_prefixes_max = 32
"""At most this many ``?exclude=`` prefixes are honoured for one connection."""

assert ring_events_max_default >= 1
assert ring_bytes_max_default >= 1


@dataclass(frozen=True)
class RingEntry:
    seq: int
    type: str
    frame: bytes


@dataclass(frozen=True)
class Replay:
    """What a (re)connecting subscriber is sent first: an optional gap frame, then frames."""

    gap: bytes | None
    frames: list[bytes]

    def all_frames(self) -> list[bytes]:
        """The gap frame (when present) followed by the replayed frames."""
        return ([self.gap] if self.gap is not None else []) + self.frames


@dataclass(frozen=True)
class RingStatistics:
    events: int
    bytes: int
    dropped_events: int
    oldest_seq: int | None
    next_seq: int
    epoch_start_seq: int


def parse_exclude(value: str | None) -> tuple[str, ...]:
    """``"hook,mcp"`` → ``("hook", "mcp")``: trimmed, empty parts and trailing dots dropped,
    duplicates removed, at most ``exclude_prefixes_max`` kept."""
    if not value:
        return ()
    prefixes: list[str] = []
    for part in value.split(","):
        prefix = part.strip().rstrip(".")
        if prefix and prefix not in prefixes:
            prefixes.append(prefix)
    return tuple(prefixes[:exclude_prefixes_max])


def is_excluded(event_type: str, exclude_prefixes: Iterable[str]) -> bool:
    """True when a KERNEL event of this type is filtered out by one of the prefixes.

    A prefix matches whole dot-separated segments: ``hook`` matches ``hook`` and ``hook.*``
    but not ``hooks.x``.  Control types are never excluded.
    """
    if is_control_type(event_type):
        return False
    for prefix in exclude_prefixes:
        prefix = prefix.rstrip(".")
        if prefix and (event_type == prefix or event_type.startswith(prefix + ".")):
            return True
    return False


class EventRing:
    """The last ``events_max`` / ``bytes_max`` frames of one session's current epoch."""

    def __init__(
        self,
        session_id: str,
        *,
        epoch_start_seq: int = 1,
        events_max: int = ring_events_max_default,
        bytes_max: int = ring_bytes_max_default,
    ) -> None:
        assert events_max >= 1 and bytes_max >= 1
        assert epoch_start_seq >= 0
        self.session_id = session_id
        self.epoch_start_seq = epoch_start_seq
        self.events_max = events_max
        self.bytes_max = bytes_max
        self.dropped_events = 0
        """Cumulative evictions since the ring was made (the gap frame's ``droppedEvents``)."""
        self._entries: deque[RingEntry] = deque()
        self._bytes = 0
        self._next_seq = epoch_start_seq

    @property
    def next_seq(self) -> int:
        """The seq the next appended event must have at least."""
        return self._next_seq

    @property
    def last_seq(self) -> int:
        """The seq of the newest event appended (``epoch_start_seq - 1`` before any)."""
        return self._next_seq - 1

    @property
    def oldest_seq(self) -> int | None:
        """The oldest retained seq, None when the ring is empty."""
        return self._entries[0].seq if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def statistics(self) -> RingStatistics:
        return RingStatistics(
            events=len(self._entries),
            bytes=self._bytes,
            dropped_events=self.dropped_events,
            oldest_seq=self.oldest_seq,
            next_seq=self._next_seq,
            epoch_start_seq=self.epoch_start_seq,
        )

    def append(self, seq: int, event_type: str, frame: bytes) -> None:
        """Keep one published frame; evicts the oldest beyond either cap (never the newest)."""
        assert seq >= self._next_seq, f"seq {seq} not after {self._next_seq - 1}"
        self._entries.append(RingEntry(seq, event_type, frame))
        self._bytes += len(frame)
        self._next_seq = seq + 1
        while len(self._entries) > self.events_max or (
            self._bytes > self.bytes_max and len(self._entries) > 1
        ):
            evicted = self._entries.popleft()
            self._bytes -= len(evicted.frame)
            self.dropped_events += 1

    def replay(self, after_seq: int | None, exclude_prefixes: Sequence[str] = ()) -> Replay:
        """The frames after ``after_seq`` (a ``Last-Event-ID``), with a gap frame when needed.

        - None or negative (the contract's -1): everything retained, no gap;
        - at or beyond ``next_seq``: gap ``ahead_of_log``, no frames (nothing is after it);
        - below the oldest seq the ring can show minus one (evicted events, or a cursor older
          than the epoch start): gap ``evicted``, then everything retained;
        - otherwise the exact frames after it.
        """
        if after_seq is None or after_seq < 0:
            return Replay(None, self._frames_after(None, exclude_prefixes))
        if after_seq >= self._next_seq:
            gap = gap_frame(
                self.session_id,
                after_seq,
                self.oldest_seq,
                self.dropped_events,
                gap_reason_ahead_of_log,
            )
            return Replay(gap, [])
        showable_from = self.oldest_seq if self._entries else self._next_seq
        if after_seq < showable_from - 1:
            gap = gap_frame(
                self.session_id,
                after_seq,
                self.oldest_seq,
                self.dropped_events,
                gap_reason_evicted,
            )
            return Replay(gap, self._frames_after(None, exclude_prefixes))
        return Replay(None, self._frames_after(after_seq, exclude_prefixes))

    def _frames_after(self, after_seq: int | None, exclude_prefixes: Sequence[str]) -> list[bytes]:
        frames = []
        for entry in self._entries:
            if after_seq is not None and entry.seq <= after_seq:
                continue
            if exclude_prefixes and is_excluded(entry.type, exclude_prefixes):
                continue
            frames.append(entry.frame)
        return frames


__all__ = [
    "EventRing",
    "Replay",
    "RingEntry",
    "RingStatistics",
    "exclude_prefixes_max",
    "is_excluded",
    "parse_exclude",
    "ring_bytes_max_default",
    "ring_events_max_default",
]
