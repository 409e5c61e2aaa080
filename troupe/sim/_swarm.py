"""Which faults a run injects, and how often: swarm testing.

A fixed mix of faults at fixed rates finds the bugs that mix is good at and hides the rest: a
bug that needs many crashes in a row is masked by I/O errors that crash actors first, and one
that needs a long quiet stretch never gets it.  Swarm testing (Groce et al., 2012) gives each
seed its own configuration instead: a random subset of the allowed fault kinds, each at a rate
drawn from a wide (log-uniform) range.  Over a sweep every kind is exercised alone, together,
rarely and in bursts.  ``--no-swarm`` arms every allowed kind at the default rates.

Everything is drawn from the run's own ``random.Random`` (seeded from the seed), so the same
seed always picks the same configuration.
"""

from __future__ import annotations

import math
import random as random_module
from dataclasses import dataclass, field

crash_interval_seconds_default = 1.5
crash_interval_seconds_range = (0.2, 6.0)
"""A 2000-step run lasts about 12 simulated seconds: these give it several lifetimes."""
crash_inside_io_share_default = 0.5
"""Share of process crashes that land at an I/O operation (inside a batch, a COMMIT or a
checkpoint) rather than at a moment between batches."""
crash_io_operations_mean = 40.0
"""Mean number of VFS writes/syncs before an I/O-located crash lands."""
power_loss_share_default = 0.5
"""Share of process crashes that are power losses (un-synced data is lost too)."""
io_error_probability_default = 0.002
io_error_probability_range = (0.0002, 0.02)
disk_full_probability_default = 0.001
disk_full_probability_range = (0.0001, 0.01)
clock_jump_interval_seconds_default = 5.0
clock_jump_interval_seconds_range = (1.0, 60.0)
clock_jump_seconds_max = 3600.0
graceful_restart_share = 0.2
"""Share of process lifetimes that end in a clean shutdown and restart instead of a crash,
when crashes are armed: recovery from a clean close is a path of its own."""
read_faults_share = 0.3
"""Share of swarm seeds whose I/O errors also strike reads."""
swarm_arm_probability = 0.65
"""Chance that an allowed fault kind is armed in a swarm seed."""


@dataclass
class FaultSettings:
    armed: frozenset[str]
    crash_interval_seconds: float = crash_interval_seconds_default
    crash_inside_io_share: float = crash_inside_io_share_default
    power_loss_share: float = power_loss_share_default
    io_error_probability: float = io_error_probability_default
    disk_full_probability: float = disk_full_probability_default
    clock_jump_interval_seconds: float = clock_jump_interval_seconds_default
    read_faults: bool = False
    """Whether I/O errors also hit reads (the reminder service's and recovery's read paths)."""
    fault_point_rates: dict[str, float] = field(default_factory=dict)

    @property
    def crashes(self) -> bool:
        return bool({"crash", "power_loss"} & self.armed)


def _log_uniform(decisions: random_module.Random, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return math.exp(decisions.uniform(math.log(low), math.log(high)))


def choose_fault_settings(allowed: frozenset[str], swarm: bool, decisions: random_module.Random,
                          fault_point_randomness: random_module.Random) -> FaultSettings:
    """The run's faults: every allowed kind at default rates, or (swarm) a per-seed subset
    at per-seed rates."""
    if not swarm:
        settings = FaultSettings(armed=frozenset(allowed))
        if "power_loss" not in allowed:
            settings.power_loss_share = 0.0
        elif "crash" not in allowed:
            settings.power_loss_share = 1.0
        if "runtime" in allowed:
            settings.fault_point_rates = _fault_point_rates(None)
        return settings
    ordered = sorted(allowed)
    armed = {kind for kind in ordered if decisions.random() < swarm_arm_probability}
    if ordered and not armed:
        armed.add(ordered[decisions.randrange(0, len(ordered))])
    settings = FaultSettings(
        armed=frozenset(armed),
        crash_interval_seconds=_log_uniform(decisions, crash_interval_seconds_range),
        crash_inside_io_share=decisions.random(),
        io_error_probability=_log_uniform(decisions, io_error_probability_range),
        disk_full_probability=_log_uniform(decisions, disk_full_probability_range),
        clock_jump_interval_seconds=_log_uniform(decisions, clock_jump_interval_seconds_range),
        read_faults=decisions.random() < read_faults_share,
    )
    if "power_loss" not in armed:
        settings.power_loss_share = 0.0
    elif "crash" not in armed:
        settings.power_loss_share = 1.0
    else:
        settings.power_loss_share = decisions.random()
    if "runtime" in armed:
        settings.fault_point_rates = _fault_point_rates(fault_point_randomness)
    return settings


def _fault_point_rates(randomness: random_module.Random | None) -> dict[str, float]:
    from ._fault_points import default_fault_point_rates, swarm_fault_point_rates

    return default_fault_point_rates() if randomness is None else swarm_fault_point_rates(randomness)
