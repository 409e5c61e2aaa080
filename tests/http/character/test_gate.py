"""The character gate over real HTTP, in its order: Host (400), Origin (403), route (404 /
405), character name (400), body limit (413, at and just over each route's limit)."""

from __future__ import annotations

import json

import pytest

from troupe.actors.character import character_name_characters_max
from troupe.http.character import control_body_bytes_max, history_body_bytes_max, match_route

from ._character_harness import history_body


def assert_detail(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    document = response.json()
    assert set(document) == {"detail"}, document
    assert isinstance(document["detail"], str) and document["detail"]
    return document["detail"]


async def test_a_non_loopback_host_is_refused(client):
    assert_detail(await client.get("/health", headers={"Host": "evil.example"}), 400)
    assert_detail(await client.post("/cache/小天", json=history_body(), headers={"Host": "evil.example:48912"}), 400)
    for host in ("localhost:48912", "127.0.0.1", "[::1]:1"):
        assert (await client.get("/health", headers={"Host": host})).status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "https://127.0.0.1.evil.example",
                                    "file://", "http://user@127.0.0.1"])
async def test_a_non_loopback_origin_is_refused(client, origin):
    assert_detail(await client.get("/health", headers={"Origin": origin}), 403)
    assert_detail(await client.post("/cache/小天", json=history_body(), headers={"Origin": origin}), 403)


async def test_loopback_origins_pass(client):
    for origin in ("http://localhost:5173", "http://127.0.0.1:48911", "https://[::1]"):
        assert (await client.get("/health", headers={"Origin": origin})).status_code == 200


async def test_unknown_routes_are_404_and_wrong_methods_405(client):
    assert assert_detail(await client.get("/nothing"), 404) == "Not Found"
    assert_detail(await client.get("/cache/a/b"), 404)  # a literal slash is another path
    assert_detail(await client.post("/v1/cache/a", json={}), 404)
    response = await client.get("/cache/小天")
    assert_detail(response, 405)
    assert response.headers["allow"] == "POST"
    response = await client.post("/health")
    assert_detail(response, 405)
    assert response.headers["allow"] == "GET"


@pytest.mark.parametrize("raw", ["", "%01a", "a%2Fb", "a%5Cb", "%2E%2E", "a..b", "%20a", "a%20", "%FF",
                                 "x" * (character_name_characters_max + 1)])
async def test_invalid_names_are_400(client, raw):
    detail = assert_detail(await client.get(f"/get_recent_history/{raw}"), 400)
    assert detail.startswith("Invalid lanlan_name")
    assert_detail(await client.post(f"/cache/{raw}", json=history_body()), 400)
    assert_detail(await client.get(f"/search_for_memory/{raw}/q"), 400)


async def test_a_name_at_the_length_limit_and_encoded_names_are_accepted(client):
    longest = "x" * character_name_characters_max
    assert (await client.get(f"/get_recent_history/{longest}")).status_code == 200
    assert (await client.get("/get_recent_history/%E5%B0%8F%E5%A4%A9")).status_code == 200  # 小天
    assert (await client.get("/get_recent_history/a.b c")).status_code == 200


def test_match_route_decodes_each_raw_segment():
    route = match_route("POST", "/cache/a%2Fb")
    assert route is not None and route.character_name == "a/b"
    assert match_route("POST", "/cache/a/b") is None
    route = match_route("GET", "/search_for_memory/%E5%B0%8F/%E5%90%83")
    assert route is not None and route.values == {"lanlan_name": "小", "query": "吃"}
    assert match_route("GET", "/cache/x").operation is None  # wrong method: 405


def _padded(document: dict, size: int) -> bytes:
    """``document`` plus a ``pad`` member, encoded to exactly ``size`` bytes."""
    base = json.dumps({**document, "pad": ""}).encode()
    return json.dumps({**document, "pad": "x" * (size - len(base))}).encode()


async def test_control_body_limit_at_and_over(client):
    at_limit = _padded({"query": None}, control_body_bytes_max)
    assert len(at_limit) == control_body_bytes_max
    response = await client.post("/query_memory/小天", content=at_limit, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    over = _padded({"query": None}, control_body_bytes_max + 1)
    assert_detail(await client.post("/query_memory/小天", content=over), 413)


async def test_history_body_limit_at_and_over(client):
    at_limit = _padded(history_body(("user", "你好")), history_body_bytes_max)
    response = await client.post("/cache/小天", content=at_limit, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json() == {"status": "cached", "count": 1}
    over = _padded(history_body(("user", "你好")), history_body_bytes_max + 1)
    assert_detail(await client.post("/cache/小天", content=over), 413)
    # Nothing of the refused body was applied.
    history = (await client.get("/get_recent_history/小天")).json()
    assert history.count("你好") == 1


async def test_a_chunked_body_over_the_limit_is_refused(character_server):
    from tests.http._harness import chunked_upload

    outcome = await chunked_upload(character_server.port, "/query_memory/a")
    assert outcome.status == 413 and outcome.closed_by_server
