"""POST /api/v1/entries/{entry_id}/prepare over real HTTP: the eight sections and their
defaults, text omitted versus "", every limit at and just over its boundary, known ids,
token budget, source redaction by token scope, other_entries_pending (token-scoped, counts
and UTC bounds only), the recorded recall, and model failures as hints."""

from __future__ import annotations

import trio

from troupe.actors.host import forget_memories, host_memory_indexes
from troupe.actors.host._prepare import _person_memory_ids
from troupe.auth import TokenScope
from troupe.models import Completion

from ._host_harness import message
from ._memory_helpers import delete, fields_of, remember
from .test_checks import assert_error

entry = "astrbot:group-a"
path = f"/api/v1/entries/{entry}/prepare"
sections = {"persona", "memories", "recent_messages", "state", "goals", "hints", "entry_profile", "people"}


async def post_messages(client, entry_id: str, *contents: str, sender: str = "小林") -> list[int]:
    response = await client.post(
        f"/api/v1/entries/{entry_id}/messages",
        json=[message(f"{entry_id}-{index}-{content}", content=content, sender=sender)
              for index, content in enumerate(contents)],
    )
    assert response.status_code == 200, response.text
    return response.json()["message_ids"]


async def test_empty_body_gives_every_section_with_defaults(client, host):
    ids = await post_messages(client, entry, "今晚看星星", "好啊")
    await host.engine.write(lambda connection: connection.execute(
        "UPDATE host_messages SET learning_state = 'learned' WHERE id = ?", (ids[0],)))
    for request in ({"json": {}}, {"content": b""}):
        response = await client.post(path, **request)
        assert response.status_code == 200, response.text
        document = response.json()
        assert sections | {"judgment", "recall_id"} <= set(document)
        assert document["goals"] == [] and document["people"] == [] and document["entry_profile"] is None
        assert document["state"] == {} and document["memories"] == []
        assert [m["id"] for m in document["recent_messages"]] == ids
        assert [m["unlearned"] for m in document["recent_messages"]] == [False, True]
        assert document["recent_messages"][0]["content"] == "今晚看星星"
        assert document["recall_id"].startswith("recall_")
    rows = await host.rows("SELECT token_name, entry_id, expires_at - created_at FROM host_recalls")
    assert rows == [("astrbot-connector", entry, 86400.0)] * 2


async def test_recent_limit_default_20_max_100(client):
    await post_messages(client, entry, *[f"消息{index}" for index in range(105)])
    default = (await client.post(path, json={})).json()["recent_messages"]
    assert len(default) == 20 and default[-1]["content"] == "消息104"
    assert [m["id"] for m in default] == sorted(m["id"] for m in default)
    most = (await client.post(path, json={"recent_limit": 100})).json()["recent_messages"]
    assert len(most) == 100 and most[0]["content"] == "消息5"
    assert (await client.post(path, json={"recent_limit": 0})).json()["recent_messages"] == []
    assert_error(await client.post(path, json={"recent_limit": 101}), 400, "invalid_request")


async def test_every_limit_at_and_over_its_boundary(client):
    accepted = [
        {"memory_limit": 8}, {"memory_limit": 0}, {"token_budget": 1500}, {"goal_limit": 10},
        {"people_limit": 0}, {"people_limit": 3}, {"judge_budget_seconds": 10}, {"judge_budget_seconds": 0.01},
        {"judge": False}, {"participants": []}, {"participants": ["x" * 200]},
        {"participant_names": {f"p{index}": "名" * 200 for index in range(100)}},
        {"known_memory_ids": [1, 2]}, {"text": ""}, {"text": None},
    ]
    for body in accepted:
        response = await client.post(path, json=body)
        assert response.status_code == 200, (body, response.text)
    refused = {
        "memory_limit": 9, "token_budget": 1501, "goal_limit": 11, "recent_limit": -1,
        "people_limit": 4, "judge_budget_seconds": 10.001,
    }
    for name, value in refused.items():
        response = await client.post(path, json={name: value})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == [f"body.{name}"]
    strict = [
        {"people_limit": True}, {"people_limit": 1.0}, {"people_limit": "1"}, {"people_limit": -1},
        {"judge_budget_seconds": 0}, {"judge_budget_seconds": -1}, {"judge": "yes"},
        {"participants": ["x" * 201]}, {"participants": ["  "]}, {"participants": [""]},
        {"participant_names": {f"p{index}": "名" for index in range(101)}},
        {"participant_names": {"k" * 201: "名"}}, {"participant_names": {"k": "名" * 201}},
        {"participant_names": {" ": "名"}}, {"participant_names": {"k": " \t"}},
        {"known_memory_ids": ["1"]}, {"text": 5},
    ]
    for body in strict:
        assert_error(await client.post(path, json=body), 400, "invalid_request")
    assert_error(await client.post(path, json=[]), 400, "invalid_request")
    assert_error(await client.post(path, content=b"{", headers={"content-type": "application/json"}), 400, "invalid_request")


