"""The character workload's lease check: a released character's handles are not read after
the release answered.  A planted bug (queries admitted although the character is released)
must be caught; seed 16 (a reload whose client step a process crash ended was not recorded as
sent, so the claim it ended looked live) stays fixed."""

from __future__ import annotations

from troupe.actors.character import _character
from troupe.sim import SimulationConfig, run_simulation

quiet = frozenset()


def test_catches_a_leased_read_after_the_release_answered(monkeypatch):

    async def admits_released(self, message):
        # PLANTED BUG: a released character keeps its recall handle open and lends it.
        reply = await self._admit_query(message)
        if isinstance(reply, _character.RecallOpening):
            return await self._open_recall(reply, message)
        return reply

    monkeypatch.setattr(_character.CharacterActor, "_query_memory", admits_released)
    monkeypatch.setattr(_character.StoreMemory, "close_stores", lambda self, port: False)
    result = run_simulation(SimulationConfig(seed=1, steps=150, workloads=("character",), faults=quiet))
    texts = [violation.text for violation in result.violations]
    assert any("leased recall" in text and "after the release" in text for text in texts), texts


def test_seed_16_a_reload_cut_short_by_a_crash_still_counts_as_sent():
    result = run_simulation(SimulationConfig(seed=16, steps=400, workloads=("character",)))
    assert [str(violation) for violation in result.violations] == []
    assert result.event_counts["character_lease_read"] > 0
