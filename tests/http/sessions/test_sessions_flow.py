"""The sessions surface end to end over real HTTP/SSE with the session actors and the local
model: create → events (retry first, kernel frames with ids) → messages → Last-Event-ID
replay; unified envelope negotiation on /api only; ownership (403); attach, close, resume;
checkpoints round trip; audio without a voice provider; the per-user cap; shutdown frames."""

from __future__ import annotations

import json

import trio

from troupe.http.sessions import shutdown_retry_milliseconds

from .test_gate import assert_unified_error, assert_v2_error

read_seconds_max = 10


async def read_frames(client, path: str, *, until, headers=None) -> tuple[list[bytes], dict]:
    """The stream's frames (split at blank lines) until ``until(frames)`` holds or it ends."""
    frames: list[bytes] = []
    buffer = b""
    with trio.fail_after(read_seconds_max):
        async with client.stream("GET", path, headers=headers or {}) as response:
            assert response.status_code == 200, await response.aread()
            async for chunk in response.aiter_bytes():
                buffer += chunk
                *complete, buffer = buffer.split(b"\n\n")
                frames += [frame + b"\n\n" for frame in complete]
                if until(frames):
                    break
            return frames, dict(response.headers)


def data_of(frame: bytes) -> dict:
    line = next(line for line in frame.split(b"\n") if line.startswith(b"data: "))
    return json.loads(line[6:])


def ids_of(frames: list[bytes]) -> list[int]:
    return [int(line[4:]) for frame in frames for line in frame.split(b"\n") if line.startswith(b"id: ")]


def turn_ended(frames: list[bytes]) -> bool:
    return any(b'"type":"turn.completed"' in frame or b'"type":"turn.aborted"' in frame for frame in frames)


async def create(client, **body) -> str:
    response = await client.post("/v2/sessions", json=body)
    assert response.status_code == 201, response.text
    document = response.json()
    assert document["resumed"] is False and document["lastSeq"] == 0
    return document["sessionId"]


async def test_create_stream_and_replay_after_last_event_id(client):
    session_id = await create(client, prompt="你好")
    frames, headers = await read_frames(client, f"/v2/sessions/{session_id}/events", until=turn_ended)
    assert frames[0] == b"retry: 3000\n\n"
    assert headers["content-type"].startswith("text/event-stream")
    kernel = frames[1:]
    for frame in kernel:
        assert frame.startswith(b"id: ") and b"\nevent:" not in frame
        event = data_of(frame)
        assert {"type", "sessionId", "seq", "ts", "v", "source"} <= set(event)
        assert event["sessionId"] == session_id and event["v"] == 1
    seqs = ids_of(kernel)
    assert seqs == sorted(seqs) and seqs[0] == 1 and len(set(seqs)) == len(seqs)
    assert data_of(kernel[0])["type"] == "session.created"

    # L1: reconnect after seq 3 -> exactly the frames after it, bytes unchanged.
    replay, _ = await read_frames(client, f"/v2/sessions/{session_id}/events",
                                  headers={"Last-Event-ID": "3"}, until=lambda got: len(got) >= len(kernel) - 2)
    assert replay[0] == b"retry: 3000\n\n" and replay[1:] == kernel[3:]
    everything, _ = await read_frames(client, f"/v2/sessions/{session_id}/events",
                                      headers={"Last-Event-ID": "-1"}, until=lambda got: len(got) > len(kernel))
    assert everything[1:] == kernel

    response = await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "再来"})
    assert response.status_code == 202 and response.json() == {"sessionId": session_id, "accepted": True}
    last = seqs[-1]
    more, _ = await read_frames(client, f"/v2/sessions/{session_id}/events",
                                headers={"Last-Event-ID": str(last)}, until=turn_ended)
    assert ids_of(more)[0] == last + 1
    history = (await client.get(f"/v2/sessions/{session_id}/history")).json()
    assert history["sessionId"] == session_id and history["lastSeq"] >= ids_of(more)[-1]
    page = (await client.get(f"/v2/sessions/{session_id}/history?offset=1&limit=1")).json()
    assert page["messages"] == history["messages"][1:2] and page["offset"] == 1


