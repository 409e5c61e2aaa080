"""The ``troupe`` command: ``serve``, ``sim run|sweep|shrink|replay|explain|workloads``.

Argument parsing only; each command lives in its own module.  The simulator is imported only
when the command is ``troupe sim`` (its options list the simulator's fault kinds and planted
bugs, which live there), so that ``troupe serve`` never loads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace


def _seed_range(text: str) -> range:
    """``A..B`` (inclusive) or a single seed."""
    if ".." in text:
        first, last = text.split("..", 1)
        start, stop = int(first), int(last)
        if stop < start:
            raise argparse.ArgumentTypeError("the range A..B needs A <= B")
        return range(start, stop + 1)
    return range(int(text), int(text) + 1)


def _faults(text: str) -> frozenset[str]:
    from troupe.sim import fault_names

    if text in ("", "none"):
        return frozenset()
    if text == "all":
        return frozenset(fault_names)
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = chosen - set(fault_names)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault(s) {sorted(unknown)}; choose from {list(fault_names)}")
    return chosen


def planted_bug_names() -> list[str]:
    """Every ``--plant-bug`` choice: the runtime's, storage's and the workloads' own."""
    from troupe import sim

    return list(sim.planted_bug_names())


def _build_parser(*, simulator: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="troupe", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    from troupe.auth import add_token_commands
    from troupe.http.host import add_persona_commands

    add_token_commands(commands)
    add_persona_commands(commands)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--data-dir", default=None, help="data directory (default ./troupe-data)")
    serve.add_argument("--config", default=None, help="troupe.toml to read")
    serve.add_argument("--listen", action="append", default=[], metavar="SURFACE=HOST:PORT",
                       help="where a surface listens (repeatable; port 0 picks a free port; off disables it)")
    serve.add_argument("--trace", default=None, metavar="FILE", help="write the runtime trace (CBOR) to FILE")

    sim = commands.add_parser("sim", help="the deterministic simulator")
    if simulator:
        _add_simulator_commands(sim)
    return parser


def _add_simulator_commands(sim: argparse.ArgumentParser) -> None:
    from troupe.sim import fault_names

    sim_commands = sim.add_subparsers(dest="sim_command", required=True)
    bugs = planted_bug_names()

    def common(sub: argparse.ArgumentParser, *, seeds: bool) -> None:
        if seeds:
            sub.add_argument("--seeds", type=_seed_range, required=True, metavar="A..B")
        else:
            sub.add_argument("--seed", type=int, required=True)
        sub.add_argument("--steps", type=int, default=2000)
        sub.add_argument("--faults", type=_faults, default="all", metavar="KIND,...",
                         help=f"kinds of fault allowed, comma-separated, or none (default all: {','.join(fault_names)})")
        sub.add_argument("--workload", action="append", default=[], help="workload name (repeatable; default all)")
        sub.add_argument("--plant-bug", action="append", default=[], choices=bugs, metavar="BUG",
                         help="switch on a deliberately planted bug, to prove the simulator catches it"
                              f" (repeatable; one of: {', '.join(bugs)})")
        sub.add_argument("--no-swarm", dest="swarm", action="store_false",
                         help="arm every allowed fault kind at its default rate instead of a per-seed mix")

    def html_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--html", default=None, metavar="FILE",
                         help="write an HTML timeline of the trace (one lane per actor) to FILE")

    run = sim_commands.add_parser("run", help="run one seed")
    common(run, seeds=False)
    run.add_argument("--trace", default=None, metavar="FILE", help="write the trace (CBOR records) to FILE")
    html_option(run)

    sweep = sim_commands.add_parser("sweep", help="run many seeds")
    common(sweep, seeds=True)
    sweep.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPU count)")
    sweep.add_argument("--stop-at-first-failure", action="store_true",
                       help="stop starting seeds once one has failed")

    shrink = sim_commands.add_parser("shrink", help="reduce a failing seed to a minimal replay file")
    common(shrink, seeds=False)
    shrink.add_argument("--output", default=None, metavar="FILE", help="replay file (default sim-SEED.replay.json)")

    replay = sim_commands.add_parser("replay", help="run a replay file again")
    replay.add_argument("file")
    html_option(replay)

    explain = sim_commands.add_parser("explain", help="replay a file and tell the story of its first violation")
    explain.add_argument("file", metavar="REPLAY_FILE")
    html_option(explain)

    sim_commands.add_parser("workloads", help="list the registered workloads")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fixture"]:  # the tansr SDK harness fixture: its own argument rules
        from troupe._fixture_tansr import fixture_main

        return fixture_main(argv[1:])
    arguments = _build_parser(simulator=argv[:1] == ["sim"]).parse_args(argv)
    if arguments.command == "serve":
        from troupe.server import serve_main

        return serve_main(arguments) or 0
    if arguments.command == "token":
        from troupe.auth import run_token_command

        return run_token_command(arguments)
    if arguments.command == "persona":
        from troupe.http.host import run_persona_command

        return run_persona_command(arguments)
    return _sim(arguments)


def _config(arguments, seed: int):
    from troupe.sim import SimulationConfig

    return SimulationConfig(
        seed=seed,
        steps=arguments.steps,
        faults=arguments.faults,
        workloads=tuple(arguments.workload),
        planted_bugs=frozenset(arguments.plant_bug),
        trace_path=getattr(arguments, "trace", None),
        swarm=arguments.swarm,
    )


