"""The sessions surface's checks over real HTTP, in order: Host (400), readiness (503 with
Retry-After), end-user bearer (401), route (404 / 405 / 410 by the legacy knob), body cap
(413); probes without a token; /v1 404; both error dialects; Deprecation headers on /v2."""

from __future__ import annotations

import pytest

from troupe.auth import TokenScope, host_audience
from troupe.http.sessions import (
    LegacyPrefixPolicy,
    deprecation_header_value,
    deprecation_link_value,
    manifest_revision,
    operations,
)

from ._sessions_harness import start_sessions_server

unified_keys = {"contract", "code", "status", "retryAction", "message", "detail"}


def assert_v2_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    document = response.json()
    assert set(document) == {"error"}, document
    error = document["error"]
    assert error["code"] == code and isinstance(error["message"], str) and error["message"]
    assert set(error) <= {"code", "message", "detail"}
    if status in (429, 503):
        assert int(response.headers["retry-after"]) >= 1
    return error


def assert_unified_error(response, status: int, domain_code: str, retry_action: str | None = None) -> dict:
    assert response.status_code == status, response.text
    document = response.json()
    assert set(document) == unified_keys, document
    assert document["contract"] == "unified-v1" and document["status"] == status
    assert document["detail"]["domainCode"] == domain_code
    assert isinstance(document["detail"]["domainStatus"], int)
    if retry_action is not None:
        assert document["retryAction"] == retry_action
    if status in (429, 503):
        assert int(response.headers["retry-after"]) >= 1
    return document


async def test_probes_answer_without_a_token(sessions):
    async with sessions.client() as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).json() == {"status": "ready"}
        sessions.ready[0] = False
        response = await client.get("/readyz")
        assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/openapi.json")).json()["openapi"] == "3.1.0"


async def test_host_header_comes_first_in_each_dialect(sessions):
    sessions.ready[0] = False
    async with sessions.client() as client:
        assert_v2_error(await client.get("/v2/sessions", headers={"Host": "evil.example"}), 400, "bad_host")
        assert_unified_error(await client.get("/api/sessions", headers={"Host": "evil.example"}), 400, "bad_host", "none")
        assert_v2_error(await client.get("/v2/sessions", headers={"Host": "localhost:8787"}), 503, "overloaded")


async def test_readiness_before_the_token_overloaded_then_draining(sessions):
    sessions.ready[0] = False
    async with sessions.client() as client:
        assert_v2_error(await client.get("/v2/sessions"), 503, "overloaded")
        assert_unified_error(await client.get("/api/sessions"), 503, "overloaded", "retry_after")
        sessions.shutdown.set()
        assert_v2_error(await client.post("/v2/sessions", json={}), 503, "draining")
        document = assert_unified_error(await client.post("/api/sessions", json={}), 503, "draining", "retry_after")
        assert document["code"] == "unavailable"


@pytest.mark.parametrize("authorization", [None, "Bearer", "Bearer nope", "Basic abc", "bearer  x y"])
async def test_missing_or_unknown_tokens_answer_401(sessions, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    async with sessions.client() as client:
        response = await client.get("/v2/sessions", headers=headers)
        assert_v2_error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
        assert_unified_error(await client.get("/api/sessions", headers=headers), 401, "unauthorized", "reauthenticate")


async def test_host_tokens_and_revoked_tokens_do_not_open_sessions(sessions):
    host_secret = await sessions.token("bot", scope=TokenScope.all(), audience=host_audience)
    async with sessions.client(host_secret) as client:
        assert_v2_error(await client.get("/v2/sessions/nope"), 401, "unauthorized")
    secret = await sessions.token("phone", "u_1")
    async with sessions.client(secret) as client:
        assert_v2_error(await client.get("/v2/sessions/nope"), 404, "session_not_found")
        await sessions.revoke("phone")
        assert_v2_error(await client.get("/v2/sessions/nope"), 401, "unauthorized")


async def test_the_token_is_checked_before_the_body(sessions):
    async with sessions.client() as client:
        assert_v2_error(await client.post("/v2/sessions", content=b"{not json"), 401, "unauthorized")
        response = await client.post("/v2/sessions", content=b"x" * (2 * 1024 * 1024))
        assert_v2_error(response, 401, "unauthorized")


async def test_retired_and_foreign_paths_are_404_without_a_token(sessions):
    async with sessions.client() as client:
        for path in ("/v1/status", "/v1/sessions", "/v1/approvals/a/credential", "/v3/sdk2/x", "/"):
            assert_v2_error(await client.get(path), 404, "not_found")


async def test_unknown_routes_and_methods_under_the_prefixes(client):
    assert_v2_error(await client.get("/v2/sessions/s_1/nothing"), 404, "not_found")
    assert_unified_error(await client.get("/api/nothing"), 404, "not_found", "none")
    response = await client.put("/v2/sessions/s_1")
    assert_v2_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "DELETE, GET"
    assert_unified_error(await client.post("/api/manifest"), 405, "method_not_allowed")


async def test_v2_responses_carry_deprecation_headers_api_ones_do_not(client):
    for response in (await client.get("/v2/sessions/nope"), await client.get("/v2/nothing")):
        assert response.headers["deprecation"] == deprecation_header_value
        assert response.headers["link"] == deprecation_link_value
        assert "sunset" not in response.headers
    response = await client.get("/api/sessions/nope")
    assert_unified_error(response, 404, "session_not_found", "resume")
    assert "deprecation" not in response.headers and "link" not in response.headers


async def test_sunset_header_when_configured(nursery, tmp_path):
    policy = LegacyPrefixPolicy("readwrite", "Thu, 01 Apr 2027 00:00:00 GMT")
    server = await start_sessions_server(nursery, str(tmp_path / "d"), legacy_policy=policy)
    async with server.client(await server.token("p")) as client:
        response = await client.get("/v2/sessions/nope")
    assert response.headers["sunset"] == "Thu, 01 Apr 2027 00:00:00 GMT"


async def test_readonly_knob_refuses_v2_writes_with_gone(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "d"), legacy_policy=LegacyPrefixPolicy("readonly"))
    async with server.client(await server.token("p")) as client:
        for method, path in (("POST", "/v2/sessions"), ("POST", "/v2/sessions/s_1/messages"),
                             ("DELETE", "/v2/sessions/s_1"), ("POST", "/v2/sessions/s_1/checkpoints/import")):
            response = await client.request(method, path, json={"prompt": "hi"})
            document = assert_unified_error(response, 410, "legacy_prefix_retired", "rediscover")
            assert document["code"] == "gone"
            assert response.headers["deprecation"] == deprecation_header_value
        # Reads still pass the gate; /api writes are unaffected.
        assert_v2_error(await client.get("/v2/sessions/nope"), 404, "session_not_found")
        assert_unified_error(await client.post("/api/sessions/nope/messages", json={"prompt": "x"}), 404, "session_not_found")
        manifest = (await client.get("/api/manifest")).json()
    assert manifest["legacyPrefixes"]["mode"] == "readonly"
    for entry in manifest["operations"]:
        assert ("legacyPath" in entry) == (entry["kind"] == "read")


