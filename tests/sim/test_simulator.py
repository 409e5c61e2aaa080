"""The simulator end to end, through the real CLI in separate processes."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from troupe.sim import SimulationConfig, fault_names, run_simulation, workload_names


def troupe(*arguments, environment=None, cwd=None):
    completed = subprocess.run(
        [sys.executable, "-m", "troupe", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(environment or {})},
        cwd=cwd,
    )
    return completed


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def test_same_seed_same_trace_in_two_processes():
    first = troupe("sim", "run", "--seed", "11", "--steps", "400", environment={"PYTHONHASHSEED": "1"})
    second = troupe("sim", "run", "--seed", "11", "--steps", "400", environment={"PYTHONHASHSEED": "2"})
    assert first.returncode == 0, first.stdout + first.stderr
    one, two = last_json(first.stdout), last_json(second.stdout)
    assert one["trace_sha256"] == two["trace_sha256"]
    for field in ("seed", "steps", "process_crashes", "power_losses", "process_lifetimes", "actor_crashes",
                  "actor_restarts", "faults_injected", "runtime_faults", "event_counts", "violations",
                  "distinct_violations", "trace_sha256", "simulated_seconds", "wall_seconds"):
        assert field in one
    other = troupe("sim", "run", "--seed", "12", "--steps", "400")
    assert last_json(other.stdout)["trace_sha256"] != one["trace_sha256"]


def test_faults_are_really_injected():
    # Without swarm every kind is armed at its default rate.
    result = run_simulation(SimulationConfig(seed=7, steps=1500, swarm=False))
    assert result.process_crashes > 0 and result.io_errors + result.disk_full > 0
    assert result.power_losses > 0 and sum(result.runtime_faults.values()) > 0
    assert result.process_lifetimes == result.process_crashes + 1 + result.event_counts.get("sim_clean_restart", 0)
    assert result.faults_injected >= result.process_crashes + result.io_errors + sum(result.runtime_faults.values())
    assert result.violations == []


def test_swarm_gives_seeds_different_fault_mixes():
    armed = {tuple(run_simulation(SimulationConfig(seed=seed, steps=50)).faults_armed) for seed in range(1, 9)}
    assert len(armed) >= 4


def test_no_faults_means_none_injected():
    result = run_simulation(SimulationConfig(seed=7, steps=300, faults=frozenset()))
    assert result.faults_injected == 0 and result.violations == []


def test_trace_file_matches_the_hash(tmp_path):
    import hashlib

    path = tmp_path / "run.trace"
    result = run_simulation(SimulationConfig(seed=3, steps=200, trace_path=str(path)))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == result.trace_sha256


def printed_command(line):
    """The words of a command the CLI printed after ``...: ``, without the leading ``troupe``."""
    words = shlex.split(line.split(": ", 1)[1])
    assert words[0] == "troupe"
    return words[1:]


def test_planted_ack_before_commit_is_caught_shrunk_replayed_and_explained(tmp_path):
    sweep = troupe("sim", "sweep", "--seeds", "1..4", "--steps", "600", "--jobs", "2", "--workload", "bank",
                   "--plant-bug", "ack_before_commit", "--stop-at-first-failure")
    assert sweep.returncode == 1, sweep.stdout + sweep.stderr
    summary = last_json(sweep.stdout)
    assert summary["violations"] > 0 and summary["failing_seeds"] and summary["distinct_violations"] >= 1
    assert "ETA" in sweep.stderr
    seed = summary["failing_seeds"][0]
    # Shrink, replay and explain exactly as printed.
    shrink_line = next(line for line in sweep.stdout.splitlines() if line.startswith(f"failing seed {seed};"))
    replay_file = tmp_path / "failing.replay.json"
    shrink = troupe(*printed_command(shrink_line), "--output", str(replay_file))
    assert shrink.returncode == 0, shrink.stderr
    shrunk = last_json(shrink.stdout)
    assert shrunk["steps"] < 600 and shrunk["violations"] > 0
    document = json.loads(replay_file.read_text())
    assert document["planted_bugs"] == ["ack_before_commit"] and document["workloads"] == ["bank"]
    # The shrinker may legitimately drop every fault; whatever it kept must be a subset.
    assert set(document["faults"]) <= set(fault_names)
    replay = troupe(*printed_command("replay: " + shrunk["command"]))
    assert replay.returncode == 1
    verdict = last_json(replay.stdout)
    assert verdict["reproduced"] and verdict["same_trace"]
    assert "acknowledged" in replay.stdout or "dedupe" in replay.stdout
    html_file = tmp_path / "story.html"
    explain = troupe(*printed_command("explain: " + shrunk["explain_command"]), "--html", str(html_file))
    assert explain.returncode == 0, explain.stdout + explain.stderr
    assert explain.stdout.startswith("Violation") and "per actor:" in explain.stdout
    told = last_json(explain.stdout)
    assert told["reproduced"] and told["same_trace"] and told["trace_records"] > 0
    assert "<svg" in html_file.read_text()


def test_clean_seed_cannot_be_shrunk():
    from troupe.sim import shrink

    with pytest.raises(ValueError):
        shrink(SimulationConfig(seed=5, steps=100))


def test_workloads_are_listed_and_selected():
    listed = troupe("sim", "workloads")
    assert listed.stdout.split() == workload_names() and "bank" in workload_names()
    unknown = troupe("sim", "run", "--seed", "1", "--steps", "10", "--workload", "nope")
    assert unknown.returncode != 0 and "unknown workload" in unknown.stderr