def _sim(arguments) -> int:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "workloads": _workloads, "run": _run, "sweep": _sweep, "shrink": _shrink,
        "replay": _replay, "explain": _explain,
    }
    try:
        return handlers[arguments.sim_command](arguments)
    except KeyError as exc:
        # make_workloads names an unknown --workload this way; anything else is our bug.
        if "unknown workload" not in str(exc):
            raise
        print(f"troupe sim {arguments.sim_command}: {exc.args[0]}", file=sys.stderr)
        return 2


def _workloads(arguments) -> int:
    from troupe import sim

    for name in sim.workload_names():
        print(name)
    return 0


def _run(arguments) -> int:
    from troupe import sim
    from troupe.sim._sweep import simulation_command

    config = _config(arguments, arguments.seed)
    result, records = _with_trace(config.trace_path, arguments.html,
                                  lambda path: sim.run_simulation(replace(config, trace_path=path)))
    for violation in result.violations:
        print(f"violation: {violation}")
    if records is not None:
        _write_html(records, arguments.html, result.violations)
    if result.violations:
        print(f"seed {config.seed} failed; run it again with: {simulation_command('run', config)}")
        print(f"shrink it with: {simulation_command('shrink', config)}")
    print(json.dumps(result.summary()), flush=True)
    return 1 if result.violations else 0


def _sweep(arguments) -> int:
    from troupe import sim
    from troupe.sim._sweep import simulation_command

    summary = sim.sweep(
        arguments.seeds,
        steps=arguments.steps,
        faults=arguments.faults,
        workloads=tuple(arguments.workload),
        planted_bugs=frozenset(arguments.plant_bug),
        swarm=arguments.swarm,
        jobs=arguments.jobs,
        progress=sys.stderr,
        stop_at_first_failure=arguments.stop_at_first_failure,
        runner=sim.run_simulation,
    )
    for seed in summary["failing_seeds"][:10]:
        print(f"failing seed {seed}; shrink with: {simulation_command('shrink', _config(arguments, seed))}")
    print(json.dumps(summary), flush=True)
    return 1 if summary["violations"] else 0


def _shrink(arguments) -> int:
    from troupe import sim
    from troupe.sim._sweep import replay_document

    config, result = sim.shrink(_config(arguments, arguments.seed), progress=sys.stderr, runner=sim.run_simulation)
    path = arguments.output or f"sim-{config.seed}.replay.json"
    document = replay_document(config, result, path)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(document, file, indent=2, ensure_ascii=False)
        file.write("\n")
    print(json.dumps({"replay_file": path, "seed": config.seed, "steps": config.steps,
                      "faults": sorted(config.faults), "workloads": list(config.workloads),
                      "planted_bugs": sorted(config.planted_bugs), "swarm": config.swarm,
                      "violations": len(result.violations), "command": document["command"],
                      "explain_command": document["explain_command"]}), flush=True)
    return 0


def _replay(arguments) -> int:
    from troupe import sim

    try:
        (verdict, result), records = _with_trace(
            None, arguments.html, lambda path: sim.replay(arguments.file, trace_path=path, runner=sim.run_simulation))
    except ValueError as exc:
        print(f"troupe sim replay: {exc}", file=sys.stderr)
        return 2
    for violation in result.violations:
        print(f"violation: {violation}")
    if records is not None:
        _write_html(records, arguments.html, result.violations)
    print(json.dumps({**result.summary(), **verdict}), flush=True)
    return 1 if result.violations else 0


def _explain(arguments) -> int:
    """Exit status 0 when it told a story, 1 when the replay no longer fails."""
    from troupe import sim
    from troupe.sim._explain import explain
    from troupe.sim._sweep import first_violation

    try:
        (verdict, result), records = _with_trace(
            None, "always", lambda path: sim.replay(arguments.file, trace_path=path, runner=sim.run_simulation))
    except ValueError as exc:
        print(f"troupe sim explain: {exc}", file=sys.stderr)
        return 2
    violation = first_violation(result)
    if violation is None:
        print("the replay no longer fails: there is no violation to explain")
    else:
        print(explain(records, violation))
        if arguments.html:
            _write_html(records, arguments.html, [violation])
    print(json.dumps({**verdict, "violations": len(result.violations), "trace_records": len(records)}), flush=True)
    return 0 if violation is not None else 1


def _with_trace(trace_path: str | None, wanted: str | None, run):
    """Run ``run(trace_path)``; when ``wanted``, also return the trace's records, read from
    ``trace_path`` or from a scratch file when the user asked for no trace file."""
    from troupe.runtime import read_trace

    if not wanted:
        return run(trace_path), None
    if trace_path is not None:
        outcome = run(trace_path)
        with open(trace_path, "rb") as file:
            return outcome, read_trace(file.read())
    with tempfile.TemporaryDirectory(prefix="troupe-trace-") as scratch:
        path = os.path.join(scratch, "run.trace")
        outcome = run(path)
        with open(path, "rb") as file:
            return outcome, read_trace(file.read())


def _write_html(records, path: str, violations) -> None:
    from troupe.sim._timeline import write_timeline_html

    write_timeline_html(records, path, violations)
    print(f"timeline: {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
