"""SSE frames: events, heartbeats on silence, a clean end on shutdown; and a real stream."""

from __future__ import annotations

from contextlib import aclosing

import httpx
import httpx_sse
import trio
from quart_trio import QuartTrio

from troupe.http import ShutdownSignal, SseEvent, heartbeat_frame, protect, sse_frames, sse_response

from ._harness import start_hypercorn


def test_event_encoding_splits_lines_and_orders_fields():
    event = SseEvent("one\ntwo\r\nthree", event="message.delta", id="7", retry_milliseconds=1500)
    assert event.encode() == b"id: 7\nevent: message.delta\nretry: 1500\ndata: one\ndata: two\ndata: three\n\n"
    assert SseEvent("").encode() == b"data: \n\n"


async def test_frames_interleave_heartbeats_and_end_with_the_channel(autojump_clock):
    send, receive = trio.open_memory_channel[SseEvent](4)
    frames: list[bytes] = []

    async def produce():
        async with send:
            await send.send(SseEvent("a", id="1"))
            await trio.sleep(25)  # one heartbeat at 10 s, another at 20 s
            await send.send(SseEvent("b", id="2"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        async with aclosing(sse_frames(receive, shutdown=ShutdownSignal(), heartbeat_seconds=10)) as stream:
            async for frame in stream:
                frames.append(frame)
    assert frames == [SseEvent("a", id="1").encode(), heartbeat_frame, heartbeat_frame, SseEvent("b", id="2").encode()]


async def test_shutdown_ends_the_stream_with_the_closing_event_and_closes_the_channel(autojump_clock):
    send, receive = trio.open_memory_channel[SseEvent](4)
    shutdown = ShutdownSignal()
    frames: list[bytes] = []
    closing = SseEvent("bye", event="shutdown")

    async def stop_later():
        await trio.sleep(3)
        shutdown.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_later)
        await send.send(SseEvent("hello"))
        async with aclosing(sse_frames(receive, shutdown=shutdown, heartbeat_seconds=10, closing_event=closing)) as stream:
            async for frame in stream:
                frames.append(frame)
    assert frames == [SseEvent("hello").encode(), closing.encode()]
    assert shutdown.open_scopes == 0
    try:
        send.send_nowait(SseEvent("late"))
    except trio.BrokenResourceError:
        pass
    else:
        raise AssertionError("the stream must close its channel so the producer stops")


async def test_a_stream_opened_after_shutdown_ends_at_once():
    shutdown = ShutdownSignal()
    shutdown.set()
    _, receive = trio.open_memory_channel[SseEvent](1)
    frames = [frame async for frame in sse_frames(receive, shutdown=shutdown)]
    assert frames == []


async def test_a_real_stream_over_hypercorn_ends_cleanly_on_shutdown(nursery):
    shutdown = ShutdownSignal()
    app = QuartTrio("sse")
    producers: list[trio.MemorySendChannel[SseEvent]] = []

    @app.get("/events")
    async def events():
        send, receive = trio.open_memory_channel[SseEvent](8)
        send.send_nowait(SseEvent("first", id="1"))
        producers.append(send)
        return sse_response(receive, shutdown=shutdown, closing_event=SseEvent("closing", event="shutdown"))

    app.asgi_app = protect(app.asgi_app)
    port = await start_hypercorn(nursery, app)
    received: list[tuple[str, str]] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        async with httpx_sse.aconnect_sse(client, "GET", "/events") as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            assert source.response.headers["cache-control"] == "no-cache"
            async with aclosing(source.aiter_sse()) as stream:
                async for event in stream:
                    received.append((event.event, event.data))
                    if event.data == "first":
                        await producers[0].send(SseEvent("second"))
                    elif event.data == "second":
                        shutdown.set()
    assert received == [("message", "first"), ("message", "second"), ("shutdown", "closing")]
