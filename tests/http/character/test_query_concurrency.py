"""``/query_memory`` over real HTTP runs its recall outside the character's actor turn: queries
of one character overlap and the character's other routes keep answering meanwhile; a
``/release_character`` waits for a reading query, and revokes one that hangs past the limit
(that query answers 503 with ``Retry-After`` and only ``detail``, never exception text)."""

from __future__ import annotations

import trio

from troupe.actors.character import RecallLeases, character_recall_indexes
from troupe.actors.character._recall import CharacterRecallIndexes

from ._character_harness import history_body

name = "小天"


async def opened_recall(client, character_server):
    await client.post(f"/settle/{name}", json=history_body(("user", "我喜欢吃寿司")))
    with trio.fail_after(20):  # the fact comes from the background post-turn extraction
        while True:
            response = await client.post(f"/query_memory/{name}", json={"query": "寿司"})
            if response.status_code == 200 and response.json()["results"]:
                break
            await trio.sleep(0.05)
    recall = character_recall_indexes.opened(character_server.engine, name)
    assert recall is not None
    return recall


def gate_reads(recall, gate: trio.Event, reading: list[int]):
    read = recall.recall

    async def gated(*args, **options):
        reading.append(1)
        try:
            await gate.wait()
            return await read(*args, **options)
        finally:
            reading.pop()

    recall.recall = gated


async def test_queries_of_one_character_overlap_and_the_mailbox_moves(client, character_server):
    recall = await opened_recall(client, character_server)
    gate, reading = trio.Event(), []
    gate_reads(recall, gate, reading)
    answers: list = []

    async def query() -> None:
        answers.append(await client.post(f"/query_memory/{name}", json={"query": "寿司"}))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(query)
        with trio.fail_after(10):
            while len(reading) < 3:
                await trio.sleep(0.01)
        # Three recalls of one character read at once, and its actor still answers.
        assert (await client.get(f"/get_recent_history/{name}")).status_code == 200
        gate.set()
    assert [response.status_code for response in answers] == [200, 200, 200]
    assert all(response.json()["results"][0]["text"] == "我喜欢吃寿司" for response in answers)


async def test_a_release_waits_for_a_reading_query(client, character_server):
    recall = await opened_recall(client, character_server)
    gate, reading = trio.Event(), []
    gate_reads(recall, gate, reading)
    answers: dict[str, object] = {}

    async def query() -> None:
        answers["query"] = await client.post(f"/query_memory/{name}", json={"query": "寿司"})

    async def release() -> None:
        answers["release"] = await client.post(f"/release_character/{name}", params={
            "derived_task_claim_token": "op-1", "derived_task_claim_generation": 0})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(query)
        with trio.fail_after(10):
            while not reading:
                await trio.sleep(0.01)
        nursery.start_soon(release)
        await trio.sleep(0.2)
        assert not answers  # the release waits for the reading query
        gate.set()
    assert answers["query"].status_code == 200 and answers["query"].json()["results"]
    assert answers["release"].status_code == 200
    assert (await client.post(f"/query_memory/{name}", json={"query": "寿司"})).status_code == 503


async def test_a_release_revokes_a_hanging_query_which_answers_503(client, character_server):
    character_server.engine.attachments[CharacterRecallIndexes.leases_key] = RecallLeases(drain_seconds_max=0.2)
    recall = await opened_recall(client, character_server)
    reading: list[int] = []
    gate_reads(recall, trio.Event(), reading)  # never opens
    answers: dict[str, object] = {}

    async def query() -> None:
        answers["query"] = await client.post(f"/query_memory/{name}", json={"query": "寿司"})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(query)
        with trio.fail_after(10):
            while not reading:
                await trio.sleep(0.01)
        released = await client.post(f"/release_character/{name}", params={
            "derived_task_claim_token": "op-1", "derived_task_claim_generation": 0})
        assert released.status_code == 200
        assert not reading  # the revoked read ended before the release answered
    response = answers["query"]
    assert response.status_code == 503 and set(response.json()) == {"detail"}
    assert response.headers["retry-after"].isdigit()
