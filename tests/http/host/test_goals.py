"""POST/GET/PATCH /api/v1/goals over real HTTP: receipts and dedup, host-key retries per bound
host, 403 for global goals with restricted tokens (merges included), validation at and over
every limit (nothing changes), PATCH rules (409s, no content editing), list filters and paging,
goals in prepare/search with their hints, held goals hidden, reminders published once each."""

from __future__ import annotations

import datetime
import json

import pytest
import trio

from troupe.actors.host import (
    goal_list_limit_max,
    goal_people_max,
    goal_person_characters_max,
    host_key_characters_max,
    reminder_minutes_max,
    set_character_time_zone,
)
from troupe.auth import TokenScope
from troupe.http.host import goal_body_bytes_max

from ._host_harness import start_host_server
from .test_checks import assert_error

goals_path = "/api/v1/goals"


@pytest.fixture
async def host(nursery, tmp_path):
    server = await start_host_server(nursery, str(tmp_path / "data"))
    server.clock.freeze()
    return server


@pytest.fixture
async def client(host):
    secret = await host.token("astrbot-connector")
    async with host.client(secret) as client:
        yield client


@pytest.fixture
async def limited(host):
    secret = await host.token("limited", TokenScope.of_prefix("astrbot:"))
    async with host.client(secret) as client:
        yield client


def iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(int(wall), tz=datetime.UTC).isoformat(timespec="seconds")


def fields_of(response) -> list[str]:
    return [problem["field"] for problem in response.json()["error"]["fields"]]


async def goal_rows(host) -> list[tuple]:
    return await host.rows("SELECT * FROM host_goals ORDER BY id")


async def test_create_answers_a_receipt_and_the_list_shows_it(client, host):
    now = host.clock.wall()
    response = await client.post(goals_path, json={
        "content": "整理出行清单", "entry_id": "astrbot:a", "people": ["小林"],
        "deadline": iso(now + 7200), "reminder_minutes": 30, "host_key": "k-1"})
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    receipt = response.json()
    goal = receipt["goal"]
    assert receipt["submitted_id"] == goal["id"] == 1
    assert receipt["dedup"] == {"result": "created", "canonical_id": None, "candidate_id": None,
                                "judgement": "not_needed", "fallback_at": None}
    assert goal | {} == {
        "id": 1, "content": "整理出行清单", "kind": "normal", "people": ["小林"], "entry_id": "astrbot:a",
        "deadline_at": iso(now + 7200), "deadline_is_date": False, "reminder_minutes": 30,
        "near_at": iso(now + 5400), "due_state": "upcoming", "status": "active", "revision": 1,
        "canonical_id": None, "source": "astrbot-connector", "created_at": iso(now), "updated_at": iso(now),
        "completed_at": None, "abandoned_at": None, "dedup_pending": False, "dedup_injectable": True,
        "dedup_fallback_at": None}
    listing = (await client.get(goals_path)).json()
    assert listing == {"items": [goal], "total": 1, "limit": 20, "offset": 0}


async def test_host_key_retries_return_the_first_receipt_per_bound_host(client, host):
    first = await client.post(goals_path, json={"content": "买菜", "entry_id": "astrbot:a", "host_key": "k"})
    host.clock.advance(60)
    again = await client.post(goals_path, json={"content": "别的", "entry_id": "astrbot:b", "host_key": "k"})
    assert again.status_code == 201 and again.json() == first.json()
    assert len(await goal_rows(host)) == 1
    other = await host.token("other-bot")
    async with host.client(other) as other_client:
        separate = await other_client.post(goals_path, json={"content": "别的", "entry_id": "astrbot:b", "host_key": "k"})
    assert separate.json()["goal"]["id"] == 2


async def test_restricted_tokens_get_403_for_global_goals_including_through_a_merge(client, limited, host):
    created = await client.post(goals_path, json={"content": "整理出行清单"})
    assert created.status_code == 201 and created.json()["goal"]["entry_id"] is None
    before = await goal_rows(host)
    assert_error(await limited.post(goals_path, json={"content": "另一件事"}), 403, "entry_forbidden")
    assert_error(await limited.post(goals_path, json={"content": "整理出行清单", "entry_id": "astrbot:a"}),
                 403, "entry_forbidden")
    assert_error(await limited.post(goals_path, json={"content": "x", "entry_id": "other:a"}), 403, "entry_forbidden")
    assert_error(await limited.patch(f"{goals_path}/1", json={"status": "completed"}), 403, "entry_forbidden")
    assert await goal_rows(host) == before
    # Global goals stay readable by every token; other entries' goals are not shown.
    await client.post(goals_path, json={"content": "别人的目标", "entry_id": "other:a"})
    listing = (await limited.get(goals_path)).json()
    assert [item["id"] for item in listing["items"]] == [1] and listing["total"] == 1
    assert_error(await limited.get(goals_path, params={"entry_id": "other:a"}), 403, "entry_forbidden")
    own = await limited.post(goals_path, json={"content": "自己的目标", "entry_id": "astrbot:a"})
    assert own.status_code == 201


