"""Every error code of the contract's table that troupe can produce, reached over HTTP in the
/v2 envelope (and a few in the unified one), where the other test files do not already reach
it; the codes that cannot occur in troupe are listed in docs/sessions.md with the reason.
Also: ``maxTurns`` capped at the kernel's ``max_turns_limit``, and the
``api.legacy_prefix_mixed`` warning when one session is used through both prefixes."""

from __future__ import annotations

import logging

import pytest
import trio

from troupe.actors.sessions import SessionRefused, SessionSettings, max_turns_limit

from ._sessions_harness import start_sessions_server
from .test_gate import assert_unified_error, assert_v2_error
from .test_recovery import wait_idle


async def open_session(client, **body) -> str:
    response = await client.post("/v2/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


async def test_session_ended_for_input_to_a_closed_session(client):
    session_id = await open_session(client)
    assert (await client.delete(f"/v2/sessions/{session_id}")).status_code == 202
    assert_v2_error(await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "x"}), 409, "session_ended")
    assert_unified_error(await client.post(f"/api/sessions/{session_id}/messages", json={"prompt": "x"}),
                         409, "session_ended", "none")


async def test_create_failed_for_unknown_aliases_and_tools(client):
    assert_v2_error(await client.post("/v2/sessions", json={"model": "no-such-model"}), 400, "create_failed")
    assert_v2_error(await client.post("/v2/sessions", json={"tools": ["NoSuchTool"]}), 400, "create_failed")
    assert_v2_error(await client.post("/v2/sessions", json={"capabilitiesProfile": "nope"}), 400, "create_failed")


async def test_turn_running_and_midturn_blocks(client):
    session_id = await open_session(client, prompt="/slow 5")
    assert_v2_error(await client.post(f"/v2/sessions/{session_id}/compact", json={}), 409, "turn_running")
    # A manual checkpoint snapshots the committed state, so it is taken mid-turn; restoring is
    # an idle-time operation.
    checkpoint = await client.post(f"/v2/sessions/{session_id}/checkpoints", json={})
    assert checkpoint.status_code == 201, checkpoint.text
    restore = f"/v2/sessions/{session_id}/checkpoints/{checkpoint.json()['checkpointId']}/restore"
    assert_v2_error(await client.post(restore, json={}), 409, "turn_running")
    assert_unified_error(await client.post(f"/api/sessions/{session_id}/compact", json={}), 409, "turn_running",
                         "wait_idle")
    blocks = {"blocks": [{"t": "text", "text": "hi"}]}
    assert_v2_error(await client.post(f"/v2/sessions/{session_id}/messages", json=blocks), 422,
                    "midturn_blocks_rejected")
    assert (await client.post(f"/v2/sessions/{session_id}/interrupt")).status_code == 202
    await wait_idle(client, session_id)
    assert (await client.post(f"/v2/sessions/{session_id}/messages", json=blocks)).status_code == 202


async def test_session_mismatch_when_importing_another_sessions_checkpoint(client):
    first = await open_session(client, prompt="one")
    second = await open_session(client, prompt="two")
    await wait_idle(client, first)
    checkpoint = (await client.post(f"/v2/sessions/{first}/checkpoints", json={})).json()["checkpointId"]
    exported = await client.get(f"/v2/sessions/{first}/checkpoints/{checkpoint}/export")
    assert exported.status_code == 200
    assert_v2_error(await client.post(f"/v2/sessions/{second}/checkpoints/import", content=exported.content),
                    409, "session_mismatch")
    assert_v2_error(await client.post(f"/v2/sessions/{second}/checkpoints/{checkpoint}/restore", json={}),
                    404, "checkpoint_not_found")
    assert_v2_error(await client.post(f"/v2/sessions/{second}/checkpoints/import", content=b"\xa0junk"),
                    400, "validation_failed")


async def test_cwd_invalid_and_cwd_unavailable_with_policies(nursery, tmp_path):
    gone: set[str] = set()

    def session_policy(path: str) -> SessionRefused | None:
        return SessionRefused("cwd_unavailable", "gone") if path in gone else None

    server = await start_sessions_server(
        nursery, str(tmp_path / "cwd"), cwd_policy=lambda path: path.startswith("/srv/"),
        session_settings=SessionSettings(cwd_policy=session_policy))
    async with server.client(await server.token("phone")) as client:
        for bad in ("srv/a", "/srv/../etc", "/srv//a"):
            assert_v2_error(await client.post("/v2/sessions", json={"cwd": bad}), 400, "cwd_invalid")
        assert_v2_error(await client.post("/v2/sessions", json={"cwd": "/etc"}), 400, "cwd_not_allowed")
        session_id = await open_session(client, cwd="/srv/project")
        assert (await client.delete(f"/v2/sessions/{session_id}")).status_code == 202
        gone.add("/srv/project")
        assert_v2_error(await client.post("/v2/sessions", json={"resume": {"sessionId": session_id}}),
                        409, "cwd_unavailable")


async def test_store_corrupted_is_500_never_a_partial_history(sessions, client):
    session_id = await open_session(client, prompt="hello")
    await wait_idle(client, session_id)
    assert (await client.delete(f"/v2/sessions/{session_id}")).status_code == 202
    await sessions.engine.write(lambda connection: connection.execute(
        "DELETE FROM agent_session_messages WHERE session_id = ? AND position = 0", (session_id,)))
    assert_v2_error(await client.get(f"/v2/sessions/{session_id}/history"), 500, "store_corrupted")
    assert_unified_error(await client.get(f"/api/sessions/{session_id}/history"), 500, "store_corrupted", "none")


@pytest.mark.parametrize(("max_turns", "status"), [(1, 201), (max_turns_limit, 201), (max_turns_limit + 1, 400), (0, 400)])
async def test_max_turns_is_capped_at_the_kernel_limit(client, max_turns, status):
    response = await client.post("/v2/sessions", json={"maxTurns": max_turns})
    assert response.status_code == status, response.text
    if status == 400:
        error = assert_v2_error(response, 400, "validation_failed")
        assert error["detail"]["fields"][0]["field"] == "body.maxTurns"


async def test_legacy_prefix_mixed_is_logged_once_per_session(client, caplog):
    caplog.set_level(logging.WARNING, logger="troupe.sessions")
    session_id = await open_session(client)
    await client.get(f"/v2/sessions/{session_id}")
    assert not [record for record in caplog.records if "api.legacy_prefix_mixed" in record.getMessage()]
    for _ in range(3):
        assert (await client.get(f"/api/sessions/{session_id}")).status_code == 200
        assert (await client.get(f"/v2/sessions/{session_id}")).status_code == 200
    await trio.sleep(0)
    mixed = [record for record in caplog.records if "api.legacy_prefix_mixed" in record.getMessage()]
    assert len(mixed) == 1 and session_id in mixed[0].getMessage()
    other = await open_session(client)
    assert (await client.get(f"/v2/sessions/{other}")).status_code == 200
    assert len([record for record in caplog.records if "api.legacy_prefix_mixed" in record.getMessage()]) == 1