async def test_unified_envelope_only_on_api_and_only_when_negotiated(client):
    session_id = await create(client, prompt="hi")
    negotiate = {"tansr-event-envelope": "unified-v1"}
    plain, _ = await read_frames(client, f"/v2/sessions/{session_id}/events", until=turn_ended)
    legacy, legacy_headers = await read_frames(client, f"/v2/sessions/{session_id}/events",
                                               headers=negotiate, until=turn_ended)
    assert legacy == plain and "tansr-event-envelope" not in legacy_headers
    api_plain, _ = await read_frames(client, f"/api/sessions/{session_id}/events", until=turn_ended)
    assert api_plain == plain
    unified, headers = await read_frames(client, f"/api/sessions/{session_id}/events", headers=negotiate,
                                         until=lambda got: len(got) >= len(plain))
    assert headers["tansr-event-envelope"] == "unified-v1"
    assert unified[0] == b"retry: 3000\n\n" and ids_of(unified) == ids_of(plain)
    for wrapped, original in zip(unified[1:], plain[1:], strict=True):
        envelope = data_of(wrapped)
        assert set(envelope) == {"contract", "eventId", "domain", "type", "cursorSet", "terminalStatus", "raw"}
        assert envelope["raw"] == data_of(original) and envelope["eventId"] == str(data_of(original)["seq"])


async def test_exclude_filters_kernel_events_by_prefix_keeping_seq(client):
    session_id = await create(client, prompt="hi")
    frames, _ = await read_frames(client, f"/v2/sessions/{session_id}/events", until=turn_ended)
    filtered, _ = await read_frames(client, f"/v2/sessions/{session_id}/events?exclude=msg,cost",
                                    until=turn_ended)
    types = [data_of(frame)["type"] for frame in filtered[1:]]
    assert types and not any(kind.startswith(("msg", "cost")) for kind in types)
    kept = [frame for frame in frames[1:] if not data_of(frame)["type"].startswith(("msg", "cost"))]
    assert filtered[1:] == kept


async def test_another_users_session_is_forbidden(sessions, client):
    session_id = await create(client)
    other = await sessions.token("other-phone", "u_2")
    async with sessions.client(other) as intruder:
        for method, path, body in (
            ("GET", f"/v2/sessions/{session_id}", None),
            ("GET", f"/v2/sessions/{session_id}/history", None),
            ("POST", f"/v2/sessions/{session_id}/messages", {"prompt": "x"}),
            ("GET", f"/v2/sessions/{session_id}/events", None),
            ("DELETE", f"/v2/sessions/{session_id}", None),
        ):
            assert_v2_error(await intruder.request(method, path, json=body), 403, "forbidden")
        assert_v2_error(await intruder.post("/v2/sessions", json={"resume": {"sessionId": session_id}}), 403, "forbidden")
        assert_unified_error(await intruder.get(f"/api/sessions/{session_id}"), 403, "forbidden", "none")
        assert (await intruder.get("/v2/sessions")).json()["total"] == 0


async def test_attach_close_and_resume(client):
    session_id = await create(client, prompt="hi")
    await read_frames(client, f"/v2/sessions/{session_id}/events", until=turn_ended)
    attach = await client.post("/v2/sessions", json={"resume": {"sessionId": session_id}})
    assert attach.status_code == 200, attach.text
    watermark = attach.json()["lastSeq"]
    assert watermark > 0 and attach.json()["sessionId"] == session_id
    assert (await client.post(f"/v2/sessions/{session_id}/interrupt")).status_code == 202
    assert (await client.post(f"/v2/sessions/{session_id}/interrupt")).status_code == 202
    closed = await client.delete(f"/v2/sessions/{session_id}")
    assert closed.status_code == 202 and closed.json() == {"sessionId": session_id, "accepted": True}
    meta = (await client.get(f"/v2/sessions/{session_id}")).json()
    assert meta["live"] is False
    response = await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "x"})
    assert response.status_code in (404, 409), response.text
    resumed = await client.post("/v2/sessions", json={"resume": {"sessionId": session_id}})
    assert resumed.status_code == 201, resumed.text
    assert resumed.json()["resumed"] is True and resumed.json()["lastSeq"] >= watermark
    assert_v2_error(await client.post("/v2/sessions", json={"resume": {"sessionId": "s_nothing"}}), 404, "session_not_found")
    assert_unified_error(await client.get("/api/sessions/s_nothing"), 404, "session_not_found", "resume")


