"""How often the simulator catches each planted bug: the share of seeds that fail.

For every planted bug the simulator knows (``troupe sim sweep --help`` lists them), run a sweep
of the same seeds at each step count and report the share of seeds with a violation.  A good
simulator catches every bug in most seeds; a bug caught in few seeds is one a real regression
of that kind could slip past.  Prints one JSON line:
``{"seeds": 50, "steps": [1000, 2000], "hit_rate": {"bug": {"1000": 0.96, "2000": 1.0}}, ...}``.

    python bench/sim_hit_rate.py --seeds 1..50 --steps 1000,2000 --jobs 2 [--bug NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from troupe.sim import planted_bug_names, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1..50")
    parser.add_argument("--steps", default="1000,2000")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--bug", action="append", default=[])
    parser.add_argument("--workload", action="append", default=[])
    parser.add_argument("--no-swarm", action="store_true")
    arguments = parser.parse_args()
    first, last = (int(part) for part in arguments.seeds.split(".."))
    seeds = range(first, last + 1)
    step_counts = [int(part) for part in arguments.steps.split(",")]
    bugs = arguments.bug or list(planted_bug_names())
    started = time.perf_counter()
    hit_rate: dict[str, dict[str, float]] = {}
    for bug in bugs:
        hit_rate[bug] = {}
        for steps in step_counts:
            summary = sweep(seeds, steps=steps, workloads=tuple(arguments.workload),
                            planted_bugs=frozenset({bug}), jobs=arguments.jobs,
                            swarm=not arguments.no_swarm)
            hit_rate[bug][str(steps)] = round(len(summary["failing_seeds"]) / len(seeds), 3)
            print(f"{bug} at {steps} steps: {hit_rate[bug][str(steps)]}", file=sys.stderr, flush=True)
    print(json.dumps({
        "seeds": len(seeds),
        "steps": step_counts,
        "swarm": not arguments.no_swarm,
        "workloads": arguments.workload or "all",
        "hit_rate": hit_rate,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }), flush=True)


if __name__ == "__main__":
    main()
