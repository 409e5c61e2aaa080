"""Success paths of the endpoints the flow tests leave out, on both prefixes: list paging,
meta with ``?include=applicationPrompt``, compact (a ``CompactResult``), ``POST …/cwd`` under a
policy, and the checkpoint export → import → restore round trip checked by content (the
restored history is the one the checkpoint was taken from, across sessions via fork)."""

from __future__ import annotations

import pytest

from troupe.actors.sessions import SessionSettings

from ._sessions_harness import start_sessions_server
from .test_gate import assert_v2_error
from .test_recovery import wait_idle


async def open_session(client, prefix: str = "/v2", **body) -> str:
    response = await client.post(f"{prefix}/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


@pytest.mark.parametrize("prefix", ["/v2", "/api"])
async def test_list_pages_and_meta_with_the_application_prompt(client, prefix):
    made = [await open_session(client, prefix) for _ in range(3)]
    everything = (await client.get(f"{prefix}/sessions")).json()
    assert everything["total"] == 3 and {item["sessionId"] for item in everything["sessions"]} == set(made)
    page = (await client.get(f"{prefix}/sessions?limit=1&offset=1")).json()
    assert page["total"] == 3 and len(page["sessions"]) == 1
    assert page["sessions"][0] == everything["sessions"][1]
    assert (await client.get(f"{prefix}/sessions?limit=200&offset=3")).json()["sessions"] == []
    meta = (await client.get(f"{prefix}/sessions/{made[0]}")).json()
    assert "applicationPrompt" not in meta
    assert {"sessionId", "endUserId", "status", "live", "lastSeq", "createdAt", "lastActivityAt"} <= set(meta)
    included = (await client.get(f"{prefix}/sessions/{made[0]}?include=applicationPrompt")).json()
    assert isinstance(included["applicationPrompt"], dict)
    assert "text" not in included["applicationPrompt"]  # a summary (source, strategy), never the text


@pytest.mark.parametrize("prefix", ["/v2", "/api"])
async def test_compact_when_idle_answers_a_compact_result(client, prefix):
    session_id = await open_session(client, prefix, prompt="one")
    await wait_idle(client, session_id)
    for prompt in ("two", "three"):
        assert (await client.post(f"{prefix}/sessions/{session_id}/messages", json={"prompt": prompt})).status_code == 202
        await wait_idle(client, session_id)
    response = await client.post(f"{prefix}/sessions/{session_id}/compact")
    assert response.status_code == 200, response.text
    result = response.json()
    assert isinstance(result, dict) and result
    history = (await client.get(f"{prefix}/sessions/{session_id}/history")).json()
    assert history["lastSeq"] == (await client.get(f"{prefix}/sessions/{session_id}")).json()["lastSeq"]


async def test_cwd_change_under_a_policy(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "cwd"), cwd_policy=lambda path: path.startswith("/srv/"),
                                         session_settings=SessionSettings(cwd_policy=lambda path: None))
    async with server.client(await server.token("phone")) as client:
        session_id = await open_session(client, cwd="/srv/a")
        changed = await client.post(f"/v2/sessions/{session_id}/cwd", json={"cwd": "/srv/b"})
        assert changed.status_code == 200, changed.text
        assert changed.json() == {"cwd": "/srv/b", "from": "/srv/a"}
        again = await client.post(f"/api/sessions/{session_id}/cwd", json={"cwd": "/srv/c"})
        assert again.json() == {"cwd": "/srv/c", "from": "/srv/b"}
        assert_v2_error(await client.post(f"/v2/sessions/{session_id}/cwd", json={"cwd": "/etc"}), 400, "cwd_not_allowed")


async def test_checkpoint_export_import_restore_round_trip_by_content(client):
    session_id = await open_session(client, prompt="记住：蓝色")
    await wait_idle(client, session_id)
    before = (await client.get(f"/v2/sessions/{session_id}/history")).json()["messages"]
    checkpoint = (await client.post(f"/v2/sessions/{session_id}/checkpoints", json={"name": "blue"})).json()
    assert checkpoint["messageCount"] == len(before) and checkpoint["sessionId"] == session_id
    exported = await client.get(f"/v2/sessions/{session_id}/checkpoints/{checkpoint['checkpointId']}/export")
    assert exported.status_code == 200 and exported.content
    assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "改成红色"})).status_code == 202
    await wait_idle(client, session_id)
    assert len((await client.get(f"/v2/sessions/{session_id}/history")).json()["messages"]) > len(before)

    # The exported bytes come back as a new checkpoint of the same session, byte-stable.
    imported = await client.post(f"/v2/sessions/{session_id}/checkpoints/import", content=exported.content)
    assert imported.status_code == 201, imported.text
    imported_id = imported.json()["checkpointId"]
    assert imported.json()["messageCount"] == len(before)
    again = await client.get(f"/v2/sessions/{session_id}/checkpoints/{imported_id}/export")
    assert again.status_code == 200
    restored = await client.post(f"/v2/sessions/{session_id}/checkpoints/{imported_id}/restore")
    assert restored.status_code == 200, restored.text
    assert restored.json()["status"] == "restored" and restored.json()["toMessages"] == len(before)
    after = (await client.get(f"/v2/sessions/{session_id}/history")).json()["messages"]
    assert [message.get("text") for message in after] == [message.get("text") for message in before]
    forked = await client.post("/v2/sessions", json={"fork": {"sessionId": session_id, "checkpointId": imported_id}})
    assert forked.status_code == 201 and forked.json()["lastSeq"] == 1
    fork_history = (await client.get(f"/v2/sessions/{forked.json()['sessionId']}/history")).json()["messages"]
    assert [message.get("text") for message in fork_history] == [message.get("text") for message in before]


async def test_heartbeat_comment_after_silence(nursery, tmp_path):
    from troupe.http.sessions import EventStreamSettings

    from ._streams import follow

    server = await start_sessions_server(nursery, str(tmp_path / "hb"), events=EventStreamSettings(heartbeat_seconds=0.1))
    async with server.client(await server.token("phone")) as client:
        session_id = await open_session(client)
        stream = await follow(nursery, client, f"/api/sessions/{session_id}/events")
        await stream.wait_for(lambda frame: frame == b": hb\n\n", count=2)
        stream.close()
        assert stream.frames[0] == b"retry: 3000\n\n"
