"""Sweep summary, progress, shrinking and the printed commands, driven by a stub runner so the
tests are fast and independent of what the simulator happens to find."""

import io
import json
import shlex

import pytest

from troupe import cli, sim
from troupe.sim import SimulationConfig, SimulationResult, fault_names
from troupe.sim._sweep import (
    config_from_replay,
    eta_text,
    progress_line,
    replay_document,
    replay_format_version,
    shrink,
    simulation_command,
    sweep,
)
from troupe.sim._violation import Violation


def stub_runner(config: SimulationConfig) -> SimulationResult:
    """Even seeds fail with a lost write (numbers vary by seed: one signature); seeds divisible
    by three also fail a second way; every seed 'sees' a couple of events."""
    violations = []
    if config.seed % 2 == 0:
        violations.append(Violation(f"acknowledged write lost: account a{config.seed} op {config.seed * 7}",
                                    sequences=(config.seed, config.seed + 1)))
    if config.seed % 3 == 0:
        violations.append(Violation("applied twice: key k3"))
    return SimulationResult(
        seed=config.seed, steps=config.steps, process_crashes=2, power_losses=1, process_lifetimes=3,
        actor_crashes=4, actor_restarts=4, faults_injected=5, io_errors=1, disk_full=0, clock_jumps=2,
        runtime_faults={"turn_raises": 1}, event_counts={"activate": 3, "crash": 1, "sim_crash": 2},
        violations=violations, trace_sha256=f"hash{config.seed}", simulated_seconds=30.0, wall_seconds=0.01,
    )


def test_summary_counts_each_distinct_violation_once_with_its_seeds():
    summary = sweep(range(1, 7), steps=100, jobs=1, runner=stub_runner)
    assert summary["seeds"] == summary["seeds_run"] == 6
    assert summary["failing_seeds"] == [2, 3, 4, 6]
    assert summary["failing_share"] == round(4 / 6, 4)
    assert summary["violations"] == 5  # seeds 2, 4, 6 once; 3 and 6 the second way
    assert summary["distinct_violations"] == 2
    by_signature = {entry["signature"]: entry for entry in summary["violation_signatures"]}
    assert by_signature["acknowledged write lost"]["seeds"] == [2, 4, 6]
    assert by_signature["applied twice"]["seeds"] == [3, 6]
    assert "(trace #2, #3)" in by_signature["acknowledged write lost"]["example"]
    assert summary["process_crashes"] == 12 and summary["power_losses"] == 6 and summary["actor_restarts"] == 24
    assert summary["runtime_faults"] == {"turn_raises": 6}
    assert summary["event_counts"]["activate"] == 18
    assert summary["event_kinds_seen"] == ["activate", "crash", "sim_crash"]
    import troupe.runtime

    expected_never = sorted(set(getattr(troupe.runtime, "runtime_event_kinds", ())) - {"activate", "crash", "sim_crash"})
    assert summary["event_kinds_never_seen"] == expected_never
    assert summary["simulated_seconds"] == 180.0
    assert summary["simulated_seconds_per_wall_second"] > 0
    assert summary["crash_restart_cycles_per_minute"] > 0
    assert summary["planted_bugs"] == [] and summary["swarm"] is True
    json.dumps(summary)


def test_stop_at_first_failure_stops_early():
    summary = sweep(range(1, 51), steps=100, jobs=1, runner=stub_runner, stop_at_first_failure=True)
    assert summary["seeds"] == 50 and summary["seeds_run"] == 2
    assert summary["failing_seeds"] == [2] and summary["stopped_at_first_failure"] is True


