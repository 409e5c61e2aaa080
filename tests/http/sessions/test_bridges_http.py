"""Every bridge outcome over real HTTP/SSE: the request frames arrive on the stream, the
answers go to ``POST …/tool-results/:callId``, ``…/permission/:requestId`` and
``…/questions/:requestId``.  Client tool answered / duplicate 409 / after cancel 410 /
deadline; permission allow / deny / digest mismatch 409 / timeout → deny; question answered /
no subscriber → degrade.  Deadlines are shortened through ``SessionSettings`` (and the
declaration's ``timeoutMs`` at its 1000 ms floor), never waited for in real time."""

from __future__ import annotations

import json

import pytest
import trio

from troupe.actors.sessions import SessionSettings

from ._sessions_harness import start_sessions_server
from ._streams import Follower, data_of, follow, is_turn_end, type_of
from .test_gate import assert_unified_error, assert_v2_error

pick = {"name": "pick", "description": "pick a colour on the phone", "timeoutMs": 1000}


@pytest.fixture
async def short(nursery, tmp_path):
    """A server whose permission and question deadlines are a fraction of a second."""
    settings = SessionSettings(permission_ttl_seconds=0.3, question_grace_seconds=0.2, question_ttl_seconds=5)
    return await start_sessions_server(nursery, str(tmp_path / "short"), session_settings=settings)


