"""The sessions-api workload: clean under faults, deterministic, and able to see input bugs
(planted here by monkeypatching, never in the surface code)."""

from __future__ import annotations

from troupe.actors.sessions import _inputs
from troupe.sim import SimulationConfig, run_simulation, workload_names


def _run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("sessions-api",), **options))


def test_registered():
    assert "sessions-api" in workload_names()


def test_clean_under_faults_and_exercises_inputs():
    result = _run(1, 150)
    assert [str(violation) for violation in result.violations] == []
    assert result.process_crashes > 0
    assert result.event_counts["session_input_accepted"] > 10
    assert result.event_counts["session_input_consumed"] > 0
    assert result.event_counts["session_input_closed"] > 0
    assert result.event_counts["http_ok"] > 150


def test_same_seed_same_trace():
    assert _run(4, 60).trace_sha256 == _run(4, 60).trace_sha256


def test_an_input_taken_twice_is_seen(monkeypatch):
    original = _inputs.TurnInbox.take

    def take_without_forgetting(self, *, close_if_empty=False):
        taken = original(self, close_if_empty=close_if_empty)
        self.pending.extend(taken)  # planted: the same input is taken again at the next step
        return taken

    monkeypatch.setattr(_inputs.TurnInbox, "take", take_without_forgetting)
    result = _run(1, 150, swarm=False)
    assert any("consumed twice" in str(violation) for violation in result.violations)