async def test_exact_duplicates_merge_into_the_kept_goal(client, host):
    first = (await client.post(goals_path, json={"content": "整理出行清单", "entry_id": "astrbot:a"})).json()
    merged = (await client.post(goals_path, json={"content": "整理 出行清单!", "entry_id": "astrbot:a",
                                                  "people": ["小美"]})).json()
    assert merged["dedup"]["result"] == "merged" and merged["dedup"]["canonical_id"] == first["goal"]["id"]
    assert merged["goal"]["id"] == first["goal"]["id"] and merged["goal"]["people"] == ["小美"]
    submitted = merged["submitted_id"]
    response = await client.patch(f"{goals_path}/{submitted}", json={"status": "completed"})
    error = assert_error(response, 409, "goal_merged")
    assert error["canonical_id"] == first["goal"]["id"]
    statuses = [item["status"] for item in (await client.get(goals_path)).json()["items"]]
    assert statuses == ["active", "merged"]


async def test_validation_at_and_over_every_limit_changes_nothing(client, host):
    ok = {"content": "c", "entry_id": "astrbot:a"}
    at_limits = {
        "people": [f"p{index}" for index in range(goal_people_max)],
        "reminder_minutes": reminder_minutes_max, "host_key": "k" * host_key_characters_max,
    }
    assert (await client.post(goals_path, json=ok | at_limits)).status_code == 201
    assert (await client.post(goals_path, json=ok | {"content": "d", "people": ["p" * goal_person_characters_max]})).status_code == 201
    before = await goal_rows(host)
    bad = [
        ({"entry_id": "astrbot:a"}, "body.content"),
        (ok | {"content": "   "}, "body.content"),
        (ok | {"content": 3}, "body.content"),
        (ok | {"kind": "wish"}, "body.kind"),
        (ok | {"people": [f"p{index}" for index in range(goal_people_max + 1)]}, "body.people"),
        (ok | {"people": ["p" * (goal_person_characters_max + 1)]}, "body.people[0]"),
        (ok | {"people": "小林"}, "body.people"),
        (ok | {"deadline": "2026-10-11T18:00:00"}, "body.deadline"),
        (ok | {"deadline": "2026-02-30"}, "body.deadline"),
        (ok | {"deadline": "tomorrow"}, "body.deadline"),
        (ok | {"reminder_minutes": reminder_minutes_max + 1}, "body.reminder_minutes"),
        (ok | {"reminder_minutes": -1}, "body.reminder_minutes"),
        (ok | {"reminder_minutes": True}, "body.reminder_minutes"),
        (ok | {"reminder_minutes": 1.5}, "body.reminder_minutes"),
        (ok | {"host_key": "k" * (host_key_characters_max + 1)}, "body.host_key"),
        (ok | {"host_key": " "}, "body.host_key"),
        (ok | {"entry_id": "a?b"}, "body.entry_id"),
        ([ok], "body"),
    ]
    for body, field in bad:
        response = await client.post(goals_path, json=body)
        assert_error(response, 400, "invalid_request")
        assert field in fields_of(response), (body, response.text)
    assert_error(await client.post(goals_path, content=b"{", headers={"Content-Type": "application/json"}),
                 400, "invalid_request")
    assert await goal_rows(host) == before


async def test_body_limit_is_32768_bytes(client, host):
    body = json.dumps({"content": "c", "entry_id": "astrbot:a"}).encode()
    at_limit = body[:-1] + b" " * (goal_body_bytes_max - len(body)) + b"}"
    assert len(at_limit) == goal_body_bytes_max
    headers = {"Content-Type": "application/json"}
    assert (await client.post(goals_path, content=at_limit, headers=headers)).status_code == 201
    over = at_limit[:-1] + b" }"
    assert_error(await client.post(goals_path, content=over, headers=headers), 413, "payload_too_large")
    assert_error(await client.patch(f"{goals_path}/1", content=over, headers=headers), 413, "payload_too_large")
    assert len(await goal_rows(host)) == 1


