"""Each runtime fault point fires where it should and the runtime reacts as it does to the real
failure; the production default never fires; every trace event kind is listed and recorded."""

import pathlib
import re

import pytest
import trio

import troupe.runtime
from troupe.runtime import (
    ActorCrashed,
    ActorKind,
    ChildSpec,
    InjectedFault,
    NoFaultPoints,
    Overloaded,
    PoisonMessage,
    RestartIntensity,
    Tracer,
    fault_point_names,
    no_fault_points,
    open_actor_system,
    runtime_event_kinds,
)
from troupe.storage import reminders_for

from ._faults import (
    Add,
    Alarm,
    Boom,
    Get,
    ScriptedFaultPoints,
    Store,
    Ticker,
    counter_kind,
    events,
    start_alarm_system,
)


def traced():
    return Tracer(keep_in_memory=True, time_source=trio.current_time)


async def test_turn_raises_before_runs_no_actor_code(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"turn_raises_before": [False, True]})
    tracer = traced()
    async with open_actor_system(env, [counter_kind(store)], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        assert await ref.ask(Add(1)) == 1
        with pytest.raises(ActorCrashed, match="InjectedFault"):
            await ref.ask(Add(5, trace_id="op-7"))
        assert store.values == {"a": 1}  # the actor never saw the message
        assert await ref.ask(Get()) == 1
        assert store.events.count(("activate", "a")) == 2  # re-activated from durable state
    [fault] = events(tracer, "fault")
    assert fault[3:] == ["counter", "a", {"point": "turn_raises_before", "id": "op-7"}]
    [crash] = events(tracer, "crash")
    assert crash[5] == {"message": "Add", "error": "InjectedFault", "id": "op-7"}
    assert [record[5].get("id") for record in events(tracer, "turn")][:2] == [None, "op-7"]


async def test_turn_raises_after_commits_but_the_caller_sees_a_crash(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"turn_raises_after": [True]})
    async with open_actor_system(env, [counter_kind(store)]) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed, match="InjectedFault"):
            await ref.ask(Add(5))
        assert store.values == {"a": 5}  # the write happened: the outcome was unknown
        assert await ref.ask(Get()) == 5


async def test_the_same_injected_message_crashing_twice_is_poison(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"turn_raises_before": [True, True]})
    tracer = traced()
    kind = counter_kind(store, intensity=RestartIntensity(5, 5.0))
    async with open_actor_system(env, [kind], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed):
            await ref.ask(Add(1, trace_id="op-1"))
        with pytest.raises(PoisonMessage):
            await ref.ask(Add(1, trace_id="op-1"))
        with pytest.raises(PoisonMessage):
            await ref.ask(Add(1, trace_id="op-1"))
    assert [record[5]["id"] for record in events(tracer, "poison")] == ["op-1"]
    assert [record[5]["id"] for record in events(tracer, "poison_refused")] == ["op-1"]


@pytest.mark.parametrize("answers, activated", [([True], 0), ([False, True], 1)])
async def test_activate_fails_before_or_after_on_activate(env, autojump_clock, answers, activated):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"activate_fails": answers})
    tracer = traced()
    async with open_actor_system(env, [counter_kind(store)], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed, match="InjectedFault"):
            await ref.ask(Add(1))
        assert store.events.count(("activate", "a")) == activated
        assert store.values == {}
        assert await ref.ask(Add(2)) == 2
        # The instance whose activation failed was thrown away; the live one was not.
        assert [context.discarded for context in store.contexts] == [True] * activated + [False]
    assert events(tracer, "activation_failed")[0][5] == {"error": "InjectedFault"}


async def test_passivate_fails_and_the_next_life_still_starts(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"passivate_fails": [True]})
    tracer = traced()
    async with open_actor_system(env, [counter_kind(store, idle_seconds=1)], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        await ref.ask(Add(3))
        await trio.sleep(2)
        assert system.live_count == 0
        assert ("passivate", "a") not in store.events  # on_passivate never ran
        assert store.contexts[0].discarded
        assert await ref.ask(Get()) == 3
    assert events(tracer, "passivate_failed")[0][5] == {"error": "InjectedFault"}


def counting_service(starts: list):
    async def run(*, task_status=trio.TASK_STATUS_IGNORED):
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep_forever()

    return ChildSpec("svc", run)


async def test_service_crashes_and_the_root_restarts_it(env, autojump_clock):
    starts = []
    env.fault_points = ScriptedFaultPoints({"service_crashes": [False, True]})
    tracer = traced()
    async with open_actor_system(env, [], tracer=tracer, services=[counting_service(starts)]):
        await trio.sleep(5)
    assert starts == [0.0, 2.0]  # crashed at its second check, restarted at once
    [fault] = events(tracer, "fault")
    assert fault[3:] == ["supervisor", "root", {"point": "service_crashes", "child": "svc"}]
    [crash] = events(tracer, "child_crash")
    assert crash[5] == {"child": "svc", "error": "InjectedFault"}
    assert [record[5]["child"] for record in events(tracer, "restart")] == ["svc"]


async def test_service_crashing_often_goes_unavailable_and_recovers(env, autojump_clock):
    starts = []
    env.fault_points = ScriptedFaultPoints({"service_crashes": True})
    tracer = traced()
    async with open_actor_system(env, [], tracer=tracer, services=[counting_service(starts)]):
        await trio.sleep(6)
    assert tracer.counts["unavailable"] >= 1 and tracer.counts["recover"] >= 1
    assert len(starts) >= 3


async def test_fault_points_armed_after_start_reach_the_services(env, autojump_clock):
    """The simulator arms the Env once the system runs: the first consulted point arms the
    supervisors' crashers too."""
    starts = []
    store = Store()
    async with open_actor_system(env, [counter_kind(store)], services=[counting_service(starts)]) as system:
        await trio.sleep(3)
        env.fault_points = ScriptedFaultPoints({"service_crashes": [True]})
        await trio.sleep(3)
        assert len(starts) == 1  # nothing consulted yet: no crasher
        await system.ref("counter", "a").ask(Get())
        await trio.sleep(3)
        assert len(starts) == 2


async def test_turn_overruns_until_the_watchdog_cancels_it(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"turn_overruns": [True]}, delays={"turn_overruns": 0.5})
    tracer = traced()
    async with open_actor_system(env, [counter_kind(store, turn_timeout_seconds=1)], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed, match="TooSlowError"):
            await ref.ask(Add(1, trace_id="slow"))
        assert trio.current_time() < 2  # ended by the watchdog, not by the sleep
        assert store.values == {}
        assert await ref.ask(Add(1)) == 1
    assert events(tracer, "turn_timeout")[0][3:] == ["counter", "a", {"id": "slow"}]


