"""Each planted runtime bug really misbehaves when planted, and the runtime is right without it.

Every test runs twice (``planted`` False/True) and asserts the correct behaviour or the wrong
one, so a planted bug that silently stopped doing anything would fail here before it made a
simulator test pass for the wrong reason."""

import pytest
import trio

from troupe.runtime import (
    Actor,
    ActorCrashed,
    ActorKind,
    ChildSpec,
    RestartIntensity,
    open_actor_system,
    runtime_planted_bugs,
)
from troupe.storage import reminders_for

from ._faults import (
    Alarm,
    Boom,
    DirtyBoom,
    Get,
    ScriptedFaultPoints,
    Store,
    Ticker,
    counter_kind,
    start_alarm_system,
)

both = pytest.mark.parametrize("planted", [False, True])


def plant(env, name, planted):
    assert name in runtime_planted_bugs
    env.planted_bugs = frozenset({name}) if planted else frozenset()


@both
async def test_keep_instance_after_crash(env, autojump_clock, planted):
    plant(env, "keep_instance_after_crash", planted)
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed):
            await ref.ask(DirtyBoom(100))
        # Correct: re-activated from storage (0).  Planted: the dirty in-memory 100 survives.
        assert await ref.ask(Get()) == (100 if planted else 0)
        assert store.contexts[0].discarded is not planted


@both
async def test_no_service_restart(env, autojump_clock, planted):
    plant(env, "no_service_restart", planted)
    starts = []

    async def crashes_once(*, task_status=trio.TASK_STATUS_IGNORED):
        starts.append(trio.current_time())
        task_status.started()
        if len(starts) == 1:
            await trio.sleep(1)
            raise RuntimeError("service fails")
        await trio.sleep_forever()

    async with open_actor_system(env, [], services=[ChildSpec("svc", crashes_once)]) as system:
        await trio.sleep(10)
        assert len(starts) == (1 if planted else 2)
        assert system.root.escalations == 0 and not system.root.down


@both
async def test_redeliver_after_crash(env, autojump_clock, planted):
    plant(env, "redeliver_after_crash", planted)
    store = Store()
    async with open_actor_system(env, [counter_kind(store, intensity=RestartIntensity(5, 5.0))]) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed):
            await ref.ask(Boom("x"))
        await ref.ask(Get())
        deliveries = [event for event in store.events if event[0] == "receive" and event[2] == Boom("x")]
        assert len(deliveries) == (2 if planted else 1)


@both
async def test_skip_predecessor_wait(env, autojump_clock, planted):
    plant(env, "skip_predecessor_wait", planted)
    log = []

    class SlowToPassivate(Actor):
        async def on_activate(self):
            log.append("activate")

        async def receive(self, message):
            return message

        async def on_passivate(self):
            log.append("passivate-start")
            await trio.sleep(5)
            log.append("passivate-end")

    async with open_actor_system(env, [ActorKind("slow", SlowToPassivate)], live_actors_max=1) as system:
        await system.ref("slow", "a").ask(1)
        await system.ref("slow", "b").ask(1)  # evicts a: its passivation takes 5 s
        log.clear()
        await system.ref("slow", "a").ask(2)  # a second life of a
        overlapped = log.index("activate") < log.index("passivate-end") if "passivate-end" in log else True
        assert overlapped is planted


@both
async def test_no_restart_intensity(env, autojump_clock, planted):
    plant(env, "no_restart_intensity", planted)
    store = Store()
    async with open_actor_system(env, [counter_kind(store, intensity=RestartIntensity(1, 5.0))]) as system:
        for tag in "123":
            with pytest.raises(ActorCrashed):
                await system.ref("counter", "a").ask(Boom(tag))
        statistics = system.statistics()["counter"]
        assert statistics.escalations == (0 if planted else 1)
        assert statistics.restarts == (3 if planted else 2)  # escalation starts a fresh budget


@both
async def test_reminder_lost_on_crash(env, autojump_clock, planted):
    plant(env, "reminder_lost_on_crash", planted)
    async with trio.open_nursery() as nursery:
        engine, system = await start_alarm_system(env, nursery)
        Alarm.crashes = {"wake": 1}  # the first delivery's turn crashes; a retry would succeed
        await system.ref("alarm", "a").ask(("wake", 5))
        await trio.sleep(20)
        assert [entry[1] for entry in Alarm.fired] == ([] if planted else ["wake"])
        assert await engine.read(lambda connection: reminders_for(connection, "alarm", "a")) == []
        nursery.cancel_scope.cancel()


@both
async def test_late_timer_dropped(env, autojump_clock, planted):
    plant(env, "late_timer_dropped", planted)
    Ticker.fired = []
    env.fault_points = ScriptedFaultPoints({"timer_late": [True]}, delays={"timer_late": 1.0})
    async with open_actor_system(env, [ActorKind("ticker", Ticker)]) as system:
        await system.ref("ticker", "x").ask("arm")
        await trio.sleep(20)
    assert Ticker.fired == ([] if planted else [6.0])


@both
async def test_timer_fires_twice(env, autojump_clock, planted):
    plant(env, "timer_fires_twice", planted)
    Ticker.fired = []
    async with open_actor_system(env, [ActorKind("ticker", Ticker)]) as system:
        await system.ref("ticker", "x").ask("arm")
        await trio.sleep(20)
    assert Ticker.fired == ([5.0, 5.0] if planted else [5.0])


def test_every_planted_bug_has_a_test_here():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(runtime_planted_bugs) <= tested
