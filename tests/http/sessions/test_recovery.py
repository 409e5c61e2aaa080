"""The contract's three recovery levels, black box over real HTTP/SSE.

- L1: the stream drops mid-turn; the client reconnects with ``Last-Event-ID`` = the last seq it
  consumed, dedupes by seq, and ends up with every event exactly once, in order.
- L2: the cursor is older than the ring (a small ring here): the first frame after ``retry:``
  is the gap (``evicted``, ``oldestRetainedSeq``, no id); the client drops its projection,
  reads meta and history (consistent: same ``lastSeq`` when idle) and resumes the stream from
  ``history.lastSeq`` without a gap or a duplicate.  A cursor beyond the log is
  ``ahead_of_log``.
- L3: the server is killed (no drain: the epoch stays unsealed) and started again on the same
  data directory: meta says ``live: false`` with the store's watermark; ``POST /v2/sessions
  {resume}`` answers 201 ``resumed: true`` with the new epoch's start, the next events are
  numbered above every old cursor, and an old cursor gets the ``evicted`` gap.  A sealed epoch
  (closed session) resumes at exactly the watermark + 1.
"""

from __future__ import annotations

import trio

from troupe.actors.sessions import SessionSettings

from ._sessions_harness import start_sessions_server
from ._streams import data_of, follow, is_turn_end, seq_of, type_of
from .test_gate import assert_unified_error, assert_v2_error


async def wait_idle(client, session_id: str) -> dict:
    with trio.fail_after(10):
        while True:
            meta = (await client.get(f"/v2/sessions/{session_id}")).json()
            if meta["status"] == "idle":
                return meta
            await trio.sleep(0.02)


async def test_l1_reconnect_with_last_event_id_and_dedupe_by_seq(nursery, client):
    created = await client.post("/v2/sessions", json={"prompt": "/slow 0.05\n/todo [{\"content\":\"a\"}]\n/say fine"})
    session_id = created.json()["sessionId"]
    first = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
    await first.wait_for(lambda frame: (seq_of(frame) or 0) >= 3)
    first.close()  # the connection drops mid-turn
    await first.ended.wait()
    consumed = [frame for frame in first.frames if seq_of(frame) is not None]
    cursor = seq_of(consumed[-1])
    second = await follow(nursery, client, f"/v2/sessions/{session_id}/events", {"Last-Event-ID": str(cursor)})
    await second.wait_for(is_turn_end)
    second.close()
    assert second.frames[0] == b"retry: 3000\n\n" and not second.of_type("server.replay.gap")
    seen: dict[int, bytes] = {}
    for frame in consumed + second.frames:  # the client's dedupe
        if seq_of(frame) is not None:
            seen.setdefault(seq_of(frame), frame)
    seqs = sorted(seen)
    assert seqs == list(range(1, seqs[-1] + 1))
    assert seq_of(second.frames[1]) == cursor + 1
    meta = await wait_idle(client, session_id)
    assert meta["lastSeq"] == seqs[-1]


async def test_l2_gap_then_meta_history_and_resume_from_history_last_seq(nursery, tmp_path):
    server = await start_sessions_server(nursery, str(tmp_path / "ring"),
                                         session_settings=SessionSettings(ring_events_max=8))
    async with server.client(await server.token("phone")) as client:
        session_id = (await client.post("/v2/sessions", json={"prompt": "/todo [{\"content\":\"a\"}]"})).json()["sessionId"]
        await wait_idle(client, session_id)
        stale = await follow(nursery, client, f"/v2/sessions/{session_id}/events", {"Last-Event-ID": "1"})
        await stale.wait_for(lambda frame: type_of(frame) is not None)
        stale.close()
        gap = stale.frames[1]
        assert stale.frames[0] == b"retry: 3000\n\n" and gap.startswith(b"event: server.replay.gap\ndata: ")
        assert b"\nid: " not in gap and not gap.startswith(b"id:")
        notice = data_of(gap)
        assert notice["type"] == "server.replay.gap" and notice["sessionId"] == session_id
        assert notice["reason"] == "evicted" and notice["requestedAfterSeq"] == 1
        assert notice["oldestRetainedSeq"] > 2 and notice["droppedEvents"] >= notice["oldestRetainedSeq"] - 2

        # L2: drop the projection, rebuild from meta + history, resume from history.lastSeq.
        meta = (await client.get(f"/v2/sessions/{session_id}")).json()
        history = (await client.get(f"/v2/sessions/{session_id}/history")).json()
        assert meta["live"] is True and history["lastSeq"] == meta["lastSeq"] > notice["oldestRetainedSeq"]
        assert [message["role"] for message in history["messages"]][0] == "user"
        resumed = await follow(nursery, client, f"/v2/sessions/{session_id}/events",
                               {"Last-Event-ID": str(history["lastSeq"])})
        assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "more"})).status_code == 202
        await resumed.wait_for(is_turn_end)
        resumed.close()
        assert not resumed.of_type("server.replay.gap")
        assert seq_of(resumed.frames[1]) == history["lastSeq"] + 1

        ahead = await follow(nursery, client, f"/v2/sessions/{session_id}/events", {"Last-Event-ID": "100000"})
        await ahead.wait_for(lambda frame: type_of(frame) is not None)
        ahead.close()
        assert data_of(ahead.frames[1])["reason"] == "ahead_of_log"
        assert data_of(ahead.frames[1])["requestedAfterSeq"] == 100000


