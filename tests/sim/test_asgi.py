"""The in-process ASGI driver: streams on the mock clock, hang-ups, chunked bodies, lifespan."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from quart import request
from quart_trio import QuartTrio

from troupe.http import ShutdownSignal, SseEvent, protect, sse_response
from troupe.sim._asgi import AsgiDriver, AsgiTimeout, LifespanFailed, ResponseTooLarge

frame_interval_seconds = 1.0


def sse_app(log: list[str]) -> QuartTrio:
    """``/events``: three frames a simulated second apart; ``/endless``: one a second forever.
    ``/upload`` counts a streamed body; ``/slow`` never answers; ``/crash`` raises."""
    app = QuartTrio("test")
    shutdown = ShutdownSignal()

    @app.before_serving
    async def started() -> None:
        log.append("startup")

    @app.after_serving
    async def stopped() -> None:
        log.append("shutdown")

    def stream(count: int | None):
        send, receive = trio.open_memory_channel[SseEvent](0)

        async def produce() -> None:
            number = 0
            try:
                async with send:
                    while count is None or number < count:
                        await trio.sleep(frame_interval_seconds)
                        number += 1
                        await send.send(SseEvent(str(number), id=str(number)))
            except trio.BrokenResourceError:
                log.append("producer saw the stream end")

        app.nursery.start_soon(produce)
        return sse_response(receive, shutdown=shutdown, heartbeat_seconds=100)

    @app.get("/events")
    async def events():
        return stream(3)

    @app.get("/endless")
    async def endless():
        return stream(None)

    @app.post("/upload")
    async def upload():
        received = 0
        async for chunk in request.body:
            received += len(chunk)
        return {"received": received}

    @app.get("/slow")
    async def slow():
        await trio.sleep_forever()

    @app.get("/crash")
    async def crash():
        raise RuntimeError("planted")

    app.asgi_app = protect(app.asgi_app, request_body_bytes_max=1000)
    return app


async def test_sse_frames_arrive_one_at_a_time_as_the_clock_advances(autojump_clock):
    log: list[str] = []
    driver = AsgiDriver(sse_app(log))
    async with trio.open_nursery() as nursery:
        await driver.startup(nursery)
        started = trio.current_time()
        arrivals = []
        async with driver.stream("GET", "/events") as response:
            assert response.status == 200
            assert response.header("content-type").startswith("text/event-stream")
            async for chunk in response:
                arrivals.append((trio.current_time() - started, chunk))
        await driver.shutdown()
    assert arrivals == [(1.0, b"id: 1\ndata: 1\n\n"), (2.0, b"id: 2\ndata: 2\n\n"), (3.0, b"id: 3\ndata: 3\n\n")]
    assert log == ["startup", "shutdown"]


async def test_closing_a_stream_early_ends_the_apps_generator(autojump_clock):
    log: list[str] = []
    driver = AsgiDriver(sse_app(log))
    async with trio.open_nursery() as nursery:
        await driver.startup(nursery)
        async with driver.stream("GET", "/endless") as response:
            async for chunk in response:
                assert chunk == b"id: 1\ndata: 1\n\n"
                break
        closed_at = trio.current_time()
        await trio.sleep(5 * frame_interval_seconds)  # the producer's next send finds the stream gone
        await driver.shutdown()
    assert closed_at == 1.0
    assert log == ["startup", "producer saw the stream end", "shutdown"]
    assert driver.app_errors == []


async def test_chunked_request_bodies_stream_and_hit_the_body_limit(autojump_clock):
    driver = AsgiDriver(sse_app([]))
    small = await driver.request("POST", "/upload", body=[b"a" * 300, b"b" * 300])
    assert (small.status, small.json()) == (200, {"received": 600})

    async def endless_upload():
        while True:
            await trio.sleep(0.01)
            yield b"x" * 256

    too_big = await driver.request("POST", "/upload", body=endless_upload())
    assert too_big.status == 413
    assert too_big.json()["error"]["code"] == "payload_too_large"
    declared = await driver.request("POST", "/upload", body=b"y" * 2000)
    assert declared.status == 413


async def test_limits_timeouts_and_app_errors(autojump_clock):
    driver = AsgiDriver(sse_app([]), request_seconds_max=10)
    with pytest.raises(AsgiTimeout):
        await driver.request("GET", "/slow")
    assert trio.current_time() == 10
    crashed = await driver.request("GET", "/crash")
    assert crashed.status == 500  # quart's own handler; the driver's 500 is for raw apps
    capped = AsgiDriver(sse_app([]), response_body_bytes_max=20)
    with pytest.raises(ResponseTooLarge):
        await capped.request("GET", "/events")
    bad_host = await driver.request("GET", "/events", host="evil.example")
    assert bad_host.status == 400 and json.loads(bad_host.body)["error"]["code"] == "bad_host"


async def test_a_raw_app_that_raises_gets_a_500_and_is_counted():
    async def app(scope, receive, send):
        raise ValueError("bug")

    driver = AsgiDriver(app)
    response = await driver.request("GET", "/")
    assert response.status == 500
    assert driver.app_errors == ["GET /: ValueError('bug')"]


async def test_lifespan_failure_is_reported():
    async def app(scope, receive, send):
        assert scope["type"] == "lifespan"
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    async with trio.open_nursery() as nursery:
        with pytest.raises(LifespanFailed, match="no database"):
            await AsgiDriver(app).startup(nursery)


async def test_httpx_client_over_the_transport_streams(autojump_clock):
    log: list[str] = []
    driver = AsgiDriver(sse_app(log))
    async with trio.open_nursery() as nursery:
        await driver.startup(nursery)
        async with httpx.AsyncClient(transport=driver.transport(nursery), base_url="http://127.0.0.1") as client:
            uploaded = await client.post("/upload", content=b"z" * 10)
            assert uploaded.json() == {"received": 10}
            started = trio.current_time()
            async with client.stream("GET", "/endless") as response:
                async for chunk in response.aiter_bytes():
                    assert trio.current_time() - started == 1.0
                    assert chunk.startswith(b"id: 1")
                    break
        await trio.sleep(5 * frame_interval_seconds)
        await driver.shutdown()
    assert log == ["startup", "producer saw the stream end", "shutdown"]
