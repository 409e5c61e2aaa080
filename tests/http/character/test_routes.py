"""Every route of the contract over real HTTP: statuses and body shapes, including the 200
``status: "error"`` / ``ok: false`` failures, the 409 / 400 / 500 / 503 the contract names,
and what a crashed actor turn or a full mailbox turns into on each route."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.character import (
    CacheHistory,
    GetPersona,
    LastConversationGap,
    QueryMemory,
    RecordSurfaced,
    Reload,
    ResetConfirmedAt,
)

from ._character_harness import history_body, start_character_server

funnel_counters = {
    "facts_added", "reflections_synthesized", "reflections_confirmed", "reflections_promoted",
    "reflections_merged", "reflections_denied", "reflections_archived", "persona_entries_added",
    "persona_entries_rewritten", "persona_entries_archived",
}
hit_keys = {"id", "text", "tier", "entity", "score", "created_at", "event_start_at", "event_end_at"}


async def test_health_has_the_contract_shape_and_one_instance_id(client):
    first = (await client.get("/health")).json()
    assert set(first) == {"app", "service", "status", "instance_id"}
    assert (first["app"], first["service"], first["status"]) == ("N.E.K.O", "memory", "ok")
    assert first["instance_id"] and (await client.get("/health")).json() == first


async def test_shutdown_is_disabled_by_default(client, character_server):
    response = await client.post("/shutdown")
    assert response.status_code == 200 and response.json()["status"] == "shutdown_disabled"
    assert character_server.shutdown_requests == []


async def test_shutdown_when_enabled(nursery, tmp_path):
    server = await start_character_server(nursery, str(tmp_path / "d"),
                                          environ={"TROUPE_CHARACTER_ENABLE_SHUTDOWN": "1"})
    async with server.client() as client:
        assert (await client.post("/shutdown")).json() == {"status": "shutdown_signal_received"}
    assert server.shutdown_requests == [True]


async def test_cache_process_renew_settle(client):
    assert (await client.post("/cache/小天", json=history_body())).json() == {"status": "cached", "count": 0}
    body = history_body(("user", "我喜欢寿司"), ("assistant", "记住啦"))
    assert (await client.post("/cache/小天", json=body)).json() == {"status": "cached", "count": 2}
    assert (await client.post("/process/小天", json=history_body(("user", "今天下雨")))).json() == {"status": "processed"}
    assert (await client.post("/renew/小天", json=history_body(("user", "回来了")))).json() == {"status": "processed"}
    assert (await client.post("/settle/小天", json=history_body())).json() == {"status": "settled"}
    assert (await client.post("/settle/小天", json=history_body(("user", "没缓存的")))).json() == {"status": "settled"}
    history = (await client.get("/get_recent_history/小天")).json()
    assert isinstance(history, str) and "寿司" in history


@pytest.mark.parametrize("route", ["cache", "process", "renew", "settle"])
async def test_a_malformed_input_history_is_a_200_error_and_nothing_is_written(client, route):
    for text in ("not json", '{"role":"user"}', '[{"role":"robot","content":"x"}]',
                 '[{"role":"user","content":"ok"},{"role":"user","content":3}]'):
        response = await client.post(f"/{route}/小天", json={"input_history": text})
        assert response.status_code == 200
        document = response.json()
        assert document["status"] == "error" and isinstance(document["message"], str), document
    assert "ok" not in (await client.get("/get_recent_history/小天")).json()


async def test_a_history_body_of_the_wrong_shape_is_400(client):
    for content in (b"", b"[]", b"{bad", b'{"input_history": ["a"]}', b"{}"):
        response = await client.post("/cache/小天", content=content)
        assert response.status_code == 400 and set(response.json()) == {"detail"}, content


async def test_history_routes_answer_status_error_when_the_turn_crashes(client, character_server):
    character_server.faults[CacheHistory] = "crash"
    response = await client.post("/cache/小天", json=history_body(("user", "x")))
    assert response.status_code == 200
    assert response.json() == {"status": "error", "message": "internal error"}


async def test_backpressure_is_503_with_retry_after(client, character_server):
    character_server.faults[CacheHistory] = "overloaded"
    response = await client.post("/cache/小天", json=history_body(("user", "x")))
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 2
    assert set(response.json()) == {"detail"}


async def test_new_dialog_is_text_plain_and_empty_for_unknown(client):
    response = await client.get("/new_dialog/没人")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert response.text == ""
    await client.post("/cache/小天", json=history_body(("user", "我喜欢寿司")))
    response = await client.get("/new_dialog/小天")
    assert response.headers["content-type"].startswith("text/plain") and "寿司" in response.text


async def test_string_routes(client):
    for path in ("/get_recent_history/没人", "/get_settings/没人", "/search_for_memory/没人/吃什么"):
        response = await client.get(path)
        assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
        assert isinstance(response.json(), str)
    assert "吃什么" in (await client.get("/search_for_memory/小天/吃什么")).json()
    assert isinstance((await client.get("/get_persona/小天")).json(), dict)


async def test_query_memory_shapes(client):
    await client.post("/settle/小天", json=history_body(("user", "我喜欢吃寿司")))
    nothing = (await client.post("/query_memory/小天", json={})).json()
    assert nothing["results"] == [] and {"query", "candidates_total", "elapsed_ms"} <= set(nothing)
    assert (await client.post("/query_memory/小天")).json()["results"] == []  # no body at all
    document = (await client.post("/query_memory/小天", json={"query": "寿司"})).json()
    assert document["query"] == "寿司" and isinstance(document["candidates_total"], int)
    assert isinstance(document["elapsed_ms"], (int, float)) and "error_code" not in document
    for hit in document["results"]:
        assert set(hit) == hit_keys and hit["tier"] in ("fact", "reflection", "fact_archive")
    timed = (await client.post("/query_memory/小天", json={"time": "2026-05-01/2026-05-07"})).json()
    assert timed["time"] == "2026-05-01/2026-05-07"
    assert all(hit["score"] is None for hit in timed["results"])
    bad_time = (await client.post("/query_memory/小天", json={"query": "寿司", "time": "someday"})).json()
    assert bad_time["query"] == "寿司" and "time" not in bad_time
    assert (await client.post("/query_memory/小天", json={"query": 3})).status_code == 400


async def test_query_memory_degrades_without_exception_text(client, character_server):
    character_server.faults[QueryMemory] = "crash"
    response = await client.post("/query_memory/小天", json={"query": "寿司"})
    assert response.status_code == 200
    document = response.json()
    assert document["results"] == [] and document["error_code"] == "hybrid_recall_failed"
    assert document["query"] == "寿司" and "injected" not in response.text


async def test_query_memory_is_503_while_the_stores_are_released(client):
    released = await client.post("/release_character/小天", params={
        "derived_task_claim_token": "op-1", "derived_task_claim_generation": 0,
        "hold_derived_task_admission": "1"})
    assert released.status_code == 200
    response = await client.post("/query_memory/小天", json={"query": "寿司"})
    assert response.status_code == 503 and set(response.json()) == {"detail"}


async def test_last_conversation_gap(client, character_server):
    assert (await client.get("/last_conversation_gap/没人")).json() == {"gap_seconds": -1}
    await client.post("/cache/小天", json=history_body(("user", "hi")))
    gap = (await client.get("/last_conversation_gap/小天")).json()["gap_seconds"]
    assert 0 <= gap < 60
    character_server.faults[LastConversationGap] = "crash"
    response = await client.get("/last_conversation_gap/小天")
    assert response.status_code == 500 and response.json() == {"gap_seconds": -1, "error": "server_error"}


async def test_reflection_routes(client, character_server):
    reflected = (await client.post("/reflect/小天")).json()
    assert set(reflected) == {"reflection", "auto_transitions"} and reflected["auto_transitions"] == 0
    topics = (await client.get("/followup_topics/小天")).json()
    assert set(topics) == {"topics"} and isinstance(topics["topics"], list)
    for body in (None, {}, {"reflection_ids": []}, {"reflection_ids": ["reflection_x"]}):
        response = await client.post("/record_surfaced/小天", json=body)
        assert response.status_code == 200 and response.json() == {"ok": True}
    character_server.faults[RecordSurfaced] = "crash"
    assert (await client.post("/record_surfaced/小天", json={"reflection_ids": ["reflection_x"]})).json() == {"ok": True}
    assert (await client.post("/record_surfaced/小天", json={"reflection_ids": "x"})).status_code == 400
    assert (await client.post("/cancel_correction/小天")).json() == {"status": "no_task"}


async def test_funnel_window_defaults_and_validation(client, character_server):
    document = (await client.get("/api/memory/funnel/小天")).json()
    assert set(document) == {"lanlan_name", "since", "until", "counts"} and document["lanlan_name"] == "小天"
    assert set(document["counts"]) == funnel_counters and all(v == 0 for v in document["counts"].values())
    since = datetime.datetime.fromisoformat(document["since"])
    until = datetime.datetime.fromisoformat(document["until"])
    assert until - since == datetime.timedelta(days=7)
    same = (await client.get("/api/memory/funnel/小天", params={"since": "2026-05-01T00:00:00",
                                                               "until": "2026-05-01T00:00:00"})).json()
    assert same["since"] == same["until"] == "2026-05-01T00:00:00"
    offset = (await client.get("/api/memory/funnel/小天", params={"since": "2026-05-01T08:00:00+08:00",
                                                                 "until": "2026-05-08"})).json()
    assert offset["since"] == "2026-05-01T00:00:00" and offset["until"] == "2026-05-08T00:00:00"
    for params in ({"since": "yesterday"}, {"until": "2026-13-01"},
                   {"since": "2026-05-02T00:00:00", "until": "2026-05-01T23:59:59"}):
        response = await client.get("/api/memory/funnel/小天", params=params)
        assert response.status_code == 400 and set(response.json()) == {"detail"}, params


async def test_funnel_counts_facts_after_a_turn(client):
    await client.post("/settle/小天", json=history_body(("user", "我喜欢吃寿司"), ("assistant", "好的")))
    document = (await client.get("/api/memory/funnel/小天")).json()
    assert all(isinstance(value, int) and value >= 0 for value in document["counts"].values())


async def test_release_character_parameters(client):
    path = "/release_character/小天"
    for params in ({}, {"derived_task_claim_token": "t"}, {"derived_task_claim_generation": 0},
                   {"derived_task_claim_token": "", "derived_task_claim_generation": 0},
                   {"derived_task_claim_token": "t", "derived_task_claim_generation": "x"},
                   {"derived_task_claim_token": "t", "derived_task_claim_generation": -1},
                   {"derived_task_claim_token": "t", "derived_task_claim_generation": 0,
                    "hold_derived_task_admission": "maybe"}):
        response = await client.post(path, params=params)
        assert response.status_code == 400 and set(response.json()) == {"detail"}, params


async def test_release_then_reload_then_replay_is_refused(client):
    params = {"derived_task_claim_token": "op-1", "derived_task_claim_generation": 0,
              "hold_derived_task_admission": "true"}
    response = await client.post("/release_character/小天", params=params)
    assert response.status_code == 200
    assert response.json() == {"status": "success", "character_name": "小天", "cancelled_derived_tasks": 0,
                               "derived_task_claim_token": "op-1"}
    # A retry with the same token is the same success.
    assert (await client.post("/release_character/小天", params=params)).status_code == 200
    reloaded = await client.post("/reload", json={"release_derived_task_claims": {"小天": ["op-1"]}})
    assert reloaded.status_code == 200 and reloaded.json()["status"] == "success"
    assert isinstance(reloaded.json()["message"], str)
    replay = await client.post("/release_character/小天", params=params)
    assert replay.status_code == 409 and replay.json()["status"] == "cancelled"


async def test_reload_bodies(client, character_server):
    assert (await client.post("/reload")).json()["status"] == "success"
    body = {"resume_derived_task_names": ["小天"], "resume_derived_task_generations": [1]}
    assert (await client.post("/reload", json=body)).json()["status"] == "success"
    for bad in ({"resume_derived_task_names": ["小天"]},
                {"resume_derived_task_names": ["小天"], "resume_derived_task_generations": [-1]},
                {"resume_derived_task_names": ["a/b"], "resume_derived_task_generations": [0]},
                {"release_derived_task_claims": {"小天": "op"}},
                {"release_derived_task_claims": ["小天"]}):
        response = await client.post("/reload", json=bad)
        assert response.status_code == 400 and set(response.json()) == {"detail"}, bad
    character_server.faults[Reload] = "crash"
    assert (await client.post("/reload")).json() == {"status": "error", "message": "internal error"}


async def test_reset_confirmed_at(client, character_server):
    assert (await client.post("/internal/memory/reset_confirmed_at")).json() == {"ok": True, "count": 0}
    character_server.faults[ResetConfirmedAt] = "crash"
    response = await client.post("/internal/memory/reset_confirmed_at")
    assert response.status_code == 200 and response.json() == {"ok": False, "error": "internal error", "count": 0}


async def test_a_crash_without_a_contract_failure_body_is_500(client, character_server):
    character_server.faults[GetPersona] = "crash"
    response = await client.get("/get_persona/小天")
    assert response.status_code == 500 and response.json() == {"detail": "Internal Server Error"}


async def test_openapi_and_docs(client):
    document = (await client.get("/openapi.json")).json()
    assert document["openapi"] == "3.1.0"
    assert "/cache/{lanlan_name}" in document["paths"] and "/api/memory/funnel/{lanlan_name}" in document["paths"]
    assert "409" not in document["paths"]["/health"]["get"]["responses"]
    page = await client.get("/docs")
    assert page.headers["content-type"].startswith("text/html") and "http" not in page.text.split("/openapi.json")[0][-200:]
