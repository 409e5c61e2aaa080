"""The session actor through a real ActorSystem and Engine: create → input → ordered events
→ commit → passivate → resume (new epoch, gap for an old cursor) → fork from a checkpoint;
a crash mid-turn loses only that turn; ownership, dormant answers, bridges, drain, webhook.

The kernel is scripted here (``SessionSettings.turn_runner``) so these tests pin the actor's
own behaviour; the kernel has its own tests."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
import trio

import troupe.actors.sessions as sessions
from troupe.actors.sessions import (
    Accepted,
    AnswerTool,
    CloseSession,
    CreateCheckpoint,
    CreateOptions,
    Drain,
    ExportCheckpoint,
    ImportCheckpoint,
    Interrupt,
    ListSessions,
    OpenSession,
    PostInput,
    ReadHistory,
    ReadMeta,
    SessionOpened,
    SessionRefused,
    Subscribe,
    Subscribed,
    TextBlock,
    new_session_id,
)
from troupe.actors.sessions._end_users import end_user_actor_kind
from troupe.actors.sessions._kernel import TurnOutcome
from troupe.actors.sessions._schema import sessions_migrations
from troupe.actors.sessions._session import SessionSettings, session_actor_kind
from troupe.actors.sessions._store import UsageSnapshot, load_session, record_usage
from troupe.actors.sessions._subscribers import Subscriber
from troupe.models import Usage
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

user = "u_1"


async def scripted_turn(request, ports, handle):
    """Echoes the prompt; ``wait`` blocks until interrupted; ``tool`` asks a client tool."""
    turn_id = request.turn_id
    publish = ports.publish
    publish("turn.started", {"input": request.prompt}, turn_id)
    messages = [{"role": "user", "content": request.prompt or "[blocks]"}]
    with handle.scope:
        if request.prompt == "wait":
            await trio.sleep_forever()
        if request.prompt == "tool":
            answer = await ports.bridges.request_tool(
                turn_id=turn_id, call_id="call_1", name="pick", arguments={"x": 1}, timeout_seconds=30
            )
            messages.append({"role": "tool", "content": str(answer.result)})
        publish("msg.text.delta", {"messageId": "m", "index": 0, "text": f"echo {request.prompt}"}, turn_id)
        messages.append({"role": "assistant", "content": f"echo {request.prompt}"})
    if handle.interrupted:
        publish("turn.aborted", {"reason": handle.reason}, turn_id)
        return TurnOutcome("aborted", handle.reason, tuple(messages[:1]))
    publish("turn.completed", {"reason": "end_turn"}, turn_id)
    return TurnOutcome("completed", "end_turn", tuple(messages), Usage(3, 5))


class Notifier:
    def __init__(self):
        self.notices = []

    async def enqueue_turn_end(self, notice):
        self.notices.append(notice)
        return "accepted"


@asynccontextmanager
async def running_system(engine, settings, **session_options):
    system = ActorSystem(
        engine_env(engine),
        [session_actor_kind(settings, **session_options), end_user_actor_kind(active_sessions_max=2)],
        storage=engine,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        try:
            yield system
        finally:
            nursery.cancel_scope.cancel()


def engine_env(engine):
    return engine.test_env


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*sessions_migrations])
    engine.test_env = env
    return engine


@pytest.fixture
def notifier():
    return Notifier()


@pytest.fixture
def settings(notifier):
    return SessionSettings(turn_runner=scripted_turn, notifier=notifier, webhook_recheck_seconds=0.05)


def subscriber_for(system, session_id):
    return Subscriber(session_id, clock=system.env.clock.monotonic)


def frames_of(subscriber):
    """Every frame queued so far, split, as (event name or None, id or None, data dict)."""
    chunks = []
    while (chunk := subscriber.next_chunk_nowait()) is not None:
        chunks.append(chunk)
    parsed = []
    for frame in b"".join(chunks).split(b"\n\n"):
        if not frame:
            continue
        fields = dict(line.split(": ", 1) for line in frame.decode().split("\n"))
        parsed.append((fields.get("event"), fields.get("id"), json.loads(fields["data"])))
    return parsed


async def wait_for(predicate, seconds=5.0):
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.01)


async def create(system, prompt=None, **options):
    session_id = new_session_id(system.env)
    reply = await system.ref("session", session_id).ask(
        OpenSession(end_user_id=user, mode="create", options=CreateOptions(**options), prompt=prompt)
    )
    return session_id, reply


async def idle(system, session_id):
    async def check():
        meta = await system.ref("session", session_id).ask(ReadMeta(end_user_id=user))
        return meta.status == "idle"

    with trio.fail_after(5):
        while not await check():
            await trio.sleep(0.01)


def test_every_exported_name_resolves_and_the_list_is_sorted():
    assert sessions.__all__ == sorted(sessions.__all__)
    assert len(set(sessions.__all__)) == len(sessions.__all__)
    for name in sessions.__all__:
        assert hasattr(sessions, name), name


async def test_create_input_events_commit_passivate_resume_and_gap(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, opened = await create(system)
        assert opened == SessionOpened(session_id, resumed=False, last_seq=0, created=True)
        ref = system.ref("session", session_id)
        subscriber = subscriber_for(system, session_id)
        subscribed = await ref.ask(Subscribe(end_user_id=user, last_event_id=0, subscriber=subscriber))
        assert isinstance(subscribed, Subscribed) and not subscribed.gap
        assert await ref.ask(PostInput(end_user_id=user, prompt="hi")) == Accepted(session_id)
        await idle(system, session_id)
        frames = frames_of(subscriber)
        types = [data["type"] for _, _, data in frames]
        assert types == ["session.created", "turn.started", "msg.text.delta", "turn.completed"]
        seqs = [data["seq"] for _, _, data in frames]
        assert seqs == [1, 2, 3, 4]
        assert [int(frame_id) for _, frame_id, _ in frames] == seqs
        envelope = frames[1][2]
        assert envelope["sessionId"] == session_id and envelope["v"] == 1 and envelope["source"] == "kernel"
        assert "turnId" in envelope and "turnId" not in frames[0][2]
        # Committed: the store's watermark and history are the turn's, read back from disk.
        row = await engine.read(lambda connection: load_session(connection, session_id))
        assert row.last_seq == 4 and row.message_count == 2 and not row.seq_sealed
        assert row.usage.input_tokens == 3 and row.usage.as_of_message_count == 2
        history = await ref.ask(ReadHistory(end_user_id=user))
        assert history.last_seq == 4 and [m["role"] for m in history.messages] == ["user", "assistant"]

        await system.drain()  # every actor passivates: a clean epoch end seals it
        row = await engine.read(lambda connection: load_session(connection, session_id))
        assert row.seq_sealed and row.last_seq == 4
        meta = await ref.ask(ReadMeta(end_user_id=user))
        assert meta.live is False and meta.last_seq == 4 and meta.status == "idle"
        dormant = await ref.ask(PostInput(end_user_id=user, prompt="x"))
        assert isinstance(dormant, SessionRefused) and dormant.code == "session_not_found"

        resumed = await ref.ask(OpenSession(end_user_id=user, mode="resume"))
        # The resumed epoch opens with session.resumed at seq 5, the 201's lastSeq.
        assert resumed == SessionOpened(session_id, resumed=True, last_seq=5, created=True)
        attached = await ref.ask(OpenSession(end_user_id=user, mode="resume"))
        assert attached.created is False and attached.last_seq == 5
        await ref.ask(PostInput(end_user_id=user, prompt="again"))
        await idle(system, session_id)
        old = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=2, subscriber=old))
        replay = frames_of(old)
        assert replay[0][0] == "server.replay.gap" and replay[0][1] is None
        assert replay[0][2]["reason"] == "evicted" and replay[0][2]["requestedAfterSeq"] == 2
        assert [data["seq"] for _, _, data in replay[1:]] == [5, 6, 7, 8]
        assert replay[1][2]["type"] == "session.resumed" and replay[1][2]["previousLastSeq"] == 4
        exact = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=4, subscriber=exact))
        assert [data["seq"] for _, _, data in frames_of(exact)] == [5, 6, 7, 8]


async def test_crash_mid_turn_loses_only_that_turn_and_the_next_epoch_starts_above(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system)
        ref = system.ref("session", session_id)
        await ref.ask(PostInput(end_user_id=user, prompt="kept"))
        await idle(system, session_id)
        await ref.ask(PostInput(end_user_id=user, prompt="wait"))
        await wait_for(lambda: True)
        meta = await ref.ask(ReadMeta(end_user_id=user))
        assert meta.status == "running" and meta.last_seq == 5
    # The system was cancelled under the running turn: a crash, nothing passivated.
    row = await engine.read(lambda connection: load_session(connection, session_id))
    assert row.last_seq == 4 and row.message_count == 2 and not row.seq_sealed
    async with running_system(engine, settings) as system:
        ref = system.ref("session", session_id)
        history = await ref.ask(ReadHistory(end_user_id=user))
        assert [m["content"] for m in history.messages] == ["kept", "echo kept"]
        resumed = await ref.ask(OpenSession(end_user_id=user, mode="resume"))
        # Unsealed: the epoch starts above anything the crashed epoch may have streamed.
        assert resumed.last_seq >= 5
        subscriber = subscriber_for(system, session_id)
        subscribed = await ref.ask(Subscribe(end_user_id=user, last_event_id=5, subscriber=subscriber))
        assert subscribed.gap
        assert frames_of(subscriber)[0][2]["reason"] == "evicted"


async def test_fork_from_a_checkpoint_starts_at_one(engine, settings):
    async with running_system(engine, settings) as system:
        source, _ = await create(system)
        ref = system.ref("session", source)
        await ref.ask(PostInput(end_user_id=user, prompt="one"))
        await idle(system, source)
        checkpoint = await ref.ask(CreateCheckpoint(end_user_id=user, name="first"))
        fork_id = new_session_id(system.env)
        fork = system.ref("session", fork_id)
        opened = await fork.ask(
            OpenSession(end_user_id=user, mode="fork", fork_source_session_id=source,
                        fork_checkpoint_id=checkpoint.checkpoint_id)
        )
        assert opened == SessionOpened(fork_id, resumed=False, last_seq=1, created=True)
        history = await fork.ask(ReadHistory(end_user_id=user))
        assert history.last_seq == 1 and [m["content"] for m in history.messages] == ["one", "echo one"]
        missing = await system.ref("session", new_session_id(system.env)).ask(
            OpenSession(end_user_id=user, mode="fork", fork_source_session_id=source, fork_checkpoint_id="cp_x")
        )
        assert missing.code == "checkpoint_not_found"
        stranger = await system.ref("session", new_session_id(system.env)).ask(
            OpenSession(end_user_id="u_2", mode="fork", fork_source_session_id=source,
                        fork_checkpoint_id=checkpoint.checkpoint_id)
        )
        assert stranger.code == "forbidden"
        exported = await ref.ask(ExportCheckpoint(end_user_id=user, checkpoint_id=checkpoint.checkpoint_id))
        imported = await ref.ask(ImportCheckpoint(end_user_id=user, data=exported.data))
        assert imported.message_count == 2 and imported.checkpoint_id != checkpoint.checkpoint_id
        mismatch = await fork.ask(ImportCheckpoint(end_user_id=user, data=exported.data))
        assert mismatch.code == "session_mismatch"


async def test_ownership_and_unknown_sessions(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system)
        other = await system.ref("session", session_id).ask(ReadMeta(end_user_id="u_2"))
        assert other.code == "forbidden"
        resume_other = await system.ref("session", session_id).ask(OpenSession(end_user_id="u_2", mode="resume"))
        assert resume_other.code == "forbidden"
        unknown = await system.ref("session", "s_nothing").ask(ReadMeta(end_user_id=user))
        assert unknown.code == "session_not_found" and unknown.status == 404
        bad_model = await create(system, model="gpt-unknown")
        assert bad_model[1].code == "create_failed"
        bad_profile = await create(system, capabilities_profile="nope")
        assert bad_profile[1].code == "create_failed"
        no_cwd = await create(system, cwd="/tmp")
        assert no_cwd[1].code == "cwd_not_allowed"


async def test_midturn_blocks_interrupt_close_and_session_ended(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system, prompt="wait")
        ref = system.ref("session", session_id)
        await wait_for(lambda: True)
        blocks = await ref.ask(PostInput(end_user_id=user, blocks=(TextBlock("x"),)))
        assert blocks.code == "midturn_blocks_rejected" and blocks.status == 422
        subscriber = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=0, subscriber=subscriber))
        assert await ref.ask(Interrupt(end_user_id=user)) == Accepted(session_id)
        assert await ref.ask(Interrupt(end_user_id=user)) == Accepted(session_id)
        await idle(system, session_id)
        types = [data["type"] for _, _, data in frames_of(subscriber)]
        assert types[-1] == "turn.aborted"
        assert await ref.ask(CloseSession(end_user_id=user)) == Accepted(session_id)
        ended = await ref.ask(PostInput(end_user_id=user, prompt="late"))
        assert ended.code == "session_ended"
        row = await engine.read(lambda connection: load_session(connection, session_id))
        assert row.status == "ended" and row.seq_sealed
        meta = await ref.ask(ReadMeta(end_user_id=user))
        assert meta.status == "ended" and meta.live is False


async def test_drain_aborts_the_running_turn_and_commits_it(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system, prompt="wait")
        ref = system.ref("session", session_id)
        await wait_for(lambda: True)
        subscriber = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=0, subscriber=subscriber))
        assert await ref.ask(Drain()) == Accepted(session_id)
        assert subscriber.closed and subscriber.closed_reason == "shutdown"
        row = await engine.read(lambda connection: load_session(connection, session_id))
        assert row.seq_sealed and row.message_count == 1  # the aborted turn's input is kept
        events = await engine.read(
            lambda connection: [kind for (kind,) in connection.execute(
                "SELECT json_extract(data, '$.type') FROM agent_session_events ORDER BY seq")]
        )
        assert events[-1] == "turn.aborted"


async def test_client_tool_bridge_round_trip(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system, prompt="tool")
        ref = system.ref("session", session_id)
        subscriber = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=0, subscriber=subscriber))
        await wait_for(lambda: any(d["type"] == "server.tool.request" for _, _, d in frames_of_peek(subscriber)))
        assert await ref.ask(AnswerTool(end_user_id=user, call_id="call_1", result="picked")) == Accepted(session_id)
        again = await ref.ask(AnswerTool(end_user_id=user, call_id="call_1", result="twice"))
        assert again.code == "request_already_answered" and again.status == 409
        await idle(system, session_id)
        history = await ref.ask(ReadHistory(end_user_id=user))
        assert history.messages[1]["content"] == "picked"


_peeked: dict[int, list] = {}


def frames_of_peek(subscriber):
    """Accumulates frames across calls (``frames_of`` consumes the queue)."""
    seen = _peeked.setdefault(id(subscriber), [])
    seen.extend(frames_of(subscriber))
    return seen


async def test_webhook_once_per_turn_only_without_subscribers(engine, settings, notifier):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system, prompt="alone")
        await idle(system, session_id)
        assert [(n.status, n.reason) for n in notifier.notices] == [("completed", "end_turn")]
        assert notifier.notices[0].last_seq == 4 and notifier.notices[0].end_user_id == user
        ref = system.ref("session", session_id)
        subscriber = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=-1, subscriber=subscriber))
        await ref.ask(PostInput(end_user_id=user, prompt="watched"))
        await idle(system, session_id)
        await trio.sleep(0.2)  # past the re-check: still subscribed, so nothing is sent
        assert len(notifier.notices) == 1


async def test_usage_snapshot_stale_warning_on_first_connection_after_resume(engine, settings):
    async with running_system(engine, settings) as system:
        session_id, _ = await create(system, prompt="one")
        await idle(system, session_id)
        await system.drain()
    # As if the process died between a turn's commit and its usage snapshot.
    await engine.write(lambda connection: record_usage(connection, session_id, UsageSnapshot(as_of_message_count=0)))
    async with running_system(engine, settings) as system:
        ref = system.ref("session", session_id)
        opened = await ref.ask(OpenSession(end_user_id=user, mode="resume"))
        first = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=opened.last_seq, subscriber=first))
        frames = frames_of(first)
        assert frames[0][0] == "server.platform.warning"
        assert frames[0][2]["code"] == "usage_snapshot_stale" and frames[0][2]["source"] == "server"
        assert int(frames[0][1]) == opened.last_seq + 1
        second = subscriber_for(system, session_id)
        await ref.ask(Subscribe(end_user_id=user, last_event_id=int(frames[0][1]), subscriber=second))
        assert frames_of(second) == []


async def test_list_sessions_through_the_end_user(engine, settings):
    async with running_system(engine, settings) as system:
        first, _ = await create(system)
        second, _ = await create(system)
        listed = await system.ref("end_user", user).ask(ListSessions(end_user_id=user, limit=10))
        assert listed.total == 2 and {meta.session_id for meta in listed.sessions} == {first, second}
        assert all(meta.live for meta in listed.sessions)
