"""Strict inputs driven through the real client, ``tansr-sdk`` 0.1.0, against real hypercorn:
input capabilities with the running turn's target, concurrent duplicates released by a
barrier get identical receipts, a conflicting duplicate carries ``domainCode:
input_conflict``, ``durable`` is never attempted while ``durableAck`` is false, the accepted
input is consumed by the running turn (its text in history once), a duplicate after the end
returns the consumed receipt unchanged, a late input and the old epoch after a restore are
refused and start no turn.  The bounds and the envelope of the refusals are checked over raw
HTTP.

The SDK is synchronous: its calls run in worker threads; the model is a gate the test opens.
"""

from __future__ import annotations

import json
import threading

import pytest
import trio

from troupe.actors.sessions import input_text_characters_max
from troupe.models import CompletionChunk, Usage

tansr_sdk = pytest.importorskip("tansr_sdk")
from tansr_sdk.api import AuthToken, Client  # noqa: E402
from tansr_sdk.errors import Error  # noqa: E402
from tansr_sdk.session import Input, InputContent, InputTarget, SessionClient  # noqa: E402

inserted = "PY-INSERTED actual consumption"


class GateModel:
    """Answers ``answer:<last user text>``; blocks on ``GO-BLOCK`` until released."""

    def __init__(self) -> None:
        self.gate = trio.Event()

    async def stream(self, request):
        last = [message for message in request.messages if message.role == "user"][-1].content
        yield CompletionChunk(text_delta="thinking ")
        if last == "GO-BLOCK":
            await self.gate.wait()
        yield CompletionChunk(text_delta=f"answer:{last}", finish_reason="stop", usage=Usage(1, 1))


def refused(call):
    try:
        call()
    except Error as error:
        return error
    raise AssertionError("the call unexpectedly succeeded")


async def in_thread(call):
    return await trio.to_thread.run_sync(call)


async def until(check, seconds=10.0):
    with trio.fail_after(seconds):
        while True:
            value = await in_thread(check)
            if value:
                return value
            await trio.sleep(0.01)


@pytest.fixture
async def sdk_session(sessions, secret):
    model = GateModel()
    sessions.env.model = model
    api = Client(sessions.url, lambda cancel: AuthToken(secret, "owner"), timeout=20)
    client = SessionClient(api)
    try:
        yield client, model
    finally:
        await in_thread(lambda: api.close(5))


async def test_same_turn_inputs_through_the_sdk(sdk_session, sessions, secret):
    client, model = sdk_session
    current = await in_thread(client.create)
    await in_thread(lambda: current.send("before"))
    await until(lambda: current.meta().status == "idle")
    checkpoint = await in_thread(lambda: current.checkpoint("pre-input"))

    await in_thread(lambda: current.send("GO-BLOCK"))
    capabilities = await until(lambda: (lambda found: found if found.get("target") else None)(
        current.input_capabilities()))
    assert capabilities["durableAck"] is False
    target = InputTarget(capabilities["target"]["historyEpoch"], capabilities["target"]["turnId"])
    original = Input("same-turn-original", target, InputContent(text=inserted), "memory")

    error = await in_thread(lambda: refused(lambda: current.submit_input(
        Input("no-downgrade", target, InputContent(text="next"), "durable"))))
    assert error.code == "invalid_input" and not error.http_status  # refused before any write

    barrier = threading.Barrier(2)
    results = [None, None]

    async def submit(slot):
        def call():
            barrier.wait(timeout=5)
            return current.submit_input(original)

        results[slot] = await in_thread(call)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit, 0)
        nursery.start_soon(submit, 1)
    assert results[0] == results[1]
    assert results[0]["receipt"]["state"] == "accepted" and results[0]["receipt"]["ordinal"] == 1

    conflict = await in_thread(lambda: refused(lambda: current.submit_input(
        Input(original.input_id, target, InputContent(text="changed"), "memory"))))
    assert conflict.http_status == 409 and conflict.detail["domainCode"] == "input_conflict"

    model.gate.set()
    await until(lambda: current.meta().status == "idle")
    consumed = await in_thread(lambda: current.input_status(original.input_id, target))
    assert consumed["receipt"]["state"] == "consumed"
    history = await in_thread(lambda: current.history(limit=50))
    assert [message.get("text") for message in history["messages"]].count(inserted) == 1
    again = await in_thread(lambda: current.submit_input(original))
    assert again["receipt"] == consumed["receipt"]
    late = await in_thread(lambda: refused(lambda: current.submit_input(
        Input("new-after-end", target, InputContent(text="late"), "memory"))))
    assert late.http_status == 409 and late.detail["domainCode"] == "input_target_closed"

    await in_thread(lambda: current.restore(checkpoint.checkpoint_id, False))
    stale = await in_thread(lambda: refused(lambda: current.input_status(original.input_id, target)))
    assert stale.http_status == 409 and stale.wire_code == "stale_generation"
    await in_thread(lambda: refused(lambda: current.submit_input(original)))
    assert (await in_thread(current.meta)).status == "idle"
    await in_thread(current.close)


async def test_input_bounds_and_refusals_over_raw_http(sdk_session, sessions, secret):
    client, model = sdk_session
    current = await in_thread(client.create)
    await in_thread(lambda: current.send("GO-BLOCK"))
    capabilities = await until(lambda: (lambda found: found if found.get("target") else None)(
        current.input_capabilities()))
    target = capabilities["target"]
    path = f"/api/sessions/{current.id}/inputs"
    async with sessions.client(secret) as http:
        async def post(body):
            return await http.post(path, content=json.dumps(body))

        at_bound = await post({"inputId": "at", "target": target,
                               "content": {"text": "x" * input_text_characters_max}})
        assert at_bound.status_code == 202
        over = await post({"inputId": "over", "target": target,
                           "content": {"text": "x" * (input_text_characters_max + 1)}})
        assert over.status_code == 400 and over.json()["code"] == "invalid_request"
        assert over.headers["tansr-contract"] == "unified-v1"
        durable = await post({"inputId": "durable", "target": target, "content": {"text": "d"}, "ack": "durable"})
        assert durable.status_code == 404 and durable.json()["detail"]["domainCode"] == "capability_disabled"
        both = await post({"inputId": "both", "target": target, "content": {"text": "a", "blocks": []}})
        assert both.status_code == 400
        blocks = await post({"inputId": "blocks", "target": target,
                             "content": {"blocks": [{"t": "text", "text": "b1"}, {"t": "text", "text": "b2"}]}})
        assert blocks.status_code == 202 and blocks.json()["receipt"]["ordinal"] == 2
        stale = await post({"inputId": "stale", "target": {**target, "historyEpoch": "h0"}, "content": {"text": "s"}})
        assert stale.status_code == 409 and stale.json()["code"] == "stale_generation"
        assert stale.json()["retryAction"] == "rebind"
        status = await http.get(f"{path}/at", params={"historyEpoch": target["historyEpoch"], "turnId": "t_other"})
        assert status.status_code == 404 and status.json()["detail"]["domainCode"] == "input_not_found"
    model.gate.set()
    await until(lambda: current.meta().status == "idle")
    await in_thread(current.close)
