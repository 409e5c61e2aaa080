"""The planted bugs: deliberate, named mistakes that prove the simulator can see each kind.

Each lives next to the code it breaks (the runtime, storage, a workload's actors; never a
checker) behind a check of ``env.planted_bugs``, which is empty outside ``troupe sim
--plant-bug NAME``.  Tests run a 50-seed sweep with each one and require it to be caught,
shrunk and replayed; ``bench/sim_hit_rate.py`` measures the share of seeds that catch it.
"""

from __future__ import annotations

workload_planted_bugs = ("ack_before_commit",)
"""Planted in the bank workload's accounts: a deposit is acknowledged before its commit."""


def planted_bug_names() -> tuple[str, ...]:
    """Every bug ``--plant-bug`` accepts, sorted."""
    import troupe.runtime
    import troupe.storage

    names = set(workload_planted_bugs)
    names.update(troupe.runtime.runtime_planted_bugs)
    names.update(troupe.storage.storage_planted_bugs)
    return tuple(sorted(names))
