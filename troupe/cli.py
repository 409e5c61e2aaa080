"""The ``troupe`` command: ``serve``, ``sim run|sweep|shrink|replay|workloads``.

Argument parsing only; each command lives in its own module.  ``troupe sim`` imports the
simulator lazily so that ``troupe serve`` never loads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


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
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = chosen - set(fault_names)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown fault(s) {sorted(unknown)}; choose from {list(fault_names)}")
    return chosen


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="troupe", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--data-dir", default=None, help="data directory (default ./troupe-data)")
    serve.add_argument("--config", default=None, help="troupe.toml to read")
    serve.add_argument("--listen", action="append", default=[], metavar="SURFACE=HOST:PORT",
                       help="where a surface listens (repeatable; port 0 picks a free port; off disables it)")
    serve.add_argument("--trace", default=None, metavar="FILE", help="write the runtime trace (CBOR) to FILE")

    sim = commands.add_parser("sim", help="the deterministic simulator")
    sim_commands = sim.add_subparsers(dest="sim_command", required=True)
    all_faults = "crash,io,disk_full,clock"

    def common(sub: argparse.ArgumentParser, *, seeds: bool) -> None:
        if seeds:
            sub.add_argument("--seeds", type=_seed_range, required=True, metavar="A..B")
        else:
            sub.add_argument("--seed", type=int, required=True)
        sub.add_argument("--steps", type=int, default=2000)
        sub.add_argument("--faults", type=_faults, default=_faults(all_faults), metavar=all_faults)
        sub.add_argument("--workload", action="append", default=[], help="workload name (repeatable; default all)")
        # Hidden: plants a known bug so tests can prove that sweeps catch it.
        sub.add_argument("--plant-bug", action="append", default=[], help=argparse.SUPPRESS)

    run = sim_commands.add_parser("run", help="run one seed")
    common(run, seeds=False)
    run.add_argument("--trace", default=None, metavar="FILE", help="write the trace (CBOR records) to FILE")

    sweep = sim_commands.add_parser("sweep", help="run many seeds")
    common(sweep, seeds=True)
    sweep.add_argument("--jobs", type=int, default=1)

    shrink = sim_commands.add_parser("shrink", help="reduce a failing seed to a minimal replay file")
    common(shrink, seeds=False)
    shrink.add_argument("--output", default=None, metavar="FILE", help="replay file (default sim-SEED.replay.json)")

    replay = sim_commands.add_parser("replay", help="run a replay file again")
    replay.add_argument("file")

    sim_commands.add_parser("workloads", help="list the registered workloads")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _build_parser().parse_args(argv)
    if arguments.command == "serve":
        from troupe.server import serve_main

        return serve_main(arguments) or 0
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
    )


def _replay_command(seed: int, arguments) -> str:
    faults = ",".join(sorted(arguments.faults)) or "none"
    return f"troupe sim run --seed {seed} --steps {arguments.steps} --faults {faults}"


def _sim(arguments) -> int:
    from troupe import sim

    if arguments.sim_command == "workloads":
        for name in sim.workload_names():
            print(name)
        return 0
    if arguments.sim_command == "run":
        result = sim.run_simulation(_config(arguments, arguments.seed))
        for violation in result.violations:
            print(f"violation: {violation}")
        if result.violations:
            print(f"seed {arguments.seed} failed; replay with: {_replay_command(arguments.seed, arguments)}")
        print(json.dumps(result.summary()), flush=True)
        return 1 if result.violations else 0
    if arguments.sim_command == "sweep":
        summary = sim.sweep(
            arguments.seeds,
            steps=arguments.steps,
            faults=arguments.faults,
            workloads=tuple(arguments.workload),
            planted_bugs=frozenset(arguments.plant_bug),
            jobs=arguments.jobs,
            progress=sys.stderr,
        )
        for seed in summary["failing_seeds"][:10]:
            print(f"failing seed {seed}; shrink with: troupe sim shrink --seed {seed} --steps {arguments.steps}"
                  f" --faults {','.join(sorted(arguments.faults)) or 'none'}")
        print(json.dumps(summary), flush=True)
        return 1 if summary["violations"] else 0
    if arguments.sim_command == "shrink":
        config, result = sim.shrink(_config(arguments, arguments.seed), progress=sys.stderr)
        path = arguments.output or f"sim-{config.seed}.replay.json"
        document = sim.replay_document(config, result)
        with open(path, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=2, ensure_ascii=False)
            file.write("\n")
        print(json.dumps({"replay_file": path, "seed": config.seed, "steps": config.steps,
                          "faults": sorted(config.faults), "violations": len(result.violations)}), flush=True)
        return 0
    if arguments.sim_command == "replay":
        verdict, result = sim.replay(arguments.file)
        for violation in result.violations:
            print(f"violation: {violation}")
        print(json.dumps({**result.summary(), **verdict}), flush=True)
        return 1 if result.violations else 0
    raise AssertionError(arguments.sim_command)


if __name__ == "__main__":
    sys.exit(main())
