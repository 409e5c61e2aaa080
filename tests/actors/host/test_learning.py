"""Pace batching and the learners on a real engine and actor system: batches by count, idle
time and maximum wait on a test clock, LearnNow, memories from the LocalModel with their
sources, a paused model that catches up, failures retried then abandoned, content-filter
refusals, and batches that survive a restart of the whole system on the same data."""

from __future__ import annotations

import json

import pytest
import trio

from tests.http.host._host_harness import MovableClock
from troupe.actors.host import (
    AcceptMessages,
    LearnAccepted,
    LearnNow,
    NewMessage,
    Pace,
    entry_actor_kind,
    host_migrations,
    learner_actor_kind,
    message_learning_states,
)
from troupe.auth import TokenGrant, TokenScope, auth_migrations
from troupe.models import Completion, LocalModel, ModelUnavailable, ProviderError
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

grant = TokenGrant(1, "connector", TokenScope.all())


def new(key: str, content: str = "我喜欢寿司。", **fields) -> NewMessage:
    return NewMessage(dedupe_key=key, sender="小林", content=content, occurred_at="2026-10-10T20:00:00+08:00",
                      occurred_at_seconds=1.0, **fields)


class ScriptedModel:
    """Fails as scripted, then answers like the LocalModel."""

    name = "scripted"
    capabilities = frozenset({"json_object"})

    def __init__(self, failures: list[BaseException | str]) -> None:
        self.failures = failures
        self.calls = 0
        self.local = LocalModel()

    async def complete(self, request):
        self.calls += 1
        if self.failures:
            failure = self.failures.pop(0)
            if failure == "content_filter":
                return Completion(text="", finish_reason="content_filter")
            raise failure
        return await self.local.complete(request)


class RecordingExecutor:
    """The real executor, recording the name of each function it runs."""

    def __init__(self, executor, calls: list[str]) -> None:
        self.executor = executor
        self.calls = calls

    async def run_sync(self, function, *args):
        self.calls.append(getattr(function, "__name__", type(function).__name__))
        return await self.executor.run_sync(function, *args)


class World:
    def __init__(self, path: str) -> None:
        self.path = path
        self.clock: MovableClock | None = None
        self.model = None
        self.executor_calls: list[str] = []

    async def start(self, nursery: trio.Nursery) -> ActorSystem:
        env = real_env(self.path)
        if self.clock is None:
            self.clock = MovableClock(env.clock)
            self.clock.freeze()
        env.clock = self.clock
        env.model = self.model
        env.executor = RecordingExecutor(env.executor, self.executor_calls)
        engine = await Engine.open(env, nursery=nursery, migrations=[*auth_migrations, *host_migrations])
        system = ActorSystem(env, [entry_actor_kind(), learner_actor_kind()], storage=engine)
        await nursery.start(system.run)
        return system


async def rows(system, sql, *parameters):
    return await system.storage.read(lambda connection: list(connection.execute(sql, parameters)))


async def wait_for(system, sql, expected, *, seconds: float = 10.0):
    with trio.fail_after(seconds):
        while (found := await rows(system, sql)) != expected:
            await trio.sleep(0.02)
    return found


async def advance_until(world, system, sql, expected, *, step_seconds: float = 1.0, steps_max: int = 400):
    """Moves the frozen clock a second at a time until ``sql`` returns ``expected`` (the
    reminder service reschedules relative to "now", which only moves when the test moves it)."""
    for _ in range(steps_max):
        if await rows(system, sql) == expected:
            return
        world.clock.advance(step_seconds)
        await trio.sleep(0.02)
    assert await rows(system, sql) == expected


@pytest.fixture
def world(tmp_path):
    return World(str(tmp_path))


quick = Pace(3, 30.0, 120.0)


async def test_count_closes_a_batch_and_the_local_model_makes_memories(world, nursery):
    system = await world.start(nursery)
    entry = system.ref("entry", "astrbot:g")
    reply = await entry.ask(AcceptMessages((new("a", pace=quick), new("b", "今天下雨")), grant))
    assert reply.pending_count == 2
    assert await rows(system, "SELECT count(*) FROM host_batches") == [(0,)]
    reply = await entry.ask(AcceptMessages((new("c", "我打算明天去爬山。"),), grant))
    assert reply.pending_count == 3  # batched, not yet learned
    await wait_for(system, "SELECT id, state, trigger, message_count FROM host_batches", [(1, "succeeded", "count", 3)])
    memories = await rows(system, "SELECT id, content, kind, people, entry_id FROM host_memories ORDER BY id")
    assert [(content, kind, json.loads(people)) for _, content, kind, people, _ in memories] == [
        ("我喜欢寿司。", "preference", ["小林"]), ("我打算明天去爬山。", "plan", ["小林"])]
    sources = await rows(system, "SELECT memory_id, entry_id, message_id FROM host_memory_sources ORDER BY memory_id")
    assert sources == [(1, "astrbot:g", 1), (2, "astrbot:g", 3)]
    states = await system.storage.read(lambda c: message_learning_states(c, "astrbot:g", [1, 2, 3, 99]))
    assert states == {1: "learned", 2: "learned", 3: "learned"}
    result = await rows(system, "SELECT result_json FROM host_batches")
    assert json.loads(result[0][0]) == {"memories_created": 2, "memory_ids": [1, 2]}
    # The LocalModel is CPU-bound: its answer (and reading it) ran in the executor, not the loop.
    assert world.executor_calls.count("_learn_sync") == 1


