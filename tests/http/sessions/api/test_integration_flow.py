"""The SDK's public session flow (tansr-python ``integration/session.py``), run as one black-box
scenario against ``troupe fixture tansr``: the sessions carry over from phase to phase as they
do there, and the test ends by comparing the phases passed with the flow's 13 phase names.

Our own code, written from the flow's phases (the public file itself is not in this
repository); the per-feature detail lives in ``test_sdk_flow.py`` and ``test_inputs_sdk.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("tansr_sdk")

from tansr_sdk.lifecycle import CancellationToken, now_ms  # noqa: E402
from tansr_sdk.session import (  # noqa: E402
    Answer,
    AsyncSessionClient,
    CompactOptions,
    ImageBlock,
    Input,
    InputContent,
    InputTarget,
    SessionClient,
    SpeechRequest,
    TextBlock,
    TranscriptionRequest,
    TurnTracker,
)
from tansr_sdk.strict_json import dumps, loads  # noqa: E402

from .test_sdk_flow import (  # noqa: E402, F401
    clients,
    complete,
    finish,
    png,
    refused_to_others,
    rejected,
    wait_idle,
    wait_kind,
)

public_phases = [
    "create-live-resume-original-identity",
    "two-turn-current-terminal-with-original-turn-id",
    "attach-history-zero-and-content",
    "local-stream-cancel-keeps-remote-idle",
    "cross-owner-cross-family-attach-resume-no-replacement",
    "image-checkpoint-export-import-restore-delete",
    "synthetic-stt-tts-and-compaction-status",
    "dormant-resume-and-ahead-gap-explicit-reconciliation",
    "explicit-remote-interrupt-aborted-terminal",
    "concurrent-same-turn-input-idempotency-consumption-epoch",
    "question-original-ticket-options-revocation-expiry",
    "explicit-close",
    "async-create-stream-current-turn-history-close",
]
stream_ms = 25_000


def observed(session):
    floor = session.meta().last_seq
    return floor, session.events(str(floor), deadline_ms=now_ms() + stream_ms)


def test_the_public_session_flow_phase_by_phase(clients, fixture_process):  # noqa: F811
    passed: list[str] = []
    control = fixture_process.command
    sessions = SessionClient(clients())
    current = sessions.create()
    assert sessions.resume(current.id).id == current.id
    assert not sessions.resume(current.id).created.resumed
    passed.append(public_phases[0])

    assert current.compact()["status"] == "rejected"
    first, second = complete(current, "PY-FIRST"), complete(current, "PY-SECOND")
    assert "go-real-serve-answer" in first and second
    passed.append(public_phases[1])

    attached = sessions.attach(current.id)
    count, history = attached.history(limit=0), attached.history(limit=50)
    assert count["messages"] == [] and count["total"] >= 4
    assert count["total"] == history["total"] and history["sessionId"] == current.id
    passed.append(public_phases[2])

    local = CancellationToken()
    stream = attached.events(str(attached.meta().last_seq), cancel=local)
    local.cancel()
    assert rejected(lambda: next(stream)).code == "cancelled"
    assert attached.meta().status == "idle"
    stream.close()
    passed.append(public_phases[3])

    refused_to_others(clients, sessions, current.id)
    passed.append(public_phases[4])

    floor, stream = observed(current)
    with stream:
        current.send_blocks([TextBlock("PY-SNAPSHOT"), ImageBlock("image/png", png)])
        assert "go-real-serve-answer" in finish(stream, TurnTracker(floor))
    wait_idle(current)
    assert "image/png" in dumps(current.history(limit=50)).decode()
    total = current.history(limit=0)["total"]
    checkpoint = current.checkpoint("原始快照")
    assert checkpoint.message_count == total
    original = current.export_checkpoint(checkpoint.checkpoint_id)
    imported = current.import_checkpoint(original, "导入副本")
    assert loads(current.export_checkpoint(imported.checkpoint_id))["checkpoint"]["messages"] == \
        loads(original)["checkpoint"]["messages"]
    assert current.restore(imported.checkpoint_id, False)["toMessages"] == total
    current.delete_checkpoint(imported.checkpoint_id)
    rejected(lambda: current.export_checkpoint(imported.checkpoint_id))
    rejected(lambda: current.import_checkpoint(b"invalid-snapshot"))
    passed.append(public_phases[5])

    audio = "data:audio/wav;base64,UklGRi1ydXN0LXN5bnRoZXRpYy1hdWRpbw=="
    assert current.transcribe(TranscriptionRequest(audio, language="en"))["text"] == "rust synthetic transcript"
    assert current.speak(SpeechRequest("one", format="wav"))["audio"]["mime"] == "audio/wav"
    assert current.history(limit=0)["total"] == total
    assert current.compact(CompactOptions(checkpoint=True))["status"] in ("compacted", "rejected", "failed")
    passed.append(public_phases[6])

    kept = current.history(limit=50)
    floor, ending = observed(current)
    with ending:
        current.close()
        assert wait_kind(ending, "session.ended")["sessionId"] == current.id
    resumed = sessions.resume(current.id)
    assert resumed.id == current.id and resumed.created.resumed
    assert resumed.history(limit=50)["messages"] == kept["messages"]
    with resumed.events("9007199254740991", deadline_ms=now_ms() + stream_ms) as observing:
        gap = next(observing)
        assert gap.kind == "server.replay.gap" and gap.raw["reason"] == "ahead_of_log"
        tracker = TurnTracker.from_replay(floor)
        assert tracker.observe(gap) is None and tracker.needs_reconciliation
        assert observing.last_event_id is None
    current = resumed
    passed.append(public_phases[7])

    blocked = sessions.create()
    floor, observing = observed(blocked)
    with observing:
        blocked.send("GO-BLOCK")
        wait_kind(observing, "msg.text.delta")
        target = blocked.input_capabilities()["target"]
        blocked.interrupt()
        finish(observing, TurnTracker.resume(floor, target["turnId"]), "aborted")
    blocked.close()
    passed.append(public_phases[8])

    same_turn_inputs(sessions, control)
    passed.append(public_phases[9])
    questions(sessions, control)
    passed.append(public_phases[10])
    current.close()
    passed.append(public_phases[11])

    async def asynchronous():
        async with AsyncSessionClient(clients()) as facade:
            created = await facade.create()
            floor = (await created.meta()).last_seq
            tracker, terminal = TurnTracker(floor), None
            async with await created.events(str(floor), deadline_ms=now_ms() + stream_ms) as events:
                assert (await created.send("PY-ASYNC-TURN")).accepted
                async for event in events:
                    terminal = tracker.observe(event)
                    if terminal is not None:
                        break
            assert terminal is not None and terminal.status == "completed"
            assert (await created.history(limit=0))["total"] >= 2
            await created.close()

    asyncio.run(asynchronous())
    passed.append(public_phases[12])
    assert passed == public_phases


def same_turn_inputs(sessions, control) -> None:
    current = sessions.create()
    complete(current, "PY-BEFORE-INPUT")
    checkpoint = current.checkpoint("pre-input-generation")
    floor, observing = observed(current)
    with observing:
        current.send("GO-BLOCK")
        wait_kind(observing, "msg.text.delta")
        capabilities = current.input_capabilities()
        target = InputTarget(capabilities["target"]["historyEpoch"], capabilities["target"]["turnId"])
        original = Input("py-original", target, InputContent(text="PY-INSERTED actual consumption"), "memory")
        assert capabilities["durableAck"] is False
        rejected(lambda: current.submit_input(Input("py-durable", target, InputContent(text="next"), "durable")))
        barrier = threading.Barrier(2)

        def submit():
            barrier.wait(timeout=5)
            return current.submit_input(original)

        with ThreadPoolExecutor(max_workers=2) as pool:
            one, two = pool.submit(submit), pool.submit(submit)
            first, second = one.result(10), two.result(10)
        assert first == second and first["receipt"]["state"] == "accepted"
        conflict = rejected(lambda: current.submit_input(
            Input(original.input_id, target, InputContent(text="changed"), "memory")))
        assert conflict.detail["domainCode"] == "input_conflict"
        control({"command": "release-model"})
        finish(observing, TurnTracker.resume(floor, target.turn_id))
    wait_idle(current)
    consumed = current.input_status(original.input_id, target)
    assert consumed["receipt"]["state"] == "consumed"
    assert "PY-INSERTED actual consumption" in dumps(current.history(limit=50)).decode()
    assert current.submit_input(original)["receipt"] == consumed["receipt"]
    rejected(lambda: current.submit_input(Input("py-late", target, InputContent(text="late"), "memory")))
    current.restore(checkpoint.checkpoint_id, False)
    rejected(lambda: current.input_status(original.input_id, target))
    rejected(lambda: current.submit_input(original))
    assert current.meta().status == "idle"
    current.close()


def questions(sessions, control) -> None:
    current = sessions.create()
    floor, stream = observed(current)
    with stream:
        current.send("GO-QUESTION")
        request = wait_kind(stream, "server.question.request")
        question = request["questions"][0]
        answer, ticket = Answer(question["id"], [question["options"][0]["id"]]), request["requestId"]
        rejected(lambda: current.answer("wrong-ticket", [answer]), (404,))
        rejected(lambda: current.answer(ticket, [Answer(question["id"], ["invented-option"])]), (400,))
        control({"command": "set-auth", "allowed": False})
        try:
            rejected(lambda: current.answer(ticket, [answer]), (401, 403))
        finally:
            control({"command": "set-auth", "allowed": True})
        assert current.answer(ticket, [answer]).accepted
    with current.events(str(floor), deadline_ms=now_ms() + stream_ms) as replay:
        finish(replay, TurnTracker(floor))
    wait_idle(current)
    rejected(lambda: current.answer(ticket, [answer]), (409,))
    current.close()
    expired = sessions.create()
    with expired.events(deadline_ms=now_ms() + stream_ms) as stream:
        expired.send("GO-QUESTION")
        request = wait_kind(stream, "server.question.request")
    time.sleep(0.75)
    question = request["questions"][0]
    rejected(lambda: expired.answer(request["requestId"], [Answer(question["id"], [question["options"][0]["id"]])]),
             (410,))
    expired.close()