async def test_text_omitted_builds_a_query_but_empty_text_asks_nothing(client, host):
    stars = await remember(host, "小林喜欢在屋顶看星星")
    await post_messages(client, entry, "今晚一起看星星吗")
    omitted = (await client.post(path, json={"participants": []})).json()
    assert [m["id"] for m in omitted["memories"]] == [stars]
    assert omitted["memories"][0]["reason"] == "relevant"
    empty = (await client.post(path, json={"text": "", "participants": []})).json()
    assert empty["memories"] == []
    explicit = (await client.post(path, json={"text": "屋顶", "participants": []})).json()
    assert [m["id"] for m in explicit["memories"]] == [stars]


async def test_memory_fields_known_ids_limits_and_person_highlights(client, host):
    await post_messages(client, entry, "寿司好吃", sender="阿明")
    first = await remember(host, "阿明喜欢寿司", people=["阿明"], stance="positive", lifecycle="active", belief=0.7)
    second = await remember(host, "阿明讨厌寿司里的芥末", people=["阿明"])
    woodwork = await remember(host, "阿明在学木工", people=["阿明"])
    document = (await client.post(path, json={"text": "寿司"})).json()
    by_id = {m["id"]: m for m in document["memories"]}
    assert set(by_id) == {first, second, woodwork}
    assert by_id[woodwork]["reason"] == "person_highlight"  # from the recent sender 阿明
    memory = by_id[first]
    assert (memory["stance"], memory["lifecycle"], memory["belief"], memory["people"]) == ("positive", "active", 0.7, ["阿明"])
    assert memory["reason"] == "relevant" and memory["subject_annotations"] == []
    assert memory["sources"] == [{"entry_id": entry, "entry_name": None, "message_id": 1,
                                  "occurred_at": "2026-10-10T20:00:00+08:00"}]
    known = (await client.post(path, json={"text": "寿司", "known_memory_ids": [first]})).json()
    assert first not in {m["id"] for m in known["memories"]}
    assert len((await client.post(path, json={"text": "寿司", "memory_limit": 1})).json()["memories"]) == 1
    assert (await client.post(path, json={"text": "寿司", "memory_limit": 0})).json()["memories"] == []
    none = (await client.post(path, json={"text": "", "participants": []})).json()
    assert none["memories"] == []
    named = (await client.post(path, json={"text": "", "participants": ["阿明"]})).json()
    assert {m["reason"] for m in named["memories"]} == {"person_highlight"}
    recalled = await host.rows(
        "SELECT memory_id FROM host_recall_memories WHERE recall_id = ? ORDER BY position", named["recall_id"])
    assert [row[0] for row in recalled] == [m["id"] for m in named["memories"]]


async def test_token_budget_skips_whole_memories(client, host):
    long_id = await remember(host, "星" * 1400 + "很长的记忆")
    short_id = await remember(host, "看星星的短记忆")
    full = (await client.post(path, json={"text": "星星", "participants": []})).json()
    assert {m["id"] for m in full["memories"]} == {long_id, short_id}
    tight = (await client.post(path, json={"text": "星星", "participants": [], "token_budget": 100})).json()
    assert [m["id"] for m in tight["memories"]] == [short_id]
    assert tight["memories"][0]["content"] == "看星星的短记忆"
    assert (await client.post(path, json={"text": "星星", "participants": [], "token_budget": 0})).json()["memories"] == []


async def test_sources_outside_the_token_scope_are_nulled(host):
    await host.token("all-scope")
    narrow = await host.token("narrow", TokenScope.of_prefix("astrbot:group-a"))
    memory_id = await remember(host, "两个群都聊到的露营计划", sources=[(entry, 1), ("other:private", 2)])
    async with host.client(narrow) as client:
        document = (await client.post(path, json={"text": "露营", "participants": []})).json()
        assert_error(await client.post("/api/v1/entries/other:private/prepare", json={}), 403, "entry_forbidden")
    (memory,) = document["memories"]
    assert memory["id"] == memory_id and memory["content"] == "两个群都聊到的露营计划"
    assert memory["sources"][0]["entry_id"] == entry
    assert memory["sources"][1] == {"entry_id": None, "entry_name": None, "message_id": 2, "occurred_at": None}


