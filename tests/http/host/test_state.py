"""GET/PUT/PATCH/DELETE /api/v1/state over real HTTP: the lifecycle, same activity keeping its
start, the start-time basis, heartbeats, null deleting a detail with per-detail update times,
possibly_stale, ``{}`` when idle, history kept, scope rules, validation and the body limit."""

from __future__ import annotations

import datetime
import json

import pytest

from troupe.actors.host import current_state, state_details_max, state_stale_seconds
from troupe.auth import TokenScope
from troupe.http.host import state_body_bytes_max

from ._host_harness import start_host_server
from .test_checks import assert_error

state_path = "/api/v1/state"


@pytest.fixture
async def host(nursery, tmp_path):
    return await start_host_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def client(host):
    host.clock.freeze()
    secret = await host.token("astrbot-connector")
    async with host.client(secret) as client:
        yield client


def iso(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, tz=datetime.UTC).isoformat(timespec="seconds")


def fields_of(response) -> list[str]:
    return [problem["field"] for problem in response.json()["error"]["fields"]]


async def test_idle_reads_heartbeats_and_ends_are_empty_objects(client, host):
    assert (await client.get(state_path)).json() == {}
    assert (await client.patch(state_path, json={})).json() == {}
    assert (await client.patch(state_path, json={"details": {"a": 1}, "mood": "好"})).json() == {}
    response = await client.delete(state_path)
    assert response.status_code == 200 and response.json() == {}
    assert response.headers["cache-control"] == "no-store"
    assert (await client.get(state_path)).json() == {}
    assert await current_state(host.engine, now=host.clock.wall()) == {}


async def test_put_starts_and_the_same_activity_keeps_its_start_time(client, host):
    start = host.clock.wall()
    first = await client.put(state_path, json={"activity": "看书", "details": {"book": "三体"}, "mood": "平静"})
    assert first.status_code == 200, first.text
    assert first.json() == {
        "activity": "看书", "details": {"book": {"value": "三体", "updated_at": iso(start)}}, "mood": "平静",
        "entry_id": None, "started_at": iso(start), "start_time_basis": "first_report",
        "updated_at": iso(start), "duration_seconds": 0, "possibly_stale": False,
    }
    host.clock.advance(120)
    same = (await client.put(state_path, json={"activity": "看书", "details": {"chapter": 3}})).json()
    assert same["started_at"] == iso(start) and same["start_time_basis"] == "first_report"
    assert same["duration_seconds"] == 120 and same["mood"] is None
    assert same["details"] == {"chapter": {"value": 3, "updated_at": iso(start + 120)}}  # PUT replaces details
    host.clock.advance(30)
    other = (await client.put(state_path, json={"activity": "散步"})).json()
    assert other["started_at"] == iso(start + 150) and other["duration_seconds"] == 0 and other["details"] == {}
    assert (await client.get(state_path)).json() == other


async def test_start_time_basis_host_when_started_at_is_given(client, host):
    started = float(int(host.clock.wall())) - 600
    local = datetime.datetime.fromtimestamp(started, tz=datetime.timezone(datetime.timedelta(hours=8)))
    response = await client.put(state_path, json={"activity": "做饭", "started_at": local.isoformat()})
    body = response.json()
    assert body["start_time_basis"] == "host" and body["started_at"] == iso(started)
    assert body["duration_seconds"] == 600
    # The same activity without started_at keeps the host's start and basis.
    kept = (await client.put(state_path, json={"activity": "做饭"})).json()
    assert kept["start_time_basis"] == "host" and kept["started_at"] == iso(started)
    for bad in ("2026-10-10T20:00:00", "soon", 5):
        response = await client.put(state_path, json={"activity": "做饭", "started_at": bad})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == ["body.started_at"]


async def test_patch_merges_details_null_deletes_and_each_detail_keeps_its_time(client, host):
    start = host.clock.wall()
    await client.put(state_path, json={"activity": "看书", "details": {"book": "三体", "page": 1}, "mood": "平静"})
    host.clock.advance(60)
    patched = (await client.patch(state_path, json={"details": {"page": 42, "snack": "瓜子"}})).json()
    assert patched["details"] == {
        "book": {"value": "三体", "updated_at": iso(start)},
        "page": {"value": 42, "updated_at": iso(start + 60)},
        "snack": {"value": "瓜子", "updated_at": iso(start + 60)},
    }
    assert patched["activity"] == "看书" and patched["mood"] == "平静" and patched["updated_at"] == iso(start + 60)
    host.clock.advance(60)
    deleted = (await client.patch(state_path, json={"details": {"book": None, "never-there": None}, "mood": "开心"})).json()
    assert set(deleted["details"]) == {"page", "snack"} and deleted["mood"] == "开心"
    assert deleted["details"]["page"]["updated_at"] == iso(start + 60)
    cleared = (await client.patch(state_path, json={"mood": None})).json()
    assert cleared["mood"] is None and set(cleared["details"]) == {"page", "snack"}
    assert cleared["started_at"] == iso(start) and cleared["duration_seconds"] == 120
    for name in ("activity", "started_at"):
        response = await client.patch(state_path, json={name: "x"})
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == [f"body.{name}"]


