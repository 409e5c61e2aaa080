"""Recall and the read side over real HTTP: ``/memory/query``, ``/agent/context`` (limits at
and just over each boundary, sensitive items excluded, scope never crossed), preferences,
forget with confirmation (and its 408 / 404), conflicts, insights and the digest."""

from __future__ import annotations

import pytest

from troupe.actors.knowledge import knowledge_indexes

from ._knowledge_harness import assert_error, bill, conversation, wait_until


async def _written(client, knowledge_server, body, *, searchable_by: str | None = None) -> tuple[str, str]:
    evidence_id = (await client.post("/memory/write", json=body)).json()["evidence_id"]

    async def linked():
        row = await knowledge_server.engine.read(lambda connection: connection.execute(
            "SELECT knowledge_id FROM knowledge_links WHERE evidence_id = ?", (evidence_id,)).fetchone())
        return None if row is None else row[0]

    knowledge_id = await wait_until(linked)

    async def held():
        # Recall sees an item once the index holds it (what memory_ready announces), not
        # when its rows commit.
        index = knowledge_indexes.opened(knowledge_server.engine)
        return True if index is not None and index.holds(knowledge_id) else None

    await wait_until(held)

    async def indexed():
        # Structuring commits the link, then refreshes the recall index: reads that search
        # (query, context, forget planning) see the item once the index has it too.
        answer = (await client.post("/memory/query", json={"text": searchable_by})).json()
        return answer["source_knowledge"] == knowledge_id or None

    if searchable_by is not None:
        await wait_until(indexed)
    return evidence_id, knowledge_id


def _context(**extra):
    return {"query": "水电燃气 国家电网", "scope": "shared:home", "session_id": "session-01", "turn_id": "turn-04",
            **extra}


async def test_query_answers_from_the_sources_it_cites(client, knowledge_server):
    evidence_id, knowledge_id = await _written(client, knowledge_server, bill())
    answer = await client.post("/memory/query", json={"text": "国家电网 水电燃气 花了多少钱",
                                                      "context_hint": {"scope": "shared:home", "top_k": 5}})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"answer", "source_evidence", "source_knowledge", "confidence", "latency_ms"}
    assert body["source_knowledge"] == knowledge_id and evidence_id in body["source_evidence"]
    elsewhere = (await client.post("/memory/query", json={"text": "国家电网", "context_hint": {"scope": "user:bob"}})).json()
    assert elsewhere["source_evidence"] == [] and elsewhere["source_knowledge"] is None
    assert_error(await client.post("/memory/query", json={"text": ""}), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/query", json={"text": "x", "context_hint": {"top_k": 21}}),
                 400, "INVALID_REQUEST")


@pytest.mark.parametrize(("field", "good", "bad"), [
    ("top_k", (1, 20), (0, 21)),
    ("max_chars", (64, 16000), (63, 16001)),
])
async def test_agent_context_limits_at_and_just_over_each_boundary(client, field, good, bad):
    for value in good:
        assert (await client.post("/agent/context", json=_context(**{field: value}))).status_code == 200
    for value in bad:
        assert_error(await client.post("/agent/context", json=_context(**{field: value})), 400, "INVALID_REQUEST")


async def test_agent_context_needs_session_and_turn_and_stays_in_budget_and_scope(client, knowledge_server):
    for name in ("session_id", "turn_id"):
        body = _context()
        body.pop(name)
        assert_error(await client.post("/agent/context", json=body), 400, "INVALID_REQUEST")
    evidence_id, knowledge_id = await _written(client, knowledge_server, bill())
    await _written(client, knowledge_server, {"source_type": "MANUAL_CONFIG", "scope": "shared:office",
                                              "raw": {"title": "国家电网 水电燃气 办公室"}})
    full = (await client.post("/agent/context", json=_context())).json()
    assert full["session_id"] == "session-01" and full["turn_id"] == "turn-04"
    assert [item["knowledge_id"] for item in full["items"]] == [knowledge_id]
    item = full["items"][0]
    assert item["version"] == 1 and item["evidence_ids"] == [evidence_id] and item["scope"] == "shared:home"
    assert item["freshness"] == "fresh" and item["conflict_status"] == "none"
    assert len(full["context"]) <= 4000 and not full["truncated"]
    tight = (await client.post("/agent/context", json=_context(max_chars=64))).json()
    assert len(tight["context"]) <= 64 and tight["truncated"]
    stale = (await client.post("/agent/context", json=_context(freshness_seconds=0))).json()
    assert [i["knowledge_id"] for i in stale["items"]] == [knowledge_id]  # labels never filter


async def test_sensitive_items_never_reach_an_agent_context(client, knowledge_server):
    body = {"source_type": "MANUAL_CONFIG", "scope": "user:alice",
            "raw": {"title": "银行卡信息", "note": "银行卡号 6222021234567890123 密码: abc12345"}}
    evidence_id, _ = await _written(client, knowledge_server, body)
    assert (await client.get(f"/evidence/{evidence_id}")).json()["sensitivity"] > 0
    context = (await client.post("/agent/context", json=_context(query="银行卡", scope="user:alice"))).json()
    assert context["items"] == [] and "6222" not in context["context"]


