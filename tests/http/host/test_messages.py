"""POST /api/v1/entries/{entry_id}/messages over real HTTP: validation and every limit at and
just over its boundary, batch atomicity, dedupe, ids in input order, entry creation settings,
media references, and the per-route body limits counted while streaming."""

from __future__ import annotations

import json

import pytest

from troupe.http.host import messages_body_bytes_max, other_body_bytes_max

from ._host_harness import message, raw_upload
from .test_checks import assert_error

path = "/api/v1/entries/astrbot:group-a/messages"


def fields_of(response) -> list[str]:
    return [problem["field"] for problem in response.json()["error"]["fields"]]


async def test_single_message_and_batch_ids_increase_in_input_order(client, host):
    first = await client.post(path, json=message("one", pace="standard", entry_name="A 群", entry_kind="group"))
    assert first.json() == {"message_ids": [1], "pending_count": 1}
    batch = await client.post(path, json=[message(f"b{index}") for index in range(5)])
    assert batch.json() == {"message_ids": [2, 3, 4, 5, 6], "pending_count": 6}
    other = await client.post("/api/v1/entries/astrbot:group-b/messages", json=message("one"))
    assert other.json() == {"message_ids": [7], "pending_count": 1}
    rows = await host.rows("SELECT id, source, learning_state, received_at > 0, dedupe_key FROM host_messages ORDER BY id")
    assert [row[:4] for row in rows] == [(index, "astrbot-connector", "pending", 1) for index in range(1, 8)]


async def test_the_token_name_is_the_source_not_a_request_host_field(client, host):
    response = await client.post(path, json=message("k", host="someone-else"))
    assert response.status_code == 200
    assert await host.rows("SELECT source FROM host_messages") == [("astrbot-connector",)]
    assert await host.rows("SELECT created_by FROM host_entries") == [("astrbot-connector",)]


async def test_dedupe_returns_the_original_id_and_never_overwrites(client, host):
    original = await client.post(path, json=message("same", content="原文", occurred_at="2026-10-10T20:00:00+08:00"))
    retry = await client.post(path, json=[
        message("new-1"),
        message("same", content="改过的", occurred_at="2027-01-01T00:00:00Z"),
        message("new-1"),
    ])
    assert original.json()["message_ids"] == [1]
    assert retry.json() == {"message_ids": [2, 1, 2], "pending_count": 2}
    rows = await host.rows("SELECT content, occurred_at FROM host_messages WHERE id = 1")
    assert rows == [("原文", "2026-10-10T20:00:00+08:00")]
    # The same key in another entry is another message.
    elsewhere = await client.post("/api/v1/entries/astrbot:group-b/messages", json=message("same"))
    assert elsewhere.json()["message_ids"] == [3]


async def test_one_invalid_message_rejects_the_whole_batch(client, host):
    batch = [message(f"k{index}") for index in range(4)]
    batch[3]["content"] = 5
    del batch[1]["occurred_at"]
    response = await client.post(path, json=batch)
    assert_error(response, 400, "invalid_request")
    assert fields_of(response) == ["body[1].occurred_at", "body[3].content"]
    assert await host.rows("SELECT count(*) FROM host_messages") == [(0,)]
    assert await host.rows("SELECT count(*) FROM host_entries") == [(0,)]


async def test_media_references_are_refused_until_media_exists_and_roll_back_the_batch(client, host):
    await client.post(path, json=message("kept", media_ids=[]))
    response = await client.post(path, json=[message("a"), message("b", media_ids=["m1", "m2"])])
    assert_error(response, 404, "media_not_found")
    assert fields_of(response) == ["body[1].media_ids[0]", "body[1].media_ids[1]"]
    single = await client.post(path, json=message("c", media_ids=["m9"]))
    assert fields_of(single) == ["body.media_ids[0]"]
    assert await host.rows("SELECT dedupe_key FROM host_messages") == [("kept",)]


@pytest.mark.parametrize(
    ("field", "limit"),
    [("sender", 200), ("entry_name", 200), ("account_id", 200), ("scene_identity", 200), ("quote_author", 200),
     ("quote_author_account_id", 200), ("platform", 100), ("entry_kind", 100), ("dedupe_key", 300)],
)
async def test_character_limits_at_and_over_the_boundary(client, field, limit):
    at = {**message("at"), field: "字" * limit}
    over = {**message("over"), field: "字" * (limit + 1)}
    assert (await client.post(path, json=at)).status_code == 200
    response = await client.post(path, json=over)
    assert_error(response, 400, "invalid_request")
    assert fields_of(response) == [f"body.{field}"]


async def test_occurred_at_needs_a_timezone_and_at_most_100_characters(client):
    for value in ("2026-10-10T20:00:00", "yesterday", "", "2026-10-10T20:00:00+08:00" + " " * 80):
        response = await client.post(path, json=message("t", occurred_at=value))
        assert_error(response, 400, "invalid_request")
        assert fields_of(response) == ["body.occurred_at"]
    assert (await client.post(path, json=message("z", occurred_at="2026-10-10T12:00:00Z"))).status_code == 200


