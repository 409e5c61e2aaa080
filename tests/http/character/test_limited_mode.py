"""Limited mode over real HTTP: every route but /health, /shutdown and the two
/internal/storage/startup/* answers 409 with the contract's body; continue and block switch."""

from __future__ import annotations

import pytest

from troupe.http.character import blocking_reason_variable, operations, start_blocked_variable

from ._character_harness import history_body, start_character_server

exempt = {"health", "shutdown", "storage_continue", "storage_block"}
blocked_keys = {"ok", "error_code", "blocking_reason", "limited_mode", "error"}


def example_path(operation) -> str:
    return operation.path.replace("{lanlan_name}", "小天").replace("{query}", "吃")


def assert_blocked(response, reason: str | None = None) -> None:
    assert response.status_code == 409, response.text
    document = response.json()
    assert set(document) == blocked_keys
    assert document["ok"] is False and document["limited_mode"] is True
    assert document["error_code"] == "storage_startup_blocked"
    assert isinstance(document["error"], str) and document["error"]
    assert isinstance(document["blocking_reason"], str) and document["blocking_reason"]
    if reason is not None:
        assert document["blocking_reason"] == reason


@pytest.fixture
async def blocked_server(nursery, tmp_path):
    environ = {start_blocked_variable: "1", blocking_reason_variable: "migrating memory/"}
    return await start_character_server(nursery, str(tmp_path / "data"), environ=environ)


async def test_every_gated_route_answers_409_while_blocked(blocked_server):
    async with blocked_server.client() as client:
        for operation in operations:
            if operation.name in exempt:
                continue
            body = history_body() if operation.body_bytes_max > 65536 else {}
            response = await client.request(operation.method, example_path(operation),
                                            json=body if operation.method == "POST" else None)
            assert_blocked(response, "migrating memory/")
        # The exempt ones still answer.
        health = (await client.get("/health")).json()
        assert health["status"] == "ok"
        assert (await client.post("/shutdown")).json()["status"] == "shutdown_disabled"


async def test_continue_and_block_switch_limited_mode(blocked_server):
    async with blocked_server.client() as client:
        assert_blocked(await client.post("/cache/小天", json=history_body(("user", "hi"))))
        response = await client.post("/internal/storage/startup/continue", json={"reason": "storage ready"})
        assert response.status_code == 200
        document = response.json()
        assert document["ok"] is True and document["initialized"] is True
        assert (await client.post("/cache/小天", json=history_body(("user", "hi")))).json() == {"status": "cached", "count": 1}

        response = await client.post("/internal/storage/startup/block", json={"reason": "upstream failed"})
        assert response.json() == {"ok": True, "limited_mode": True, "reason": "upstream failed"}
        assert_blocked(await client.get("/new_dialog/小天"), "upstream failed")
        # No body at all is fine for both switches.
        assert (await client.post("/internal/storage/startup/continue")).json()["ok"] is True
        assert (await client.get("/new_dialog/小天")).status_code == 200


async def test_a_switch_body_must_be_an_object_with_a_string_reason(blocked_server):
    async with blocked_server.client() as client:
        for body in (b"[1]", b"{not json", b'{"reason": 3}'):
            response = await client.post("/internal/storage/startup/continue", content=body)
            assert response.status_code == 400, body
        assert_blocked(await client.get("/new_dialog/小天"))


async def test_an_unknown_route_is_404_even_while_blocked(blocked_server):
    async with blocked_server.client() as client:
        assert (await client.get("/nothing")).status_code == 404
