"""The character workload: registered, exercises the real memory-server app, and its checkers
see the surface's own bugs (planted here by monkeypatching, never in the surface code)."""

from __future__ import annotations

import cbor2

from troupe.actors.character import _store
from troupe.runtime import _limits
from troupe.sim import SimulationConfig, run_simulation, workload_names
from troupe.sim._character_workload import (
    _history_lines,
    _LimitedModel,
    _quarantined,
    poison_quarantine_seconds,
)

quiet = frozenset()
"""No faults: the planted-bug runs must fail because of the bug alone."""


def _character_run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("character",), **options))


def test_registered():
    assert "character" in workload_names()


def test_clean_without_faults_and_exercises_the_surface():
    result = _character_run(4, 120, faults=quiet)
    assert [str(violation) for violation in result.violations] == []
    counts = result.event_counts
    assert counts["http_ok"] > 100
    assert counts["character_task"] > 10 and counts["character_released"] > 0
    assert counts["character_limited_mode"] > 0 and counts["character_components_swapped"] > 0


def test_catches_lost_history(monkeypatch):
    original = _store.append_time_indexed

    def forgetful(connection, name, messages, at):
        # PLANTED BUG: the raw rows of every other write are not written.
        forgetful.calls += 1
        return original(connection, name, messages, at) if forgetful.calls % 2 else []

    forgetful.calls = 0
    monkeypatch.setattr(_store, "append_time_indexed", forgetful)
    result = _character_run(2, 80, faults=quiet)
    texts = [violation.text for violation in result.violations]
    assert any("are not in the raw rows" in text for text in texts), texts
    assert all(violation.checker == "character" for violation in result.violations)


def test_history_lines_count_only_recent_history():
    text = ("======小天的人设======\n- 主人：不是历史\n\n======近期对话======\n（更早的对话摘要：主人：a）\n"
            "主人：你好 #m1#\n小天：你好呀 #m2#\n系统：提示\n\n======时间======\n主人：不算")
    assert _history_lines(text, "小天") == 3


def test_limited_mode_model():
    limited = _LimitedModel(generation=1)
    assert limited.certainly_open(5, 6)
    limited.blocks.append((10, 0))  # sent, not yet answered
    assert not limited.certainly_open(11, 12) and not limited.certainly_blocked(11, 12)
    limited.blocks[-1] = (10, 12)
    assert limited.certainly_blocked(13, 14)
    limited.continues.append((15, 0))
    assert not limited.certainly_blocked(13, 16)  # a continue was sent meanwhile
    limited.continues[-1] = (15, 17)
    assert limited.certainly_open(18, 19) and not limited.certainly_open(16, 19)



def test_a_poison_refusal_excuses_a_500_only_during_the_quarantine():
    assert poison_quarantine_seconds == _limits.poison_quarantine_seconds

    def record(sequence, seconds, event, key="Neko", message="GetSettings"):
        return cbor2.dumps([sequence, round(seconds * 1_000_000), event, "character", key,
                            {"message": message}], canonical=True)

    records = [record(1, 10.0, "crash"), record(2, 11.0, "poison"), record(3, 12.0, "turn")]
    refused_at = 11.0 + poison_quarantine_seconds
    records.append(record(4, refused_at, "poison_refused"))
    moment = round(refused_at * 1_000_000)
    assert _quarantined(records, 3, moment, "character", "Neko", "GetSettings")
    assert not _quarantined(records, 3, moment + 1, "character", "Neko", "GetSettings")  # just over
    assert not _quarantined(records, 3, moment, "character", "小天", "GetSettings")  # another actor
    assert not _quarantined(records, 3, moment, "character", "Neko", "NewDialog")  # another message
