"""Black-box tests of the actor system: ask/tell, turns, mailboxes, passivation, crashes."""

from dataclasses import dataclass

import pytest
import trio

from troupe.runtime import (
    Actor,
    ActorCrashed,
    ActorKind,
    AskTimeout,
    Overloaded,
    PoisonMessage,
    RestartIntensity,
    Unavailable,
    UnknownActorKind,
    open_actor_system,
)
from troupe.runtime._limits import poison_quarantine_seconds


@dataclass(frozen=True)
class Add:
    amount: int
    pause: float = 0.0


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Boom:
    tag: str = ""


@dataclass(frozen=True)
class Flaky:
    """Crashes while the store says so: the same bytes every time, like a request without fields."""


class Store:
    """Stands in for durable storage in these tests: survives actor instances."""

    def __init__(self):
        self.values = {}
        self.events = []


def counter_kind(store: Store, **options) -> ActorKind:
    class Counter(Actor):
        async def on_activate(self):
            self.value = store.values.get(self.context.key, 0)
            store.events.append(("activate", self.context.key))

        async def receive(self, message):
            if isinstance(message, Add):
                store.events.append(("start", self.context.key, message.amount))
                if message.pause:
                    await trio.sleep(message.pause)
                self.value += message.amount
                store.values[self.context.key] = self.value
                store.events.append(("end", self.context.key, message.amount))
                return self.value
            if isinstance(message, Get):
                return self.value
            if isinstance(message, Boom):
                raise ValueError("boom " + message.tag)
            if isinstance(message, Flaky):
                if store.values.get("flaky"):
                    raise ValueError("flaky")
                return "ok"
            raise TypeError(message)

        async def on_passivate(self):
            store.events.append(("passivate", self.context.key))

    return ActorKind("counter", Counter, **options)


async def test_ask_activates_and_replies(env):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        ref = system.ref("counter", "a")
        assert await ref.ask(Add(2)) == 2
        assert await ref.ask(Add(3)) == 5
        assert await system.ref("counter", "b").ask(Get()) == 0
        assert store.events[0] == ("activate", "a")
        assert system.live_count == 2


async def test_one_message_at_a_time_in_arrival_order(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        ref = system.ref("counter", "a")
        results = []

        async def send(amount):
            results.append(await ref.ask(Add(amount, pause=1.0)))

        async with trio.open_nursery() as nursery:
            for amount in (1, 2, 3):
                nursery.start_soon(send, amount)
                await trio.sleep(0)  # fix the arrival order
        turns = [event for event in store.events if event[0] in ("start", "end")]
        assert turns == [
            ("start", "a", 1), ("end", "a", 1),
            ("start", "a", 2), ("end", "a", 2),
            ("start", "a", 3), ("end", "a", 3),
        ]
        assert results == [1, 3, 6]


async def test_tell_is_fire_and_forget(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        system.ref("counter", "a").tell(Add(5))
        assert await system.ref("counter", "a").ask(Get()) == 5


async def test_full_mailbox_is_overloaded_with_retry_after(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store, mailbox_messages_max=2)]) as system:
        ref = system.ref("counter", "a")
        ref.tell(Add(1, pause=10))
        await trio.sleep(0.1)  # the first message is being handled; two more fill the mailbox
        ref.tell(Add(1))
        ref.tell(Add(1))
        with pytest.raises(Overloaded) as raised:
            ref.tell(Add(1))
        assert raised.value.retry_after_seconds > 0
        with pytest.raises(Overloaded):
            await ref.ask(Get())
        await trio.sleep(20)
        assert await ref.ask(Get()) == 3  # nothing queued was lost, nothing extra applied


async def test_ask_timeout(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        with pytest.raises(AskTimeout):
            await system.ref("counter", "a").ask(Add(1, pause=5), timeout=1)
        await trio.sleep(5)
        assert await system.ref("counter", "a").ask(Get()) == 1  # the turn still completed


async def test_unknown_kind(env):
    async with open_actor_system(env, []) as system:
        with pytest.raises(UnknownActorKind):
            await system.ref("nope", "x").ask(Get())


async def test_idle_actor_passivates_and_reactivates_from_storage(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store, idle_seconds=10)]) as system:
        ref = system.ref("counter", "a")
        await ref.ask(Add(4))
        await trio.sleep(5)
        assert system.live_count == 1  # not idle long enough yet
        await trio.sleep(8)  # idle for 10 s, found by the sweep within a quarter of that
        assert system.live_count == 0
        assert ("passivate", "a") in store.events
        assert await ref.ask(Get()) == 4
        assert store.events.count(("activate", "a")) == 2


async def test_live_actor_cap_evicts_least_recently_used(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)], live_actors_max=3) as system:
        for key in "abcd":
            await system.ref("counter", key).ask(Add(1))
        await trio.sleep(0.1)
        assert system.live_count == 3
        assert ("passivate", "a") in store.events
        await system.ref("counter", "b").ask(Add(1))  # b is now most recent
        await system.ref("counter", "e").ask(Add(1))  # evicts c, not b
        await trio.sleep(0.1)
        assert ("passivate", "c") in store.events and ("passivate", "b") not in store.events
        assert await system.ref("counter", "a").ask(Get()) == 1  # nothing lost
        statistics = system.statistics()["counter"]
        assert statistics.live == 3 and statistics.passivations >= 3


