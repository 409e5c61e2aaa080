"""Many seeds at once, and what to do with a failing one: shrink it, write it down, replay it.

``sweep`` fans seeds out over worker processes (each seed is an independent ``trio.run``) and
reports a one-line JSON summary: how many seeds failed and with which *distinct* violations
(a violation's signature masks run-specific numbers, so one bug hit by forty seeds counts once),
which runtime event kinds the seeds exercised and which they never did (an event kind no seed
produced is a code path the sweep proved nothing about), and how fast it went.

``shrink`` takes a failing configuration and looks for a smaller one that still fails: fewer
steps (halving, then bisecting), then fewer kinds of fault, fewer workloads, and swarm testing
switched off (every remaining fault armed at its default rate is easier to reason about than a
seed's private mix).  Planted bugs are never dropped: they are what is being reproduced.  The
result is a replay file (JSON) holding every field of ``SimulationConfig`` plus the trace hash,
so ``replay`` can tell both "it still fails" and "it is the same run".

Every command this module prints (``simulation_command``) carries every flag its configuration
needs, so it can be pasted back as it stands; a test parses them with the real CLI parser.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from ._simulation import SimulationConfig, SimulationResult, fault_names, run_simulation
from ._violation import Violation, as_violation

replay_format_version = 2
"""2: adds ``swarm`` and the printed commands; format 1 files lack fields this version needs."""
violations_kept_max = 20
"""Per replay file: enough to read, bounded for a seed that fails a lot."""
first_violations_seeds_max = 10
first_violations_per_seed_max = 3
violation_signatures_max = 50
progress_bar_width = 30

counter_names = (
    "process_crashes",
    "power_losses",
    "process_lifetimes",
    "actor_crashes",
    "actor_restarts",
    "faults_injected",
    "io_errors",
    "disk_full",
    "clock_jumps",
    "undecided_keys",
)
"""The per-seed counters a sweep adds up (see ``SimulationResult``)."""

Runner = Callable[[SimulationConfig], SimulationResult]


def simulation_command(verb: str, config: SimulationConfig) -> str:
    """The ``troupe sim VERB`` command line that runs ``config`` again, every flag included
    (``--faults none`` when it has none, one ``--workload`` / ``--plant-bug`` per name)."""
    parts = ["troupe", "sim", verb, "--seed", str(config.seed), "--steps", str(config.steps)]
    parts += ["--faults", ",".join(sorted(config.faults)) or "none"]
    for workload in config.workloads:
        parts += ["--workload", workload]
    for bug in sorted(config.planted_bugs):
        parts += ["--plant-bug", bug]
    if not config.swarm:
        parts.append("--no-swarm")
    return shlex.join(parts)


def replay_command(path: str) -> str:
    return shlex.join(["troupe", "sim", "replay", path])


def explain_command(path: str) -> str:
    return shlex.join(["troupe", "sim", "explain", path])


# -- sweep ---------------------------------------------------------------------------------


@dataclass
class _SeedOutcome:
    """What a worker process sends back for one seed: small, picklable, no trace."""

    summary: dict[str, Any]
    signatures: dict[str, tuple[int, str]] = field(default_factory=dict)
    """signature -> (how many of this seed's violations have it, the first one's text)."""
    first_texts: list[str] = field(default_factory=list)


def _run_one(runner: Runner, config: SimulationConfig) -> _SeedOutcome:
    result = runner(config)
    signatures: dict[str, tuple[int, str]] = {}
    for item in result.violations:
        violation = as_violation(item)
        count, text = signatures.get(violation.signature, (0, str(violation)))
        signatures[violation.signature] = (count + 1, text)
    first_texts = [str(as_violation(item)) for item in result.violations[:first_violations_per_seed_max]]
    return _SeedOutcome(result.summary(), signatures, first_texts)


def default_jobs() -> int:
    return os.cpu_count() or 1


def sweep(
    seeds: Iterable[int],
    *,
    steps: int,
    faults: frozenset[str] = frozenset(fault_names),
    workloads: tuple[str, ...] = (),
    planted_bugs: frozenset[str] = frozenset(),
    swarm: bool = True,
    jobs: int | None = None,
    progress: TextIO | None = None,
    stop_at_first_failure: bool = False,
    runner: Runner = run_simulation,
) -> dict[str, Any]:
    """Run every seed; return the summary (see docs/simulator.md for the fields).

    ``jobs`` defaults to the CPU count; with one job the seeds run in this process (no worker
    start-up cost, and ``runner`` need not be picklable).  ``stop_at_first_failure`` stops
    submitting seeds once one has failed (seeds already running still finish)."""
    started = time.perf_counter()
    configs = [
        SimulationConfig(seed=seed, steps=steps, faults=faults, workloads=workloads,
                         planted_bugs=planted_bugs, swarm=swarm)
        for seed in seeds
    ]
    tally = _Tally(total=len(configs), started=started, progress=progress)
    jobs = jobs or default_jobs()
    if jobs <= 1:
        for config in configs:
            tally.add(config, _run_one(runner, config))
            if stop_at_first_failure and tally.failing:
                break
    else:
        _sweep_in_processes(configs, jobs, runner, tally, stop_at_first_failure)
    if progress is not None:
        progress.write("\n")
        progress.flush()
    return tally.summary(configs[0] if configs else None, steps, time.perf_counter() - started,
                         stop_at_first_failure)


def _sweep_in_processes(configs, jobs: int, runner: Runner, tally: _Tally, stop_at_first_failure: bool) -> None:
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(_run_one, runner, config): config for config in configs}
        for future in concurrent.futures.as_completed(futures):
            if future.cancelled():
                continue
            tally.add(futures[future], future.result())
            if stop_at_first_failure and tally.failing:
                for pending in futures:
                    pending.cancel()
                break


class _Tally:
    """Folds seed outcomes into the sweep summary as they arrive, and draws the progress bar."""

    def __init__(self, *, total: int, started: float, progress: TextIO | None) -> None:
        self.total = total
        self.started = started
        self.progress = progress
        self.done = 0
        self.violations = 0
        self.failing: list[int] = []
        self.totals = dict.fromkeys(counter_names, 0)
        self.runtime_faults: dict[str, int] = {}
        self.event_counts: dict[str, int] = {}
        self.simulated_seconds = 0.0
        # signature -> {"seeds": [...], "occurrences": n, "example": the lowest seed's text}
        self.signatures: dict[str, dict[str, Any]] = {}
        self.first_violations: dict[int, list[str]] = {}

    def add(self, config: SimulationConfig, outcome: _SeedOutcome) -> None:
        summary = outcome.summary
        self.done += 1
        for name in counter_names:
            self.totals[name] += summary.get(name, 0)
        for point, count in summary.get("runtime_faults", {}).items():
            self.runtime_faults[point] = self.runtime_faults.get(point, 0) + count
        for event, count in summary.get("event_counts", {}).items():
            self.event_counts[event] = self.event_counts.get(event, 0) + count
        self.simulated_seconds += summary.get("simulated_seconds", 0.0)
        if summary.get("violations"):
            self.violations += summary["violations"]
            self.failing.append(config.seed)
            # The lowest failing seeds, whatever order the workers finish in.
            self.first_violations[config.seed] = outcome.first_texts
            if len(self.first_violations) > first_violations_seeds_max:
                del self.first_violations[max(self.first_violations)]
        for signature, (count, text) in outcome.signatures.items():
            entry = self.signatures.setdefault(signature, {"seeds": [], "occurrences": 0, "example": text})
            entry["occurrences"] += count
            entry["seeds"].append(config.seed)
            # Workers finish in any order; the lowest seed's text keeps the summary stable.
            if config.seed == min(entry["seeds"]):
                entry["example"] = text
        if self.progress is not None:
            elapsed = time.perf_counter() - self.started
            line = progress_line(self.done, self.total, self.violations, len(self.failing), elapsed)
            self.progress.write("\r" + line)
            self.progress.flush()

    def summary(self, first: SimulationConfig | None, steps: int, wall_seconds: float,
                stop_at_first_failure: bool) -> dict[str, Any]:
        known_kinds = set(runtime_event_kinds())
        seen = sorted(event for event, count in self.event_counts.items() if count)
        wall_minutes = wall_seconds / 60
        signatures = sorted(self.signatures.items(), key=lambda item: (min(item[1]["seeds"]), item[0]))
        return {
            "seeds": self.total,
            "seeds_run": self.done,
            "stopped_at_first_failure": stop_at_first_failure and bool(self.failing) and self.done < self.total,
            "steps": steps,
            "faults": sorted(first.faults) if first else [],
            "workloads": list(first.workloads) if first else [],
            "planted_bugs": sorted(first.planted_bugs) if first else [],
            "swarm": first.swarm if first else True,
            "violations": self.violations,
            "distinct_violations": len(self.signatures),
            "violation_signatures": [
                {"signature": signature, "seeds": sorted(entry["seeds"]), "occurrences": entry["occurrences"],
                 "example": entry["example"]}
                for signature, entry in signatures[:violation_signatures_max]
            ],
            "failing_seeds": sorted(self.failing),
            "failing_share": round(len(self.failing) / self.done, 4) if self.done else 0.0,
            **self.totals,
            "runtime_faults": dict(sorted(self.runtime_faults.items())),
            "event_counts": dict(sorted(self.event_counts.items())),
            "event_kinds_seen": seen,
            "event_kinds_never_seen": sorted(known_kinds - set(seen)),
            "simulated_seconds": round(self.simulated_seconds, 3),
            "wall_seconds": round(wall_seconds, 3),
            "simulated_seconds_per_wall_second": round(self.simulated_seconds / wall_seconds, 2) if wall_seconds else 0.0,
            "crash_restart_cycles_per_minute": round(self.totals["process_crashes"] / wall_minutes, 2) if wall_minutes else 0.0,
            "first_violations": {str(seed): self.first_violations[seed] for seed in sorted(self.first_violations)},
        }


def runtime_event_kinds() -> tuple[str, ...]:
    """Every trace event kind the runtime can emit (empty until the runtime declares them)."""
    import troupe.runtime

    return tuple(troupe.runtime.runtime_event_kinds)


def progress_line(done: int, total: int, violations: int, failing_seeds: int, elapsed_seconds: float) -> str:
    filled = progress_bar_width * done // total if total else progress_bar_width
    bar = "#" * filled + "." * (progress_bar_width - filled)
    return (f"[{bar}] {done}/{total} seeds, {violations} violations in {failing_seeds} seeds, "
            f"ETA {eta_text(done, total, elapsed_seconds)}")


def eta_text(done: int, total: int, elapsed_seconds: float) -> str:
    """Remaining time at the pace so far: ``?`` before the first seed, ``0s`` when done."""
    if done >= total:
        return "0s"
    if done == 0:
        return "?"
    remaining = round(elapsed_seconds / done * (total - done))
    hours, rest = divmod(remaining, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{seconds:02d}s"
    return f"{seconds}s"


# -- shrink --------------------------------------------------------------------------------


def shrink(
    config: SimulationConfig,
    *,
    runner: Runner = run_simulation,
    progress: TextIO | None = None,
    known_workloads: Callable[[], list[str]] | None = None,
) -> tuple[SimulationConfig, SimulationResult]:
    """The smallest configuration found that still fails (``config`` must fail)."""

    def fails(candidate: SimulationConfig) -> SimulationResult | None:
        result = runner(candidate)
        if progress is not None:
            progress.write(f"shrink: {simulation_command('run', candidate)} -> {len(result.violations)} violations\n")
            progress.flush()
        return result if result.violations else None

    best_result = fails(config)
    if best_result is None:
        raise ValueError(f"seed {config.seed} does not fail with this configuration: nothing to shrink")
    best = config
    best, best_result = _fewer_steps(best, best_result, fails)
    for fault in sorted(best.faults):
        best, best_result = _keep_if_fails(best, best_result, replace(best, faults=best.faults - {fault}), fails)
    # An empty workload tuple means "all of them"; dropping one needs the names spelled out.
    workloads = list(best.workloads) or _all_workloads(known_workloads)
    for workload in list(workloads):
        if len(workloads) == 1:
            break
        candidate = replace(best, workloads=tuple(name for name in workloads if name != workload))
        result = fails(candidate)
        if result is not None:
            best, best_result, workloads = candidate, result, list(candidate.workloads)
    if best.swarm:
        best, best_result = _keep_if_fails(best, best_result, replace(best, swarm=False), fails)
    return best, best_result


def _fewer_steps(best, best_result, fails):
    # Halve while it still fails, then bisect between the last pass and the last failure.
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
    return best, best_result


def _keep_if_fails(best, best_result, candidate, fails):
    result = fails(candidate)
    return (candidate, result) if result is not None else (best, best_result)


def _all_workloads(known_workloads: Callable[[], list[str]] | None) -> list[str]:
    if known_workloads is not None:
        return known_workloads()
    from ._workload import workload_names

    return workload_names()


# -- replay files --------------------------------------------------------------------------


def replay_document(config: SimulationConfig, result: SimulationResult, path: str | None = None) -> dict[str, Any]:
    """The replay file's content: every ``SimulationConfig`` field but ``trace_path``, the trace
    hash, the violations, and the commands that replay, explain and re-run it."""
    document = {
        "format": replay_format_version,
        "seed": config.seed,
        "steps": config.steps,
        "faults": sorted(config.faults),
        "workloads": list(config.workloads),
        "planted_bugs": sorted(config.planted_bugs),
        "swarm": config.swarm,
        "trace_sha256": result.trace_sha256,
        "violations": [str(violation) for violation in result.violations[:violations_kept_max]],
        "run_command": simulation_command("run", config),
    }
    if path is not None:
        document["command"] = replay_command(path)
        document["explain_command"] = explain_command(path)
    return document


def config_from_replay(document: dict[str, Any]) -> SimulationConfig:
    found = document.get("format")
    if found != replay_format_version:
        hint = f" (it was made by: {document['command']})" if "command" in document else ""
        raise ValueError(
            f"replay file format {found!r} is not supported: this troupe reads format {replay_format_version};"
            f" make the file again with `troupe sim shrink`{hint}"
        )
    return SimulationConfig(
        seed=int(document["seed"]),
        steps=int(document["steps"]),
        faults=frozenset(document["faults"]),
        workloads=tuple(document["workloads"]),
        planted_bugs=frozenset(document["planted_bugs"]),
        swarm=bool(document["swarm"]),
    )


def read_replay(path: str) -> SimulationConfig:
    with open(path, encoding="utf-8") as file:
        return config_from_replay(json.load(file))


def replay(
    path: str,
    *,
    trace_path: str | None = None,
    runner: Runner = run_simulation,
) -> tuple[dict[str, Any], SimulationResult]:
    """Run a replay file again; ``same_trace`` says whether it was byte-for-byte the same run.
    ``trace_path`` writes the trace (for ``explain`` and ``--html``)."""
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    config = replace(config_from_replay(document), trace_path=trace_path)
    result = runner(config)
    verdict = {
        "reproduced": bool(result.violations),
        "same_trace": result.trace_sha256 == document["trace_sha256"],
    }
    return verdict, result


def first_violation(result: SimulationResult) -> Violation | None:
    return as_violation(result.violations[0]) if result.violations else None
