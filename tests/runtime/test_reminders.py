"""Durable reminders: fire on time, survive a crash and restart, are poison after two crashes."""

import trio

from troupe.runtime import Actor, ActorKind, ActorSystem, RestartIntensity, Tracer
from troupe.storage import Engine, StorageError, reminders_for


class Alarm(Actor):
    fired: list = []
    crash_on: set = set()

    async def receive(self, message):
        name, delay = message
        await self.context.set_reminder(name, self.context.env.clock.wall() + delay, {"name": name})
        return "armed"

    async def on_reminder(self, name, payload):
        if name in Alarm.crash_on:
            raise RuntimeError("alarm handler fails")
        Alarm.fired.append((self.context.key, name, round(trio.current_time())))


async def start(env, nursery, tracer=None):
    engine = await Engine.open(env, nursery=nursery, readers_max=1)
    system = ActorSystem(
        env,
        [ActorKind("alarm", Alarm, intensity=RestartIntensity(5, 5.0))],
        storage=engine,
        tracer=tracer,
        transient_errors=(StorageError,),
    )
    await nursery.start(system.run)
    return engine, system


async def test_reminder_fires_at_its_time(env, autojump_clock):
    Alarm.fired = []
    Alarm.crash_on = set()
    async with trio.open_nursery() as nursery:
        engine, system = await start(env, nursery)
        await system.ref("alarm", "a").ask(("wake", 30))
        await system.ref("alarm", "b").ask(("nap", 10))
        await trio.sleep(40)
        assert Alarm.fired == [("b", "nap", 10), ("a", "wake", 30)]
        assert await engine.read(lambda connection: reminders_for(connection, "alarm", "a")) == []
        nursery.cancel_scope.cancel()


async def test_reminder_survives_a_crash_of_the_whole_system(env, autojump_clock):
    Alarm.fired = []
    Alarm.crash_on = set()
    with trio.CancelScope() as lifetime:
        async with trio.open_nursery() as nursery:
            engine, system = await start(env, nursery)
            await system.ref("alarm", "a").ask(("wake", 100))
            engine.crash()  # the process dies before the reminder is due
            lifetime.cancel()
    assert Alarm.fired == []
    async with trio.open_nursery() as nursery:
        engine, system = await start(env, nursery)  # re-armed from storage on start
        await trio.sleep(120)
        assert [entry[:2] for entry in Alarm.fired] == [("a", "wake")]
        nursery.cancel_scope.cancel()


async def test_reminder_whose_turn_crashes_twice_is_poison_and_dropped(env, autojump_clock):
    Alarm.fired = []
    Alarm.crash_on = {"bad"}
    tracer = Tracer(keep_in_memory=True)
    async with trio.open_nursery() as nursery:
        engine, system = await start(env, nursery, tracer)
        await system.ref("alarm", "a").ask(("bad", 1))
        await system.ref("alarm", "a").ask(("good", 2))
        await trio.sleep(30)
        assert [entry[1] for entry in Alarm.fired] == ["good"]
        assert tracer.counts.get("reminder_poison") == 1
        assert await engine.read(lambda connection: reminders_for(connection, "alarm", "a")) == []
        assert system.reminders.poisoned == 1
        nursery.cancel_scope.cancel()


async def test_backward_clock_jump_does_not_hold_back_due_reminders(env, autojump_clock):
    Alarm.fired = []
    Alarm.crash_on = set()
    async with trio.open_nursery() as nursery:
        engine, system = await start(env, nursery)
        await system.ref("alarm", "a").ask(("soon", 5))
        env.clock.jump(-3600)
        await trio.sleep(10)
        assert [entry[1] for entry in Alarm.fired] == ["soon"]
        nursery.cancel_scope.cancel()


async def test_forward_then_backward_jump_does_not_strand_a_reminder(env, autojump_clock):
    """Found by the simulator (seed 89): an actor armed a reminder on a wall clock that had jumped
    forward, then the clock jumped back before the service looked at it."""
    Alarm.fired = []
    Alarm.crash_on = set()
    async with trio.open_nursery() as nursery:
        engine, system = await start(env, nursery)
        await trio.sleep(0.5)
        env.clock.jump(2500)
        await system.ref("alarm", "a").ask(("now", 0))
        env.clock.jump(-2000)
        await trio.sleep(5)
        assert [entry[1] for entry in Alarm.fired] == ["now"]
        nursery.cancel_scope.cancel()


async def test_a_reminder_set_again_for_the_same_moment_during_its_turn_is_kept(tmp_path):
    # Found by the simulator (host seed 83): an entry closed a batch, setting its learner's
    # "claim" reminder due now, in the very instant the learner finished handling a "claim"
    # that was due at that same moment; the completion deleted the new setting by due time.
    import apsw

    from troupe.storage import reminder_delete, reminder_set, reminders_for
    from troupe.storage._migrations import apply_migrations
    from troupe.storage._schema import core_migrations

    connection = apsw.Connection(str(tmp_path / "reminders.db"))
    apply_migrations(connection, list(core_migrations), lambda: 0.0)
    reminder_set(connection, "learner", "1", "claim", 100.0, None)
    (fired,) = reminders_for(connection, "learner", "1")
    reminder_set(connection, "learner", "1", "claim", 100.0, None)  # set again, same moment
    assert not reminder_delete(connection, "learner", "1", "claim", due_wall=100.0, revision=fired.revision)
    (kept,) = reminders_for(connection, "learner", "1")
    assert kept.revision == fired.revision + 1
    assert reminder_delete(connection, "learner", "1", "claim", due_wall=100.0, revision=kept.revision)
