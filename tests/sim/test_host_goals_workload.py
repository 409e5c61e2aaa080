"""The goals / notifications / events part of the host workload: clean under faults, part of
``--workload host``, and able to see the surface's own bugs (planted here by monkeypatching,
never in the surface code).  Plus the goals bug it found: a verdict merged a finished goal."""

from __future__ import annotations

import trio

from tests.actors.host.test_goals import ask, create, patch, start
from troupe.actors.host import GoalReply, GoalSettings, _goals_actor
from troupe.http.host import _events, _routes_events
from troupe.models import ChatMessage, Completion, CompletionRequest, LocalModel
from troupe.sim import SimulationConfig, run_simulation, workload_names
from troupe.sim._host_goals_workload import (
    HostGoalsWorkload,
    JudgingModel,
    verdict_distinct,
    verdict_duplicate,
)
from troupe.sim._host_workload import HostWorkload


def _run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("host_goals",), **options))


def _texts(result) -> list[str]:
    return [violation.text for violation in result.violations]


def test_registered_and_part_of_the_host_workload():
    assert "host_goals" in workload_names()
    host = HostWorkload()
    assert isinstance(host.goals, HostGoalsWorkload)
    # Separate token names, so ``--workload host --workload host_goals`` do not collide.
    assert not {token.name for token in host.goals.tokens} & {token.name for token in HostGoalsWorkload().tokens}


def test_clean_under_faults_and_exercises_goals_and_streams():
    result = _run(4, 200)
    assert _texts(result) == []
    counts = result.event_counts
    assert result.process_crashes > 0 and result.clock_jumps > 0
    assert counts["goal_reminder_published"] > 10 and counts["goal_judged"] > 0
    assert counts["host_events_reminder"] > 50 and counts["host_events_resync"] > 5
    assert counts["host_events_heartbeat"] > 10


def test_catches_a_stream_that_ignores_the_scope(monkeypatch):
    # PLANTED BUG: every goal reminder goes to every stream.
    monkeypatch.setattr(_routes_events, "_deliverable", lambda row, grant: row.kind == "goal_reminder")
    texts = _texts(_run(2, 200, faults=frozenset()))
    assert any("stream showed" in text and "outside its scope" in text for text in texts), texts


def test_catches_a_due_reminder_that_is_dropped(monkeypatch):
    original = _goals_actor.fire_reminder

    def dropping(connection, goal_id, kind, payload, now, armed):
        return None if kind == "due" else original(connection, goal_id, kind, payload, now, armed)  # PLANTED BUG

    monkeypatch.setattr(_goals_actor, "fire_reminder", dropping)
    texts = _texts(_run(2, 200, faults=frozenset()))
    assert any("without its due reminder" in text or "neither its due" in text for text in texts), texts


def test_catches_a_resume_after_restart_without_resync(monkeypatch):
    original = _events.EventsHub.start_of

    def forgetful(self, resume, token_id, bounds):
        start = original(self, resume, token_id, bounds)
        if start.resync_reason == _events.resync_cursor_unavailable:
            return _events.StreamStart(bounds[1] or 0, None)  # PLANTED BUG: resume at the newest, silently
        return start

    monkeypatch.setattr(_events.EventsHub, "start_of", forgetful)
    texts = _texts(_run(3, 200, faults=frozenset({"crash"}), swarm=False))
    assert any("not resync cursor_unavailable" in text for text in texts), texts


async def test_judging_model_answers_from_the_verdict_words():
    model = JudgingModel(LocalModel())

    def question(new: str) -> CompletionRequest:
        return CompletionRequest(messages=(ChatMessage("system", "你是目标去重判断器。"),
                                           ChatMessage("user", f"已有目标：甲\n新目标：{new}")),
                                 response_format="json")

    assert (await model.complete(question(f"甲 {verdict_duplicate}"))).text == '{"duplicate": true}'
    assert (await model.complete(question(f"甲 {verdict_distinct}"))).text == '{"duplicate": false}'
    assert (await model.complete(question("甲"))).text == "{}"
    other = CompletionRequest(messages=(ChatMessage("user", "你好"),))
    assert isinstance(await model.complete(other), Completion)


class _HeldVerdict:
    """A model that says "duplicate" only when the test lets it."""

    name = "held"

    def __init__(self) -> None:
        self.release = trio.Event()

    async def complete(self, request):
        await self.release.wait()
        return Completion('{"duplicate": true}')


async def test_a_verdict_never_changes_a_finished_goal(nursery, tmp_path):
    # Found by reading the code while writing the workload's finished-goal check: a goal held
    # for judgement and completed meanwhile was turned into ``merged`` by a later verdict.
    model = _HeldVerdict()
    system = await start(nursery, tmp_path, GoalSettings(), model)
    first = await ask(system, create("整理出行清单和护照"))
    held = await ask(system, create("整理出行清单和护照吧"))
    assert isinstance(first, GoalReply) and isinstance(held, GoalReply)
    assert held.document["dedup"]["result"] == "possible_duplicate"
    held_id = held.document["goal"]["id"]
    done = await ask(system, patch(held_id, status="completed"))
    assert isinstance(done, GoalReply) and done.document["status"] == "completed"
    model.release.set()
    with trio.fail_after(5):
        while True:
            row = await system.storage.read(lambda c: c.execute(
                "SELECT status, dedup_state FROM host_goals WHERE id = ?", (held_id,)).fetchone())
            if row[1] == "none":
                break
            await trio.sleep(0.02)
    assert row == ("completed", "none")
    canonical = await system.storage.read(lambda c: c.execute(
        "SELECT revision FROM host_goals WHERE id = ?", (first.document["goal"]["id"],)).fetchone())
    assert canonical == (1,)
