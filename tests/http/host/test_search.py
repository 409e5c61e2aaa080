"""POST /api/v1/memories/search over real HTTP: text recall and filtered listing, every
filter (people, kinds, stances, time, forgotten), the optional entry_id (400 / 403), the
limit at and over 100, the optional goals and state sections, and source redaction."""

from __future__ import annotations

from troupe.actors.host import forget_memories, host_memory_indexes
from troupe.auth import TokenScope

from ._memory_helpers import delete, fields_of, remember, when
from .test_checks import assert_error

path = "/api/v1/memories/search"


def ids(response) -> list[int]:
    assert response.status_code == 200, response.text
    return [memory["id"] for memory in response.json()["memories"]]


async def test_text_recall_and_every_filter(client, host):
    stars = await remember(host, "小林喜欢看星星", people=["小林"], stance="positive", occurred_at=when(1))
    hiking = await remember(host, "阿明周末去爬山看星星", people=["阿明"], kind="plan", occurred_at=when(5))
    sushi = await remember(host, "小林不吃寿司", people=["小林"], stance="negative", occurred_at=when(9))
    assert set(ids(await client.post(path, json={"text": "星星"}))) == {stars, hiking}
    assert ids(await client.post(path, json={"text": "星星", "people": ["阿明"]})) == [hiking]
    assert ids(await client.post(path, json={"text": "星星", "kinds": ["plan"]})) == [hiking]
    assert ids(await client.post(path, json={"text": "星星", "stances": ["positive"]})) == [stars]
    window = {"time_from": "2026-10-03T00:00:00+00:00", "time_to": "2026-10-09T00:00:00+08:00"}
    assert ids(await client.post(path, json={"text": "星星", **window})) == [hiking]
    # Without text: listing by the filters, newest occurred first.
    assert ids(await client.post(path, json={})) == [sushi, hiking, stars]
    assert ids(await client.post(path, json={"text": "", "people": ["小林"]})) == [sushi, stars]
    assert ids(await client.post(path, json={"stances": ["negative", "positive"], "limit": 1})) == [sushi]
    assert ids(await client.post(path, json=window)) == [hiking]
    document = (await client.post(path, json={"text": "寿司"})).json()
    assert set(document) == {"memories", "hints", "recall_id"}  # goals / state only when asked
    memory = document["memories"][0]
    assert (memory["content"], memory["stance"], memory["people"], memory["forgotten"]) == ("小林不吃寿司", "negative", ["小林"], False)


async def test_forgotten_only_on_request_and_deleted_never(client, host):
    kept = await remember(host, "去海边看日落")
    hidden = await remember(host, "去山顶看日落")
    gone = await remember(host, "去湖边看日落")
    index = await host_memory_indexes.index_for(host.engine, host.env.embedder)
    await forget_memories(host.engine, index, [hidden])
    await delete(host, gone)
    assert ids(await client.post(path, json={"text": "日落"})) == [kept]
    deep = (await client.post(path, json={"text": "日落", "include_forgotten": True})).json()["memories"]
    assert {(m["id"], m["forgotten"]) for m in deep} == {(kept, False), (hidden, True)}
    assert set(ids(await client.post(path, json={"include_forgotten": True}))) == {kept, hidden}
    # Reading a forgotten memory does not restore it.
    assert ids(await client.post(path, json={"text": "日落"})) == [kept]


async def test_goals_and_state_sections_on_request(client):
    document = (await client.post(path, json={"include_goals": True, "include_state": True})).json()
    assert document["goals"] == [] and document["state"] == {}


async def test_entry_id_scope_and_validation(host):
    scoped = await host.token("scoped", TokenScope.of_prefix("astrbot:"))
    memory_id = await remember(host, "私聊里提到的生日", entry_id="private:lin", sources=[("private:lin", 9)])
    async with host.client(scoped) as client:
        assert_error(await client.post(path, json={"entry_id": "private:lin"}), 403, "entry_forbidden")
        response = await client.post(path, json={"entry_id": "bad?id"})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == ["body.entry_id"]
        document = (await client.post(path, json={"text": "生日", "entry_id": "astrbot:group-a"})).json()
    (memory,) = document["memories"]
    assert memory["id"] == memory_id
    assert memory["sources"] == [{"entry_id": None, "entry_name": None, "message_id": 9, "occurred_at": None}]


async def test_limits_and_bad_bodies(client, host):
    for index in range(101):
        await remember(host, f"第{index}条记忆", occurred_at=when(1 + index % 20))
    assert len(ids(await client.post(path, json={"limit": 100}))) == 100
    assert len(ids(await client.post(path, json={}))) == 8
    for body in ({"limit": 101}, {"limit": 0}, {"limit": True}, {"time_from": "2026-10-01T00:00:00"},
                 {"kinds": [""]}, {"people": ["x" * 201]}, {"stances": "positive"}, {"include_goals": 1},
                 {"kinds": ["k"] * 101}):
        assert_error(await client.post(path, json=body), 400, "invalid_request")
