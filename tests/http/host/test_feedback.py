"""POST /api/v1/feedback over real HTTP: idempotent strengthening (a retry never
strengthens twice), recalls owned by their token (403), valid 24 hours on the test clock
(400 after), memory ids outside the recall (400), deleted memories (404), unknown recalls
(404), nothing changed by a refused request, and expired recalls swept a week after expiry
(bounded per recall written)."""

from __future__ import annotations

import pytest

from troupe.actors.host._recall import (
    recall_kept_after_expiry_seconds,
    recall_sweep_rows_max,
    recall_valid_seconds,
)

from ._memory_helpers import delete, fields_of, remember
from .test_checks import assert_error

path = "/api/v1/feedback"
prepare = "/api/v1/entries/astrbot:group-a/prepare"


@pytest.fixture
async def secret(host):
    return await host.token("astrbot-connector")


async def recall(client, text: str = "星星") -> tuple[str, list[int]]:
    document = (await client.post(prepare, json={"text": text, "participants": [], "judge": False})).json()
    return document["recall_id"], [memory["id"] for memory in document["memories"]]


async def strength(host, memory_id: int) -> int:
    return (await host.rows("SELECT strength FROM host_memories WHERE id = ?", memory_id))[0][0]


async def test_strengthening_is_idempotent_per_recall_and_memory(host, secret):
    first = await remember(host, "看星星")
    second = await remember(host, "数星星")
    async with host.client(secret) as client:
        recall_id, recalled = await recall(client)
        assert set(recalled) == {first, second}
        response = await client.post(path, json={"recall_id": recall_id, "memory_ids": [first, first]})
        assert response.json() == {"recall_id": recall_id, "accepted": [first], "strengthened": [first]}
        retry = await client.post(path, json={"recall_id": recall_id, "memory_ids": [first]})
        assert retry.json() == {"recall_id": recall_id, "accepted": [first], "strengthened": []}
        both = await client.post(path, json={"recall_id": recall_id, "memory_ids": [second, first]})
        assert both.json() == {"recall_id": recall_id, "accepted": [second, first], "strengthened": [second]}
        nothing = await client.post(path, json={"recall_id": recall_id, "memory_ids": []})
        assert nothing.json() == {"recall_id": recall_id, "accepted": [], "strengthened": []}
        # A new recall of the same memory may strengthen it again (once).
        again, _ = await recall(client)
        assert (await client.post(path, json={"recall_id": again, "memory_ids": [first]})).json()["strengthened"] == [first]
    assert await strength(host, first) == 2 and await strength(host, second) == 1


async def test_recall_belongs_to_its_token(host, secret):
    memory_id = await remember(host, "看星星")
    other = await host.token("other-connector")
    async with host.client(secret) as client:
        recall_id, _ = await recall(client)
    async with host.client(other) as client:
        response = await client.post(path, json={"recall_id": recall_id, "memory_ids": [memory_id]})
        assert_error(response, 403, "recall_forbidden")
        assert_error(await client.post(path, json={"recall_id": "recall_unknown", "memory_ids": []}), 404, "recall_not_found")
    assert await strength(host, memory_id) == 0


async def test_recall_expires_after_24_hours(host, secret):
    memory_id = await remember(host, "看星星")
    async with host.client(secret) as client:
        recall_id, _ = await recall(client)
        fresh, _ = await recall(client)
        host.clock.advance(24 * 3600 - 5)
        ok = await client.post(path, json={"recall_id": fresh, "memory_ids": [memory_id]})
        assert ok.json()["strengthened"] == [memory_id]
        host.clock.advance(10)
        response = await client.post(path, json={"recall_id": recall_id, "memory_ids": [memory_id]})
        assert_error(response, 400, "recall_expired")
        assert fields_of(response) == ["body.recall_id"]
    assert await strength(host, memory_id) == 1


async def test_memories_outside_the_recall_and_deleted_ones(host, secret):
    recalled = await remember(host, "看星星")
    deleted = await remember(host, "数星星")
    elsewhere = await remember(host, "吃寿司")
    async with host.client(secret) as client:
        recall_id, ids = await recall(client)
        assert set(ids) == {recalled, deleted}
        response = await client.post(path, json={"recall_id": recall_id, "memory_ids": [recalled, elsewhere, 999]})
        assert_error(response, 400, "memory_not_in_recall")
        assert fields_of(response) == ["body.memory_ids[1]", "body.memory_ids[2]"]
        await delete(host, deleted)
        response = await client.post(path, json={"recall_id": recall_id, "memory_ids": [recalled, deleted]})
        assert_error(response, 404, "memory_not_found")
        assert fields_of(response) == ["body.memory_ids[1]"]
        for body in ({"memory_ids": []}, {"recall_id": recall_id}, {"recall_id": "", "memory_ids": []},
                     {"recall_id": recall_id, "memory_ids": ["1"]}, {"recall_id": 5, "memory_ids": []},
                     {"recall_id": recall_id, "memory_ids": list(range(1001))}):
            assert_error(await client.post(path, json=body), 400, "invalid_request")
    assert await strength(host, recalled) == 0  # every refusal changed nothing


async def test_recalls_are_swept_a_week_after_they_expire(host, secret):
    memory_id = await remember(host, "看星星")
    async with host.client(secret) as client:
        old = [(await recall(client))[0] for _ in range(recall_sweep_rows_max + 2)]
        host.clock.advance(recall_valid_seconds + recall_kept_after_expiry_seconds - 5)
        recent, _ = await recall(client)
        # Expired but within the week: still answers "expired", and still stored.
        assert_error(await client.post(path, json={"recall_id": old[0], "memory_ids": [memory_id]}), 400, "recall_expired")
        assert len(await host.rows("SELECT recall_id FROM host_recalls")) == len(old) + 1
        host.clock.advance(10)
        # Each recall written sweeps at most ``recall_sweep_rows_max`` of the oldest.
        await recall(client)
        assert len(await host.rows("SELECT recall_id FROM host_recalls")) == len(old) + 2 - recall_sweep_rows_max
        await recall(client)
        remaining = {row[0] for row in await host.rows("SELECT recall_id FROM host_recalls")}
        assert recent in remaining and not remaining & set(old)
        assert len(remaining) == 3
        assert await host.rows("SELECT count(*) FROM host_recall_memories WHERE recall_id NOT IN "
                               "(SELECT recall_id FROM host_recalls)") == [(0,)]
        assert_error(await client.post(path, json={"recall_id": old[0], "memory_ids": [memory_id]}), 404, "recall_not_found")
        ok = await client.post(path, json={"recall_id": recent, "memory_ids": [memory_id]})
        assert ok.json()["strengthened"] == [memory_id]  # the sweep never touches a live recall
