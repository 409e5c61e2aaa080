"""The tansr SDK's session flow (its ``integration/session.py``, phase by phase, as our own
tests) against troupe's fixture program on a real hypercorn."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("tansr_sdk")

from tansr_sdk.api import AuthToken, CallOptions, Client  # noqa: E402
from tansr_sdk.api.schema import validate_wire  # noqa: E402
from tansr_sdk.errors import Error  # noqa: E402
from tansr_sdk.lifecycle import CancellationToken, now_ms  # noqa: E402
from tansr_sdk.session import (  # noqa: E402
    Answer,
    AsyncSessionClient,
    CompactOptions,
    ImageBlock,
    SessionClient,
    SpeechRequest,
    TextBlock,
    TranscriptionRequest,
    TurnTracker,
)
from tansr_sdk.strict_json import dumps, loads  # noqa: E402

png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+y9k8AAAAASUVORK5CYII="
stream_seconds = 25


@pytest.fixture
def clients(fixture_process):
    made = []

    def make(other: bool = False, family: str = "sdk1") -> Client:
        info = fixture_process.info
        token = info["otherToken" if other else "token"]
        principal = "fixture-other" if other else "fixture-owner"
        client = Client(info["baseURL"], lambda cancel: AuthToken(token, principal), family=family)
        made.append(client)
        return client

    yield make
    assert all(client.close(10) for client in made)


def rejected(call, statuses=()) -> Error:
    with pytest.raises(Error) as caught:
        call()
    if statuses:
        assert caught.value.http_status in statuses, caught.value
    return caught.value


def wait_idle(session) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if session.meta().status == "idle":
            return
        time.sleep(0.01)
    raise AssertionError("session did not settle")


def wait_kind(stream, kind: str) -> dict:
    for event in stream:
        if event.kind == kind:
            return event.raw
        assert event.turn_outcome() is None, "turn ended before " + kind
    raise AssertionError("EOF before " + kind)


def finish(stream, tracker, expected: str = "completed") -> str:
    answer = []
    for event in stream:
        assert event.kind != "server.replay.gap"
        assert len(event.envelope) == 7
        if event.kind == "msg.text.delta":
            answer.append(event.raw["text"])
        outcome = tracker.observe(event)
        if outcome is not None:
            assert outcome.status == expected, outcome
            assert outcome.turn_id is not None and outcome.turn_id == tracker.active_turn_id
            return "".join(answer)
    raise AssertionError("EOF before the turn ended")


def complete(session, prompt: str) -> str:
    floor = session.meta().last_seq
    with session.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as stream:
        tracker = TurnTracker(floor)
        assert session.send(prompt).accepted
        answer = finish(stream, tracker)
        assert stream.last_event_id is not None
    wait_idle(session)
    return answer


def refused_to_others(clients, sessions, session_id: str) -> None:
    """Another owner cannot attach or resume ``session_id`` (and lists nothing); the owner under
    another family is refused too, and neither refusal creates a replacement session."""
    other = SessionClient(clients(other=True))
    rejected(lambda: other.attach(session_id), (403, 404))
    rejected(lambda: other.resume(session_id), (403, 404))
    assert other.list().total == 0
    wrong = SessionClient(clients(family="sdk2-offload-v1"))
    before = sessions.list().total
    rejected(lambda: wrong.attach(session_id))
    rejected(lambda: wrong.resume(session_id))
    assert sessions.list().total == before


def test_discovery_answers_the_frozen_contract(clients, fixture_process):
    client = clients()
    # Through the SDK's own discovery check (schema, revision and schema hash, body and headers).
    manifest = client.call("discovery.manifest")
    assert manifest.headers["tansr-domain"] == "discovery"
    assert manifest.body["revision"] == 7 and manifest.headers["tansr-manifest-revision"] == "7"
    capabilities = client.call("discovery.capabilities")
    assert capabilities.body["domains"]["session"]["installed"] is True
    session = SessionClient(client).create()
    closure = session.capabilities()
    assert closure.operations["session.message.send"] == "enabled"
    assert session.capabilities().closure_id == closure.closure_id  # stable for a live session
    stale = rejected(lambda: client.call("session.interrupt", CallOptions(
        parameters={"id": session.id}, body={}, capability_closure="0" * 64)), (412,))
    assert stale.wire_code == "precondition_failed" and stale.retry_action == "rediscover"
    assert stale.detail["domainCode"] == "closure_stale"
    session.close()


def test_create_live_resume_two_turns_history_and_local_cancel(clients):
    sessions = SessionClient(clients())
    current = sessions.create()
    assert sessions.resume(current.id).id == current.id
    assert not sessions.resume(current.id).created.resumed
    assert current.compact()["status"] == "rejected"
    first, second = complete(current, "PY-FIRST"), complete(current, "PY-SECOND")
    assert "go-real-serve-answer" in first and second
    attached = sessions.attach(current.id)
    count, history = attached.history(limit=0), attached.history(limit=50)
    assert count["messages"] == [] and count["total"] >= 4
    assert count["total"] == history["total"] and history["sessionId"] == current.id
    local = CancellationToken()
    stream = attached.events(str(attached.meta().last_seq), cancel=local)
    local.cancel()
    assert rejected(lambda: next(stream)).code == "cancelled"
    assert attached.meta().status == "idle"
    stream.close()
    current.close()


def test_cross_owner_and_cross_family_are_refused_without_replacement(clients):
    sessions = SessionClient(clients())
    current = sessions.create()
    refused_to_others(clients, sessions, current.id)
    current.close()


def test_images_checkpoints_audio_compaction_close_dormant_resume_and_gap(clients):
    sessions = SessionClient(clients())
    current = sessions.create()
    floor = current.meta().last_seq
    with current.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as stream:
        current.send_blocks([TextBlock("PY-SNAPSHOT"), ImageBlock("image/png", png)])
        assert "go-real-serve-answer" in finish(stream, TurnTracker(floor))
    wait_idle(current)
    assert "image/png" in dumps(current.history(limit=50)).decode()
    before = current.history(limit=0)
    checkpoint = current.checkpoint("原始快照")
    assert checkpoint.message_count == before["total"]
    assert checkpoint.checkpoint_id in [entry.checkpoint_id for entry in current.checkpoints()]
    original = current.export_checkpoint(checkpoint.checkpoint_id)
    imported = current.import_checkpoint(original, "导入副本")
    exported = loads(current.export_checkpoint(imported.checkpoint_id))
    assert exported["checkpoint"]["messages"] == loads(original)["checkpoint"]["messages"]
    assert current.history(limit=0)["total"] == before["total"]
    assert current.restore(imported.checkpoint_id, False)["toMessages"] == before["total"]
    current.delete_checkpoint(imported.checkpoint_id)
    rejected(lambda: current.export_checkpoint(imported.checkpoint_id))
    rejected(lambda: current.import_checkpoint(b"invalid-snapshot"))
    media_floor = current.history(limit=0)["total"]
    audio = "data:audio/wav;base64,UklGRi1ydXN0LXN5bnRoZXRpYy1hdWRpbw=="
    assert current.transcribe(TranscriptionRequest(audio, language="en"))["text"] == "rust synthetic transcript"
    assert current.speak(SpeechRequest("one", format="wav"))["audio"]["mime"] == "audio/wav"
    assert current.history(limit=0)["total"] == media_floor
    assert current.compact(CompactOptions(checkpoint=True))["status"] in ("compacted", "rejected", "failed")
    original_history = current.history(limit=50)
    floor = current.meta().last_seq
    with current.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as ending:
        current.close()
        assert wait_kind(ending, "session.ended")["sessionId"] == current.id
    resumed = sessions.resume(current.id)
    assert resumed.id == current.id and resumed.created.resumed
    assert resumed.history(limit=50)["messages"] == original_history["messages"]
    with resumed.events("9007199254740991", deadline_ms=now_ms() + stream_seconds * 1000) as observing:
        gap = next(observing)
        assert gap.kind == "server.replay.gap" and gap.raw["reason"] == "ahead_of_log"
        tracker = TurnTracker.from_replay(floor)
        assert tracker.observe(gap) is None and tracker.needs_reconciliation
        assert observing.last_event_id is None
    resumed.close()


def test_explicit_interrupt_ends_the_blocked_turn_aborted(clients):
    sessions = SessionClient(clients())
    blocked = sessions.create()
    floor = blocked.meta().last_seq
    with blocked.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as observing:
        blocked.send("GO-BLOCK")
        wait_kind(observing, "msg.text.delta")
        assert blocked.meta().status == "running"
        blocked.interrupt()
        tracker = TurnTracker.from_replay(floor)
        for event in observing:
            tracker.observe(event)
            if event.kind == "turn.aborted":
                assert event.envelope["terminalStatus"] == "aborted"
                break
    wait_idle(blocked)
    blocked.close()


def test_blocked_model_continues_when_released(clients, fixture_process):
    sessions = SessionClient(clients())
    session = sessions.create()
    floor = session.meta().last_seq
    with session.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as observing:
        session.send("GO-BLOCK")
        wait_kind(observing, "msg.text.delta")
        assert fixture_process.command({"command": "release-model"})["result"]["released"] is True
        outcome = None
        tracker = TurnTracker.from_replay(floor)
        for event in observing:
            outcome = tracker.observe(event) or outcome
            if event.kind == "turn.completed":
                break
    wait_idle(session)
    session.close()


def test_questions_wrong_ticket_revoked_auth_answer_twice_and_expiry(clients, fixture_process):
    sessions = SessionClient(clients())
    current = sessions.create()
    floor = current.meta().last_seq
    with current.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as stream:
        current.send("GO-QUESTION")
        request = wait_kind(stream, "server.question.request")
        question = request["questions"][0]
        answer = Answer(question["id"], [question["options"][0]["id"]])
        ticket = request["requestId"]
        rejected(lambda: current.answer("wrong-ticket", [answer]), (404,))
        invented = rejected(lambda: current.answer(ticket, [Answer(question["id"], ["invented-option"])]), (400,))
        assert invented.wire_code == "invalid_request" and invented.detail["domainCode"] == "validation_failed"
        fixture_process.command({"command": "set-auth", "allowed": False})
        try:
            rejected(lambda: current.answer(ticket, [answer]), (401, 403))
        finally:
            fixture_process.command({"command": "set-auth", "allowed": True})
        assert current.answer(ticket, [answer]).accepted
    with current.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as replay:
        finish(replay, TurnTracker(floor))
    wait_idle(current)
    rejected(lambda: current.answer(ticket, [answer]), (409,))
    current.close()
    expired = sessions.create()
    with expired.events(deadline_ms=now_ms() + stream_seconds * 1000) as stream:
        expired.send("GO-QUESTION")
        request = wait_kind(stream, "server.question.request")
    time.sleep(0.75)
    question = request["questions"][0]
    rejected(lambda: expired.answer(request["requestId"], [Answer(question["id"], [question["options"][0]["id"]])]),
             (410,))
    expired.close()


def test_errors_are_the_unified_envelope_with_the_unified_headers(clients, fixture_process):
    client = clients()
    error = rejected(lambda: client.call("session.get", CallOptions(parameters={"id": "s_nothing"})), (404,))
    assert error.wire_code == "not_found" and error.detail["domainCode"] == "session_not_found"
    fixture_process.command({"command": "set-auth", "allowed": False})
    try:
        assert rejected(lambda: client.call("session.list"), (401,)).wire_code == "unauthorized"
    finally:
        fixture_process.command({"command": "set-auth", "allowed": True})
    validate_wire("unified-v1", "UnifiedError", {
        "contract": "unified-v1", "traceId": "t", "requestId": None, "code": error.wire_code,
        "status": 404, "retryAction": error.retry_action, "message": "m", "detail": error.detail})


def test_async_client_create_stream_turn_history_close(clients):
    async def flow() -> None:
        async with AsyncSessionClient(clients()) as facade:
            created = await facade.create()
            floor = (await created.meta()).last_seq
            tracker = TurnTracker(floor)
            async with await created.events(str(floor), deadline_ms=now_ms() + stream_seconds * 1000) as stream:
                assert (await created.send("PY-ASYNC-TURN")).accepted
                terminal = None
                async for event in stream:
                    terminal = tracker.observe(event)
                    if terminal is not None:
                        break
                assert terminal is not None and terminal.status == "completed"
            assert (await created.history(limit=0))["total"] >= 2
            await created.close()

    asyncio.run(flow())
