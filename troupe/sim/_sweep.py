"""Many seeds at once, and what to do with a failing one: shrink it, write it down, replay it.

``sweep`` fans seeds out over worker processes (each seed is an independent ``trio.run``) and
reports a one-line JSON summary.  ``shrink`` takes a failing configuration and looks for a
smaller one that still fails: fewer steps first (halving, then bisecting), then fewer kinds of
fault.  The result is a replay file (JSON) holding everything needed to run it again, including
the trace hash, so ``replay`` can tell both "it still fails" and "it is the same run".
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

from ._simulation import SimulationConfig, SimulationResult, run_simulation

replay_format_version = 1
violations_kept_max = 20
progress_bar_width = 30


def _run_one(config: SimulationConfig) -> tuple[dict[str, Any], list[str]]:
    result = run_simulation(config)
    return result.summary(), result.violations[:violations_kept_max]


def sweep(
    seeds: range,
    *,
    steps: int,
    faults: frozenset[str],
    workloads: tuple[str, ...] = (),
    planted_bugs: frozenset[str] = frozenset(),
    jobs: int = 1,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Run every seed; return the summary (see docs/simulator.md for the fields)."""
    started = time.perf_counter()
    configs = [
        SimulationConfig(seed=seed, steps=steps, faults=faults, workloads=workloads, planted_bugs=planted_bugs)
        for seed in seeds
    ]
    totals = {"crashes": 0, "restarts": 0, "faults_injected": 0, "io_errors": 0, "disk_full": 0, "clock_jumps": 0}
    failing: list[int] = []
    first_violations: dict[int, list[str]] = {}
    violations = 0
    done = 0
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(jobs, 1), mp_context=context) as pool:
        futures = {pool.submit(_run_one, config): config.seed for config in configs}
        for future in concurrent.futures.as_completed(futures):
            summary, violation_texts = future.result()
            done += 1
            for name in totals:
                totals[name] += summary[name]
            if summary["violations"]:
                violations += summary["violations"]
                failing.append(summary["seed"])
                first_violations[summary["seed"]] = violation_texts[:3]
            if progress is not None:
                _draw_progress(progress, done, len(configs), violations)
    if progress is not None:
        progress.write("\n")
        progress.flush()
    return {
        "seeds": len(configs),
        "steps": steps,
        "violations": violations,
        "failing_seeds": sorted(failing),
        **totals,
        "wall_seconds": round(time.perf_counter() - started, 3),
        "first_violations": {str(seed): first_violations[seed] for seed in sorted(first_violations)},
    }


def _draw_progress(stream: TextIO, done: int, total: int, violations: int) -> None:
    filled = progress_bar_width * done // total
    bar = "#" * filled + "." * (progress_bar_width - filled)
    stream.write(f"\r[{bar}] {done}/{total} seeds, {violations} violations")
    stream.flush()


def shrink(
    config: SimulationConfig,
    *,
    runner: Callable[[SimulationConfig], SimulationResult] = run_simulation,
    progress: TextIO | None = None,
) -> tuple[SimulationConfig, SimulationResult]:
    """The smallest configuration found that still fails (``config`` must fail)."""

    def fails(candidate: SimulationConfig) -> SimulationResult | None:
        result = runner(candidate)
        if progress is not None:
            progress.write(f"shrink: steps={candidate.steps} faults={','.join(sorted(candidate.faults)) or '-'}"
                           f" -> {len(result.violations)} violations\n")
        return result if result.violations else None

    best_result = fails(config)
    if best_result is None:
        raise ValueError(f"seed {config.seed} does not fail with this configuration: nothing to shrink")
    best = config
    # Fewer steps: halve while it still fails, then bisect between the last pass and fail.
    passing_steps = 0
    while best.steps > 1:
        candidate = replace(best, steps=best.steps // 2)
        result = fails(candidate)
        if result is None:
            passing_steps = candidate.steps
            break
        best, best_result = candidate, result
    low, high = passing_steps, best.steps
    while high - low > 1:
        middle = (low + high) // 2
        result = fails(replace(best, steps=middle))
        if result is None:
            low = middle
        else:
            high = middle
            best, best_result = replace(best, steps=middle), result
    # Fewer kinds of fault.
    for fault in sorted(best.faults):
        candidate = replace(best, faults=best.faults - {fault})
        result = fails(candidate)
        if result is not None:
            best, best_result = candidate, result
    return best, best_result


def replay_document(config: SimulationConfig, result: SimulationResult) -> dict[str, Any]:
    return {
        "format": replay_format_version,
        "seed": config.seed,
        "steps": config.steps,
        "faults": sorted(config.faults),
        "workloads": list(config.workloads),
        "planted_bugs": sorted(config.planted_bugs),
        "trace_sha256": result.trace_sha256,
        "violations": result.violations[:violations_kept_max],
        "command": f"troupe sim replay FILE  (or: troupe sim run --seed {config.seed} --steps {config.steps}"
        f" --faults {','.join(sorted(config.faults)) or 'none'})",
    }


def config_from_replay(document: dict[str, Any]) -> SimulationConfig:
    if document.get("format") != replay_format_version:
        raise ValueError(f"unsupported replay format {document.get('format')!r}")
    return SimulationConfig(
        seed=int(document["seed"]),
        steps=int(document["steps"]),
        faults=frozenset(document["faults"]),
        workloads=tuple(document["workloads"]),
        planted_bugs=frozenset(document["planted_bugs"]),
    )


def replay(path: str) -> tuple[dict[str, Any], SimulationResult]:
    """Run a replay file again; ``same_trace`` says whether it was byte-for-byte the same run."""
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    config = config_from_replay(document)
    result = run_simulation(config)
    verdict = {
        "reproduced": bool(result.violations),
        "same_trace": result.trace_sha256 == document["trace_sha256"],
    }
    return verdict, result