async def test_patch_completes_abandons_reschedules_and_never_edits_content(client, host):
    now = host.clock.wall()
    await client.post(goals_path, json={"content": "整理出行清单", "entry_id": "astrbot:a", "deadline": iso(now + 7200)})
    refused = await client.patch(f"{goals_path}/1", json={"content": "改正文", "status": "completed"})
    assert_error(refused, 400, "invalid_request")
    assert fields_of(refused) == ["body.content"]
    for body, field in (({"status": "active"}, "body.status"), ({"reminder_minutes": reminder_minutes_max + 1}, "body.reminder_minutes"),
                        ({"expected_revision": 0}, "body.expected_revision"), ({"deadline": "soon"}, "body.deadline")):
        response = await client.patch(f"{goals_path}/1", json=body)
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == [field]
    assert_error(await client.patch(f"{goals_path}/abc", json={}), 400, "invalid_request")
    assert_error(await client.patch(f"{goals_path}/99", json={"status": "completed"}), 404, "not_found")
    conflict = await client.patch(f"{goals_path}/1", json={"expected_revision": 2, "reminder_minutes": 5})
    assert_error(conflict, 409, "revision_conflict")
    moved = await client.patch(f"{goals_path}/1", json={"expected_revision": 1, "deadline": iso(now + 3600),
                                                        "reminder_minutes": 5})
    assert moved.status_code == 200, moved.text
    assert moved.json()["revision"] == 2 and moved.json()["deadline_at"] == iso(now + 3600)
    assert moved.json()["near_at"] == iso(now + 3300)
    done = (await client.patch(f"{goals_path}/1", json={"status": "completed"})).json()
    assert done["status"] == "completed" and done["completed_at"] == iso(now) and done["revision"] == 3
    assert (await client.patch(f"{goals_path}/1", json={"status": "completed"})).json() == done
    assert_error(await client.patch(f"{goals_path}/1", json={"status": "abandoned"}), 400, "invalid_request")
    assert await host.rows("SELECT name FROM reminders WHERE kind = 'host_goals'") == []
    await client.post(goals_path, json={"content": "别的", "entry_id": "astrbot:a"})
    dropped = (await client.patch(f"{goals_path}/2", json={"status": "abandoned"})).json()
    assert dropped["status"] == "abandoned" and dropped["abandoned_at"] == iso(now)


async def test_list_filters_and_paging(client, host):
    now = host.clock.wall()
    await client.post(goals_path, json={"content": "没有截止", "entry_id": "astrbot:a"})
    await client.post(goals_path, json={"content": "很快截止", "entry_id": "astrbot:b", "deadline": iso(now + 600),
                                        "reminder_minutes": 30})
    await client.post(goals_path, json={"content": "已过截止", "deadline": iso(now - 60)})
    await client.post(goals_path, json={"content": "下周的事", "entry_id": "astrbot:a", "deadline": iso(now + 7 * 86400)})
    await client.post(goals_path, json={"content": "要问问吗", "kind": "question", "entry_id": "astrbot:a"})
    await client.patch(f"{goals_path}/4", json={"status": "completed"})

    async def ids(**params) -> list[int]:
        response = await client.get(goals_path, params=params)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    assert await ids(due="none") == [1, 5]
    assert await ids(due="near") == [2]
    assert await ids(due="overdue") == [3]
    assert await ids(due="upcoming") == [4]
    assert await ids(status="completed") == [4]
    assert await ids(status="active", kind="question") == [5]
    assert await ids(entry_id="astrbot:a") == [1, 4, 5]
    assert await ids(limit="2", offset="1") == [2, 3]
    page = (await client.get(goals_path, params={"limit": str(goal_list_limit_max), "offset": "4"})).json()
    assert [item["id"] for item in page["items"]] == [5] and page["total"] == 5 and page["limit"] == goal_list_limit_max
    for params, field in (({"limit": str(goal_list_limit_max + 1)}, "query.limit"), ({"limit": "0"}, "query.limit"),
                          ({"offset": "-1"}, "query.offset"), ({"status": "done"}, "query.status"),
                          ({"kind": "x"}, "query.kind"), ({"due": "soon"}, "query.due"),
                          ({"entry_id": "a#b"}, "query.entry_id")):
        response = await client.get(goals_path, params=params)
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == [field]