def test_progress_bar_shows_counts_and_an_eta():
    stream = io.StringIO()
    sweep(range(1, 5), steps=100, jobs=1, runner=stub_runner, progress=stream)
    lines = [line for line in stream.getvalue().split("\r") if line]
    assert "1/4 seeds" in lines[0] and "ETA" in lines[0]
    assert "4/4 seeds, 3 violations in 3 seeds, ETA 0s" in lines[-1]
    assert eta_text(0, 10, 0.0) == "?"
    assert eta_text(5, 10, 50.0) == "50s"
    assert eta_text(1, 10, 20.0) == "3m00s"
    assert eta_text(1, 1000, 20.0) == "5h33m"
    assert progress_line(2, 4, 1, 1, 10.0).startswith("[" + "#" * 15 + "." * 15 + "] 2/4 seeds")


def test_shrink_drops_steps_faults_workloads_and_swarm_but_keeps_planted_bugs():
    calls = []

    def runner(config):
        calls.append(config)
        # Fails only with the clock fault, the "cache" workload and at least 37 steps.
        fails = "clock" in config.faults and "cache" in (config.workloads or ("bank", "cache")) and config.steps >= 37
        return SimulationResult(seed=config.seed, steps=config.steps,
                                violations=[Violation("lost")] if fails else [], trace_sha256="h")

    start = SimulationConfig(seed=9, steps=1000, planted_bugs=frozenset({"ack_before_commit"}))
    best, result = shrink(start, runner=runner, known_workloads=lambda: ["bank", "cache"])
    assert best.steps == 37 and best.faults == frozenset({"clock"})
    assert best.workloads == ("cache",) and best.swarm is False
    assert best.planted_bugs == frozenset({"ack_before_commit"}) and result.violations
    assert all(call.planted_bugs == start.planted_bugs for call in calls)


def test_clean_configuration_cannot_be_shrunk():
    with pytest.raises(ValueError, match="nothing to shrink"):
        shrink(SimulationConfig(seed=1, steps=10), runner=lambda config: SimulationResult(seed=1, steps=10))


configs = [
    SimulationConfig(seed=5, steps=300),
    SimulationConfig(seed=6, steps=40, faults=frozenset(), workloads=("bank",), swarm=False),
    SimulationConfig(seed=7, steps=1000, faults=frozenset({"crash", "power_loss"}), workloads=("bank", "bank"),
                     planted_bugs=frozenset({"ack_before_commit"})),
]


@pytest.mark.parametrize("config", configs)
@pytest.mark.parametrize("verb", ["run", "shrink"])
def test_printed_commands_parse_back_to_the_same_configuration(config, verb):
    words = shlex.split(simulation_command(verb, config))
    assert words[:3] == ["troupe", "sim", verb]
    arguments = cli._build_parser().parse_args(words[1:])
    assert cli._config(arguments, arguments.seed) == config


def test_replay_document_round_trips_and_old_formats_are_refused():
    config = configs[2]
    result = stub_runner(config)
    document = json.loads(json.dumps(replay_document(config, result, "x y.json")))
    assert document["format"] == replay_format_version
    assert config_from_replay(document) == config
    assert document["command"] == "troupe sim replay 'x y.json'"
    assert document["explain_command"] == "troupe sim explain 'x y.json'"
    assert document["violations"] == [str(violation) for violation in result.violations]
    with pytest.raises(ValueError, match="format 1 is not supported.*troupe sim shrink"):
        config_from_replay({**document, "format": 1})


@pytest.fixture
def stub_simulator(monkeypatch):
    """The CLI calls ``troupe.sim.run_simulation``; record every configuration it runs."""
    seen = []

    def runner(config):
        seen.append(config)
        return stub_runner(config)

    monkeypatch.setattr(sim, "run_simulation", runner)
    return seen


def run_cli(capsys, *words):
    status = cli.main(list(words))
    return status, capsys.readouterr()


def command_from(line):
    return shlex.split(line.split(": ", 1)[1])


