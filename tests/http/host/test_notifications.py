"""GET /api/v1/notifications over real HTTP: paging with after/limit (limit at and over 100),
scope filtering before paging and before taking, idempotent taking (first taken_at kept),
cancelled items, the character's time zone, bad parameters changing nothing."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.host import notifications_limit_max, set_character_time_zone
from troupe.auth import TokenScope

from ._events_helpers import (
    cancel_goal_notifications,
    goal_for,
    notifications_path,
    publish_dedup_notice,
    publish_one,
    publish_reminders,
)
from ._host_harness import start_host_server
from .test_checks import assert_error


@pytest.fixture
async def host(nursery, tmp_path):
    server = await start_host_server(nursery, str(tmp_path / "data"), rate_burst=100_000)
    server.clock.freeze()
    return server


def iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(int(wall), tz=datetime.UTC).isoformat(timespec="seconds")


async def test_empty_and_the_item_shape(host):
    secret = await host.token("all")
    async with host.client(secret) as client:
        response = await client.get(notifications_path)
        assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
        assert response.json() == {"items": [], "next_cursor": 0, "has_more": False}
        assert (await client.get(notifications_path, params={"after": 7})).json()["next_cursor"] == 7
        deadline = float(int(host.clock.wall()) + 3600)
        published_at = host.clock.wall()
        identifier = await publish_one(host, 12, content="整理\n出行清单", deadline_at=deadline)
        host.clock.advance(5)
        page = (await client.get(notifications_path, params={"after": 0, "limit": 30})).json()
    assert page == {"items": [{
        "id": identifier, "kind": "goal_reminder", "goal_id": 12, "reminder_kind": "due",
        "deadline_at": iso(deadline), "scheduled_at": iso(deadline), "published_at": iso(published_at),
        "content": "整理\n出行清单", "status": "taken", "taken_at": iso(host.clock.wall()), "cancelled_at": None,
    }], "next_cursor": identifier, "has_more": False}


async def test_paging_and_idempotent_taking(host):
    secret = await host.token("all")
    ids = await publish_reminders(host, [goal_for(goal_id) for goal_id in range(1, 8)])
    async with host.client(secret) as client:
        first = (await client.get(notifications_path, params={"after": 0, "limit": 3})).json()
        assert [item["id"] for item in first["items"]] == ids[:3]
        assert first["next_cursor"] == ids[2] and first["has_more"] is True
        taken_at = first["items"][0]["taken_at"]
        host.clock.advance(60)
        again = (await client.get(notifications_path, params={"after": 0, "limit": 3})).json()
        assert again == first  # the same cursor again: same items, the first taken_at kept
        rest = (await client.get(notifications_path, params={"after": first["next_cursor"], "limit": 100})).json()
        assert [item["id"] for item in rest["items"]] == ids[3:] and rest["has_more"] is False
        assert {item["taken_at"] for item in rest["items"]} == {iso(host.clock.wall())} != {taken_at}
        exact = (await client.get(notifications_path, params={"after": ids[3], "limit": 3})).json()
        assert [item["id"] for item in exact["items"]] == ids[4:] and exact["has_more"] is False
    statuses = await host.rows("SELECT DISTINCT status FROM host_notifications")
    assert statuses == [("taken",)]


async def test_limit_at_and_over_its_maximum(host):
    secret = await host.token("all")
    ids = await publish_reminders(host, [goal_for(goal_id) for goal_id in range(1, notifications_limit_max + 3)])
    async with host.client(secret) as client:
        for bad in ({"limit": notifications_limit_max + 1}, {"limit": 0}, {"limit": "x"}, {"after": -1},
                    {"after": "1.5"}, {"after": "２"}, {"limit": ["1", "2"]}):
            response = await client.get(notifications_path, params=bad)
            error = assert_error(response, 400, "invalid_request")
            assert [problem["field"] for problem in error["fields"]] == [f"query.{next(iter(bad))}"]
        assert await host.rows("SELECT COUNT(*) FROM host_notifications WHERE taken_at IS NOT NULL") == [(0,)]
        page = (await client.get(notifications_path, params={"limit": notifications_limit_max})).json()
        assert len(page["items"]) == notifications_limit_max and page["has_more"] is True
        default = (await client.get(notifications_path)).json()  # default = the maximum
        assert [item["id"] for item in default["items"]] == ids[:notifications_limit_max]
        tail = (await client.get(notifications_path, params={"after": page["next_cursor"]})).json()
        assert [item["id"] for item in tail["items"]] == ids[notifications_limit_max:] and not tail["has_more"]


async def test_scope_filters_before_paging_and_before_taking(host):
    narrow = await host.token("narrow", TokenScope.of_prefix("astrbot:"))
    listed = await host.token("listed", TokenScope.of_entries(["qq:1"]))
    goals = [goal_for(1, entry_id="other:a"), goal_for(2, entry_id="astrbot:a"), goal_for(3, entry_id="other:b"),
             goal_for(4, entry_id=None), goal_for(5, entry_id="qq:1"), goal_for(6, entry_id="astrbot:b")]
    ids = await publish_reminders(host, goals)
    async with host.client(narrow) as client:
        page = (await client.get(notifications_path, params={"limit": 2})).json()
        assert [item["goal_id"] for item in page["items"]] == [2, 4] and page["has_more"] is True
        rest = (await client.get(notifications_path, params={"after": page["next_cursor"], "limit": 2})).json()
        assert [item["goal_id"] for item in rest["items"]] == [6] and rest["has_more"] is False
    taken = await host.rows("SELECT goal_id FROM host_notifications WHERE taken_at IS NOT NULL ORDER BY id")
    assert taken == [(2,), (4,), (6,)]  # nothing outside the scope was marked
    async with host.client(listed) as client:
        page = (await client.get(notifications_path)).json()
        assert [item["goal_id"] for item in page["items"]] == [4, 5]
        assert page["items"][0]["taken_at"] is not None  # the global one was taken before: kept
    assert ids == sorted(ids)


async def test_cancelled_items_stay_cancelled_and_dedup_notices_are_pulled(host):
    secret = await host.token("all")
    kept = await publish_one(host, 1)
    cancelled = await publish_one(host, 2)
    notice = await publish_dedup_notice(host, 3)
    await cancel_goal_notifications(host, 2)
    async with host.client(secret) as client:
        items = (await client.get(notifications_path)).json()["items"]
    by_id = {item["id"]: item for item in items}
    assert set(by_id) == {kept, cancelled, notice}
    assert by_id[cancelled]["status"] == "cancelled" and by_id[cancelled]["cancelled_at"] is not None
    assert by_id[cancelled]["taken_at"] is not None
    assert by_id[kept]["status"] == "taken" and by_id[notice]["kind"] == "goal_dedup"


async def test_times_in_the_character_time_zone_and_taking_leaves_goals_alone(host):
    secret = await host.token("all")
    await host.engine.write(lambda connection: set_character_time_zone(connection, "Asia/Shanghai"))
    await publish_one(host, 1, deadline_at=1_791_712_800.0)  # 2026-10-11T10:00:00Z
    async with host.client(secret) as client:
        item = (await client.get(notifications_path)).json()["items"][0]
    assert item["deadline_at"] == "2026-10-11T18:00:00+08:00"
    assert item["published_at"].endswith("+08:00") and item["taken_at"].endswith("+08:00")
    assert await host.rows("SELECT COUNT(*) FROM host_goals") == [(0,)]