async def test_preferences_are_extracted_listed_and_versioned(client):
    written = (await client.post("/memory/write", json=conversation())).json()
    extracted = await client.post("/preference/extract", json={"evidence_ids": [written["evidence_id"]]})
    assert extracted.status_code == 200, extracted.text
    preferences = extracted.json()["extracted_preferences"]
    assert preferences and preferences[0]["id"].startswith("pref_")
    listed = (await client.get("/preferences", params={"scope": "user:alice"})).json()["preferences"]
    assert {item["id"] for item in listed} >= {preferences[0]["id"]}
    assert (await client.get("/preferences", params={"scope": "shared:home"})).json() == {"preferences": []}
    history = (await client.get(f"/preference/{preferences[0]['id']}/history")).json()
    assert history["current_version"] == 1 and [v["version"] for v in history["history"]] == [1]
    assert_error(await client.get("/preference/pref_nosuch/history"), 404, "NOT_FOUND")
    assert_error(await client.get("/preferences", params={"scope": "nope"}), 400, "INVALID_REQUEST")
    assert_error(await client.post("/preference/extract", json={"evidence_ids": ["evd_nosuch"]}), 404, "NOT_FOUND")
    assert_error(await client.post("/preference/extract", json={"evidence_ids": []}), 400, "INVALID_REQUEST")
    assert_error(await client.post("/preference/extract", json={"evidence_ids": ["e"] * 101}), 400, "INVALID_REQUEST")


async def test_forget_plans_then_removes_for_good(client, knowledge_server):
    evidence_id, knowledge_id = await _written(client, knowledge_server, bill(), searchable_by="国家电网 水电燃气")
    # Asked once, no retry: an item /memory/query cites is one the index holds (the graph list
    # keeps only indexed items), so the forget plan's recall finds it too.
    plan = await client.post("/forget", json={"command": "忘记那张2026年4月家庭支出清单", "confirm": False})
    assert plan.status_code == 200, plan.text
    planned = plan.json()
    assert [target["id"] for target in planned["targets"]] == [knowledge_id]
    assert planned["cascade"]["evidence_count"] == 1 and planned["irreversible"] is True
    done = await client.post("/forget", json={"command": "忘记那张2026年4月家庭支出清单", "confirm": True})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "forgotten"
    assert set(done.json()["forgotten_ids"]) >= {knowledge_id, evidence_id}
    assert_error(await client.get(f"/evidence/{evidence_id}"), 404, "NOT_FOUND")
    answer = (await client.post("/memory/query", json={"text": "国家电网 水电燃气"})).json()
    assert answer["source_knowledge"] is None
    used = {"command": "忘记那张2026年4月家庭支出清单", "confirm": True,
            "confirmation_token": planned["confirmation_token"]}
    assert_error(await client.post("/forget", json=used), 404, "REQUEST_NOT_FOUND")
    assert_error(await client.post("/forget", json={"command": "  ", "confirm": False}), 400, "INVALID_REQUEST")


async def test_an_expired_forget_confirmation_is_408(client, knowledge_server):
    await _written(client, knowledge_server, bill())
    plan = (await client.post("/forget", json={"command": "忘记国家电网", "confirm": False})).json()
    await knowledge_server.engine.write(lambda connection: connection.execute(
        "UPDATE knowledge_forget_requests SET expires_at = 0"))
    confirm = {"command": "忘记国家电网", "confirm": True, "confirmation_token": plan["confirmation_token"]}
    assert_error(await client.post("/forget", json=confirm), 408, "CONFLICT_TIMEOUT")


async def test_conflicts_insights_and_digest(client, knowledge_server):
    await _written(client, knowledge_server, bill(amount=210.0))
    await _written(client, knowledge_server, bill(amount=230.0))
    conflicts = (await client.get("/conflicts")).json()["conflicts"]
    assert conflicts, "a changed amount on the same subject is a conflict"
    assert conflicts[0]["resolution"] == "NEW_WINS" and conflicts[0]["severity"] == "medium"
    assert conflicts[0]["knowledge_title"] == "2026年4月家庭支出清单"
    assert (await client.get("/conflicts", params={"scope": "user:bob"})).json() == {"conflicts": []}
    await _written(client, knowledge_server, {"source_type": "MANUAL_CONFIG", "scope": "user:local",
                                              "raw": {"title": "周末计划", "body": {"text": "周六去图书馆"}}})
    insights = (await client.get("/delivery/insights")).json()["insights"]
    assert [item["title"] for item in insights] == ["周末计划"] and insights[0]["kind"] == "recent"
    for limit in ("1", "10"):
        assert (await client.get("/delivery/insights", params={"limit": limit})).status_code == 200
    for limit in ("0", "11", "x", "2.5"):
        assert_error(await client.get("/delivery/insights", params={"limit": limit}), 400, "INVALID_REQUEST")
    digest = (await client.get("/delivery/digest", params={"date": "2026-08-29"})).json()
    assert digest == {"date": "2026-08-29", "summary": "当日无新记忆"}
    assert (await client.get("/delivery/digest")).status_code == 200
    for day in ("2026-13-01", "2026-02-30", "2026-1-1", "today"):
        assert_error(await client.get("/delivery/digest", params={"date": day}), 400, "INVALID_REQUEST")
