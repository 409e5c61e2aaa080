"""Bugs the character simulator workload found in the actor's background work, pinned on a
simulated clock: the outbox after the wall clock jumped back (claims and the outbox reminder
read one clock, so a retry is claimed instead of re-arming its reminder forever), and a
compression that must not drop the messages a ``/cache`` appended while the model ran."""

from __future__ import annotations

import trio

from troupe.actors.character import CacheHistory, HistoryCached, HistoryMessage, _reflection
from troupe.actors.character._character import CharacterSettings, StoreMemory, character_actor_kind
from troupe.actors.character._outbox import active_tasks, get_task, register_task
from troupe.actors.character._reflection import recent_history_kept_messages
from troupe.actors.character._schema import character_migrations
from troupe.actors.character._store import read_recent, read_recent_meta
from troupe.runtime import ActorSystem, Tracer
from troupe.runtime._env import Env
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimClock, SimStorageOpener
from troupe.storage import Engine, InlineExecutor, state_get

from .test_character_actor import ScriptedMemory, said

name = "Neko"
reminder_fires_max = 50
"""Far more than the scenario needs (a handful): beyond, the outbox spins."""


class FailingOnce(ScriptedMemory):
    """The first attempt of every task raises (the runner retries it after a backoff)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: set[str] = set()

    async def run_task(self, port, task):
        if task.task_id not in self.failed:
            self.failed.add(task.task_id)
            raise RuntimeError("the first attempt fails")
        return await super().run_task(port, task)


class SpinGuard(Tracer):
    """Cancels ``scope`` once reminders fired more often than any sane run needs: a livelock
    runs at one simulated instant, so no timeout would ever end it."""

    def __init__(self, scope: trio.CancelScope) -> None:
        super().__init__()
        self.scope = scope
        self.spun = False

    def record(self, event, kind="", key="", **fields):
        sequence = super().record(event, kind, key, **fields)
        if event == "reminder_fire" and self.counts[event] > reminder_fires_max:
            self.spun = True
            self.scope.cancel()
        return sequence


def simulated_env(tmp_path) -> Env:
    return Env(clock=SimClock(), random=SimRandom(1), ids=SimIds(),
               storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())


async def wait_for(predicate, seconds: float = 60.0) -> None:
    with trio.fail_after(seconds):
        while not await predicate():
            await trio.sleep(0.1)


async def test_a_retry_due_before_a_backward_clock_jump_is_claimed(autojump_clock, tmp_path):
    env, memory = simulated_env(tmp_path), FailingOnce()
    with trio.CancelScope() as scope:
        tracer = SpinGuard(scope)
        async with trio.open_nursery() as nursery:
            engine = await Engine.open(env, nursery=nursery, migrations=list(character_migrations))
            system = ActorSystem(env, [character_actor_kind(CharacterSettings(memory=memory))], storage=engine,
                                 tracer=tracer)
            await nursery.start(system.run)
            character = system.ref("character", name)
            assert await character.ask(CacheHistory(messages=said("你好"))) == HistoryCached(1)

            async def failed_once() -> bool:
                tasks = await engine.read(lambda connection: active_tasks(connection, name))
                return bool(tasks) and tasks[0].attempts == 1 and tasks[0].state == "pending"

            await wait_for(failed_once)
            (task,) = await engine.read(lambda connection: active_tasks(connection, name))
            assert task.available_at > env.clock.wall()  # the retry waits for its backoff
            env.clock.jump(-3600.0)  # before the retry's reminder fires

            async def drained() -> bool:
                return not await engine.read(lambda connection: active_tasks(connection, name))

            await wait_for(drained)
            applied = await engine.read(lambda connection: state_get(connection, "applied", task.task_id))
            assert applied == 1
            done = await engine.read(lambda connection: get_task(connection, task.task_id))
            assert done.state == "done"
            nursery.cancel_scope.cancel()
    assert not tracer.spun, "the outbox reminder fired again and again at one instant"


async def test_a_compression_keeps_what_was_cached_while_it_ran(autojump_clock, tmp_path, monkeypatch):
    from troupe.models import LocalModel

    env = simulated_env(tmp_path)
    env.model = LocalModel()
    gate, reading = trio.Event(), trio.Event()
    original = _reflection.compress_history

    async def slow_compression(*args, **options):
        # The compression has read recent history; the model takes its time.
        reading.set()
        await gate.wait()
        return await original(*args, **options)

    monkeypatch.setattr(_reflection, "compress_history", slow_compression)
    memory = StoreMemory()
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery, migrations=list(character_migrations))
        system = ActorSystem(env, [character_actor_kind(CharacterSettings(memory=memory))], storage=engine)
        await nursery.start(system.run)
        character = system.ref("character", name)
        older = [HistoryMessage("user" if index % 2 == 0 else "assistant", f"旧消息 {index}") for index in range(50)]
        assert await character.ask(CacheHistory(messages=tuple(older))) == HistoryCached(50)

        # A compression of what is there now (registered directly: no turn waits on it).
        def register(connection):
            register_task(connection, name, task_id="task_compress", kind="recent_compression",
                          payload={"detailed": False}, generation=0, now=env.clock.wall())

        await engine.write(register)
        # Wake the runner: a turn pumps the outbox.
        assert await character.ask(CacheHistory(messages=())) == HistoryCached(0)
        with trio.fail_after(60):
            await reading.wait()
        # The model is summarising what it read; a /cache lands meanwhile.
        assert await character.ask(CacheHistory(messages=said("新来的 1", "新来的 2"))) == HistoryCached(2)
        gate.set()

        async def compressed() -> bool:
            task = await engine.read(lambda connection: get_task(connection, "task_compress"))
            return task.state == "done"

        await wait_for(compressed)
        recent = [message.content for message in await engine.read(lambda connection: read_recent(connection, name))]
        meta = await engine.read(lambda connection: read_recent_meta(connection, name))
        assert meta["compressed_count"] == 50 - recent_history_kept_messages
        assert recent == [f"旧消息 {index}" for index in range(40, 50)] + ["新来的 1", "新来的 2"]
        nursery.cancel_scope.cancel()