async def test_checkpoints_round_trip(client):
    session_id = await create(client, prompt="hi")
    await read_frames(client, f"/v2/sessions/{session_id}/events", until=turn_ended)
    created = await client.post(f"/v2/sessions/{session_id}/checkpoints", json={"name": "before"})
    assert created.status_code == 201, created.text
    checkpoint_id = created.json()["checkpointId"]
    listed = (await client.get(f"/v2/sessions/{session_id}/checkpoints")).json()["checkpoints"]
    assert checkpoint_id in [item["checkpointId"] for item in listed]
    exported = await client.get(f"/v2/sessions/{session_id}/checkpoints/{checkpoint_id}/export")
    assert exported.status_code == 200 and exported.headers["content-type"] == "application/octet-stream"
    imported = await client.post(f"/v2/sessions/{session_id}/checkpoints/import", content=exported.content)
    assert imported.status_code == 201, imported.text
    restored = await client.post(f"/v2/sessions/{session_id}/checkpoints/{checkpoint_id}/restore")
    assert restored.status_code == 200 and restored.json()["status"] == "restored"
    assert (await client.delete(f"/v2/sessions/{session_id}/checkpoints/{checkpoint_id}")).status_code == 204
    assert_v2_error(await client.get(f"/v2/sessions/{session_id}/checkpoints/{checkpoint_id}/export"),
                    404, "checkpoint_not_found")
    forked = await client.post("/v2/sessions", json={"fork": {"sessionId": session_id,
                                                              "checkpointId": imported.json()["checkpointId"]}})
    assert forked.status_code == 201, forked.text
    assert forked.json()["lastSeq"] == 1 and forked.json()["sessionId"] != session_id


async def test_audio_without_a_voice_provider_is_upstream_unavailable(client):
    session_id = await create(client)
    for kind in ("transcriptions", "speech"):
        response = await client.post(f"/v2/sessions/{session_id}/audio/{kind}", content=b"RIFF....")
        assert_v2_error(response, 503, "upstream_unavailable")
        assert_unified_error(await client.post(f"/api/sessions/{session_id}/audio/{kind}", content=b"x"),
                             503, "upstream_unavailable", "retry_after")
    assert_v2_error(await client.post("/v2/sessions/s_nothing/audio/speech", content=b"x"), 404, "session_not_found")


async def test_active_sessions_per_end_user_are_capped(client):
    for _ in range(8):
        await create(client)
    response = await client.post("/v2/sessions", json={})
    assert_v2_error(response, 429, "session_limit_exceeded")
    assert_unified_error(await client.post("/api/sessions", json={}), 429, "session_limit_exceeded", "retry_after")


async def test_shutdown_sends_a_long_retry_frame_and_ends_the_stream(sessions, client):
    session_id = await create(client)
    frames: list[bytes] = []

    async def follow():
        got, _ = await read_frames(client, f"/v2/sessions/{session_id}/events", until=lambda got: False)
        frames.extend(got)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await trio.sleep(0.3)
        sessions.shutdown.set()
    assert frames[0] == b"retry: 3000\n\n"
    assert frames[-1] == f"retry: {shutdown_retry_milliseconds}\n\n".encode()
    assert_v2_error(await client.get(f"/v2/sessions/{session_id}"), 503, "draining")