async def test_idle_and_max_wait_close_batches_on_receive_time(world, nursery):
    system = await world.start(nursery)
    entry = system.ref("entry", "e")
    await entry.ask(AcceptMessages((new("a", pace=Pace(10, 30.0, 50.0)),), grant))
    reminders = await rows(system, "SELECT kind, key, name, due_wall FROM reminders")
    assert [(kind, key, name) for kind, key, name, _ in reminders] == [("entry", "e", "pace")]
    start = world.clock.wall()
    assert reminders[0][3] == pytest.approx(start + 30.0)
    world.clock.advance(29.0)
    await entry.ask(AcceptMessages((new("b"),), grant))  # idle restarts from this receive time
    world.clock.advance(20.0)  # 49 s after the first: neither idle (30 after b) nor max wait (50)
    await trio.sleep(1.2)
    assert await rows(system, "SELECT count(*) FROM host_batches") == [(0,)]
    world.clock.advance(1.5)  # 50.5 s after the first message: max wait
    await wait_for(system, "SELECT trigger, message_count FROM host_batches", [("max_wait", 2)])
    await entry.ask(AcceptMessages((new("c"),), grant))
    world.clock.advance(30.5)
    await wait_for(system, "SELECT trigger, message_count FROM host_batches ORDER BY id",
                   [("max_wait", 2), ("idle", 1)])


async def test_learn_now_closes_the_pending_set(world, nursery):
    system = await world.start(nursery)
    entry = system.ref("entry", "e")
    assert await entry.ask(LearnNow()) == LearnAccepted(0, False, None)
    await entry.ask(AcceptMessages((new("a"), new("b")), grant))
    reply = await entry.ask(LearnNow())
    assert reply == LearnAccepted(2, False, None)
    await wait_for(system, "SELECT trigger, state FROM host_batches", [("learn", "succeeded")])
    assert await rows(system, "SELECT count(*) FROM reminders WHERE kind = 'entry'") == [(0,)]
    assert (await entry.ask(LearnNow())).pending_count == 0


async def test_a_paused_model_keeps_the_batch_waiting_and_catches_up(world, nursery):
    world.model = ScriptedModel([ModelUnavailable("paused by the provider")])
    system = await world.start(nursery)
    entry = system.ref("entry", "e")
    await entry.ask(AcceptMessages((new("a"),), grant))
    await entry.ask(LearnNow())
    await wait_for(system, "SELECT state, attempts FROM host_batches", [("waiting", 1)])
    reply = await entry.ask(LearnNow())
    assert reply.paused and "paused by the provider" in reply.reason and reply.pending_count == 1
    await advance_until(world, system, "SELECT state, attempts FROM host_batches", [("succeeded", 2)])
    assert world.clock.offset >= 60.0  # not before the pause retry time
    assert (await entry.ask(LearnNow())) == LearnAccepted(0, False, None)


async def test_failures_are_retried_then_abandoned_and_refusals_are_final(world, nursery):
    failure = ProviderError(500, "boom")
    world.model = ScriptedModel([failure, failure, failure, "content_filter"])
    system = await world.start(nursery)
    entry = system.ref("entry", "e")
    await entry.ask(AcceptMessages((new("a"),), grant))
    await entry.ask(LearnNow())
    await wait_for(system, "SELECT state, attempts FROM host_batches", [("waiting", 1)])
    await advance_until(world, system, "SELECT state, attempts FROM host_batches", [("abandoned", 3)])
    assert world.clock.offset >= 60.0  # two backoffs of 30 s
    (reason, result), = await rows(system, "SELECT reason, result_json FROM host_batches")
    assert "ProviderError" in reason and json.loads(result)["memory_ids"] == []
    await entry.ask(AcceptMessages((new("b"),), grant))
    await entry.ask(LearnNow())
    await wait_for(system, "SELECT id, state FROM host_batches ORDER BY id", [(1, "abandoned"), (2, "refused")])
    states = await system.storage.read(lambda c: message_learning_states(c, "e", [1, 2]))
    assert states == {1: "failed", 2: "failed"}
    assert "_learn_sync" not in world.executor_calls  # a model that is not CPU-bound is awaited
    assert await rows(system, "SELECT outcome FROM host_model_calls ORDER BY id") == [
        ("error",), ("error",), ("error",), ("refused",)]


async def test_pace_reminders_and_waiting_batches_survive_a_restart(world, tmp_path):
    world.model = ScriptedModel([ModelUnavailable("down")])
    async with trio.open_nursery() as nursery:
        system = await world.start(nursery)
        entry = system.ref("entry", "e")
        await entry.ask(AcceptMessages((new("a", pace=Pace(10, 30.0, 60.0)),), grant))
        await entry.ask(AcceptMessages((new("b", pace=Pace(10, 30.0, 60.0)),), grant))
        other = system.ref("entry", "f")
        await other.ask(AcceptMessages((new("x"),), grant))
        await other.ask(LearnNow())
        await wait_for(system, "SELECT entry_id, state FROM host_batches", [("f", "waiting")])
        nursery.cancel_scope.cancel()
    world.model = ScriptedModel([])
    world.clock.advance(61.0)  # past the pace due time and the pause retry while "down"
    async with trio.open_nursery() as nursery:
        system = await world.start(nursery)
        await wait_for(system, "SELECT entry_id, state, message_count FROM host_batches ORDER BY id",
                       [("f", "succeeded", 1), ("e", "succeeded", 2)])
        nursery.cancel_scope.cancel()