async def test_l3_restart_on_the_same_data_dir_resume_and_old_cursor_gap(tmp_path):
    data = str(tmp_path / "data")
    async with trio.open_nursery() as first_life:
        first = await start_sessions_server(first_life, data)
        secret = await first.token("phone")
        async with first.client(secret) as client:
            session_id = (await client.post("/v2/sessions", json={"prompt": "hello"})).json()["sessionId"]
            watermark = (await wait_idle(client, session_id))["lastSeq"]
        first_life.cancel_scope.cancel()  # killed: no drain, the epoch stays unsealed

    async with trio.open_nursery() as second_life:
        second = await start_sessions_server(second_life, data)
        async with second.client(secret) as client:
            meta = (await client.get(f"/v2/sessions/{session_id}")).json()
            assert meta["live"] is False and meta["lastSeq"] == watermark and meta["status"] != "running"
            listed = (await client.get("/v2/sessions")).json()["sessions"]
            assert [item["lastSeq"] for item in listed if item["sessionId"] == session_id] == [watermark]
            history = (await client.get(f"/v2/sessions/{session_id}/history")).json()
            assert history["lastSeq"] == watermark and history["messages"]
            # Input to a dormant session: 404 session_not_found, unified retryAction resume (L3).
            assert_v2_error(await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "x"}),
                            404, "session_not_found")
            assert_unified_error(await client.post(f"/api/sessions/{session_id}/messages", json={"prompt": "x"}),
                                 404, "session_not_found", "resume")

            resumed = await client.post("/v2/sessions", json={"resume": {"sessionId": session_id}})
            assert resumed.status_code == 201, resumed.text
            document = resumed.json()
            assert document["resumed"] is True and document["sessionId"] == session_id
            start = document["lastSeq"]
            assert start > watermark  # unsealed: max(watermark + 1, now - createdAt ms) and above
            old = await follow(second_life, client, f"/v2/sessions/{session_id}/events",
                               {"Last-Event-ID": str(watermark - 1)})
            fresh = await follow(second_life, client, f"/v2/sessions/{session_id}/events",
                                 {"Last-Event-ID": str(start)})
            assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "again"})).status_code == 202
            await fresh.wait_for(is_turn_end)
            await old.wait_for(lambda frame: type_of(frame) is not None)
            old.close()
            fresh.close()
            assert data_of(old.frames[1])["reason"] == "evicted"
            numbered = [seq_of(frame) for frame in fresh.frames if seq_of(frame) is not None]
            assert numbered[0] == start + 1 and numbered == sorted(numbered)
            meta = await wait_idle(client, session_id)
            assert meta["live"] is True and meta["lastSeq"] == numbered[-1]
        second_life.cancel_scope.cancel()


async def test_l3_sealed_epoch_resumes_at_exactly_the_watermark(nursery, client):
    session_id = (await client.post("/v2/sessions", json={"prompt": "hello"})).json()["sessionId"]
    await wait_idle(client, session_id)
    assert (await client.delete(f"/v2/sessions/{session_id}")).status_code == 202
    meta = (await client.get(f"/v2/sessions/{session_id}")).json()
    assert meta["live"] is False and meta["status"] == "ended"
    resumed = (await client.post("/v2/sessions", json={"resume": {"sessionId": session_id}})).json()
    # Sealed: the new epoch starts at exactly watermark + 1, with session.resumed (the 201's lastSeq).
    assert resumed["resumed"] is True and resumed["lastSeq"] == meta["lastSeq"] + 1
    stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events",
                          {"Last-Event-ID": str(meta["lastSeq"])})
    assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "x"})).status_code == 202
    await stream.wait_for(is_turn_end)
    stream.close()
    assert not stream.of_type("server.replay.gap")
    assert seq_of(stream.frames[1]) == meta["lastSeq"] + 1 and type_of(stream.frames[1]) == "session.resumed"
    assert seq_of(stream.frames[2]) == resumed["lastSeq"] + 1

