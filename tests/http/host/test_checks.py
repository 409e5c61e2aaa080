"""The host surface's checks over real HTTP, in the contract's order: Host (400), readiness
(503), token (401), rate (429), entry id (400) and scope (403), then the body; the unified
error body and ``Cache-Control: no-store`` on every response."""

from __future__ import annotations

import pytest

from troupe.auth import TokenScope

from ._host_harness import message

path = "/api/v1/entries/astrbot:group-a/messages"
error_keys = {"code", "message", "fields", "retry_after_seconds", "retry_at"}
optional_error_keys = {"field", "canonical_id"}
"""Members the contract allows on some errors (the legacy ``field`` of a message over its
byte limit; ``canonical_id`` of a merged goal)."""


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error_keys <= set(error), error
    assert set(error) - error_keys <= optional_error_keys, error
    assert error["code"] == code
    assert isinstance(error["fields"], list)
    if status in (429, 503):
        assert isinstance(error["retry_after_seconds"], int) and error["retry_after_seconds"] >= 1
        assert int(response.headers["retry-after"]) == error["retry_after_seconds"]
        assert error["retry_at"].endswith("+00:00")
    else:
        assert error["retry_after_seconds"] is None and error["retry_at"] is None
    return error


async def test_host_header_is_checked_before_readiness_and_token(host):
    host.ready[0] = False
    async with host.client() as client:
        for bad in ("evil.example", "127.0.0.2", "localhost.evil", "[::2]:8080"):
            response = await client.post(path, json=message("k"), headers={"Host": bad})
            assert_error(response, 400, "bad_host")
        # Forwarded headers are never trusted.
        response = await client.post(path, headers={"Host": "evil.example", "X-Forwarded-Host": "localhost"})
        assert_error(response, 400, "bad_host")
        for good in ("127.0.0.1", "localhost:8080", "[::1]:1", "LOCALHOST"):
            response = await client.post(path, json=message("k"), headers={"Host": good})
            assert_error(response, 503, "unavailable")


async def test_readiness_comes_before_the_token(host):
    host.ready[0] = False
    async with host.client() as client:
        assert_error(await client.get("/api/v1/status"), 503, "unavailable")
    host.ready[0] = True
    async with host.client() as client:
        assert_error(await client.get("/api/v1/status"), 401, "unauthorized")


@pytest.mark.parametrize("authorization", [None, "Bearer", "Bearer nope", "Basic abc", "bearer  x y"])
async def test_missing_or_unknown_tokens_answer_401_with_www_authenticate(host, authorization):
    await host.token("astrbot")
    headers = {"Authorization": authorization} if authorization else {}
    async with host.client() as client:
        response = await client.post(path, json=message("k"), headers=headers)
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


async def test_the_token_is_checked_before_the_body_and_the_route(host):
    async with host.client() as client:
        assert_error(await client.post(path, content=b"{not json"), 401, "unauthorized")
        assert_error(await client.get("/api/v1/no-such-route"), 401, "unauthorized")
        # A declared body over the limit is still a 401 first.
        response = await client.post(path, content=b"x" * 10, headers={"Content-Length": "10"})
        assert_error(response, 401, "unauthorized")


