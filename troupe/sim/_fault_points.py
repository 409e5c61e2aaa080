"""Seeded fault points: the simulator's side of the runtime's BUGGIFY port.

The runtime asks ``env.fault_points.fires(point)`` at a handful of places (see
``troupe.runtime.fault_point_names``).  ``SeededFaultPoints`` answers from one seeded random
source, and only for the points that are armed: a disarmed point answers False without a draw,
so arming or disarming one point never shifts the random stream another point sees beyond its
own draws, and a seed replays byte for byte.  It counts what it injected (``injected``), which
``sim run`` reports.

Rates are per consultation: per turn for the turn points, per post for ``mailbox_full``, per
activation check (two per activation) for ``activate_fails``, per passivation, per timer or
reminder firing, and per ``service_fault_check_seconds`` of a supervised service's life for
``service_crashes`` and ``reminder_service_crashes``.

Swarm testing (Groce et al., 2012): ``swarm_fault_point_rates`` arms a random non-empty subset
of the points per seed, each at a log-uniform rate over a wide range, so that some seeds see a
rare fault alone and others a burst of several at once: bursts are what turn a crash into
poison (the same message crashing twice), an escalation (two crashes of one actor within its
restart period) or a whole kind failing.
"""

from __future__ import annotations

import math
from typing import Protocol

from troupe.runtime import fault_point_names

fault_point_rate_ranges: dict[str, tuple[float, float]] = {
    "turn_raises_before": (0.002, 0.3),
    "turn_raises_after": (0.002, 0.2),
    "activate_fails": (0.002, 0.2),
    "passivate_fails": (0.01, 0.5),
    "service_crashes": (0.005, 0.3),
    "turn_overruns": (0.0005, 0.02),
    "mailbox_full": (0.002, 0.2),
    "timer_late": (0.1, 0.9),
    "reminder_late": (0.02, 0.5),
    "reminder_service_crashes": (0.005, 0.2),
}
"""Per point, the (lowest, highest) rate a swarm seed may draw.  An overrunning turn blocks its
actor for twice its turn timeout, so that point stays rare even in a burst; in-memory timers
fire only a few dozen times in a run, so ``timer_late`` is drawn high."""

fault_point_delay_seconds_max: dict[str, float] = {
    "turn_overruns": 1.0,
    "timer_late": 0.5,
    "reminder_late": 10.0,
}
"""How late a late timer/reminder is at most, and how far past its doubled timeout an
overrunning turn would run (the watchdog ends it first)."""

fault_point_arm_probability = 0.5
"""Chance that a point is armed in a swarm seed (at least one always is)."""

assert set(fault_point_rate_ranges) == set(fault_point_names), "every fault point needs a rate range"
assert set(fault_point_delay_seconds_max) <= set(fault_point_names)
assert all(0 < low <= high < 1 for low, high in fault_point_rate_ranges.values())


class _Random(Protocol):
    def random(self) -> float: ...


class SeededFaultPoints:
    """``FaultPoints`` driven by ``random_source`` (a seeded ``random.Random`` or the Env's
    ``SimRandom``); ``rates`` maps point names to the chance each consultation fires."""

    def __init__(
        self,
        random_source: _Random,
        rates: dict[str, float],
        delays: dict[str, float] | None = None,
    ) -> None:
        unknown = set(rates) - set(fault_point_names)
        assert not unknown, f"unknown fault points {sorted(unknown)}"
        assert all(0 <= rate <= 1 for rate in rates.values())
        self._random = random_source
        self.rates = {point: rate for point, rate in sorted(rates.items()) if rate > 0}
        self.delays = {**fault_point_delay_seconds_max, **(delays or {})}
        self.injected: dict[str, int] = {}
        """How many times each point fired."""

    @property
    def armed(self) -> tuple[str, ...]:
        """The points that can fire, sorted."""
        return tuple(self.rates)

    def fires(self, point: str) -> bool:
        rate = self.rates.get(point)
        if rate is None:
            return False  # disarmed: no draw, so the stream stays as it was
        if self._random.random() >= rate:
            return False
        self.injected[point] = self.injected.get(point, 0) + 1
        return True

    def delay_seconds(self, point: str) -> float:
        """Between a tenth of and the whole of the point's maximum delay."""
        maximum = self.delays.get(point, 0.0)
        if point not in self.rates or maximum <= 0:
            return 0.0
        return maximum * (0.1 + 0.9 * self._random.random())


def swarm_fault_point_rates(random_source: _Random) -> dict[str, float]:
    """A per-seed configuration: a non-empty random subset of the points, each at a
    log-uniform rate within its ``fault_point_rate_ranges`` entry."""
    armed = [point for point in fault_point_names if random_source.random() < fault_point_arm_probability]
    if not armed:
        armed = [fault_point_names[min(int(random_source.random() * len(fault_point_names)), len(fault_point_names) - 1)]]
    rates = {}
    for point in armed:
        low, high = fault_point_rate_ranges[point]
        rates[point] = math.exp(math.log(low) + (math.log(high) - math.log(low)) * random_source.random())
    return rates


def default_fault_point_rates() -> dict[str, float]:
    """Every point armed at the geometric middle of its range (runs without swarm)."""
    return {point: math.sqrt(low * high) for point, (low, high) in fault_point_rate_ranges.items()}


__all__ = [
    "SeededFaultPoints",
    "default_fault_point_rates",
    "fault_point_rate_ranges",
    "swarm_fault_point_rates",
]
