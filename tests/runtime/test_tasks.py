"""Background tasks (``ActorContext.start_task``): results, errors, cancellation, and how they
end with the instance and hold off idle passivation."""

from dataclasses import dataclass

import pytest
import trio

from troupe.runtime import Actor, ActorCrashed, ActorKind, TaskEnded, Tracer, open_actor_system


@dataclass(frozen=True)
class Start:
    name: str
    seconds: float
    value: object = None
    fail: bool = False


@dataclass(frozen=True)
class Cancel:
    name: str


@dataclass(frozen=True)
class Running:
    name: str


@dataclass(frozen=True)
class Boom:
    pass


class Log:
    def __init__(self):
        self.events = []


def worker_kind(log: Log, **options) -> ActorKind:
    class Worker(Actor):
        async def receive(self, message):
            if isinstance(message, Start):

                async def work():
                    try:
                        await trio.sleep(message.seconds)
                    except trio.Cancelled:
                        log.events.append(("cancelled", message.name))
                        raise
                    if message.fail:
                        raise ValueError(message.name)
                    return message.value

                self.context.start_task(message.name, work)
                return "started"
            if isinstance(message, Cancel):
                self.context.cancel_task(message.name)
                return None
            if isinstance(message, Running):
                return self.context.task_running(message.name)
            if isinstance(message, Boom):
                raise RuntimeError("boom")
            if isinstance(message, TaskEnded):
                error = type(message.error).__name__ if message.error is not None else None
                log.events.append(("ended", message.name, message.result, error, message.cancelled))
                return None
            raise TypeError(message)

        async def on_passivate(self):
            log.events.append(("passivate", self.context.key))

    return ActorKind("worker", Worker, **options)


async def test_task_result_arrives_as_task_ended(env, autojump_clock):
    log = Log()
    tracer = Tracer()
    async with open_actor_system(env, [worker_kind(log)], tracer=tracer) as system:
        ref = system.ref("worker", "a")
        assert await ref.ask(Start("t", 5, value=42)) == "started"
        assert await ref.ask(Running("t")) is True
        await trio.sleep(6)
        assert log.events == [("ended", "t", 42, None, False)]
        assert await ref.ask(Running("t")) is False
    assert tracer.counts["task_started"] == 1
    assert tracer.counts["task_ended"] == 1


async def test_task_error_is_reported_not_a_crash(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log)]) as system:
        ref = system.ref("worker", "a")
        await ref.ask(Start("t", 1, fail=True))
        await trio.sleep(2)
        assert log.events == [("ended", "t", None, "ValueError", False)]
        assert await ref.ask(Running("t")) is False


async def test_cancel_task_reports_cancelled(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log)]) as system:
        ref = system.ref("worker", "a")
        await ref.ask(Start("t", 100))
        await ref.ask(Cancel("t"))
        await trio.sleep(1)
        assert log.events == [("cancelled", "t"), ("ended", "t", None, None, True)]


async def test_restarting_a_name_cancels_the_old_task_silently(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log)]) as system:
        ref = system.ref("worker", "a")
        await ref.ask(Start("t", 100, value="old"))
        await ref.ask(Start("t", 1, value="new"))
        await trio.sleep(2)
        assert log.events == [("cancelled", "t"), ("ended", "t", "new", None, False)]


async def test_crash_cancels_tasks_without_reporting_them(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log)]) as system:
        ref = system.ref("worker", "a")
        await ref.ask(Start("t", 100))
        with pytest.raises(ActorCrashed):
            await ref.ask(Boom())
        await trio.sleep(1)
        assert log.events == [("cancelled", "t")]
        assert await ref.ask(Running("t")) is False


async def test_a_running_task_holds_off_idle_passivation(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log, idle_seconds=10)]) as system:
        ref = system.ref("worker", "a")
        await ref.ask(Start("t", 60))
        await trio.sleep(50)
        assert log.events == []
        assert system.live_count == 1
        await trio.sleep(11)
        # The task ended at 60 s; idleness counts from there.
        assert log.events == [("ended", "t", None, None, False)]
        await trio.sleep(15)
        assert log.events[-1] == ("passivate", "a")
        assert system.live_count == 0


async def test_eviction_cancels_tasks(env, autojump_clock):
    log = Log()
    async with open_actor_system(env, [worker_kind(log)], live_actors_max=1) as system:
        await system.ref("worker", "a").ask(Start("t", 100))
        await system.ref("worker", "b").ask(Running("t"))
        await trio.sleep(1)
        assert ("cancelled", "t") in log.events
        assert ("passivate", "a") in log.events
        assert not any(event[0] == "ended" for event in log.events)
