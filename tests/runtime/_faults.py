"""Helpers shared by the fault-point and planted-bug tests: a scripted ``FaultPoints``, a
counter actor with a durable stand-in store, a timer actor, and trace reading."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from troupe.runtime import Actor, ActorKind, ActorSystem, RestartIntensity, Tracer, read_trace
from troupe.storage import Engine, StorageError


class ScriptedFaultPoints:
    """Fires exactly as scripted: ``plan[point]`` is a list of answers used one per
    consultation (then False), or ``True`` for always.  Records every consultation."""

    def __init__(self, plan: dict[str, list[bool] | bool] | None = None, delays: dict[str, float] | None = None):
        self.plan = {point: (answers if answers is True else list(answers)) for point, answers in (plan or {}).items()}
        self.delays = delays or {}
        self.consulted: list[str] = []

    def fires(self, point: str) -> bool:
        self.consulted.append(point)
        answers = self.plan.get(point)
        if answers is True:
            return True
        return bool(answers.pop(0)) if answers else False

    def delay_seconds(self, point: str) -> float:
        return self.delays.get(point, 0.0)


@dataclass(frozen=True)
class Add:
    amount: int
    trace_id: str | None = None


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Boom:
    tag: str = ""
    trace_id: str | None = None


@dataclass(frozen=True)
class DirtyBoom:
    """Changes the in-memory value, then crashes before writing it."""

    amount: int


class Store:
    """Stands in for durable storage: survives actor instances."""

    def __init__(self):
        self.values = {}
        self.events = []
        self.contexts = []


def counter_kind(store: Store, **options) -> ActorKind:
    class Counter(Actor):
        async def on_activate(self):
            self.value = store.values.get(self.context.key, 0)
            store.events.append(("activate", self.context.key))
            store.contexts.append(self.context)

        async def receive(self, message):
            store.events.append(("receive", self.context.key, message))
            if isinstance(message, Add):
                self.value += message.amount
                store.values[self.context.key] = self.value
                return self.value
            if isinstance(message, Get):
                return self.value
            if isinstance(message, Boom):
                raise ValueError("boom " + message.tag)
            if isinstance(message, DirtyBoom):
                self.value += message.amount
                raise ValueError("dirty")
            raise TypeError(message)

        async def on_passivate(self):
            store.events.append(("passivate", self.context.key))

    return ActorKind("counter", Counter, **options)


def events(tracer: Tracer, name: str | None = None) -> list[list]:
    """Decoded records ``[seq, time, event, kind, key, fields]``, optionally of one kind."""
    records = read_trace(b"".join(tracer.records))
    return [record for record in records if name is None or record[2] == name]


class Ticker(Actor):
    """Arms a 5-second timer on ``"arm"`` and records the mock time of every tick in ``fired``
    (reset it per test); shared so the fault-point and planted-bug timer tests watch one actor."""

    fired: list = []

    async def receive(self, message):
        if message == "arm":
            self.context.start_timer("t", 5, "tick")
        else:
            Ticker.fired.append(trio.current_time())


class Alarm(Actor):
    """Sets durable reminders on request; ``crashes`` names fail their handler that many times."""

    fired: list = []
    crashes: dict = {}

    async def receive(self, message):
        name, delay = message
        await self.context.set_reminder(name, self.context.env.clock.wall() + delay, {"name": name})
        return "armed"

    async def on_reminder(self, name, payload):
        if Alarm.crashes.get(name, 0) > 0:
            Alarm.crashes[name] -= 1
            raise RuntimeError("alarm handler fails")
        Alarm.fired.append((self.context.key, name, round(trio.current_time(), 1)))


async def start_alarm_system(env, nursery, tracer=None, **options) -> tuple[Engine, ActorSystem]:
    Alarm.fired = []
    Alarm.crashes = {}
    engine = await Engine.open(env, nursery=nursery, readers_max=1)
    system = ActorSystem(
        env,
        [ActorKind("alarm", Alarm, intensity=RestartIntensity(5, 5.0))],
        storage=engine,
        tracer=tracer,
        transient_errors=(StorageError,),
        **options,
    )
    await nursery.start(system.run)
    return engine, system
