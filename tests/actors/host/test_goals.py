"""The goals actor on a real engine with a movable clock: dedup (merge, possible duplicate,
background verdict, fallback), near/due reminders published once each with increasing ids,
cancellation, the character's time zone, receipts, and publication across a restart."""

from __future__ import annotations

import datetime
import json

import pytest
import trio

from troupe.actors.host import (
    CreateGoal,
    Deadline,
    GoalRefused,
    GoalReply,
    GoalSettings,
    PatchGoal,
    character_time_zone,
    goals_actor_kind,
    goals_key,
    goals_kind_name,
    host_migrations,
    injected_goals,
    reminder_minutes_max,
    set_character_time_zone,
)
from troupe.auth import TokenScope, auth_migrations
from troupe.models import Completion
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

all_scope = TokenScope.all()
restricted = TokenScope.of_prefix("astrbot:")


class Clock:
    """The real monotonic clock; a wall clock that only ``advance`` moves."""

    def __init__(self, real, wall: float) -> None:
        self.real, self.now = real, wall

    def monotonic(self) -> float:
        return self.real.monotonic()

    def wall(self) -> float:
        return self.now

    def wall_datetime(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now, tz=datetime.UTC)

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScriptedModel:
    """Answers dedup judgements with ``verdicts`` in turn (an exception is raised)."""

    name = "scripted"

    def __init__(self, *verdicts) -> None:
        self.verdicts = list(verdicts)
        self.calls = 0

    async def complete(self, request):
        self.calls += 1
        verdict = self.verdicts.pop(0) if self.verdicts else "cannot"
        if isinstance(verdict, Exception):
            raise verdict
        text = json.dumps({"duplicate": verdict}) if isinstance(verdict, bool) else "{}"
        return Completion(text)

    def stream(self, request):  # pragma: no cover - not used by goals
        raise NotImplementedError


start_wall = datetime.datetime(2026, 10, 11, 2, 0, tzinfo=datetime.UTC).timestamp()


async def start(nursery, tmp_path, settings=None, model=None):
    env = real_env(str(tmp_path))
    env.clock = Clock(env.clock, start_wall)
    env.model = model
    engine = await Engine.open(env, nursery=nursery, migrations=[*auth_migrations, *host_migrations])
    system = ActorSystem(env, [goals_actor_kind(settings or GoalSettings())], storage=engine)
    await nursery.start(system.run)
    return system


def create(content="整理出行清单", *, entry_id="astrbot:a", scope=all_scope, deadline=None, minutes=None,
           host_key=None, kind="normal", source="bot", people=()) -> CreateGoal:
    return CreateGoal(content=content, kind=kind, people=tuple(people), entry_id=entry_id, deadline=deadline,
                      reminder_minutes=minutes, host_key=host_key, source=source,
                      all_scope=scope.kind == "all", allows=scope.allows)


def patch(goal_id, scope=all_scope, *, status=None, deadline_given=False, deadline=None, minutes=None,
          expected=None) -> PatchGoal:
    return PatchGoal(goal_id=goal_id, status=status, deadline_given=deadline_given, deadline=deadline,
                     reminder_minutes=minutes, expected_revision=expected, source="bot",
                     all_scope=scope.kind == "all", allows=scope.allows)


async def ask(system, message):
    return await system.ref(goals_kind_name, goals_key).ask(message, timeout=10)


async def notifications(system):
    return await system.storage.read(lambda c: list(c.execute(
        "SELECT id, goal_id, kind, reminder_kind, status FROM host_notifications ORDER BY id")))


async def wait_for(predicate, seconds=5.0):
    with trio.fail_after(seconds):
        while not await predicate():
            await trio.sleep(0.02)


def at(hours: float) -> Deadline:
    return Deadline(seconds=start_wall + hours * 3600)


