"""The events hub behind ``GET /api/v1/events``: connection slots, event ids, replay cursors.

Why a hub object rather than actor state: everything it holds is, by the contract, memory
only and per process (a restart means ``resync``): the instance id, the one sequence that
every connection's frame ids share, the cursors that let a reconnect replay, the connection
counts behind the 429 limits and the ``reminders_pushed`` counter.  None of it may survive a
restart, so it lives in one object owned by the app (``app.state.events``), not in storage.

The pieces:
- ``EventSettings``: every limit of the contract's table as a named field (tests shorten them);
- ``EventCursors``: frame seq → (token id, notification watermark, issue time), at most
  ``cursors_max`` in all and ``replay_seconds`` old; oldest dropped first.  A cursor records
  only where a stream was, never a reminder's text: replays read current rows;
- ``EventsHub``: slots (``admit`` / ``release``), ``next_event_id`` (``<instance_id>:<seq>``,
  seq strictly increasing across all connections), where a new stream starts (``start_of``:
  replay from a cursor, or the window with a ``resync`` first), ``status_document`` and
  ``shutdown()``, which ends every stream's waiting at once (SIGINT/SIGTERM, or an embedding
  application before it waits for HTTP connections to end).

The window rule: a stream replays only notification ids greater than ``max_id -
notification_window_ids``.  A fresh subscription starts at that bound (with ``resync
window_exceeded`` first when older history exists); a cursor below it gets the same resync;
an unknown, expired, evicted, other-instance or other-token cursor gets ``resync
cursor_unavailable`` and then the window.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from troupe.http import ShutdownSignal

event_connections_per_token_max = 2
event_connections_max = 32
event_poll_seconds = 1.0
event_heartbeat_seconds = 15.0
event_idle_seconds = 300.0
"""A stream that pushed no reminder for this long ends (heartbeats do not count)."""
event_connection_seconds_max = 3600.0
event_send_seconds_max = 5.0
"""One ASGI send of a stream may wait this long for a slow client."""
event_final_send_seconds_max = 1.0
"""...and the final send (the end of the body) this much more."""
event_replay_seconds = 900.0
event_cursors_max = 10_000
event_notification_window_ids = 1000
event_limit_retry_after_seconds = 5
"""``Retry-After`` of the 429 connection-limit refusals."""

assert 1 <= event_connections_per_token_max <= event_connections_max
assert 0 < event_poll_seconds < event_heartbeat_seconds < event_idle_seconds < event_connection_seconds_max
assert 0 < event_final_send_seconds_max <= event_send_seconds_max < event_heartbeat_seconds
assert event_replay_seconds > 0 and event_cursors_max >= 1 and event_notification_window_ids >= 1

resync_cursor_unavailable = "cursor_unavailable"
resync_window_exceeded = "window_exceeded"

code_event_token_limit = "event_token_limit"
code_event_global_limit = "event_global_limit"

instance_id_bytes = 16
"""The instance id is this many random bytes as lower-case hex (32 characters)."""

event_id_characters_max = 2 * instance_id_bytes + 1 + 19
"""``<instance_id>:<seq>``: a presented id longer than this cannot be one of ours."""

_event_id_pattern = re.compile(r"([0-9a-f]{%d}):([0-9]{1,19})" % (2 * instance_id_bytes))


@dataclass(frozen=True)
class EventSettings:
    """The stream's limits (the contract's fixed defaults; tests inject short ones)."""

    connections_per_token_max: int = event_connections_per_token_max
    connections_max: int = event_connections_max
    poll_seconds: float = event_poll_seconds
    heartbeat_seconds: float = event_heartbeat_seconds
    idle_seconds: float = event_idle_seconds
    connection_seconds_max: float = event_connection_seconds_max
    send_seconds_max: float = event_send_seconds_max
    final_send_seconds_max: float = event_final_send_seconds_max
    replay_seconds: float = event_replay_seconds
    cursors_max: int = event_cursors_max
    notification_window_ids: int = event_notification_window_ids
    limit_retry_after_seconds: int = event_limit_retry_after_seconds

    def __post_init__(self) -> None:
        assert 1 <= self.connections_per_token_max <= self.connections_max
        assert self.poll_seconds > 0 and self.heartbeat_seconds > 0
        assert self.idle_seconds > 0 and self.connection_seconds_max > 0
        assert 0 < self.final_send_seconds_max and 0 < self.send_seconds_max
        assert self.replay_seconds > 0 and self.cursors_max >= 1 and self.notification_window_ids >= 1
        assert self.limit_retry_after_seconds >= 1


@dataclass(frozen=True)
class EventCursor:
    """Where a stream was when it sent one frame: its token, the notification id it had
    examined up to (``watermark``) and when (Env monotonic seconds)."""

    token_id: int
    watermark: int
    issued_at: float


class EventCursors:
    """Cursors by frame seq, oldest first (see the module docstring)."""

    def __init__(self, *, cursors_max: int, replay_seconds: float) -> None:
        assert cursors_max >= 1 and replay_seconds > 0
        self.cursors_max = cursors_max
        self.replay_seconds = replay_seconds
        self._cursors: OrderedDict[int, EventCursor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cursors)

    def remember(self, seq: int, cursor: EventCursor) -> None:
        self.expire(cursor.issued_at)
        self._cursors[seq] = cursor
        while len(self._cursors) > self.cursors_max:
            self._cursors.popitem(last=False)

    def find(self, seq: int, token_id: int, now: float) -> EventCursor | None:
        """The cursor of frame ``seq`` if it is kept, young enough and ``token_id``'s."""
        self.expire(now)
        cursor = self._cursors.get(seq)
        if cursor is None or cursor.token_id != token_id:
            return None
        return cursor

    def expire(self, now: float) -> None:
        # Seqs are issued in clock order, so the expired ones are at the front.
        while self._cursors:
            seq, oldest = next(iter(self._cursors.items()))
            if now - oldest.issued_at <= self.replay_seconds:
                return
            del self._cursors[seq]