async def test_eviction_waits_for_queued_messages_and_passivation(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)], live_actors_max=1) as system:
        system.ref("counter", "a").tell(Add(1, pause=5))
        system.ref("counter", "a").tell(Add(1))
        await trio.sleep(0)
        await system.ref("counter", "b").ask(Get())  # evicts a while it is busy
        assert await system.ref("counter", "a").ask(Get()) == 2
        activations = [event for event in store.events if event == ("activate", "a")]
        passivations = [index for index, event in enumerate(store.events) if event == ("passivate", "a")]
        second_activation = [index for index, event in enumerate(store.events) if event == ("activate", "a")][1]
        assert len(activations) == 2 and passivations[0] < second_activation


async def test_crash_fails_only_that_caller_and_restarts_from_durable_state(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        ref = system.ref("counter", "a")
        await ref.ask(Add(7))
        results = []

        async def ask(message):
            try:
                results.append(await ref.ask(message))
            except ActorCrashed as error:
                results.append(type(error).__name__)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, Boom("x"))
            await trio.sleep(0)
            nursery.start_soon(ask, Add(1))
        assert results == ["ActorCrashed", 8]
        assert store.events.count(("activate", "a")) == 2
        statistics = system.statistics()["counter"]
        assert statistics.crashes == 1 and statistics.restarts == 1


async def test_message_that_crashes_twice_is_poison_and_quarantined(env, autojump_clock):
    store = Store()
    kind = counter_kind(store, intensity=RestartIntensity(5, 5.0))
    async with open_actor_system(env, [kind]) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed) as first:
            await ref.ask(Boom("p"))
        assert not isinstance(first.value, PoisonMessage)
        with pytest.raises(PoisonMessage):
            await ref.ask(Boom("p"))
        starts_before = len(store.events)
        with pytest.raises(PoisonMessage):
            await ref.ask(Boom("p"))  # refused without running
        assert await ref.ask(Add(1)) == 1
        assert store.events[starts_before:].count(("activate", "a")) <= 1
        assert system.statistics()["counter"].poison == 1


async def test_poison_quarantine_ends_and_a_message_that_ran_is_not_poison(env, autojump_clock):
    store = Store()
    kind = counter_kind(store, intensity=RestartIntensity(10, 5.0))
    async with open_actor_system(env, [kind]) as system:
        ref = system.ref("counter", "a")
        # Crashed once, then ran: its count is forgotten, so one more crash is not poison.
        store.values["flaky"] = True
        with pytest.raises(ActorCrashed):
            await ref.ask(Flaky())
        store.values["flaky"] = False
        assert await ref.ask(Flaky()) == "ok"
        store.values["flaky"] = True
        with pytest.raises(ActorCrashed) as again:
            await ref.ask(Flaky())
        assert not isinstance(again.value, PoisonMessage)
        # Twice in a row: quarantined, refused without running even once it would succeed...
        with pytest.raises(PoisonMessage):
            await ref.ask(Flaky())
        store.values["flaky"] = False
        with pytest.raises(PoisonMessage):
            await ref.ask(Flaky())
        # ...until the quarantine has passed: then it runs again.
        await trio.sleep(poison_quarantine_seconds)
        assert await ref.ask(Flaky()) == "ok"


async def test_restart_intensity_escalates_then_kind_goes_unavailable_and_recovers(env, autojump_clock):
    store = Store()
    kind = counter_kind(
        store,
        intensity=RestartIntensity(1, 5.0),
        kind_intensity=RestartIntensity(1, 5.0),
    )
    async with open_actor_system(env, [kind], root_intensity=RestartIntensity(0, 5.0)) as system:
        # Two crashes of one actor within 5 s exceed its intensity: it escalates.
        for key in ("a", "b"):
            for tag in ("1", "2"):
                with pytest.raises(ActorCrashed):
                    await system.ref("counter", key).ask(Boom(key + tag))
        # Two escalations exceed the kind supervisor's intensity; the root (intensity 0)
        # marks the kind down instead of exiting.
        with pytest.raises(Unavailable) as raised:
            await system.ref("counter", "c").ask(Get())
        assert raised.value.retry_after_seconds > 0
        await trio.sleep(raised.value.retry_after_seconds + 0.1)
        assert await system.ref("counter", "c").ask(Add(2)) == 2
        assert system.root.escalations == 1


async def test_turn_timeout_counts_as_crash(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store, turn_timeout_seconds=1)]) as system:
        with pytest.raises(ActorCrashed, match="TooSlowError"):
            await system.ref("counter", "a").ask(Add(1, pause=5))
        assert await system.ref("counter", "a").ask(Get()) == 0