async def test_other_entries_pending_counts_only_entries_in_scope(host):
    everything = await host.token("everything")
    scoped = await host.token("scoped", TokenScope.of_prefix("astrbot:"))
    async with host.client(everything) as client:
        await post_messages(client, entry, "本入口")
        await post_messages(client, "astrbot:group-b", "一", "二")
        host.clock.advance(60)  # apart in time, yet within the standard pace's idle wait
        await post_messages(client, "astrbot:group-c", "三")
        await post_messages(client, "secret:room", "机密")
        learned = await post_messages(client, "astrbot:group-d", "已学")
        await host.engine.write(lambda connection: connection.execute(
            "UPDATE host_messages SET learning_state = 'learned' WHERE id = ?", (learned[0],)))
        wide = (await client.post(path, json={})).json()["hints"]
    async with host.client(scoped) as client:
        narrow = (await client.post(path, json={})).json()["hints"]
    (hint,) = [h for h in narrow if h["code"] == "other_entries_pending"]
    assert set(hint) == {"code", "entry_count", "time_from", "time_to", "time_basis", "message"}
    assert hint["entry_count"] == 2 and hint["time_basis"] == "received_at"
    assert hint["time_from"].endswith("+00:00") and hint["time_to"].endswith("+00:00")
    assert hint["time_from"] < hint["time_to"]
    assert "group" not in str(hint) and "机密" not in str(hint)
    assert [h["entry_count"] for h in wide if h["code"] == "other_entries_pending"] == [3]
    # Only this entry pending: no hint at all.
    lonely = await host.token("lonely", TokenScope.of_entries([entry]))
    async with host.client(lonely) as client:
        hints = (await client.post(path, json={})).json()["hints"]
    assert [h for h in hints if h["code"] == "other_entries_pending"] == []


class FailingModel:
    name = "failing"

    async def complete(self, request):
        raise RuntimeError("provider down")


class SlowModel:
    name = "slow"

    async def complete(self, request):
        await trio.sleep(5)
        raise AssertionError("the judgment budget should have ended this call")


class PickyModel:
    name = "picky"

    def __init__(self, keep):
        self.keep = keep

    async def complete(self, request):
        return Completion(text='{"keep": %s}' % list(self.keep), finish_reason="stop")


async def test_judgment_applied_disabled_and_model_failures_become_hints(client, host):
    kept = await remember(host, "星空摄影的窍门")
    dropped = await remember(host, "星巴克的优惠券")
    body = {"text": "星", "participants": []}
    host.env.model = PickyModel([kept])
    applied = (await client.post(path, json=body)).json()
    assert applied["judgment"]["status"] == "applied"
    assert [m["id"] for m in applied["memories"]] == [kept]
    disabled = (await client.post(path, json={**body, "judge": False})).json()
    assert disabled["judgment"] == {"status": "disabled"}
    assert {m["id"] for m in disabled["memories"]} == {kept, dropped}
    host.env.model = FailingModel()
    failed = await client.post(path, json=body)
    assert failed.status_code == 200
    assert failed.json()["judgment"]["status"] == "degraded"
    assert {m["id"] for m in failed.json()["memories"]} == {kept, dropped}
    assert "judgment_degraded" in [h["code"] for h in failed.json()["hints"]]
    host.env.model = SlowModel()
    with trio.fail_after(4):
        slow = await client.post(path, json={**body, "judge_budget_seconds": 0.2})
    assert slow.status_code == 200 and slow.json()["judgment"]["reason"] == "timeout"


async def test_memories_added_forgotten_or_deleted_after_a_prepare_are_seen_by_the_next(client, host):
    def ids(document):
        return [memory["id"] for memory in document["memories"]]

    body = {"text": "星星", "participants": [], "judge": False}
    first = await remember(host, "小林喜欢看星星")
    assert ids((await client.post(path, json=body)).json()) == [first]
    second = await remember(host, "阿明也数星星")
    assert set(ids((await client.post(path, json=body)).json())) == {first, second}
    index = await host_memory_indexes.index_for(host.engine, host.env.embedder)
    await forget_memories(host.engine, index, [first])
    assert ids((await client.post(path, json=body)).json()) == [second]
    await delete(host, second)
    assert ids((await client.post(path, json=body)).json()) == []
    # Person highlights too: a new memory about a participant shows; a deleted one does not.
    about = await remember(host, "阿明在学木工", people=["阿明"])
    named = {"text": "", "participants": ["阿明"], "judge": False}
    assert ids((await client.post(path, json=named)).json()) == [about]
    await delete(host, about)
    assert ids((await client.post(path, json=named)).json()) == []


async def test_person_highlights_stop_once_enough_are_found(host):
    for person, count in (("甲", 3), ("乙", 3), ("丙", 3)):
        for number in range(count):
            await remember(host, f"{person}的第{number}件事", people=[person, "共同"])
    rows = await host.engine.read(lambda connection: _person_memory_ids(connection, ["甲", "共同", "乙", "丙"], 2, 4))
    # 甲 gives 2; 共同 gives 2 more (distinct): 4 reached, 乙 and 丙 are never read.
    assert len(rows) == 4 and len(set(rows)) == 4
    duplicates = await host.engine.read(lambda connection: _person_memory_ids(connection, ["丙", "共同", "乙"], 2, 3))
    # 共同's newest two are 丙's own: duplicates do not count towards the bound, so 乙 is read.
    assert len(duplicates) == 6 and len(set(duplicates)) == 4
