"""Body caps at and just over each limit (1 MiB default, 20 MiB messages and tool results,
32 MiB checkpoint import and audio), declared and chunked; invalid JSON; validation; checks
the HTTP layer makes before asking an actor (endUser.id, cwd without a policy)."""

from __future__ import annotations

import pytest

from troupe.http.sessions import (
    client_tools_max,
    default_body_bytes_max,
    import_body_bytes_max,
    large_body_bytes_max,
)

from .test_gate import assert_unified_error, assert_v2_error

# Paths whose session id is one troupe never issues: the route answers 404 session_not_found
# right after the body cap, so these tests need no session actor.
capped = [
    ("/v2/sessions", default_body_bytes_max, 400, "invalid_json"),
    ("/v2/sessions/nope/messages", large_body_bytes_max, 404, "session_not_found"),
    ("/v2/sessions/nope/tool-results/c1", large_body_bytes_max, 404, "session_not_found"),
    ("/v2/sessions/nope/checkpoints/import", import_body_bytes_max, 404, "session_not_found"),
    ("/v2/sessions/nope/audio/transcriptions", import_body_bytes_max, 404, "session_not_found"),
    ("/v2/sessions/nope/audio/speech", import_body_bytes_max, 404, "session_not_found"),
    ("/v2/sessions/nope/permission/r1", default_body_bytes_max, 404, "session_not_found"),
]


@pytest.mark.parametrize(("path", "limit", "status", "code"), capped)
async def test_declared_bodies_at_and_just_over_the_cap(client, path, limit, status, code):
    at_limit = await client.post(path, content=b"x" * limit)
    assert_v2_error(at_limit, status, code)
    over = await client.post(path, content=b"x" * (limit + 1))
    assert_v2_error(over, 413, "payload_too_large")
    assert over.headers["deprecation"]  # still a /v2 response


async def test_chunked_bodies_over_the_cap_and_the_unified_dialect(client):
    async def chunks(total: int):
        sent = 0
        while sent < total:
            size = min(64 * 1024, total - sent)
            sent += size
            yield b"x" * size

    assert_v2_error(await client.post("/v2/sessions", content=chunks(default_body_bytes_max + 1)), 413, "payload_too_large")
    response = await client.post("/api/sessions", content=chunks(default_body_bytes_max + 1))
    assert_unified_error(response, 413, "payload_too_large", "none")
    assert_v2_error(await client.post("/v2/sessions", content=chunks(default_body_bytes_max)), 400, "invalid_json")


async def test_invalid_json_and_validation_failures(client):
    assert_v2_error(await client.post("/v2/sessions", content=b"{not json"), 400, "invalid_json")
    assert_v2_error(await client.post("/v2/sessions", content=b"\xff\xfe"), 400, "invalid_json")
    assert_unified_error(await client.post("/api/sessions", content=b"[1,"), 400, "invalid_json", "none")
    error = assert_v2_error(await client.post("/v2/sessions", json=[1, 2]), 400, "validation_failed")
    assert error["detail"]["fields"][0]["field"] == "body"
    both = {"resume": {"sessionId": "s_1"}, "fork": {"sessionId": "s_1", "checkpointId": "c"}}
    assert_v2_error(await client.post("/v2/sessions", json=both), 400, "validation_failed")
    error = assert_v2_error(await client.post("/v2/sessions", json={"model": 3}), 400, "validation_failed")
    assert error["detail"]["fields"][0]["field"] == "body.model"


@pytest.mark.parametrize(("tool", "valid"), [
    ({"name": "a", "description": "d"}, True),
    ({"name": "A" + "b" * 63, "description": "d" * 2048, "timeoutMs": 1000}, True),
    ({"name": "a", "description": "d", "timeoutMs": 600_000}, True),
    ({"name": "A" + "b" * 64, "description": "d"}, False),
    ({"name": "1a", "description": "d"}, False),
    ({"name": "a-b", "description": "d"}, False),
    ({"name": "a", "description": ""}, False),
    ({"name": "a", "description": "d" * 2049}, False),
    ({"name": "a", "description": "d", "timeoutMs": 999}, False),
    ({"name": "a", "description": "d", "timeoutMs": 600_001}, False),
])
async def test_client_tool_declarations_at_their_limits(client, tool, valid):
    # endUser.id mismatch is checked after validation, before any actor: a valid body gets 403.
    body = {"clientTools": [tool], "endUser": {"id": "someone-else"}}
    response = await client.post("/v2/sessions", json=body)
    if valid:
        assert_v2_error(response, 403, "forbidden")
    else:
        assert_v2_error(response, 400, "validation_failed")


async def test_client_tool_count_at_and_over_the_cap(client):
    tools = [{"name": f"t{index}", "description": "d"} for index in range(client_tools_max + 1)]
    body = {"clientTools": tools[:client_tools_max], "endUser": {"id": "other"}}
    assert_v2_error(await client.post("/v2/sessions", json=body), 403, "forbidden")
    body = {"clientTools": tools, "endUser": {"id": "other"}}
    assert_v2_error(await client.post("/v2/sessions", json=body), 400, "validation_failed")
    duplicate = {"clientTools": [tools[0], tools[0]]}
    assert_v2_error(await client.post("/v2/sessions", json=duplicate), 400, "validation_failed")


async def test_end_user_mismatch_is_403_and_unknown_keys_are_ignored(client):
    body = {"endUser": {"id": "u_2"}, "somethingNew": {"x": 1}}
    assert_v2_error(await client.post("/v2/sessions", json=body), 403, "forbidden")
    assert_unified_error(await client.post("/api/sessions", json=body), 403, "forbidden", "none")


async def test_cwd_without_a_policy_is_refused(client):
    assert_v2_error(await client.post("/v2/sessions", json={"cwd": "/tmp"}), 400, "cwd_not_allowed")
    assert_v2_error(await client.post("/v2/sessions/s_1/cwd", json={"cwd": "/tmp"}), 400, "cwd_not_allowed")
    assert_v2_error(await client.post("/v2/sessions/s_1/cwd", json={}), 400, "validation_failed")


async def test_query_and_header_validation(client):
    for query in ("limit=0", "limit=201", "limit=x", "offset=-1"):
        assert_v2_error(await client.get(f"/v2/sessions?{query}"), 400, "validation_failed")
    assert_v2_error(await client.get("/v2/sessions/s_1?include=everything"), 400, "validation_failed")
    response = await client.get("/v2/sessions/s_1/events", headers={"Last-Event-ID": "abc"})
    assert_v2_error(response, 400, "validation_failed")
    response = await client.get("/v2/sessions/s_1/events?exclude=" + ",".join(f"p{i}" for i in range(17)))
    assert_v2_error(response, 400, "validation_failed")
