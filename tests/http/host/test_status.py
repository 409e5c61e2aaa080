"""GET /api/v1/status over real HTTP: its shape, the 24-hour model usage, the bound of 20
finished batches per entry (chosen by id descending, returned ascending), current and latest
batches per entry, and filtering by the token's scope."""

from __future__ import annotations

import trio

from troupe.auth import TokenScope

from ._host_harness import message
from .test_checks import assert_error
from .test_learn import batches_when

status_keys = {"health", "time", "model_health", "usage", "timeouts_seconds", "entries", "backlog", "batches"}


async def insert_batches(host, entry_id: str, states: list[str]) -> None:
    now = host.clock.wall()

    def job(connection):
        for state in states:
            connection.execute(
                "INSERT INTO host_batches (entry_id, state, learner_key, trigger, message_count, first_message_id, "
                "last_message_id, created_at, attempts, result_json) VALUES (?, ?, '9', 'learn', 1, 1, 1, ?, 1, ?)",
                (entry_id, state, now, '{"memory_ids": [], "memories_created": 0}'),
            )

    await host.engine.write(job)


async def test_status_shape_usage_and_current_batches(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        empty = await client.get("/api/v1/status")
        assert empty.status_code == 200 and empty.headers["cache-control"] == "no-store"
        document = empty.json()
        assert set(document) == status_keys
        assert document["health"] == "ok" and document["entries"] == [] and document["batches"] == []
        assert document["usage"]["model_calls"] == 0 and document["usage"]["window_seconds"] == 86_400
        assert document["model_health"]["paused"] is False
        assert document["timeouts_seconds"]["image_understanding_per_batch"] == 120.0
        await client.post("/api/v1/entries/a/messages", json=message("1", content="我住在上海。"))
        await client.post("/api/v1/entries/a/learn")
        await batches_when(client, lambda found: found and found[0]["state"] == "succeeded")
        await client.post("/api/v1/entries/a/messages", json=message("2"))
        document = (await client.get("/api/v1/status")).json()
        assert document["usage"]["model_calls"] == 1 and document["usage"]["failed_calls"] == 0
        assert document["usage"]["latency_seconds"]["max"] is not None
        (entry,) = document["entries"]
        assert entry["entry_id"] == "a" and entry["pending_count"] == 1 and entry["pace"]["name"] == "standard"
        assert entry["current_batch"] is None and entry["latest_batch"]["state"] == "succeeded"
        assert document["backlog"]["pending_messages"] == 1 and document["backlog"]["entries_with_backlog"] == 1


async def test_twenty_finished_batches_per_entry_plus_every_open_one(host):
    secret = await host.token("astrbot")
    await insert_batches(host, "a", ["succeeded"] * 12 + ["abandoned"] * 10 + ["refused"])  # ids 1..23
    await insert_batches(host, "b", ["succeeded", "succeeded"])  # 24, 25
    await insert_batches(host, "a", ["waiting", "running"])  # 26, 27 (learner 9 never runs them)
    async with host.client(secret) as client:
        batches = (await client.get("/api/v1/status")).json()["batches"]
    ids = [batch["id"] for batch in batches]
    assert ids == sorted(ids)
    assert ids == [*range(4, 24), 24, 25, 26, 27]
    assert {batch["state"] for batch in batches if batch["id"] >= 26} == {"waiting", "running"}


async def test_status_is_filtered_by_the_token_scope(host):
    everything = await host.token("all")
    limited = await host.token("limited", scope=TokenScope.of_prefix("astrbot:"))
    async with host.client(everything) as client:
        await client.post("/api/v1/entries/astrbot:x/messages", json=message("1"))
        await client.post("/api/v1/entries/other:y/messages", json=[message("1"), message("2")])
    await insert_batches(host, "other:y", ["succeeded"])
    await insert_batches(host, "astrbot:x", ["refused"])
    async with host.client(limited) as client:
        document = (await client.get("/api/v1/status")).json()
    assert [entry["entry_id"] for entry in document["entries"]] == ["astrbot:x"]
    assert [batch["entry_id"] for batch in document["batches"]] == ["astrbot:x"]
    assert document["backlog"]["pending_messages"] == 1
    assert "other:y" not in str(document)
    async with host.client() as anonymous:
        assert_error(await anonymous.get("/api/v1/status"), 401, "unauthorized")
    await trio.lowlevel.checkpoint()