async def test_goals_in_prepare_and_search_with_hints(client, host):
    now = host.clock.wall()
    await host.engine.write(lambda connection: set_character_time_zone(connection, "Asia/Shanghai"))
    await client.post(goals_path, json={"content": "整理出行清单", "entry_id": "astrbot:a", "deadline": iso(now + 600),
                                        "reminder_minutes": 30})
    await client.post(goals_path, json={"content": "全局的打算"})
    await client.post(goals_path, json={"content": "另一个入口的事", "entry_id": "astrbot:b"})
    await client.patch(f"{goals_path}/2", json={"reminder_minutes": 10})
    prepared = (await client.post("/api/v1/entries/astrbot:a/prepare", json={"text": ""})).json()
    goals = prepared["goals"]
    assert [goal["id"] for goal in goals] == [1, 2]
    assert goals[0]["deadline_at"].endswith("+08:00")
    assert [hint["code"] for hint in goals[0]["hints"]] == ["deadline_near"]
    assert [hint["code"] for hint in goals[1]["hints"]] == ["basis_changed"]
    limited = (await client.post("/api/v1/entries/astrbot:a/prepare", json={"text": "", "goal_limit": 1})).json()
    assert [goal["id"] for goal in limited["goals"]] == [1]
    searched = (await client.post("/api/v1/memories/search", json={"text": "", "include_goals": True})).json()
    assert [goal["id"] for goal in searched["goals"]] == [1, 3, 2]  # soonest deadline, then newest
    scoped = (await client.post("/api/v1/memories/search", json={"include_goals": True, "entry_id": "astrbot:b"})).json()
    assert [goal["id"] for goal in scoped["goals"]] == [3, 2]
    assert "goals" not in (await client.post("/api/v1/memories/search", json={})).json()
    host.clock.advance(601)
    again = (await client.post("/api/v1/entries/astrbot:a/prepare", json={"text": ""})).json()
    assert [hint["code"] for hint in again["goals"][0]["hints"]] == ["deadline_passed"]


async def test_held_possible_duplicates_are_listed_but_not_injected_until_the_fallback(client, host):
    await client.post(goals_path, json={"content": "周六整理出行清单和护照", "entry_id": "astrbot:a"})
    held = (await client.post(goals_path, json={"content": "周六整理出行清单和签证", "entry_id": "astrbot:a"})).json()
    goal = held["goal"]
    assert held["dedup"]["result"] == "possible_duplicate" and held["dedup"]["judgement"] == "pending"
    assert goal["dedup_pending"] and not goal["dedup_injectable"]
    assert goal["dedup_fallback_at"] == iso(host.clock.wall() + 1800)
    assert [item["id"] for item in (await client.get(goals_path)).json()["items"]] == [1, 2]
    prepared = (await client.post("/api/v1/entries/astrbot:a/prepare", json={"text": ""})).json()
    assert [item["id"] for item in prepared["goals"]] == [1]
    host.clock.advance(1800)
    with trio.fail_after(5):
        while True:
            prepared = (await client.post("/api/v1/entries/astrbot:a/prepare", json={"text": ""})).json()
            if len(prepared["goals"]) == 2:
                break
            await trio.sleep(0.05)
    released = [item for item in prepared["goals"] if item["id"] == goal["id"]][0]
    assert released["dedup_pending"] and released["dedup_injectable"]
    assert [hint["code"] for hint in released["hints"]] == ["dedup_pending"]


async def test_reminders_are_published_once_each_and_cancelled_on_completion(client, host):
    now = host.clock.wall()
    await client.post(goals_path, json={"content": "整理出行清单", "entry_id": "astrbot:a", "deadline": iso(now + 3600),
                                        "reminder_minutes": 30})
    await client.post(goals_path, json={"content": "去银行", "entry_id": "astrbot:a", "deadline": iso(now + 3600),
                                        "reminder_minutes": 0})
    host.clock.advance(1801)

    async def published(count: int) -> list[tuple]:
        with trio.fail_after(5):
            while len(rows := await host.rows(
                    "SELECT id, goal_id, reminder_kind, status FROM host_notifications ORDER BY id")) < count:
                await trio.sleep(0.05)
        return rows

    assert await published(1) == [(1, 1, "near", "pending")]
    await client.patch(f"{goals_path}/1", json={"status": "completed"})
    host.clock.advance(1800)
    rows = await published(2)
    await trio.sleep(1.2)
    assert await host.rows("SELECT id, goal_id, reminder_kind, status FROM host_notifications ORDER BY id") == [
        (1, 1, "near", "cancelled"), (2, 2, "due", "pending")]
    assert rows[1] == (2, 2, "due", "pending")