def test_commands_printed_by_sweep_shrink_and_run_work_as_printed(tmp_path, capsys, stub_simulator, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, printed = run_cli(capsys, "sim", "sweep", "--seeds", "1..3", "--steps", "64", "--jobs", "1",
                              "--faults", "crash,clock", "--workload", "bank", "--plant-bug", "ack_before_commit",
                              "--no-swarm")
    assert status == 1
    summary = json.loads(printed.out.splitlines()[-1])
    assert summary["failing_seeds"] == [2, 3] and summary["distinct_violations"] == 2
    shrink_line = next(line for line in printed.out.splitlines() if line.startswith("failing seed 2"))
    shrink_words = command_from(shrink_line)
    wanted = SimulationConfig(seed=2, steps=64, faults=frozenset({"crash", "clock"}), workloads=("bank",),
                              planted_bugs=frozenset({"ack_before_commit"}), swarm=False)

    stub_simulator.clear()
    status, printed = run_cli(capsys, *shrink_words[1:])
    assert status == 0 and stub_simulator[0] == wanted
    shrunk = json.loads(printed.out.splitlines()[-1])
    assert shrunk["replay_file"] == "sim-2.replay.json" and shrunk["planted_bugs"] == ["ack_before_commit"]

    stub_simulator.clear()
    status, printed = run_cli(capsys, *shlex.split(shrunk["command"])[1:])
    assert status == 1
    verdict = json.loads(printed.out.splitlines()[-1])
    assert verdict["reproduced"] and verdict["same_trace"]
    replayed = stub_simulator[0]
    assert replayed.planted_bugs == wanted.planted_bugs and replayed.workloads == ("bank",)

    document = json.loads((tmp_path / "sim-2.replay.json").read_text())
    stub_simulator.clear()
    status, printed = run_cli(capsys, *shlex.split(document["run_command"])[1:])
    assert status == 1 and stub_simulator[0].seed == 2
    again = [line for line in printed.out.splitlines() if line.startswith(("seed 2 failed", "shrink it with"))]
    assert len(again) == 2
    for line in again:
        words = command_from(line)
        arguments = cli._build_parser().parse_args(words[1:])
        assert cli._config(arguments, arguments.seed) == replace_trace(stub_simulator[0])


def replace_trace(config):
    from dataclasses import replace

    return replace(config, trace_path=None)


def test_replay_of_an_old_format_says_why(tmp_path, capsys, stub_simulator):
    old = tmp_path / "old.replay.json"
    old.write_text(json.dumps({"format": 1, "seed": 1, "steps": 10, "faults": [], "workloads": [],
                               "planted_bugs": [], "trace_sha256": "x"}))
    status, printed = run_cli(capsys, "sim", "replay", str(old))
    assert status == 2 and "format 1 is not supported" in printed.err and stub_simulator == []


def test_help_lists_planted_bugs_and_new_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sim", "sweep", "--help"])
    text = capsys.readouterr().out
    for flag in ("--plant-bug", "ack_before_commit", "--no-swarm", "--stop-at-first-failure", "--jobs"):
        assert flag in text
    for name in fault_names:
        assert name in text
    with pytest.raises(SystemExit):
        cli.main(["sim", "run", "--seed", "1", "--plant-bug", "no_such_bug"])
    assert "invalid choice" in capsys.readouterr().err


def test_serve_parsing_does_not_load_the_simulator():
    import subprocess
    import sys

    code = ("import sys; from troupe import cli; cli._build_parser(simulator=False).parse_args(['serve']);"
            "print(any(name.startswith('troupe.sim') for name in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert completed.stdout.strip() == "False", completed.stderr


def test_worker_processes_give_the_same_summary():
    """jobs > 1 runs seeds in spawned workers (the stub is importable there by name)."""
    inline = sweep(range(1, 7), steps=100, jobs=1, runner=stub_runner)
    pooled = sweep(range(1, 7), steps=100, jobs=2, runner=stub_runner)
    for field in ("failing_seeds", "violations", "distinct_violations", "violation_signatures", "process_crashes",
                  "event_counts", "event_kinds_never_seen", "first_violations"):
        assert pooled[field] == inline[field], field
