"""SeededFaultPoints and the swarm rates: seeded, frugal with randomness, wide enough that a
small 4-client workload with retries sees poison, escalation and whole-kind failure."""

import collections
import random
import tempfile

import trio
import trio.testing

from tests.runtime._faults import Add, Store, counter_kind
from troupe.runtime import (
    ActorCrashed,
    AskTimeout,
    Overloaded,
    PoisonMessage,
    Tracer,
    Unavailable,
    fault_point_names,
    no_fault_points,
    open_actor_system,
)
from troupe.sim._fault_points import (
    SeededFaultPoints,
    default_fault_point_rates,
    fault_point_rate_ranges,
    swarm_fault_point_rates,
)
from troupe.sim._sim_env import sim_env


class CountingRandom:
    def __init__(self, seed):
        self.generator = random.Random(seed)
        self.draws = 0

    def random(self):
        self.draws += 1
        return self.generator.random()


def test_disarmed_points_never_draw():
    source = CountingRandom(1)
    points = SeededFaultPoints(source, {"mailbox_full": 0.5, "turn_overruns": 0.0})
    assert points.armed == ("mailbox_full",)
    for point in fault_point_names:
        if point != "mailbox_full":
            assert not points.fires(point)
            assert points.delay_seconds(point) == 0.0
    assert source.draws == 0


def test_fires_at_its_rate_and_counts_what_it_injected():
    points = SeededFaultPoints(random.Random(7), {"turn_raises_before": 0.25})
    fired = sum(points.fires("turn_raises_before") for _ in range(4000))
    assert 900 < fired < 1100
    assert points.injected == {"turn_raises_before": fired}


def test_delays_stay_within_the_maximum():
    points = SeededFaultPoints(random.Random(3), {"timer_late": 1.0}, delays={"timer_late": 4.0})
    delays = [points.delay_seconds("timer_late") for _ in range(200)]
    assert all(0.4 <= delay <= 4.0 for delay in delays)


def test_swarm_rates_are_seeded_non_empty_and_spread():
    assert swarm_fault_point_rates(random.Random(5)) == swarm_fault_point_rates(random.Random(5))
    configurations = [swarm_fault_point_rates(random.Random(seed)) for seed in range(200)]
    assert all(configurations)
    armed = collections.Counter(point for rates in configurations for point in rates)
    assert set(armed) == set(fault_point_names)
    sizes = {len(rates) for rates in configurations}
    assert min(sizes) <= 2 and max(sizes) >= 8  # some seeds see one fault alone, some a burst
    for rates in configurations:
        for point, rate in rates.items():
            low, high = fault_point_rate_ranges[point]
            assert low <= rate <= high
    turn_rates = [rates["turn_raises_before"] for rates in configurations if "turn_raises_before" in rates]
    assert min(turn_rates) < 0.01 and max(turn_rates) > 0.1


def test_default_rates_arm_every_point():
    rates = default_fault_point_rates()
    assert set(rates) == set(fault_point_names) and all(0 < rate < 1 for rate in rates.values())


def run_small_workload(seed: int, operations: int = 400) -> tuple[dict[str, int], dict[str, int]]:
    """Four clients retrying increments on eight counters for a few simulated seconds."""
    env = sim_env(seed, tempfile.mkdtemp())
    points = SeededFaultPoints(random.Random(seed * 4099 + 5), swarm_fault_point_rates(random.Random(seed)))
    tracer = Tracer(enabled=False)

    async def client(system, number):
        choices = random.Random(seed * 100 + number)
        for index in range(operations // 4):
            message = Add(1, trace_id=f"{number}-{index}")
            key = str(choices.randrange(8))
            for _ in range(4):
                try:
                    await system.ref("counter", key).ask(message, timeout=10)
                    break
                except (Overloaded, Unavailable) as error:
                    await trio.sleep(error.retry_after_seconds)
                except PoisonMessage:
                    break
                except (ActorCrashed, AskTimeout):
                    await trio.sleep(0.01)
            await trio.sleep(0.02)

    async def main():
        kind = counter_kind(Store(), idle_seconds=2.0)
        async with open_actor_system(env, [kind], tracer=tracer, live_actors_max=5) as system:
            env.fault_points = points  # armed once the system runs, as the simulator does
            async with trio.open_nursery() as nursery:
                for number in range(4):
                    nursery.start_soon(client, system, number)
            env.fault_points = no_fault_points

    # Seed trio's scheduler as the simulator does (private hooks, see _simulation.py).
    allowed = trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio._core._run._r.seed(seed)
    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = allowed
        trio._core._run._r.seed()
    return dict(tracer.counts), dict(points.injected)


def test_swarm_seeds_reach_poison_escalation_and_kind_failure():
    seen = collections.Counter()
    for seed in range(1, 13):
        counts, _ = run_small_workload(seed)
        seen.update(name for name in ("poison", "escalate", "kind_failed", "turn_timeout", "overloaded") if counts.get(name))
    assert set(seen) == {"poison", "escalate", "kind_failed", "turn_timeout", "overloaded"}, seen
    assert seen["escalate"] < 12  # and some seeds stay quiet enough to see none


def test_same_seed_same_faults():
    assert run_small_workload(3, 200) == run_small_workload(3, 200)