async def test_mailbox_full_answers_overloaded(env, autojump_clock):
    store = Store()
    env.fault_points = ScriptedFaultPoints({"mailbox_full": [True]})
    tracer = traced()
    async with open_actor_system(env, [counter_kind(store)], tracer=tracer) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(Overloaded) as raised:
            ref.tell(Add(1, trace_id="t"))
        assert raised.value.retry_after_seconds > 0
        assert system.live_count == 0  # refused before a cell was made
        assert await ref.ask(Add(2)) == 2
        assert system.statistics()["counter"].overloaded == 1
    assert events(tracer, "overloaded")[0][3:] == ["counter", "a", {"id": "t"}]


async def test_timer_late_delivers_late(env, autojump_clock):
    Ticker.fired = []
    env.fault_points = ScriptedFaultPoints({"timer_late": [True]}, delays={"timer_late": 3.0})
    tracer = traced()
    async with open_actor_system(env, [ActorKind("ticker", Ticker)], tracer=tracer) as system:
        await system.ref("ticker", "x").ask("arm")
        await trio.sleep(20)
    assert Ticker.fired == [8.0]
    assert events(tracer, "fault")[0][5] == {"point": "timer_late"}


async def test_reminder_late_fires_late(env, autojump_clock):
    env.fault_points = ScriptedFaultPoints({"reminder_late": [True]}, delays={"reminder_late": 4.0})
    async with trio.open_nursery() as nursery:
        engine, system = await start_alarm_system(env, nursery)
        await system.ref("alarm", "a").ask(("wake", 10))
        await trio.sleep(12)
        assert Alarm.fired == []
        await trio.sleep(4)
        assert [entry[:2] for entry in Alarm.fired] == [("a", "wake")]
        assert Alarm.fired[0][2] >= 14
        nursery.cancel_scope.cancel()


async def test_reminder_service_crashes_and_rearms_from_storage(env, autojump_clock):
    env.fault_points = ScriptedFaultPoints({"reminder_service_crashes": [False, True]})
    tracer = traced()
    async with trio.open_nursery() as nursery:
        engine, system = await start_alarm_system(env, nursery, tracer)
        await system.ref("alarm", "a").ask(("wake", 30))
        await trio.sleep(40)
        assert [entry[:2] for entry in Alarm.fired] == [("a", "wake")]
        assert await engine.read(lambda connection: reminders_for(connection, "alarm", "a")) == []
        nursery.cancel_scope.cancel()
    assert events(tracer, "fault")[0][5] == {"point": "reminder_service_crashes", "child": "reminders"}
    assert [record[5]["child"] for record in events(tracer, "restart")] == ["reminders"]


async def test_production_default_never_fires_and_records_no_fault(env, autojump_clock):
    assert env.fault_points is no_fault_points
    assert not any(NoFaultPoints().fires(point) for point in fault_point_names)
    store = Store()
    starts = []
    tracer = traced()
    kind = counter_kind(store, idle_seconds=1, intensity=RestartIntensity(5, 5.0))
    async with open_actor_system(env, [kind], tracer=tracer, services=[counting_service(starts)]) as system:
        for amount in range(20):
            await system.ref("counter", str(amount % 3)).ask(Add(amount))
        with pytest.raises(ActorCrashed, match="ValueError"):
            await system.ref("counter", "0").ask(Boom())
        await trio.sleep(30)
    assert "fault" not in tracer.counts
    assert len(starts) == 1


def test_injected_fault_is_an_ordinary_exception():
    assert issubclass(InjectedFault, Exception)
    assert len(set(fault_point_names)) == len(fault_point_names)


def test_every_listed_event_kind_is_recorded_by_the_runtime_and_vice_versa():
    source = "".join(path.read_text() for path in pathlib.Path(troupe.runtime.__file__).parent.glob("*.py"))
    recorded = set(re.findall(r"\.record\(\s*\"([a-z_]+)\"", source))
    assert recorded == set(runtime_event_kinds)
    assert len(runtime_event_kinds) == len(set(runtime_event_kinds))