class EventLimitReached(Exception):
    """A new stream would exceed a connection limit; ``code`` says which."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class StreamStart:
    """Where a new stream begins: the notification id it replays after, and the resync
    reason to send first (None when it resumes a usable cursor)."""

    position: int
    resync_reason: str | None


def parse_event_id(text: str) -> tuple[str, int] | None:
    """``(instance_id, seq)`` of a well-formed ``<instance_id>:<seq>``, else None."""
    if len(text) > event_id_characters_max:
        return None
    match = _event_id_pattern.fullmatch(text)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


class EventsHub:
    """One per app (``app.state.events``); see the module docstring.

    ``clock`` is the Env clock (monotonic for durations and cursor ages, wall for heartbeat
    times); ``random`` the Env random source (the instance id); ``server_shutdown`` the
    server's ``ShutdownSignal`` when there is one, raced beside the hub's own."""

    def __init__(
        self,
        *,
        engine: Any,
        clock: Any,
        random: Any,
        settings: EventSettings | None = None,
        server_shutdown: ShutdownSignal | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.settings = settings or EventSettings()
        self.instance_id = random.token_bytes(instance_id_bytes).hex()
        self.cursors = EventCursors(
            cursors_max=self.settings.cursors_max, replay_seconds=self.settings.replay_seconds
        )
        self.reminders_pushed = 0
        self._seq = 0
        self._per_token: dict[int, int] = {}
        self._shutdown = ShutdownSignal()
        self._server_shutdown = server_shutdown

    # -- connections -------------------------------------------------------------------

    @property
    def connections(self) -> int:
        return sum(self._per_token.values())

    def connections_of(self, token_id: int) -> int:
        return self._per_token.get(token_id, 0)

    def admit(self, token_id: int) -> None:
        """Take a slot for a new stream of ``token_id`` or raise ``EventLimitReached``."""
        if self.connections_of(token_id) >= self.settings.connections_per_token_max:
            raise EventLimitReached(code_event_token_limit)
        if self.connections >= self.settings.connections_max:
            raise EventLimitReached(code_event_global_limit)
        self._per_token[token_id] = self.connections_of(token_id) + 1

    def release(self, token_id: int) -> None:
        count = self._per_token.get(token_id, 0)
        assert count > 0, "release without admit"
        if count == 1:
            del self._per_token[token_id]
        else:
            self._per_token[token_id] = count - 1

    # -- ids and cursors -----------------------------------------------------------------

    def next_event_id(self, token_id: int, watermark: int) -> str:
        """A new frame id; remembers the stream's ``watermark`` under it as a cursor."""
        self._seq += 1
        self.cursors.remember(self._seq, EventCursor(token_id, watermark, self.clock.monotonic()))
        return f"{self.instance_id}:{self._seq}"

    def start_of(self, resume: str | None, token_id: int, bounds: tuple[int | None, int | None]) -> StreamStart:
        """Where a stream for ``token_id`` that presented ``resume`` (a well-formed event id or
        None) starts, given the notification id ``bounds`` (smallest, largest) read just now."""
        smallest, largest = bounds
        window_start = max(0, (largest or 0) - self.settings.notification_window_ids)
        if resume is None:
            older = smallest is not None and smallest <= window_start
            return StreamStart(window_start, resync_window_exceeded if older else None)
        parsed = parse_event_id(resume)
        assert parsed is not None, "event ids are validated before a stream starts"
        instance_id, seq = parsed
        cursor = None
        if instance_id == self.instance_id:
            cursor = self.cursors.find(seq, token_id, self.clock.monotonic())
        if cursor is None:
            return StreamStart(window_start, resync_cursor_unavailable)
        if cursor.watermark < window_start:
            return StreamStart(window_start, resync_window_exceeded)
        return StreamStart(cursor.watermark, None)

    # -- shutdown ------------------------------------------------------------------------

    def shutdown(self) -> None:
        """End every stream's waiting now; new streams are refused (503).  Idempotent."""
        self._shutdown.set()

    def is_shut_down(self) -> bool:
        server = self._server_shutdown
        return self._shutdown.is_set() or (server is not None and server.is_set())

    @contextmanager
    def waiting(self, *, timeout_seconds: float) -> Iterator[None]:
        """A wait that ends after ``timeout_seconds`` or at shutdown, whichever is first
        (check ``is_shut_down()`` afterwards)."""
        with ExitStack() as stack:
            stack.enter_context(self._shutdown.scope(timeout_seconds=timeout_seconds))
            if self._server_shutdown is not None:
                stack.enter_context(self._server_shutdown.scope())
            yield

    @property
    def waiting_streams(self) -> int:
        """Streams waiting inside ``waiting()`` now (for tests)."""
        return self._shutdown.open_scopes

    # -- status --------------------------------------------------------------------------

    def status_document(self) -> dict[str, Any]:
        """``GET /events/status``: process-level counts and every limit; no reminder text,
        host name or token value."""
        settings = self.settings
        return {
            "instance_id": self.instance_id,
            "connections": self.connections,
            "reminders_pushed": self.reminders_pushed,
            "per_token_limit": settings.connections_per_token_max,
            "global_limit": settings.connections_max,
            "poll_seconds": settings.poll_seconds,
            "heartbeat_seconds": settings.heartbeat_seconds,
            "idle_seconds": settings.idle_seconds,
            "max_seconds": settings.connection_seconds_max,
            "replay_seconds": settings.replay_seconds,
            "cursor_limit": settings.cursors_max,
            "notification_window": settings.notification_window_ids,
            "send_seconds": settings.send_seconds_max,
            "final_send_seconds": settings.final_send_seconds_max,
        }


__all__ = [
    "EventCursor",
    "EventCursors",
    "EventLimitReached",
    "EventSettings",
    "EventsHub",
    "StreamStart",
    "code_event_global_limit",
    "code_event_token_limit",
    "event_connection_seconds_max",
    "event_connections_max",
    "event_connections_per_token_max",
    "event_cursors_max",
    "event_final_send_seconds_max",
    "event_heartbeat_seconds",
    "event_id_characters_max",
    "event_idle_seconds",
    "event_limit_retry_after_seconds",
    "event_notification_window_ids",
    "event_poll_seconds",
    "event_replay_seconds",
    "event_send_seconds_max",
    "instance_id_bytes",
    "parse_event_id",
    "resync_cursor_unavailable",
    "resync_window_exceeded",
]
