"""Every planted bug is caught by a 50-seed sweep at 1000 steps, shrunk, and replayed.

The bugs live in the runtime, storage and a workload's actors (``troupe.sim.planted_bug_names``),
never in a checker.  For each one: ``sweep --seeds 1..50 --steps 1000`` (stopping at the first
failing seed, which is what keeps this affordable) must fail; ``shrink`` must give a smaller
configuration that still fails; its replay file must reproduce the very same run.  The share
of the 50 seeds that catch each bug is measured by ``bench/sim_hit_rate.py``.
"""

import json

import pytest

from troupe.sim import planted_bug_names, replay, replay_document, shrink, sweep
from troupe.sim._sweep import read_replay

seeds_in_a_sweep = range(1, 51)
steps_in_a_sweep = 1000
workloads_in_a_sweep = ("admin", "bank", "host", "registers")
"""The workloads the bugs' hit rates were measured with (``bench/sim_hit_rate.py``); the
surfaces' later workloads make each seed several times dearer and test surfaces, not the
runtime layers these bugs live in."""

def test_at_least_eight_bugs_across_the_layers():
    caught = set(planted_bug_names())
    assert len(caught) >= 8
    for layer_example in ("weak_durability", "no_service_restart", "skip_predecessor_wait",
                          "timer_fires_twice", "redeliver_after_crash"):
        assert layer_example in caught


@pytest.mark.parametrize("bug", planted_bug_names())
def test_planted_bug_is_caught_shrunk_and_replayed(bug, tmp_path):
    summary = sweep(seeds_in_a_sweep, steps=steps_in_a_sweep, planted_bugs=frozenset({bug}),
                    workloads=workloads_in_a_sweep, jobs=1, stop_at_first_failure=True)
    assert summary["failing_seeds"], f"{bug} was not caught by a {len(seeds_in_a_sweep)}-seed sweep"
    seed = summary["failing_seeds"][0]
    failing = read_replay_config(seed, bug)

    shrunk, result = shrink(failing)
    assert result.violations
    assert shrunk.planted_bugs == frozenset({bug})
    reduced = (shrunk.steps < failing.steps or shrunk.faults < failing.faults or not shrunk.swarm
               or 0 < len(shrunk.workloads) < len(workloads_in_a_sweep))
    assert reduced, f"shrink did not reduce anything for {bug}"
    path = tmp_path / "failing.replay.json"
    path.write_text(json.dumps(replay_document(shrunk, result, str(path))))
    assert read_replay(str(path)) == shrunk
    verdict, again = replay(str(path))
    assert verdict == {"reproduced": True, "same_trace": True}
    assert [str(violation) for violation in again.violations] == [str(violation) for violation in result.violations]


def read_replay_config(seed, bug):
    from troupe.sim import SimulationConfig

    return SimulationConfig(seed=seed, steps=steps_in_a_sweep, planted_bugs=frozenset({bug}),
                            workloads=workloads_in_a_sweep)