async def test_timers_fire_and_die_with_the_actor(env, autojump_clock):
    fired = []

    class Ticker(Actor):
        async def receive(self, message):
            if message == "arm":
                self.context.start_timer("t", 5, "tick")
                self.context.start_timer("u", 50, "late")
            elif message == "rest":
                self.context.passivate()
            else:
                fired.append(message)

    async with open_actor_system(env, [ActorKind("ticker", Ticker)]) as system:
        await system.ref("ticker", "x").ask("arm")
        await trio.sleep(6)
        assert fired == ["tick"]
        await system.ref("ticker", "x").ask("rest")
        await trio.sleep(100)
        assert fired == ["tick"]


async def test_drain_passivates_every_live_actor(env, autojump_clock):
    store = Store()
    async with open_actor_system(env, [counter_kind(store)]) as system:
        for key in "xyz":
            system.ref("counter", key).tell(Add(1, pause=1))
        await trio.sleep(0)
        await system.drain()
        assert system.live_count == 0
        assert sorted(event for event in store.events if event[0] == "passivate") == [
            ("passivate", "x"), ("passivate", "y"), ("passivate", "z"),
        ]
        assert store.values == {"x": 1, "y": 1, "z": 1}


async def test_turn_timeout_also_applies_to_an_evicted_actor(env, autojump_clock):
    store = Store()
    kind = counter_kind(store, turn_timeout_seconds=1)
    async with open_actor_system(env, [kind], live_actors_max=1) as system:
        results = []

        async def ask_slow():
            try:
                await system.ref("counter", "a").ask(Add(1, pause=50))
            except ActorCrashed as error:
                results.append(error.reason)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask_slow)
            await trio.sleep(0.1)
            await system.ref("counter", "b").ask(Get())  # evicts a in the middle of its turn
        assert results and "TooSlowError" in results[0]
        assert trio.current_time() < 5


async def test_a_cell_evicted_before_it_ran_still_waits_for_its_predecessor(env, autojump_clock):
    """Three lives of one key in a row: each must load only after the previous passivated."""
    events = []

    class Slow(Actor):
        async def on_activate(self):
            events.append(("activate", self.context.key))

        async def receive(self, message):
            return message

        async def on_passivate(self):
            events.append(("passivate-start", self.context.key))
            await trio.sleep(5)
            events.append(("passivate-end", self.context.key))

    async with open_actor_system(env, [ActorKind("slow", Slow)], live_actors_max=1) as system:
        await system.ref("slow", "a").ask(1)
        system.ref("slow", "b").tell(1)  # evicts a (slow passivation begins)
        system.ref("slow", "a").tell(2)  # new cell for a, evicts b before either task ran
        system.ref("slow", "b").tell(3)  # evicts the new a before its task ran
        await trio.sleep(30)
        for key in "ab":
            lives = [event[0] for event in events if event[1] == key]
            # Never an activation while a passivation of the same key is in progress.
            depth = 0
            for event in lives:
                if event == "activate":
                    assert depth == 0, events
                elif event == "passivate-start":
                    depth += 1
                elif event == "passivate-end":
                    depth -= 1


async def test_restart_intensity_survives_passivation(env, autojump_clock):
    """Found by the simulator once actors passivated often: a crash, an idle passivation and a
    second crash within the period must escalate, not start a fresh budget."""
    store = Store()
    kind = counter_kind(store, idle_seconds=0.4, intensity=RestartIntensity(1, 5.0))
    async with open_actor_system(env, [kind]) as system:
        ref = system.ref("counter", "a")
        with pytest.raises(ActorCrashed):
            await ref.ask(Boom("1"))
        await trio.sleep(1)  # idle: passivated
        assert system.live_count == 0
        with pytest.raises(ActorCrashed):
            await ref.ask(Boom("2"))
        statistics = system.statistics()["counter"]
        assert statistics.restarts == 1 and statistics.escalations == 1


async def test_a_post_while_the_system_is_being_cancelled_is_unavailable(env, autojump_clock):
    # Found by the simulator (seeds 24, 77, 86, 140 of a full sweep): a process crash cancels
    # the system while a client task still posts; the kind's nursery was closing, and the post
    # raised trio's "closed to new arrivals" instead of Unavailable.
    class Stubborn(Actor):
        async def receive(self, message):
            with trio.CancelScope(shield=True):  # keeps the kind's nursery open while it closes
                await trio.sleep(1)
            return "done"

    from troupe.runtime import ActorSystem

    system = ActorSystem(env, [ActorKind("stubborn", Stubborn)])
    outcomes = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as inner:
            await inner.start(system.run)
            system.ref("stubborn", "a").tell("go")
            await trio.sleep(0.1)
            inner.cancel_scope.cancel()
            with trio.CancelScope(shield=True):
                await trio.sleep(0.1)  # the system is being cancelled; the stubborn turn runs on
                try:
                    system.ref("stubborn", "b").tell("go")
                except Unavailable as error:
                    outcomes.append(error)
        outer.cancel_scope.cancel()
    assert len(outcomes) == 1