async def test_heartbeat_keeps_the_activity_and_resets_possibly_stale(client, host):
    start = host.clock.wall()
    await client.put(state_path, json={"activity": "写作", "details": {"topic": "星星"}})
    host.clock.advance(state_stale_seconds)
    assert (await client.get(state_path)).json()["possibly_stale"] is False
    host.clock.advance(1)
    stale = (await client.get(state_path)).json()
    assert stale["possibly_stale"] is True and stale["duration_seconds"] == state_stale_seconds + 1
    beat = (await client.patch(state_path, json={})).json()
    assert beat["possibly_stale"] is False and beat["activity"] == "写作"
    assert beat["updated_at"] == iso(start + state_stale_seconds + 1) and beat["started_at"] == iso(start)
    assert beat["details"]["topic"]["updated_at"] == iso(start)


async def test_delete_ends_the_activity_and_keeps_the_report_history(client, host):
    await client.put(state_path, json={"activity": "看书"})
    await client.patch(state_path, json={"details": {"page": 3}})
    await client.patch(state_path, json={})  # a heartbeat is not a report in the history
    ended = await client.request("DELETE", state_path, json={"entry_id": "astrbot:group-a"})
    assert ended.status_code == 200 and ended.json() == {}
    assert (await client.get(state_path)).json() == {}
    history = await host.rows("SELECT operation, activity, entry_id, source FROM host_state_reports ORDER BY id")
    assert history == [("put", "看书", None, "astrbot-connector"), ("patch", "看书", None, "astrbot-connector"),
                       ("delete", "看书", "astrbot:group-a", "astrbot-connector")]
    # A new activity after the end starts afresh.
    again = (await client.put(state_path, json={"activity": "看书"})).json()
    assert again["start_time_basis"] == "first_report"


async def test_validation_of_put(client, host):
    response = await client.put(state_path, json={})
    assert_error(response, 400, "invalid_request")
    assert fields_of(response) == ["body.activity"]
    assert fields_of(await client.put(state_path, json={"activity": "  "})) == ["body.activity"]
    assert fields_of(await client.put(state_path, json={"activity": "a", "details": [1]})) == ["body.details"]
    assert fields_of(await client.put(state_path, json={"activity": "a", "mood": 3})) == ["body.mood"]
    assert fields_of(await client.put(state_path, json={"activity": "a", "entry_id": "a?b"})) == ["body.entry_id"]
    assert fields_of(await client.put(state_path, json={"activity": "a", "details": {"": 1}})) == ["body.details."]
    assert fields_of(await client.put(state_path, json=["activity"])) == ["body"]
    assert fields_of(await client.put(state_path, content=b"{", headers={"Content-Type": "application/json"})) == ["body"]
    assert (await client.get(state_path)).json() == {}


async def test_details_are_bounded(client, host):
    many = {f"k{index}": index for index in range(state_details_max)}
    assert (await client.put(state_path, json={"activity": "a", "details": many})).status_code == 200
    over = await client.patch(state_path, json={"details": {"one-more": 1}})
    assert_error(over, 400, "invalid_request")
    assert fields_of(over) == ["body.details"]
    assert len((await client.get(state_path)).json()["details"]) == state_details_max
    too_many = await client.put(state_path, json={"activity": "a", "details": {**many, "x": 1}})
    assert fields_of(too_many) == ["body.details"]


async def test_entry_scope_and_redaction(host):
    host.clock.freeze()
    narrow = await host.token("narrow", TokenScope.of_entries(["astrbot:a"]))
    wide = await host.token("wide")
    async with host.client(narrow) as client:
        forbidden = await client.put(state_path, json={"activity": "a", "entry_id": "astrbot:b"})
        assert_error(forbidden, 403, "entry_forbidden")
        response = await client.request("DELETE", state_path, json={"entry_id": "astrbot:b"})
        assert_error(response, 403, "entry_forbidden")
        assert (await client.put(state_path, json={"activity": "a", "entry_id": "astrbot:a"})).json()["entry_id"] == "astrbot:a"
    async with host.client(wide) as client:
        assert (await client.put(state_path, json={"activity": "b", "entry_id": "astrbot:b"})).status_code == 200
    async with host.client(narrow) as client:
        seen = (await client.get(state_path)).json()
        assert seen["activity"] == "b" and seen["entry_id"] is None  # the state is shared; the entry is not
    assert (await current_state(host.engine, now=host.clock.wall()))["entry_id"] == "astrbot:b"


async def test_body_limit_and_methods(client, host):
    base = json.dumps({"activity": "a", "mood": ""}).encode()
    at_limit = base[:-2] + b"x" * (state_body_bytes_max - len(base)) + b'"}'
    assert len(at_limit) == state_body_bytes_max
    headers = {"Content-Type": "application/json"}
    assert (await client.put(state_path, content=at_limit, headers=headers)).status_code == 200
    over = at_limit[:-2] + b'x"}'
    assert_error(await client.put(state_path, content=over, headers=headers), 413, "payload_too_large")
    assert_error(await client.patch(state_path, content=b" " * (state_body_bytes_max + 1), headers=headers),
                 413, "payload_too_large")
    response = await client.post(state_path, json={})
    assert_error(response, 400, "method_not_allowed")
    assert set(response.headers["allow"].split(", ")) >= {"GET", "PUT", "PATCH", "DELETE"}