async def test_off_knob_answers_all_of_v2_404_without_a_token(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "d"), legacy_policy=LegacyPrefixPolicy("off"))
    secret = await server.token("p")
    async with server.client(secret) as client:
        assert_v2_error(await client.get("/v2/sessions"), 404, "not_found")
        assert_v2_error(await client.post("/v2/sessions", json={}), 404, "not_found")
        assert_unified_error(await client.get("/api/sessions/nope"), 404, "session_not_found")
    async with server.client() as client:
        assert_v2_error(await client.get("/v2/sessions/s_1/events"), 404, "not_found")


def test_the_knob_is_read_from_the_environment():
    assert LegacyPrefixPolicy.from_environ({}).mode == "readwrite"
    for mode in ("readwrite", "readonly", "off"):
        assert LegacyPrefixPolicy.from_environ({"TANSR_SERVE_LEGACY_PREFIX": mode.upper()}).mode == mode
    policy = LegacyPrefixPolicy.from_environ({"TANSR_SERVE_LEGACY_SUNSET": "Thu, 01 Apr 2027 00:00:00 GMT"})
    assert policy.sunset == "Thu, 01 Apr 2027 00:00:00 GMT"
    with pytest.raises(ValueError):
        LegacyPrefixPolicy.from_environ({"TANSR_SERVE_LEGACY_PREFIX": "sometimes"})


async def test_manifest_lists_every_operation_with_its_kind(sessions, client):
    assert_v2_error(await client.get("/v2/manifest"), 404, "not_found")
    response = await client.get("/api/manifest")
    assert response.status_code == 200
    manifest = response.json()
    assert manifest["revision"] == manifest_revision
    assert len(manifest["operations"]) == len(operations)
    kinds = {entry["id"]: entry["kind"] for entry in manifest["operations"]}
    assert kinds["sessions.create"] == "write" and kinds["sessions.events"] == "read"
    assert kinds["sessions.checkpoints.export"] == "read" and kinds["sessions.close"] == "write"
    assert all(entry["path"].startswith("/api/sessions") for entry in manifest["operations"])
    assert all(entry["legacyPath"].startswith("/v2/sessions") for entry in manifest["operations"])
    async with sessions.client() as unauthenticated:
        assert_unified_error(await unauthenticated.get("/api/manifest"), 401, "unauthorized")


async def test_rate_limit_seam_answers_429_with_retry_after(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "d"), rate_per_second=0.01, rate_burst=1)
    async with server.client(await server.token("p")) as client:
        assert_v2_error(await client.get("/v2/sessions/nope"), 404, "session_not_found")
        assert_v2_error(await client.get("/v2/sessions/nope"), 429, "rate_limited")
        assert_unified_error(await client.get("/api/sessions/nope"), 429, "rate_limited", "retry_after")


class _CrashingSystem:
    def ref(self, kind, key):
        return self

    async def ask(self, message, timeout=None):
        raise RuntimeError("a bug in a route")

    def tell(self, message):
        raise RuntimeError("a bug in a route")


async def test_a_crashing_route_answers_500_and_the_server_keeps_serving(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "d"), system_override=_CrashingSystem())
    async with server.client(await server.token("p")) as client:
        for _ in range(2):
            assert_v2_error(await client.get("/v2/sessions/s_1"), 500, "internal_error")
            assert_unified_error(await client.get("/api/sessions/s_1"), 500, "internal_error", "backoff")
        assert (await client.get("/healthz")).status_code == 200
