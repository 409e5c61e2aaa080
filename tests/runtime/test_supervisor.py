"""Supervisor strategies and restart intensity, asserting the exact recorded order."""

import pytest
import trio

from troupe.runtime import (
    ChildSpec,
    RestartIntensity,
    Strategy,
    Supervisor,
    SupervisorEscalated,
    Tracer,
)


def make_children(log, crashes):
    """Children a, b, c; ``crashes[name]`` counts how many times that child crashes at start+1s."""

    def child(name):
        async def run(*, task_status=trio.TASK_STATUS_IGNORED):
            log.append(f"start {name}")
            task_status.started()
            try:
                if crashes.get(name, 0) > 0:
                    await trio.sleep(1)
                    crashes[name] -= 1
                    log.append(f"crash {name}")
                    raise ValueError(name)
                await trio.sleep_forever()
            except trio.Cancelled:
                log.append(f"stop {name}")
                raise

        return ChildSpec(name, run)

    return [child(name) for name in "abc"]


async def run_for(supervisor, seconds):
    with trio.move_on_after(seconds):
        await supervisor.run()


@pytest.mark.parametrize(
    "strategy, expected",
    [
        (Strategy.one_for_one, ["start a", "start b", "start c", "crash b", "start b"]),
        (Strategy.one_for_all, ["start a", "start b", "start c", "crash b", "stop c", "stop a", "start a", "start b", "start c"]),
        (Strategy.rest_for_one, ["start a", "start b", "start c", "crash b", "stop c", "start b", "start c"]),
    ],
)
async def test_strategies_restart_exactly_the_right_children(strategy, expected, autojump_clock):
    log = []
    supervisor = Supervisor("test", make_children(log, {"b": 1}), strategy=strategy)
    await run_for(supervisor, 10)
    assert log[: len(expected)] == expected
    # After the restart nothing else happens until the test ends and stops everyone.
    assert all(entry.startswith("stop") for entry in log[len(expected):])
    assert supervisor.restarts == 1


async def test_intensity_exceeded_escalates_to_the_parent(autojump_clock):
    log = []
    tracer = Tracer(keep_in_memory=True)
    supervisor = Supervisor(
        "inner", make_children(log, {"a": 5}), intensity=RestartIntensity(2, 10.0), tracer=tracer
    )
    with pytest.raises(SupervisorEscalated):
        await run_for(supervisor, 100)
    assert log.count("crash a") == 3  # two restarts allowed, the third crash escalates
    assert tracer.counts["escalate"] == 1 and tracer.counts["restart"] == 2
    assert "stop b" in log and "stop c" in log  # children are stopped before escalating


async def test_restarts_outside_the_period_do_not_accumulate(autojump_clock):
    log = []

    async def slow_crasher(*, task_status=trio.TASK_STATUS_IGNORED):
        log.append("start")
        task_status.started()
        await trio.sleep(6)
        raise ValueError("again")

    supervisor = Supervisor("test", [ChildSpec("x", slow_crasher)], intensity=RestartIntensity(1, 5.0))
    await run_for(supervisor, 40)
    assert log.count("start") >= 6  # one restart per 6 s never exceeds 1 per 5 s


async def test_root_never_exits_and_recovers_the_child_after_backoff(autojump_clock):
    log = []
    marks = []
    crashes = {"a": 3}

    def child_a():
        spec = make_children(log, crashes)[0]
        spec.on_unavailable = lambda retry_after: marks.append(("down", retry_after))
        spec.on_recovered = lambda: marks.append(("up",))
        return spec

    root = Supervisor("root", [child_a()], intensity=RestartIntensity(1, 5.0), escalate=False)
    await run_for(root, 60)
    assert log.count("crash a") == 3
    assert marks[0][0] == "down" and marks[-1] == ("up",)
    assert root.escalations >= 1
    assert log[-1] == "stop a" or log[-1] == "start a"


async def test_a_child_that_fails_to_start_counts_as_a_crash(autojump_clock):
    attempts = []

    async def broken(*, task_status=trio.TASK_STATUS_IGNORED):
        attempts.append(1)
        raise OSError("cannot start")

    supervisor = Supervisor("test", [ChildSpec("x", broken)], intensity=RestartIntensity(1, 5.0))
    with pytest.raises(SupervisorEscalated):
        await run_for(supervisor, 10)
    assert len(attempts) == 2


async def test_a_child_failing_while_it_is_cancelled_does_not_escape(autojump_clock):
    # Found by the simulator (host seed 60): the process crashed while the reminder service's
    # own task group held both the cancellation and a storage error; the group escaped the
    # root supervisor and took the whole server down instead of letting it stop.
    async def service(*, task_status=trio.TASK_STATUS_IGNORED):
        task_status.started()
        async with trio.open_nursery() as nursery:
            async def refuses_while_stopping():
                try:
                    await trio.sleep_forever()
                finally:
                    raise OSError("storage went away with the process")

            nursery.start_soon(refuses_while_stopping)
            await trio.sleep_forever()

    tracer = Tracer(keep_in_memory=True)
    supervisor = Supervisor("root", [ChildSpec("service", service)], tracer=tracer, escalate=False)
    with trio.move_on_after(1) as scope:
        await supervisor.run()
    assert scope.cancelled_caught
    assert tracer.counts.get("child_crash") == 1
