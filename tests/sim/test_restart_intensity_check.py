"""The simulator's restart-intensity checker against the runtime's own decision at the edge
of the period.

The trace keeps moments in whole microseconds; the runtime decides on its exact clock.  Seed 2
of the character workload (2,000 steps) crashed ``Neko`` twice 5.0000001 s apart (the second
crash came from the outbox's retry, due ``retry_backoff_seconds`` = 5 s after the first, read
back through the wall clock): the runtime rightly restarted both times, and the checker, seeing
both moments end in ``.968041``, reported "restart intensity exceeded ... without escalation".
"""

from dataclasses import dataclass

import pytest
import trio

from troupe.runtime import (
    Actor,
    ActorCrashed,
    ActorKind,
    RestartIntensity,
    Tracer,
    open_actor_system,
)
from troupe.sim._sim_env import sim_env
from troupe.sim._simulation import _check_restart_intensity, trace_moments_per_second

period_seconds = RestartIntensity().period_seconds
first_crash_seconds = 2290.9680412805196
"""The moments of seed 2's two crashes, as the runtime saw them."""
second_crash_seconds = 2295.968041385356


@dataclass(frozen=True)
class Boom:
    tag: str


class Crasher(Actor):
    async def receive(self, message):
        raise ValueError(message.tag)


async def crash_at(moments: list[float], tmp_path) -> tuple[Tracer, object]:
    tracer = Tracer(time_source=trio.current_time, keep_in_memory=True)
    async with open_actor_system(sim_env(1, str(tmp_path)), [ActorKind("crasher", Crasher)],
                                 tracer=tracer) as system:
        for number, moment in enumerate(moments):
            await trio.sleep_until(moment)
            with pytest.raises(ActorCrashed):
                await system.ref("crasher", "Neko").ask(Boom(str(number)))
        return tracer, system.statistics()["crasher"]


async def test_restarts_a_hair_more_than_the_period_apart_are_no_violation(tmp_path, autojump_clock):
    assert second_crash_seconds - first_crash_seconds > period_seconds
    assert round(second_crash_seconds * trace_moments_per_second) - round(
        first_crash_seconds * trace_moments_per_second) == round(period_seconds * trace_moments_per_second)
    tracer, statistics = await crash_at([first_crash_seconds, second_crash_seconds], tmp_path)
    # The runtime saw them outside one period: two restarts, no escalation...
    assert (statistics.restarts, statistics.escalations) == (2, 0)
    # ...and the trace, which cannot tell them from exactly one period apart, agrees.
    assert _check_restart_intensity(tracer) == []


async def test_restarts_a_microsecond_inside_the_period_escalate(tmp_path, autojump_clock):
    inside = first_crash_seconds + period_seconds - 1 / trace_moments_per_second
    tracer, statistics = await crash_at([first_crash_seconds, inside], tmp_path)
    assert (statistics.restarts, statistics.escalations) == (1, 1)
    assert _check_restart_intensity(tracer) == []


class Moments:
    """A time source the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("gap_microseconds", "violations"),
    [(4_999_998, 1), (4_999_999, 1), (5_000_000, 0), (5_000_001, 0)],
)
def test_checker_flags_only_restarts_certainly_inside_the_period(gap_microseconds, violations):
    moments = Moments()
    tracer = Tracer(time_source=moments, keep_in_memory=True)
    moments.now = first_crash_seconds
    first = tracer.record("restart", "character", "Neko")
    moments.now = first_crash_seconds + gap_microseconds / trace_moments_per_second
    second = tracer.record("restart", "character", "Neko")
    found = _check_restart_intensity(tracer)
    assert len(found) == violations
    if found:
        assert "restart intensity exceeded for character/Neko without escalation" in str(found[0])
        assert found[0].sequences == (first, second)


def test_checker_accepts_a_burst_that_escalated():
    moments = Moments()
    tracer = Tracer(time_source=moments, keep_in_memory=True)
    tracer.record("restart", "character", "Neko")
    moments.now = 1.0
    tracer.record("escalate", "character", "Neko")
    moments.now = 2.0
    tracer.record("restart", "character", "Neko")
    assert _check_restart_intensity(tracer) == []
