"""Strict inputs through the session actor and the real kernel: receipts, duplicates,
conflicts, late / stale / durable refusals, consumption by the running turn, settlement at
the turn's end (consumed / closed / cancelled after a crash), retention and the per-turn bound.

The model is a gate: a turn whose last user message is ``GO-BLOCK`` streams one delta and
waits until the test releases it, so inputs can be posted into a turn that is really running.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
import trio

from troupe.actors.sessions import (
    CreateCheckpoint,
    CreateOptions,
    InputAccepted,
    InputCapabilities,
    InputStatus,
    InputTarget,
    Interrupt,
    OpenSession,
    PostInput,
    ReadHistory,
    ReadInputCapabilities,
    ReadInputStatus,
    ReadMeta,
    SessionRefused,
    SubmitInput,
    inputs_per_turn_max,
    new_session_id,
)
from troupe.actors.sessions._end_users import end_user_actor_kind
from troupe.actors.sessions._protocol import RestoreCheckpoint
from troupe.actors.sessions._schema import sessions_migrations
from troupe.actors.sessions._session import SessionSettings, session_actor_kind
from troupe.models import CompletionChunk, Usage
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

user = "u_1"


class GateModel:
    """Answers ``answer:<last user text>``; blocks on ``GO-BLOCK`` until ``release()``."""

    def __init__(self) -> None:
        self.gate = trio.Event()

    def release(self) -> None:
        self.gate.set()

    async def stream(self, request):
        last = [message for message in request.messages if message.role == "user"][-1].content
        yield CompletionChunk(text_delta="thinking ")
        if last == "GO-BLOCK":
            await self.gate.wait()
        yield CompletionChunk(text_delta=f"answer:{last}", finish_reason="stop", usage=Usage(1, 1))


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    env.model = GateModel()
    engine = await Engine.open(env, nursery=nursery, migrations=[*sessions_migrations])
    engine.test_env = env
    return engine


@asynccontextmanager
async def running_system(engine, settings=None, **options):
    system = ActorSystem(engine.test_env, [session_actor_kind(settings or SessionSettings()), end_user_actor_kind()],
                         storage=engine, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        try:
            yield system
        finally:
            nursery.cancel_scope.cancel()


async def create(system):
    session_id = new_session_id(system.env)
    await system.ref("session", session_id).ask(OpenSession(end_user_id=user, mode="create", options=CreateOptions()))
    return system.ref("session", session_id), session_id


async def running_target(ref) -> InputTarget:
    with trio.fail_after(5):
        while True:
            capabilities = await ref.ask(ReadInputCapabilities(end_user_id=user))
            if capabilities.target is not None:
                return capabilities.target
            await trio.sleep(0.005)


async def idle(ref):
    with trio.fail_after(5):
        while (await ref.ask(ReadMeta(end_user_id=user))).status != "idle":
            await trio.sleep(0.005)


def submit(input_id, target, text="PY-INSERTED", **fields):
    return SubmitInput(end_user_id=user, input_id=input_id, target=target, text=text, **fields)


async def history_text(ref) -> str:
    history = await ref.ask(ReadHistory(end_user_id=user))
    return json.dumps(history.messages, ensure_ascii=False)


async def test_capabilities_of_an_idle_session_have_no_target(engine):
    async with running_system(engine) as system:
        ref, _ = await create(system)
        capabilities = await ref.ask(ReadInputCapabilities(end_user_id=user))
        assert isinstance(capabilities, InputCapabilities)
        body = capabilities.encode()
        assert body["target"] is None and body["historyEpoch"] == "h1"
        assert body["durableAck"] is False and body["memoryAck"] is True
        assert body["limits"]["inputsPerTurn"] == inputs_per_turn_max


async def test_the_same_turn_flow_duplicates_conflict_consumption_late_and_restore(engine):
    model = engine.test_env.model
    async with running_system(engine) as system:
        ref, session_id = await create(system)
        await ref.ask(PostInput(end_user_id=user, prompt="before"))
        await idle(ref)
        checkpoint = await ref.ask(CreateCheckpoint(end_user_id=user, name="pre-input"))
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        assert target.history_epoch == "h1"

        refused = await ref.ask(submit("no-downgrade", target, durability="durable"))
        assert isinstance(refused, SessionRefused) and refused.code == "capability_disabled"

        first, second = [None], [None]

        async def post(slot):
            slot[0] = await ref.ask(submit("original", target))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, first)
            nursery.start_soon(post, second)
        assert isinstance(first[0], InputAccepted)
        assert first[0].encode() == second[0].encode()
        receipt = first[0].encode()["receipt"]
        assert receipt == {"sessionId": session_id, "inputId": "original", "historyEpoch": "h1",
                           "turnId": target.turn_id, "source": "strict", "state": "accepted",
                           "durability": "memory", "ordinal": 1, "revision": 1}

        conflict = await ref.ask(submit("original", target, text="changed"))
        assert conflict.code == "input_conflict" and conflict.status == 409
        conflict = await ref.ask(submit("original", target, blocks=True))
        assert conflict.code == "input_conflict"

        model.release()
        await idle(ref)
        status = await ref.ask(ReadInputStatus(end_user_id=user, input_id="original", target=target))
        assert isinstance(status, InputStatus)
        consumed = status.encode()["receipt"]
        assert consumed["state"] == "consumed" and consumed["revision"] == 2
        text = await history_text(ref)
        assert text.count("PY-INSERTED") == 2  # the user message once, and the model's answer to it
        assert text.count('"text": "PY-INSERTED"') == 1

        again = await ref.ask(submit("original", target))
        assert again.encode()["receipt"] == consumed
        late = await ref.ask(submit("new-after-end", target, text="late"))
        assert late.code == "input_target_closed"
        assert "late" not in await history_text(ref)

        await ref.ask(RestoreCheckpoint(end_user_id=user, checkpoint_id=checkpoint.checkpoint_id))
        stale = await ref.ask(ReadInputStatus(end_user_id=user, input_id="original", target=target))
        assert stale.code == "input_target_stale"
        stale = await ref.ask(submit("original", target))
        assert stale.code == "input_target_stale"
        assert (await ref.ask(ReadMeta(end_user_id=user))).status == "idle"
        assert (await ref.ask(ReadInputCapabilities(end_user_id=user))).history_epoch == "h2"


async def test_an_interrupted_turn_closes_what_it_did_not_take(engine):
    async with running_system(engine) as system:
        ref, _ = await create(system)
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        assert isinstance(await ref.ask(submit("pending", target)), InputAccepted)
        await ref.ask(Interrupt(end_user_id=user))
        await idle(ref)
        status = await ref.ask(ReadInputStatus(end_user_id=user, input_id="pending", target=target))
        receipt = status.encode()["receipt"]
        assert receipt["state"] == "closed" and receipt["reason"] == "aborted_by_user" and receipt["revision"] == 2
        assert "PY-INSERTED" not in await history_text(ref)


async def test_inputs_per_turn_at_and_over_the_bound(engine):
    model = engine.test_env.model
    async with running_system(engine) as system:
        ref, _ = await create(system)
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        for index in range(inputs_per_turn_max):
            reply = await ref.ask(submit(f"in-{index}", target, text=f"t{index}"))
            assert reply.receipt.ordinal == index + 1
        over = await ref.ask(submit("one-more", target))
        assert over.code == "input_limit_exceeded" and over.status == 422
        assert (await ref.ask(submit("in-0", target, text="t0"))).receipt.state == "accepted"
        model.release()
        await idle(ref)
        for index in (0, inputs_per_turn_max - 1):
            status = await ref.ask(ReadInputStatus(end_user_id=user, input_id=f"in-{index}", target=target))
            assert status.receipt.state == "consumed"
        missing = await ref.ask(ReadInputStatus(end_user_id=user, input_id="one-more", target=target))
        assert missing.code == "input_not_found"


async def test_receipts_are_kept_for_the_current_and_the_last_turn_only(engine):
    model = engine.test_env.model
    async with running_system(engine) as system:
        ref, _ = await create(system)
        targets = []
        for turn in range(3):
            model.gate = trio.Event()
            await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
            target = await running_target(ref)
            targets.append(target)
            assert isinstance(await ref.ask(submit(f"turn-{turn}", target)), InputAccepted)
            model.release()
            await idle(ref)
        oldest = await ref.ask(ReadInputStatus(end_user_id=user, input_id="turn-0", target=targets[0]))
        assert oldest.code == "input_not_found"
        last = await ref.ask(ReadInputStatus(end_user_id=user, input_id="turn-2", target=targets[2]))
        assert last.receipt.state == "consumed"


async def test_a_crash_mid_turn_cancels_the_acknowledged_receipts_with_a_reason(engine):
    async with running_system(engine) as system:
        ref, session_id = await create(system)
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        accepted = await ref.ask(submit("acked", target))
        assert accepted.receipt.state == "accepted"
    # The system was cancelled under the running turn: a crash.
    async with running_system(engine) as system:
        ref = system.ref("session", session_id)
        status = await ref.ask(ReadInputStatus(end_user_id=user, input_id="acked", target=target))
        receipt = status.encode()["receipt"]
        assert receipt["state"] == "cancelled" and receipt["reason"] == "turn_lost" and receipt["revision"] == 2
        again = await ref.ask(OpenSession(end_user_id=user, mode="resume"))
        assert again.resumed
        duplicate = await ref.ask(submit("acked", target))
        assert duplicate.encode()["receipt"] == receipt
        assert "PY-INSERTED" not in await history_text(ref)


async def test_durable_ack_when_the_deployment_turns_it_on(engine):
    model = engine.test_env.model
    async with running_system(engine, SessionSettings(input_durable_ack=True)) as system:
        ref, _ = await create(system)
        capabilities = await ref.ask(ReadInputCapabilities(end_user_id=user))
        assert capabilities.encode()["durableAck"] is True
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        reply = await ref.ask(submit("durable", target, durability="durable"))
        assert reply.receipt.durability == "durable"
        model.release()
        await idle(ref)


async def test_inputs_on_a_dormant_or_foreign_session_are_refused(engine):
    async with running_system(engine) as system:
        ref, _ = await create(system)
        target = InputTarget("h1", "t_none")
        foreign = await ref.ask(SubmitInput(end_user_id="u_2", input_id="x", target=target, text="x"))
        assert foreign.code == "forbidden"
        unknown = await system.ref("session", "s_missing").ask(submit("x", target))
        assert unknown.code == "session_not_found"
        idle_late = await ref.ask(submit("x", target))
        assert idle_late.code == "input_target_closed"


async def test_a_drain_mid_turn_aborts_and_commits_the_turn_and_closes_its_inputs(engine):
    # The runtime cancels an actor's tasks before on_passivate: the turn must still end
    # aborted (server_draining) with its input in the history, not as an internal error.
    async with running_system(engine) as system:
        ref, session_id = await create(system)
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        assert isinstance(await ref.ask(submit("drained", target)), InputAccepted)
        await system.drain()
        status = await ref.ask(ReadInputStatus(end_user_id=user, input_id="drained", target=target))
        receipt = status.encode()["receipt"]
        assert receipt["state"] == "closed" and receipt["reason"] == "server_draining"
        history = (await ref.ask(ReadHistory(end_user_id=user))).messages
        assert [message.get("text") for message in history if message["role"] == "user"] == ["GO-BLOCK"]
        events = await engine.read(lambda connection: [
            data for (data,) in connection.execute(
                "SELECT data FROM agent_session_events WHERE session_id = ? ORDER BY seq", (session_id,))])
        text = " ".join(events)
        assert "turn.aborted" in text and "server_draining" in text and "turn.error" not in text


async def test_an_eviction_after_the_input_was_taken_consumes_it(engine):
    model = engine.test_env.model
    async with running_system(engine, live_actors_max=2) as system:
        ref, session_id = await create(system)
        model.gate = trio.Event()
        await ref.ask(PostInput(end_user_id=user, prompt="GO-BLOCK"))
        target = await running_target(ref)
        assert isinstance(await ref.ask(submit("taken", target, text="GO-BLOCK")), InputAccepted)
        model.release()  # step 0 answers, takes the input; step 1 blocks on the input's GO-BLOCK
        model.gate = trio.Event()
        with trio.fail_after(5):
            while "taken" not in json.dumps(book_messages(system, session_id)):
                await trio.sleep(0.005)
        for _ in range(2):  # two more actors evict the least recently used: our session
            await create(system)
        assert ("session", session_id) not in system._live
        status = await ref.ask(ReadInputStatus(end_user_id=user, input_id="taken", target=target))
        assert status.encode()["receipt"]["state"] == "consumed"
        text = await history_text(ref)
        assert text.count('"inputId": "taken"') == 1


def book_messages(system, session_id):
    """The running turn's inbox: what the kernel has taken so far."""
    cell = system._live.get(("session", session_id))
    actor = getattr(cell, "actor", None)
    inbox = getattr(getattr(actor, "input_book", None), "inbox", None)
    return [] if inbox is None else list(inbox.taken)