async def test_near_and_due_are_published_once_each_with_increasing_ids(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    reply = await ask(system, create(deadline=at(2), minutes=30))
    assert isinstance(reply, GoalReply) and reply.created
    goal_id = reply.document["goal"]["id"]
    assert reply.document["dedup"]["result"] == "created"
    system.env.clock.advance(1.5 * 3600 + 1)
    await wait_for(lambda: _count(system, 1))
    system.env.clock.advance(0.5 * 3600)
    await wait_for(lambda: _count(system, 2))
    await trio.sleep(1.2)  # nothing fires twice
    rows = await notifications(system)
    assert rows == [(1, goal_id, "goal_reminder", "near", "pending"), (2, goal_id, "goal_reminder", "due", "pending")]


async def _count(system, wanted: int) -> bool:
    return len(await notifications(system)) == wanted


async def test_completing_cancels_reminders_and_pending_notifications(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    goal_id = (await ask(system, create(deadline=at(2), minutes=60))).document["goal"]["id"]
    system.env.clock.advance(3600 + 1)
    await wait_for(lambda: _count(system, 1))
    done = await ask(system, patch(goal_id, status="completed"))
    assert done.document["status"] == "completed" and done.document["revision"] == 2
    system.env.clock.advance(3600)
    await trio.sleep(1.2)
    rows = await notifications(system)
    assert [(row[3], row[4]) for row in rows] == [("near", "cancelled")]
    left = await system.storage.read(lambda c: list(c.execute("SELECT name FROM reminders WHERE kind = ?", (goal_kind(),))))
    assert left == []


def goal_kind() -> str:
    return goals_kind_name


async def test_questions_get_no_deadline_reminders(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    await ask(system, create("周末要不要去爬山？", kind="question", deadline=at(-1)))
    await trio.sleep(0.2)
    assert await notifications(system) == []


async def test_a_deadline_already_passed_gives_exactly_one_immediate_due_reminder(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    await ask(system, create(deadline=at(-1), minutes=30))
    rows = await notifications(system)
    assert [(row[3], row[4]) for row in rows] == [("due", "pending")]


async def test_a_date_deadline_is_the_end_of_that_day_in_the_character_time_zone(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    await system.storage.write(lambda c: set_character_time_zone(c, "Asia/Shanghai"))
    reply = await ask(system, create(deadline=Deadline(date="2026-10-11")))
    assert reply.document["goal"]["deadline_at"] == "2026-10-11T23:59:59+08:00"
    assert reply.document["goal"]["created_at"] == "2026-10-11T10:00:00+08:00"
    zone = await system.storage.read(character_time_zone)
    assert str(zone) == "Asia/Shanghai"
    with pytest.raises(ValueError):
        await system.storage.write(lambda c: set_character_time_zone(c, "Mars/Olympus"))


async def test_exact_duplicates_merge_and_restricted_tokens_never_touch_global_goals(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    first = await ask(system, create("整理出行清单", entry_id=None, people=["小林"]))
    merged = await ask(system, create("整理 出行清单！", entry_id=None, people=["小美"]))
    assert merged.document["dedup"]["result"] == "merged"
    assert merged.document["goal"]["id"] == first.document["goal"]["id"]
    assert merged.document["goal"]["people"] == ["小林", "小美"] and merged.document["goal"]["revision"] == 2
    assert merged.document["submitted_id"] != first.document["goal"]["id"]
    before = await system.storage.read(lambda c: list(c.execute("SELECT * FROM host_goals")))
    refused = await ask(system, create("整理出行清单", entry_id="astrbot:a", scope=restricted))
    assert refused.status == 403 and refused.code == "entry_forbidden"
    refused_global = await ask(system, create("别的目标", entry_id=None, scope=restricted))
    assert isinstance(refused_global, GoalRefused) and refused_global.status == 403
    patched = await ask(system, patch(first.document["goal"]["id"], restricted, status="completed"))
    assert patched.status == 403
    assert await system.storage.read(lambda c: list(c.execute("SELECT * FROM host_goals"))) == before


async def test_host_key_returns_the_first_receipt_unchanged(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    first = await ask(system, create("买菜", host_key="k1"))
    again = await ask(system, create("完全不同的内容", host_key="k1"))
    assert again.document == first.document and not again.created
    other_host = await ask(system, create("完全不同的内容", host_key="k1", source="other-bot"))
    assert other_host.document["goal"]["id"] != first.document["goal"]["id"]


async def test_possible_duplicate_is_held_until_the_fallback_then_one_immediate_reminder(nursery, tmp_path):
    model = ScriptedModel("cannot", "cannot", "cannot")
    settings = GoalSettings(fallback_seconds=1800, judgement_retry_seconds=0.05)
    system = await start(nursery, tmp_path, settings, model)
    await ask(system, create("周六整理出行清单和护照", deadline=at(5)))
    held = await ask(system, create("周六整理出行清单和签证", deadline=at(0.25), minutes=10))
    goal = held.document["goal"]
    assert held.document["dedup"]["result"] == "possible_duplicate"
    assert held.document["dedup"]["judgement"] == "pending"
    assert goal["dedup_pending"] and not goal["dedup_injectable"]
    assert goal["dedup_fallback_at"] == "2026-10-11T02:30:00+00:00"
    await wait_for(lambda: _calls(model, 3))
    await trio.sleep(0.2)
    assert model.calls == 3  # bounded retries
    shown = await system.storage.read(lambda c: injected_goals(
        c, now=system.env.clock.wall(), allows=all_scope.allows, entry_id="astrbot:a", limit=10, whole_scope=False))
    assert [item["id"] for item in shown] == [1]
    system.env.clock.advance(1800)  # the deadline (15 min) has passed while it was held
    await wait_for(lambda: _count(system, 1))
    rows = await notifications(system)
    assert [(row[1], row[3]) for row in rows] == [(goal["id"], "due")]
    shown = await system.storage.read(lambda c: injected_goals(
        c, now=system.env.clock.wall(), allows=all_scope.allows, entry_id="astrbot:a", limit=10, whole_scope=False))
    released = [item for item in shown if item["id"] == goal["id"]][0]
    assert released["dedup_pending"] and released["dedup_injectable"]
    assert {hint["code"] for hint in released["hints"]} >= {"dedup_pending", "deadline_passed"}


async def _calls(model, wanted):
    return model.calls >= wanted


async def test_a_duplicate_verdict_merges_and_publishes_a_dedup_notification(nursery, tmp_path):
    model = ScriptedModel(True)
    system = await start(nursery, tmp_path, GoalSettings(), model)
    first = await ask(system, create("周六整理出行清单和护照"))
    held = await ask(system, create("周六整理出行清单和签证", people=["小美"]))
    held_id = held.document["goal"]["id"]

    async def merged():
        rows = await system.storage.read(lambda c: list(c.execute("SELECT status, canonical_id FROM host_goals WHERE id = ?", (held_id,))))
        return rows == [("merged", first.document["goal"]["id"])]

    await wait_for(merged)
    rows = await notifications(system)
    assert [(row[1], row[2]) for row in rows] == [(held_id, "goal_dedup")]
    conflict = await ask(system, patch(held_id, status="completed"))
    assert conflict.status == 409 and conflict.code == "goal_merged"
    assert conflict.extra == {"canonical_id": first.document["goal"]["id"]}


async def test_judgement_off_or_fallback_zero_injects_at_once(nursery, tmp_path):
    system = await start(nursery, tmp_path, GoalSettings(judgement_enabled=False))
    await ask(system, create("周六整理出行清单和护照"))
    reply = await ask(system, create("周六整理出行清单和签证"))
    assert reply.document["dedup"] == {"result": "possible_duplicate", "canonical_id": None, "candidate_id": 1,
                                       "judgement": "disabled", "fallback_at": None}
    assert reply.document["goal"]["dedup_injectable"] and not reply.document["goal"]["dedup_pending"]


async def test_fallback_zero_keeps_the_pending_mark_but_injects(nursery, tmp_path):
    system = await start(nursery, tmp_path, GoalSettings(fallback_seconds=0), ScriptedModel())
    await ask(system, create("周六整理出行清单和护照"))
    reply = await ask(system, create("周六整理出行清单和签证", deadline=at(-1)))
    goal = reply.document["goal"]
    assert goal["dedup_pending"] and goal["dedup_injectable"]
    assert [(row[3]) for row in await notifications(system)] == ["due"]


async def test_revision_conflict_and_schedule_changes(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    goal_id = (await ask(system, create(deadline=at(3), minutes=30))).document["goal"]["id"]
    conflict = await ask(system, patch(goal_id, expected=5, minutes=10))
    assert conflict.status == 409 and conflict.code == "revision_conflict"
    moved = await ask(system, patch(goal_id, expected=1, deadline_given=True, deadline=at(-0.5),
                                    minutes=reminder_minutes_max))
    assert moved.document["revision"] == 2 and moved.document["due_state"] == "overdue"
    assert [row[3] for row in await notifications(system)] == ["due"]
    cleared = await ask(system, patch(goal_id, deadline_given=True, deadline=None))
    assert cleared.document["deadline_at"] is None and cleared.document["due_state"] == "none"
    missing = await ask(system, patch(999, status="completed"))
    assert missing.status == 404


async def test_a_reminder_due_during_a_restart_is_published_after_it(nursery, tmp_path):
    system = await start(nursery, tmp_path)
    await ask(system, create(deadline=at(1), minutes=0))
    await system.drain()
    system.env.clock.advance(3600 + 1)
    await wait_for(lambda: _count(system, 1))
    assert [row[3] for row in await notifications(system)] == ["due"]


async def test_a_refired_reminder_publishes_nothing_new(nursery, tmp_path):
    from troupe.actors.host import Armed, fire_reminder, reminder_kind_due

    system = await start(nursery, tmp_path)
    goal_id = (await ask(system, create(deadline=at(1), minutes=0))).document["goal"]["id"]
    system.env.clock.advance(3600 + 1)
    await wait_for(lambda: _count(system, 1))
    payload = {"goal_id": goal_id, "kind": reminder_kind_due, "schedule_revision": 1}
    again = await system.storage.write(lambda c: fire_reminder(c, goal_id, reminder_kind_due, payload,
                                                               system.env.clock.wall(), Armed()))
    assert again is None and len(await notifications(system)) == 1


async def test_judgement_resumes_after_a_restart_within_its_attempts(nursery, tmp_path):
    model = ScriptedModel(RuntimeError("down"), False)
    system = await start(nursery, tmp_path, GoalSettings(judgement_retry_seconds=30), model)
    await ask(system, create("周六整理出行清单和护照"))
    held_id = (await ask(system, create("周六整理出行清单和签证"))).document["goal"]["id"]
    await wait_for(lambda: _calls(model, 1))
    await trio.sleep(0.1)
    await system.drain()  # the in-memory retry timer dies with the instance
    await ask(system, patch(999, status="completed"))  # activation queues held goals again

    async def judged():
        rows = await system.storage.read(lambda c: list(c.execute(
            "SELECT dedup_state, dedup_attempts FROM host_goals WHERE id = ?", (held_id,))))
        return rows == [("none", 1)]

    await wait_for(judged)
