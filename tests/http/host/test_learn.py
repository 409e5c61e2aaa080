"""POST /api/v1/entries/{entry_id}/learn over real HTTP: no body, scope and entry-id checks,
the batch lifecycle seen through /status, pace batching by count and idle time on the test
clock, and a pending set that survives a restart of the server on the same data directory."""

from __future__ import annotations

import trio

from troupe.actors.host import message_learning_states
from troupe.auth import TokenScope

from ._host_harness import message, start_host_server
from .test_checks import assert_error

entry = "astrbot:group-a"
learn_path = f"/api/v1/entries/{entry}/learn"
messages_path = f"/api/v1/entries/{entry}/messages"


async def batches_when(client, predicate, *, seconds: float = 10.0) -> list[dict]:
    with trio.fail_after(seconds):
        while True:
            batches = (await client.get("/api/v1/status")).json()["batches"]
            if predicate(batches):
                return batches
            await trio.sleep(0.05)


async def test_learn_needs_no_body_and_closes_the_pending_set(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        empty = await client.post(learn_path)
        assert empty.status_code == 200
        assert empty.json() == {"accepted": True, "pending_count": 0, "paused": False, "reason": None}
        await client.post(messages_path, json=[message("a", content="我喜欢寿司。"), message("b", content="你好")])
        response = await client.post(learn_path)
        assert response.json() == {"accepted": True, "pending_count": 2, "paused": False, "reason": None}
        batches = await batches_when(client, lambda found: found and found[0]["state"] == "succeeded")
        (batch,) = batches
        assert (batch["entry_id"], batch["trigger"], batch["message_count"]) == (entry, "learn", 2)
        assert batch["result"]["memories_created"] == 1 and len(batch["result"]["memory_ids"]) == 1
        states = await host.engine.read(lambda c: message_learning_states(c, entry, [1, 2]))
        assert states == {1: "learned", 2: "learned"}
        assert (await client.post(learn_path)).json()["pending_count"] == 0


async def test_learn_checks_scope_entry_id_and_method(host):
    secret = await host.token("limited", scope=TokenScope.of_prefix("astrbot:"))
    async with host.client(secret) as client:
        assert_error(await client.post("/api/v1/entries/other:x/learn"), 403, "entry_forbidden")
        assert_error(await client.post("/api/v1/entries/a%23b/learn"), 400, "invalid_request")
        refused = await client.get(learn_path)
        assert_error(refused, 400, "method_not_allowed")
        assert refused.headers["allow"] == "POST"
    async with host.client() as anonymous:
        assert_error(await anonymous.post(learn_path), 401, "unauthorized")


async def test_count_and_idle_paces_over_http(host):
    host.clock.freeze()
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        custom = {"count": 2, "idle_seconds": 30, "max_wait_seconds": 600}
        first = await client.post(messages_path, json=message("a", pace=custom))
        assert first.json()["pending_count"] == 1
        await client.post(messages_path, json=message("b"))
        await batches_when(client, lambda found: [batch["trigger"] for batch in found] == ["count"])
        await client.post(messages_path, json=message("c"))
        host.clock.advance(29.0)
        await trio.sleep(1.2)
        assert len((await client.get("/api/v1/status")).json()["batches"]) == 1
        host.clock.advance(1.5)
        batches = await batches_when(client, lambda found: len(found) == 2 and found[1]["state"] == "succeeded")
        assert [(batch["trigger"], batch["message_count"]) for batch in batches] == [("count", 2), ("idle", 1)]


async def test_the_pace_timer_survives_a_restart(tmp_path):
    data = str(tmp_path / "data")
    async with trio.open_nursery() as nursery:
        server = await start_host_server(nursery, data)
        server.clock.freeze()
        secret = await server.token("astrbot")
        async with server.client(secret) as client:
            custom = {"count": 10, "idle_seconds": 30, "max_wait_seconds": 600}
            await client.post(messages_path, json=[message("a", pace=custom), message("b")])
        offset = server.clock.offset
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        server = await start_host_server(nursery, data)
        server.clock.offset = offset + 31.0  # the idle time passed while the server was down
        async with server.client(secret) as client:
            batches = await batches_when(client, lambda found: found and found[0]["state"] == "succeeded")
            assert [(batch["trigger"], batch["message_count"]) for batch in batches] == [("idle", 2)]
        nursery.cancel_scope.cancel()