async def open_session(client, prompt: str, **body) -> str:
    response = await client.post("/v2/sessions", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


async def test_client_tool_answered_then_duplicate_is_409(nursery, client):
    session_id = await open_session(client, '/client pick {"hint":"sky"}', clientTools=[pick | {"timeoutMs": 60_000}])
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    [request] = await stream.wait_type("server.tool.request")
    assert request.startswith(b"event: server.tool.request\nid: ")
    payload = data_of(request)
    assert payload["source"] == "server" and payload["name"] == "pick" and payload["args"] == {"hint": "sky"}
    assert payload["ttlMs"] == 60_000 and payload["deadlineAt"] == payload["ts"] + 60_000
    path = f"/v2/sessions/{session_id}/tool-results/{payload['callId']}"
    answered = await client.post(path, json={"result": "blue"})
    assert answered.status_code == 200 and answered.json() == {"accepted": True}
    assert_v2_error(await client.post(path, json={"result": "red"}), 409, "request_already_answered")
    assert_unified_error(await client.post(f"/api/sessions/{session_id}/tool-results/{payload['callId']}",
                                           json={"result": "red"}), 409, "request_already_answered", "none")
    await stream.wait_for(is_turn_end)
    [completed] = stream.of_type("tool.completed")
    assert data_of(completed)["callId"] == payload["callId"] and "blue" in json.dumps(data_of(completed)["output"])
    assert_v2_error(await client.post(f"/v2/sessions/{session_id}/tool-results/call_never", json={"result": 1}),
                    404, "request_not_found")
    stream.close()


async def test_client_tool_after_cancel_is_410(nursery, client):
    session_id = await open_session(client, "/client pick {}", clientTools=[pick | {"timeoutMs": 60_000}])
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    call_id = data_of((await stream.wait_type("server.tool.request"))[0])["callId"]
    assert (await client.post(f"/v2/sessions/{session_id}/interrupt")).status_code == 202
    [cancel] = await stream.wait_type("server.tool.cancel")
    assert cancel.startswith(b"event: server.tool.cancel\nid: ") and data_of(cancel)["callId"] == call_id
    await stream.wait_for(is_turn_end)
    assert type_of(stream.of_type("turn.aborted")[0]) == "turn.aborted"
    response = await client.post(f"/v2/sessions/{session_id}/tool-results/{call_id}", json={"result": "late"})
    assert_v2_error(response, 410, "request_cancelled")
    stream.close()


async def test_client_tool_deadline_fails_the_call_and_the_turn_goes_on(nursery, client):
    session_id = await open_session(client, "/client pick {}", clientTools=[pick])  # timeoutMs 1000: the floor
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    call_id = data_of((await stream.wait_type("server.tool.request"))[0])["callId"]
    [failed] = await stream.wait_type("tool.failed")
    assert data_of(failed)["callId"] == call_id
    [end] = await stream.wait_for(is_turn_end)
    assert type_of(end) == "turn.completed"
    response = await client.post(f"/v2/sessions/{session_id}/tool-results/{call_id}", json={"result": "late"})
    assert_v2_error(response, 410, "request_cancelled")
    stream.close()


fetch = '/permission WebFetch {"url":"https://example.com/a"}'


@pytest.mark.parametrize("verdict", ["allow", "deny"])
async def test_permission_answered_with_the_digest(nursery, client, verdict):
    session_id = await open_session(client, fetch)
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    [request] = await stream.wait_type("server.permission.request")
    payload = data_of(request)
    assert "args" not in payload and "url" not in json.dumps(payload.get("attribution"))
    assert payload["expiresAt"] == payload["ts"] + payload["ttlMs"]
    path = f"/v2/sessions/{session_id}/permission/{payload['requestId']}"
    wrong = await client.post(path, json={"digest": "0" * 64, "verdict": verdict})
    assert_v2_error(wrong, 409, "digest_mismatch")
    right = await client.post(path, json={"digest": payload["digest"], "verdict": verdict})
    assert right.status_code == 200 and right.json() == {"accepted": True}
    assert_v2_error(await client.post(path, json={"digest": payload["digest"], "verdict": verdict}),
                    409, "request_already_answered")
    [decided] = await stream.wait_type("tool.permission.decided")
    assert data_of(decided)["verdict"] == verdict and data_of(decided)["requestId"] == payload["requestId"]
    [closed] = await stream.wait_type("server.permission.closed")
    assert data_of(closed)["verdict"] == verdict
    await stream.wait_for(is_turn_end)
    if verdict == "deny":
        assert stream.of_type("tool.failed") and not stream.of_type("tool.started")
    stream.close()


async def test_permission_unanswered_is_denied_and_the_turn_continues(nursery, short):
    async with short.client(await short.token("phone")) as client:
        session_id = await open_session(client, fetch)
        stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
        [request] = await stream.wait_type("server.permission.request")
        assert data_of(request)["ttlMs"] == 300
        [decided] = await stream.wait_type("tool.permission.decided")
        assert data_of(decided)["verdict"] == "deny"
        [closed] = await stream.wait_type("server.permission.closed")
        assert data_of(closed)["verdict"] == "deny"
        [end] = await stream.wait_for(is_turn_end)
        assert type_of(end) == "turn.completed"
        late = await client.post(f"/v2/sessions/{session_id}/permission/{data_of(request)['requestId']}",
                                 json={"digest": data_of(request)["digest"], "verdict": "allow"})
        assert_v2_error(late, 410, "request_cancelled")
        stream.close()


ask = '/ask [{"question":"什么颜色？","options":[{"label":"蓝"},{"label":"红"}]}]'


async def test_question_answered(nursery, client):
    session_id = await open_session(client, ask)
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    [request] = await stream.wait_type("server.question.request")
    payload = data_of(request)
    assert payload["questions"][0]["question"] == "什么颜色？"
    path = f"/v2/sessions/{session_id}/questions/{payload['requestId']}"
    assert_v2_error(await client.post(path, json={}), 400, "validation_failed")
    answered = await client.post(path, json={"answers": ["蓝"]})
    assert answered.status_code == 200 and answered.json() == {"accepted": True}
    assert_v2_error(await client.post(path, json={"answers": ["红"]}), 409, "request_already_answered")
    await stream.wait_type("server.question.closed")
    [end] = await stream.wait_for(is_turn_end)
    assert type_of(end) == "turn.completed"
    [completed] = stream.of_type("tool.completed")
    assert "蓝" in json.dumps(data_of(completed)["output"], ensure_ascii=False)
    stream.close()


async def test_question_without_a_subscriber_degrades_and_never_hangs(short):
    async with short.client(await short.token("phone")) as client:
        session_id = await open_session(client, ask)
        # Nobody subscribes: after the grace the tool decides for itself and the turn ends.
        follower = Follower(client, f"/v2/sessions/{session_id}/events", {"Last-Event-ID": "-1"})
        with trio.fail_after(5):
            while True:
                meta = (await client.get(f"/v2/sessions/{session_id}")).json()
                if meta["status"] == "idle" and meta["lastSeq"] > 3:
                    break
                await trio.sleep(0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(follower.run)
            await follower.wait_for(is_turn_end)
            follower.close()
        [closed] = follower.of_type("server.question.closed")
        assert data_of(closed).get("why") == "unattended"
        [end] = [frame for frame in follower.frames if is_turn_end(frame)]
        assert type_of(end) == "turn.completed"
        assert follower.of_type("tool.completed")