async def test_a_revoked_token_answers_401_on_its_next_request(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        assert (await client.post(path, json=message("a"))).status_code == 200
        await host.revoke("astrbot")
        assert_error(await client.post(path, json=message("b")), 401, "unauthorized")


async def test_rate_buckets_are_per_token_with_a_burst_of_60_and_20_per_second(host):
    first = await host.token("first")
    second = await host.token("second")
    async with host.client(first) as client, host.client(second) as other:
        host.clock.freeze()
        statuses = []
        for _ in range(61):
            statuses.append((await client.get("/api/v1/nothing")).status_code)
        assert statuses[:60] == [404] * 60
        error = assert_error(await client.get("/api/v1/nothing"), 429, "rate_limited")
        assert error["retry_after_seconds"] == 1
        # Another token's bucket is untouched.
        assert (await other.get("/api/v1/nothing")).status_code == 404
        # 20 per second: after 0.5 s ten more requests pass, the eleventh does not.
        host.clock.advance(0.5)
        passed = [(await client.get("/api/v1/nothing")).status_code for _ in range(11)]
        assert passed[:10] == [404] * 10 and passed[10] == 429


@pytest.mark.parametrize(
    ("raw_path", "reason"),
    [
        ("/api/v1/entries/%20%20/messages", "all whitespace"),
        ("/api/v1/entries/a%3Fb/messages", "question mark"),
        ("/api/v1/entries/a%23b/messages", "hash"),
        ("/api/v1/entries/a%09b/messages", "tab (Cc)"),
        ("/api/v1/entries/a%7Fb/messages", "DEL (Cc)"),
        ("/api/v1/entries/a%0Ab/messages", "newline (Cc)"),
        ("/api/v1/entries//messages", "empty"),
        ("/api/v1/entries/" + "x" * 201 + "/messages", "201 characters"),
    ],
)
async def test_invalid_entry_ids_answer_400_on_path_entry_id(host, raw_path, reason):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        response = await client.post(raw_path, json=message("k"))
    error = assert_error(response, 400, "invalid_request")
    assert [problem["field"] for problem in error["fields"]] == ["path.entry_id"], reason


async def test_valid_entry_ids_keep_colons_slashes_case_and_200_characters(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        for entry_id, raw in [
            ("x" * 200, "x" * 200),
            ("astrbot:Group-A", "astrbot:Group-A"),
            ("astrbot:group-a", "astrbot:group-a"),
            ("a/b", "a%2Fb"),
            ("星星 群", "%E6%98%9F%E6%98%9F%20%E7%BE%A4"),
        ]:
            response = await client.post(f"/api/v1/entries/{raw}/messages", json=message("k"))
            assert response.status_code == 200, (entry_id, response.text)
    rows = await host.rows("SELECT entry_id FROM host_entries ORDER BY entry_id")
    assert sorted(row[0] for row in rows) == sorted(["x" * 200, "astrbot:Group-A", "astrbot:group-a", "a/b", "星星 群"])


async def test_scopes_all_list_and_literal_prefix(host):
    listed = await host.token("listed", TokenScope.of_entries(["astrbot:a", "qq:b"]))
    prefixed = await host.token("prefixed", TokenScope.of_prefix("as%_"))
    everything = await host.token("everything")
    cases = [
        (listed, "astrbot:a", 200), (listed, "qq:b", 200), (listed, "astrbot:A", 403), (listed, "astrbot:ab", 403),
        (prefixed, "as%_x", 200), (prefixed, "as%_", 200), (prefixed, "asXYx", 403), (prefixed, "as%", 403),
        (everything, "anything:at-all", 200),
    ]
    for secret, entry_id, status in cases:
        async with host.client(secret) as client:
            response = await client.post(f"/api/v1/entries/{entry_id.replace('%', '%25')}/messages", json=message("k"))
        if status == 403:
            assert_error(response, 403, "entry_forbidden")
        else:
            assert response.status_code == 200, (entry_id, response.text)


async def test_the_scope_is_checked_before_the_body(host):
    secret = await host.token("listed", TokenScope.of_entries(["mine"]))
    async with host.client(secret) as client:
        assert_error(await client.post("/api/v1/entries/theirs/messages", content=b"{oops"), 403, "entry_forbidden")
        assert_error(await client.post("/api/v1/entries/mine/messages", content=b"{oops",
                                       headers={"Content-Type": "application/json"}), 400, "invalid_request")


async def test_a_stored_scope_with_a_now_forbidden_character_answers_401(host):
    secret = await host.token("old", TokenScope.of_entries(["fine"]))
    await host.engine.write(lambda connection: connection.execute(
        "UPDATE auth_tokens SET scope_value = ? WHERE name = 'old'", ('["fine", "bad\\tid"]',)))
    async with host.client(secret) as client:
        assert_error(await client.post("/api/v1/entries/fine/messages", json=message("k")), 401, "unauthorized")
    prefix_secret = await host.token("old-prefix", TokenScope.of_prefix("p:"))
    await host.engine.write(lambda connection: connection.execute(
        "UPDATE auth_tokens SET scope_value = 'p#' WHERE name = 'old-prefix'"))
    async with host.client(prefix_secret) as client:
        assert_error(await client.post("/api/v1/entries/p%23x/messages", json=message("k")), 401, "unauthorized")


async def test_unsupported_methods_are_400_with_allow_and_unknown_routes_404(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        for method in ("GET", "PUT", "DELETE", "OPTIONS"):
            response = await client.request(method, path)
            assert_error(response, 400, "method_not_allowed")
            assert response.headers["allow"] == "POST"
            assert "access-control-allow-origin" not in response.headers
        assert_error(await client.get("/api/v1/entries/a/unknown"), 404, "not_found")
        assert_error(await client.get("/nothing-here"), 404, "not_found")


async def test_no_cors_headers_even_when_an_origin_is_sent(host):
    secret = await host.token("astrbot")
    async with host.client(secret) as client:
        response = await client.post(path, json=message("k"), headers={"Origin": "http://evil.example"})
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    assert not [name for name in response.headers if name.lower().startswith("access-control-")]


async def test_openapi_and_offline_docs(host):
    async with host.client() as client:
        document = (await client.get("/openapi.json")).json()
        page = await client.get("/docs")
    assert document["openapi"].startswith("3.1")
    operation = document["paths"]["/api/v1/entries/{entry_id}/messages"]["post"]
    assert operation["summary"] == "接收消息"
    assert "Message" in document["components"]["schemas"]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from the internet


async def test_storage_that_cannot_be_read_or_written_answers_503_on_any_route(host, monkeypatch):
    """An I/O error met by a quart route or by the intake route is the client's 503 with
    Retry-After (retrying is the answer), not a 500; the next request works again."""
    import troupe.http.host._routes_state as state_routes
    from troupe.actors.host import entry_actor_kind
    from troupe.storage import StorageIOError

    secret = await host.token("astrbot")

    async def unreadable(*arguments, **options):
        raise StorageIOError("disk I/O error: injected")

    async with host.client(secret) as client:
        with monkeypatch.context() as patch:
            patch.setattr(state_routes, "current_state", unreadable)
            assert_error(await client.get("/api/v1/state"), 503, "unavailable")
        assert (await client.get("/api/v1/state")).status_code == 200

        ask = host.system.ref(entry_actor_kind().name, "astrbot:group-a").__class__.ask

        async def failing_ask(self, message, timeout=None):
            raise StorageIOError("disk I/O error: injected")

        with monkeypatch.context() as patch:
            patch.setattr(host.system.ref("x", "y").__class__, "ask", failing_ask)
            assert_error(await client.post(path, json=message("k-503")), 503, "unavailable")
        assert host.system.ref("x", "y").__class__.ask is ask
        assert (await client.post(path, json=message("k-503"))).status_code == 200
