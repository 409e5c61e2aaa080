"""The goals actor ``("host_goals", "global")``: goal writes, reminder firings, dedup judgement.

Why one actor: dedup compares a new goal with the others and merges two goals in one step, and
notification ids must follow one publication order; one mailbox gives both without locks.
Each turn is one storage transaction (``_goals``) that also writes or deletes the goal's
durable reminder rows, which are announced to the scheduler after the commit, so a crash
loses nothing that was acknowledged and a reminder can never outlive the goal state that made
it.

Background judgement: a goal held as a possible duplicate is judged through the Model port in
a task beside the actor's turns (``start_task``), at most ``judgement_tasks_max`` at once; the
verdict is applied in a turn.  No usable verdict (failure, timeout, a model that cannot judge)
is retried every ``judgement_retry_seconds`` up to ``judgement_attempts_max`` times; none of
this moves the fallback time, whose durable ``fallback`` reminder releases the goal anyway.
After a restart the held goals are queued again on activation.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

import trio

from troupe.models import ChatMessage, CompletionRequest
from troupe.runtime import Actor, ActorKind, TaskEnded
from troupe.storage import StorageError

from ._goals import (
    Armed,
    CreateGoal,
    GoalRefused,
    GoalsUnavailable,
    PatchGoal,
    Refusal,
    apply_verdict,
    create_goal,
    dedup_fallback_seconds_default,
    fallback_kind,
    fire_reminder,
    goals_kind_name,
    held_goal_ids,
    judgement_material,
    parse_reminder_name,
    patch_goal,
    record_judgement_attempt,
    release_goal,
)

goals_mailbox_messages_max = 256
judgement_tasks_max = 2
"""Model calls for dedup judgement running at once (the model is shared with learning)."""
judgement_timeout_seconds = 30.0
judgement_retry_seconds = 60.0
judgement_attempts_max = 3
judgement_output_tokens_max = 64
held_goals_resumed_max = 1_000
"""Held goals queued for judgement on activation (the rest are released by their fallback)."""

assert judgement_tasks_max >= 1 and judgement_attempts_max >= 1 and judgement_timeout_seconds > 0


@dataclass(frozen=True)
class GoalSettings:
    """Knobs of the goals actor; tests shorten the durations."""

    judgement_enabled: bool = True
    fallback_seconds: float = dedup_fallback_seconds_default
    """0: a possible duplicate is injected at once (judgement still runs)."""
    judgement_timeout_seconds: float = judgement_timeout_seconds
    judgement_retry_seconds: float = judgement_retry_seconds
    judgement_attempts_max: int = judgement_attempts_max

    def __post_init__(self) -> None:
        assert self.fallback_seconds >= 0 and self.judgement_timeout_seconds > 0
        assert self.judgement_retry_seconds > 0 and self.judgement_attempts_max >= 1


@dataclass(frozen=True)
class JudgeAgain:
    """In-memory timer: retry the judgement of a held goal."""

    goal_id: int


_judge_task_prefix = "judge:"


async def ask_for_verdict(model: Any, new_content: str, candidate_content: str, timeout_seconds: float) -> bool | None:
    """Whether the model says the two goals are the same intention; None without a usable
    answer (no model, failure, timeout, unparseable)."""
    if model is None:
        return None
    request = CompletionRequest(
        messages=(
            ChatMessage("system", "你是目标去重判断器。判断两个目标是否是同一件打算，"
                                  "只输出 JSON：{\"duplicate\": true 或 false}。"),
            ChatMessage("user", f"已有目标：{candidate_content}\n新目标：{new_content}"),
        ),
        response_format="json",
        max_output_tokens=judgement_output_tokens_max,
    )
    try:
        with trio.move_on_after(timeout_seconds):
            completion = await model.complete(request)
            answer = json.loads(completion.text)
            verdict = answer.get("duplicate") if isinstance(answer, dict) else None
            return verdict if isinstance(verdict, bool) else None
    except Exception:  # any model trouble is "no verdict yet"; the fallback still holds
        return None
    return None


class GoalsActor(Actor):
    """See the module docstring."""

    def __init__(self, context: Any, settings: GoalSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self._queued: deque[int] = deque()
        self._judging: set[int] = set()

    async def on_activate(self) -> None:
        attempts_max = self.settings.judgement_attempts_max
        held = await self.context.storage.read(
            lambda connection: held_goal_ids(connection, held_goals_resumed_max, attempts_max))
        self._queue(held)

    async def receive(self, message: Any) -> Any:
        now = self.context.env.clock.wall()
        if isinstance(message, CreateGoal):
            settings = self.settings
            return await self._write(lambda connection, armed: create_goal(
                connection, message, now, judgement_enabled=settings.judgement_enabled,
                fallback_seconds=settings.fallback_seconds, armed=armed))
        if isinstance(message, PatchGoal):
            return await self._write(lambda connection, armed: patch_goal(connection, message, now, armed))
        if isinstance(message, TaskEnded):
            await self._judged(message, now)
            return None
        if isinstance(message, JudgeAgain):
            self._queue([message.goal_id])
            return None
        raise AssertionError(f"goals actor got an unknown message {type(message).__name__}")

    async def on_reminder(self, name: str, payload: Any) -> None:
        parsed = parse_reminder_name(name)
        if parsed is None:
            return
        goal_id, kind = parsed
        now = self.context.env.clock.wall()
        if kind == fallback_kind:
            await self._commit(lambda connection, armed: release_goal(connection, goal_id, now, armed))
            self.context.trace("goal_released", goal_id=goal_id)
            return
        published = await self._commit(
            lambda connection, armed: fire_reminder(connection, goal_id, kind, payload, now, armed))
        if published is not None:
            self.context.trace("goal_reminder_published", goal_id=goal_id, notification_id=published)

    # -- writes ------------------------------------------------------------------------

    async def _write(self, job: Any) -> Any:
        try:
            return await self._commit(job)
        except Refusal as refusal:
            return refusal.refused
        except StorageError as exc:
            return GoalsUnavailable(type(exc).__name__)

    async def _commit(self, job: Any) -> Any:
        armed = Armed()
        result = await self.context.storage.write(lambda connection: job(connection, armed))
        for name, due in armed.set:
            self.context.reminder_armed(name, due)
        self._queue(armed.judge)
        return result

    # -- judgement ---------------------------------------------------------------------

    def _queue(self, goal_ids: list[int]) -> None:
        if not self.settings.judgement_enabled:
            return
        for goal_id in goal_ids:
            if goal_id not in self._queued and goal_id not in self._judging:
                self._queued.append(goal_id)
        self._start_judgements()

    def _start_judgements(self) -> None:
        while self._queued and len(self._judging) < judgement_tasks_max:
            goal_id = self._queued.popleft()
            self._judging.add(goal_id)
            self.context.start_task(f"{_judge_task_prefix}{goal_id}", self._judgement(goal_id))

    def _judgement(self, goal_id: int) -> Any:
        storage, model, timeout = self.context.storage, self.context.env.model, self.settings.judgement_timeout_seconds

        async def judge() -> tuple[int, bool | None, bool]:
            material = await storage.read(lambda connection: judgement_material(connection, goal_id))
            if material is None:
                return goal_id, None, False
            return goal_id, await ask_for_verdict(model, material[0], material[1], timeout), True

        return judge

    async def _judged(self, ended: TaskEnded, now: float) -> None:
        if not ended.name.startswith(_judge_task_prefix):
            return
        goal_id = int(ended.name[len(_judge_task_prefix):])
        self._judging.discard(goal_id)
        verdict, judged = (None, True) if ended.result is None else ended.result[1:]
        if ended.cancelled or ended.error is not None:
            verdict, judged = None, True
        try:
            if verdict is not None:
                await self._commit(lambda connection, armed: apply_verdict(connection, goal_id, verdict, now, armed))
                self.context.trace("goal_judged", goal_id=goal_id, duplicate=verdict)
            elif judged:
                attempts = await self.context.storage.write(
                    lambda connection: record_judgement_attempt(connection, goal_id))
                if attempts < self.settings.judgement_attempts_max:
                    self.context.start_timer(f"rejudge:{goal_id}", self.settings.judgement_retry_seconds,
                                             JudgeAgain(goal_id))
        finally:
            self._start_judgements()


def goals_actor_kind(settings: GoalSettings | None = None) -> ActorKind:
    chosen = settings or GoalSettings()
    return ActorKind(goals_kind_name, lambda context: GoalsActor(context, chosen),
                     mailbox_messages_max=goals_mailbox_messages_max)


__all__ = [
    "GoalRefused",
    "GoalSettings",
    "GoalsActor",
    "JudgeAgain",
    "ask_for_verdict",
    "goals_actor_kind",
    "goals_mailbox_messages_max",
    "held_goals_resumed_max",
    "judgement_attempts_max",
    "judgement_retry_seconds",
    "judgement_tasks_max",
    "judgement_timeout_seconds",
]
