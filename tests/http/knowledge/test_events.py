"""``/events`` over a real WebSocket: ``connected`` first, then ``memory_ready``,
``conflict_detected`` and ``forget_confirmation`` as the actors announce them, heartbeats,
slow clients dropped without stalling anyone else, refused handshakes, clean shutdown."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.knowledge import (
    EventsHubSettings,
    HubStatus,
    MemoryReady,
    events_key,
    events_kind_name,
    publish_event,
)
from troupe.http.knowledge import EventsSettings

from ._knowledge_harness import (
    WebSocketClient,
    WebSocketRejected,
    bill,
    start_knowledge_server,
    wait_until,
)


async def _next(client: WebSocketClient, event: str) -> dict:
    while True:
        message = await client.receive_json()
        if message["event"] == event:
            return message


@pytest.fixture
async def fast_server(nursery, tmp_path):
    return await start_knowledge_server(
        nursery, str(tmp_path / "data"),
        hub_settings=EventsHubSettings(queue_messages_max=4, heartbeat_interval_seconds=0.2),
        events_settings=EventsSettings(event_send_seconds_max=1.0))


async def test_connected_then_the_write_paths_events(fast_server):
    socket = await WebSocketClient.connect(fast_server.port, headers=[(b"x-request-id", b"ws-1")])
    assert socket.headers["x-request-id"] == "ws-1"
    connected = await socket.receive_json()
    assert connected["event"] == "connected" and connected["data"]["connection_id"].startswith("ws_")
    async with fast_server.client() as client:
        written = (await client.post("/memory/write", json=bill(amount=210.0))).json()
        ready = await _next(socket, "memory_ready")
        assert ready["data"]["evidence_id"] == written["evidence_id"] and ready["data"]["scope"] == "shared:home"
        assert ready["data"]["knowledge_id"].startswith("knw_")
        await client.post("/memory/write", json=bill(amount=230.0))
        conflict = await _next(socket, "conflict_detected")
        assert conflict["data"]["old_value"] == 210 and conflict["data"]["new_value"] == 230
        assert conflict["data"]["severity"] == "medium"
        await client.post("/forget", json={"command": "忘记国家电网", "confirm": False})
        await client.post("/forget", json={"command": "忘记国家电网", "confirm": True})
        forgotten = await _next(socket, "forget_confirmation")
        assert forgotten["data"]["command"] == "忘记国家电网"
        assert {target["type"] for target in forgotten["data"]["targets"]} >= {"knowledge", "evidence", "relation"}
    heartbeat = await _next(socket, "heartbeat")
    assert isinstance(heartbeat["data"]["timestamp"], int)
    await socket.close()


async def test_a_slow_client_is_dropped_and_others_keep_receiving(fast_server):
    slow = await WebSocketClient.connect(fast_server.port)
    assert (await slow.receive_json())["event"] == "connected"
    fast = await WebSocketClient.connect(fast_server.port)
    assert (await fast.receive_json())["event"] == "connected"
    hub = fast_server.system.ref(events_kind_name, events_key)
    big = "x" * 200_000
    received = []

    async def keep_reading():
        while True:
            received.append(await fast.receive_json(seconds=30))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_reading)
        for number in range(40):  # the slow client never reads: its socket and queue fill up
            publish_event(fast_server.system, MemoryReady(evidence_id=f"evd_{number}", knowledge_id="knw_x",
                                                          title=big, scope="user:alice"))
            await trio.sleep(0.01)

        async def dropped():
            statistics = await hub.ask(HubStatus(), timeout=5)
            return statistics.subscribers == 1

        await wait_until(dropped, seconds=20)
        await wait_until(lambda: _async(sum(1 for m in received if m["event"] == "memory_ready") == 40), seconds=20)
        nursery.cancel_scope.cancel()
    code, reason = await slow.wait_closed(seconds=20)
    assert code in (1008, 1006)
    await slow.close()
    await fast.close()


async def _async(value):
    return value


async def test_refused_handshakes(fast_server):
    with pytest.raises(WebSocketRejected) as bad_host:
        await WebSocketClient.connect(fast_server.port, host="attacker.example")
    assert bad_host.value.status == 403
    with pytest.raises(WebSocketRejected):
        await WebSocketClient.connect(fast_server.port, path="/elsewhere")


async def test_shutdown_closes_connections_with_going_away(fast_server):
    socket = await WebSocketClient.connect(fast_server.port)
    assert (await socket.receive_json())["event"] == "connected"
    fast_server.shutdown.set()
    code, _ = await socket.wait_closed()
    assert code == 1001
    await socket.close()