@pytest.mark.parametrize("field", ["content", "quote_content"])
async def test_content_byte_limits_413_never_truncated(client, host, field):
    at_limit = "字" * (32768 // 3) + "ab"  # 32768 bytes exactly
    assert len(at_limit.encode()) == 32768
    assert (await client.post(path, json=message("at", **{field: at_limit}))).status_code == 200
    over = at_limit + "c"
    response = await client.post(path, json=[message("x"), message("over", **{field: over})])
    assert_error(response, 413, "payload_too_large")
    assert fields_of(response) == [f"body[1].{field}"]
    assert response.json()["error"]["field"] == f"body[1].{field}"  # the legacy member, kept
    stored = await host.rows(f"SELECT {field} FROM host_messages")
    assert stored == [(at_limit,)]


async def test_required_fields_kinds_and_empty_content(client):
    response = await client.post(path, json={})
    assert_error(response, 400, "invalid_request")
    assert sorted(fields_of(response)) == ["body.content", "body.dedupe_key", "body.occurred_at", "body.sender"]
    assert (await client.post(path, json=message("empty", content=""))).status_code == 200
    for kind in ("message", "self_output", "action_result", "event"):
        assert (await client.post(path, json=message(kind, kind=kind))).status_code == 200
    assert fields_of(await client.post(path, json=message("bad", kind="shout"))) == ["body.kind"]
    assert fields_of(await client.post(path, json=message("n", sender=5))) == ["body.sender"]
    assert fields_of(await client.post(path, json=message(""))) == ["body.dedupe_key"]


async def test_media_ids_at_most_100_and_unique(client):
    over = await client.post(path, json=message("m", media_ids=[f"m{index}" for index in range(101)]))
    assert fields_of(over) == ["body.media_ids"]
    duplicate = await client.post(path, json=message("m", media_ids=["a", "a"]))
    assert fields_of(duplicate) == ["body.media_ids"]
    at_limit = await client.post(path, json=message("m", media_ids=[f"m{index}" for index in range(100)]))
    assert_error(at_limit, 404, "media_not_found")  # valid shape; no such objects yet


async def test_array_of_1_to_1000(client, host):
    assert fields_of(await client.post(path, json=[])) == ["body"]
    too_many = [message(f"k{index}") for index in range(1001)]
    assert fields_of(await client.post(path, json=too_many)) == ["body"]
    response = await client.post(path, json=too_many[:1000])
    assert response.status_code == 200
    assert response.json()["message_ids"] == list(range(1, 1001))
    assert response.json()["pending_count"] == 1000
    assert fields_of(await client.post(path, json="text")) == ["body"]


async def test_pace_is_used_on_creation_only(client, host):
    custom = {"count": 6, "idle_seconds": 30, "max_wait_seconds": 180}
    assert (await client.post(path, json=message("a", pace=custom, entry_name="first"))).status_code == 200
    assert (await client.post(path, json=message("b", pace="relaxed", entry_name="second"))).status_code == 200
    rows = await host.rows("SELECT name, pace_name, pace_count, pace_idle_seconds, pace_max_wait_seconds FROM host_entries")
    assert rows == [("first", None, 6, 30.0, 180.0)]
    bad = await client.post(path, json=message("c", pace={"count": 6, "idle_seconds": 30, "max_wait_seconds": 10}))
    assert fields_of(bad) == ["body.pace.custom"]
    assert fields_of(await client.post(path, json=message("d", pace="warp"))) == ["body.pace"]
    default = await client.post("/api/v1/entries/other/messages", json=message("e"))
    assert default.status_code == 200
    assert await host.rows("SELECT pace_name FROM host_entries WHERE entry_id = 'other'") == [("standard",)]


async def test_bad_json_content_type_and_encoding_are_400(client):
    assert fields_of(await client.post(path, content=b"{", headers={"Content-Type": "application/json"})) == ["body"]
    assert fields_of(await client.post(path, content=b"\xff\xfe", headers={"Content-Type": "application/json"})) == ["body"]
    response = await client.post(path, content=json.dumps(message("k")).encode(), headers={"Content-Type": "text/plain"})
    assert fields_of(response) == ["header.content-type"]


async def test_body_limits_per_route_counted_while_streaming(host):
    secret = await host.token("big")
    auth = {"Authorization": f"Bearer {secret}"}
    # Other writes: 256 KiB, declared or chunked.
    async with host.client(secret) as client:
        response = await client.post("/api/v1/feedback", content=b"x" * (other_body_bytes_max + 1),
                                     headers={"Content-Type": "application/json"})
        assert_error(response, 413, "payload_too_large")
        at_limit = await client.post("/api/v1/feedback", content=b"x" * other_body_bytes_max,
                                     headers={"Content-Type": "application/json"})
        assert_error(at_limit, 400, "invalid_request")  # within the limit: read, then refused as JSON
    # Messages: 64 MiB; a declared length over it is refused before a byte is read, and a
    # chunked body is cut at the limit (Content-Length is not needed, nor trusted).
    declared = await raw_upload(host.port, path, headers=auth, body_bytes=0,
                                declared_bytes=messages_body_bytes_max + 1, chunked=False)
    assert declared.status == 413
    streamed = await raw_upload(host.port, path, headers=auth, body_bytes=messages_body_bytes_max + 512 * 1024,
                                chunked=True, chunk_bytes=1024 * 1024)
    assert streamed.status == 413  # the overshoot is within the lingering-close budget
    assert b'"payload_too_large"' in streamed.response and b"no-store" in streamed.response


async def test_an_early_401_is_read_by_a_client_still_uploading(host):
    outcome = await raw_upload(host.port, path, headers={}, body_bytes=4 * 1024 * 1024, chunked=True)
    assert outcome.status == 401 and outcome.closed_by_server
    assert outcome.body_bytes_sent < 4 * 1024 * 1024
