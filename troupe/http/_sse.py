"""Server-Sent Events responses that survive hypercorn's defaults and end cleanly.

``sse_response`` turns a channel of ``SseEvent`` into a quart streaming response with the
three things every SSE endpoint here needs and is easy to forget:

- ``response.timeout = None``: quart's default 60 s response timeout would cut the stream;
- heartbeats: a comment frame after ``heartbeat_seconds`` of silence, because a client that
  vanished without closing is only found by a write (bounded by the ``SendGuard``
  middleware), and proxies drop idle connections;
- the shutdown race: waiting happens inside ``ShutdownSignal.scope()``, so a server shutdown
  ends the stream with an optional closing event instead of hypercorn's cancellation.

The source is a ``trio.abc.ReceiveChannel``, not an async iterator: receiving from a memory
channel can be cancelled (by a heartbeat deadline or by shutdown) without losing an event,
which is not true of an arbitrary ``__anext__``.  Producers that are async generators can be
adapted with ``trio.as_safe_channel``.  The channel is closed when the stream ends for any
reason (client gone, shutdown, end of channel), which tells the producer to stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import trio
from quart import Response

from ._shutdown import ShutdownSignal

heartbeat_seconds_default = 15.0
"""Silence longer than this gets a comment frame."""

assert heartbeat_seconds_default > 0

heartbeat_frame = b": heartbeat\n\n"


@dataclass(frozen=True)
class SseEvent:
    """One event; ``encode()`` gives its wire frame (multi-line data split per the spec)."""

    data: str
    event: str | None = None
    id: str | None = None
    retry_milliseconds: int | None = None

    def encode(self) -> bytes:
        lines = []
        if self.id is not None:
            assert "\n" not in self.id and "\r" not in self.id, "SSE ids are single-line"
            lines.append(f"id: {self.id}")
        if self.event is not None:
            assert "\n" not in self.event and "\r" not in self.event, "SSE event names are single-line"
            lines.append(f"event: {self.event}")
        if self.retry_milliseconds is not None:
            lines.append(f"retry: {int(self.retry_milliseconds)}")
        for line in self.data.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            lines.append(f"data: {line}")
        return ("\n".join(lines) + "\n\n").encode("utf-8")


async def sse_frames(
    events: trio.abc.ReceiveChannel[SseEvent],
    *,
    shutdown: ShutdownSignal,
    heartbeat_seconds: float = heartbeat_seconds_default,
    closing_event: SseEvent | None = None,
) -> AsyncIterator[bytes]:
    """The frames of the stream: events, heartbeats, and ``closing_event`` on shutdown."""
    assert heartbeat_seconds > 0
    async with events:
        while True:
            event: SseEvent | None = None
            with shutdown.scope(timeout_seconds=heartbeat_seconds):
                try:
                    event = await events.receive()
                except trio.EndOfChannel:
                    return
            if event is not None:
                yield event.encode()
            elif shutdown.is_set():
                if closing_event is not None:
                    yield closing_event.encode()
                return
            else:
                yield heartbeat_frame


def sse_response(
    events: trio.abc.ReceiveChannel[SseEvent],
    *,
    shutdown: ShutdownSignal,
    heartbeat_seconds: float = heartbeat_seconds_default,
    closing_event: SseEvent | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A ``text/event-stream`` response streaming ``events`` (see the module docstring)."""
    frames = sse_frames(
        events, shutdown=shutdown, heartbeat_seconds=heartbeat_seconds, closing_event=closing_event
    )
    response = Response(frames, status=200, content_type="text/event-stream; charset=utf-8")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    for name, value in (headers or {}).items():
        response.headers[name] = value
    response.timeout = None
    return response


__all__ = ["SseEvent", "heartbeat_frame", "heartbeat_seconds_default", "sse_frames", "sse_response"]
