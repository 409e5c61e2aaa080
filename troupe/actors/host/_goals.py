"""The goal store: what the character intends to do, its dedup state and its reminders.

Why plain functions of one SQLite connection: every rule here is read-modify-write on a few
rows (a dedup merge touches two goals, a reminder firing reads a goal and inserts a
notification), and the contract wants each acknowledged change durable.  The goals actor
(``_goals_actor``) runs each of them inside one write transaction of its turn; prepare, search
and ``GET /goals`` read them on a read connection.  Nothing is cached in memory.

Rules this module owns (the contract's goals part):
- A deadline given as a date means the end of that day (23:59:59) in the character's time
  zone; an aware ISO time is taken as is.  Documents show every time in that zone.
- Reminders: ``near`` at ``deadline - reminder_minutes`` (none when the lead is 0) and ``due``
  at the deadline, for active ``normal`` goals that are injectable (questions never get
  deadline reminders).  They are durable reminder rows of the goals actor, written in the same
  transaction as the goal, and each publishes one ``host_notifications`` row per schedule
  (``_goal_schema``).  A moment already past when a schedule is (re)made - a released dedup
  hold, a deadline moved into the past, a new goal whose deadline has passed - becomes exactly
  one immediate reminder (``due`` if the deadline passed, else ``near``), keeping the original
  deadline and taking a new publication id now.
- Dedup: an active goal with the same normalised content in the same place (its entry or
  global) is merged at once; a similar one (character-bigram Dice ≥ ``dedup_similarity_min``)
  makes the new goal a *possible duplicate* held for background judgement: not injected, no
  reminders, until a verdict or the fallback time (``dedup_fallback_seconds`` after it was
  first queued; retries never move it), after which it is injected with the pending mark.
- A restricted token never changes a global goal, a merge into one included
  (``GoalRefused`` 403 ``entry_forbidden``, nothing written).
"""

from __future__ import annotations

import datetime
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw

from troupe.storage import reminder_delete, reminder_set

from ._goal_schema import (
    character_time_zone,
    dedup_state_none,
    dedup_state_pending,
    goal_kind_question,
    goal_status_abandoned,
    goal_status_active,
    goal_status_completed,
    goal_status_merged,
    iso_in,
    notification_kind_goal_dedup,
    notification_kind_goal_reminder,
    notification_status_cancelled,
    notification_status_pending,
    reminder_kind_due,
    reminder_kind_near,
)

goals_kind_name = "host_goals"
goals_key = "global"
"""One actor owns every goal: dedup compares goals with each other and publication ids must
follow one order, so one mailbox is the simplest correct owner."""

reminder_minutes_default = 60
reminder_minutes_max = 10_080
"""A week of lead time at most."""
goal_people_max = 100
goal_person_characters_max = 200
host_key_characters_max = 300
goal_content_characters_max = 8_000
"""A goal is a sentence or two; the 32768-byte body limit bounds it anyway."""
goal_list_limit_default = 20
goal_list_limit_max = 100
goal_list_offset_max = 1_000_000
dedup_fallback_seconds_default = 1_800.0
"""The contract: without a verdict 30 minutes after first being queued, a held goal is injected."""
dedup_similarity_min = 0.6
"""Character-bigram Dice coefficient from which two goals are possible duplicates."""
dedup_candidates_scan_max = 500
"""Active goals (newest first) compared with a new one; older ones are not dedup candidates."""
basis_changed_hint_seconds = 86_400.0
"""How long after a deadline, lead-time or merge change prepare says "the basis changed"."""

assert 0 < dedup_similarity_min <= 1 and goal_list_limit_default <= goal_list_limit_max
assert 0 <= reminder_minutes_default <= reminder_minutes_max

due_state_none = "none"
due_state_upcoming = "upcoming"
due_state_near = "near"
due_state_overdue = "overdue"
due_states = (due_state_none, due_state_upcoming, due_state_near, due_state_overdue)

dedup_result_created = "created"
dedup_result_merged = "merged"
dedup_result_possible_duplicate = "possible_duplicate"
judgement_not_needed = "not_needed"
judgement_pending = "pending"
judgement_disabled = "disabled"


@dataclass(frozen=True)
class Deadline:
    """A requested deadline: an aware moment (``seconds``) or a calendar ``date`` (ISO text)
    that means the end of that day in the character's time zone."""

    seconds: float | None = None
    date: str | None = None

    def __post_init__(self) -> None:
        assert (self.seconds is None) != (self.date is None)

    def resolve(self, zone: datetime.tzinfo) -> float:
        if self.seconds is not None:
            return self.seconds
        assert self.date is not None
        day = datetime.date.fromisoformat(self.date)
        end = datetime.datetime.combine(day, datetime.time(23, 59, 59), tzinfo=zone)
        return end.timestamp()


@dataclass(frozen=True)
class Goal:
    """One row of ``host_goals`` (wall seconds)."""

    id: int
    content: str
    content_key: str
    kind: str
    people: tuple[str, ...]
    entry_id: str | None
    deadline_at: float | None
    deadline_is_date: bool
    reminder_minutes: int
    status: str
    revision: int
    schedule_revision: int
    canonical_id: int | None
    dedup_state: str
    dedup_candidate_id: int | None
    dedup_queued_at: float | None
    dedup_fallback_at: float | None
    dedup_released_at: float | None
    dedup_attempts: int
    basis_changed_at: float | None
    source: str
    created_at: float
    updated_at: float
    completed_at: float | None
    abandoned_at: float | None

    @property
    def dedup_pending(self) -> bool:
        return self.dedup_state == dedup_state_pending

    @property
    def injectable(self) -> bool:
        """Shown in prepare/search and allowed to publish reminders."""
        return not self.dedup_pending or self.dedup_released_at is not None

    @property
    def near_at(self) -> float | None:
        if self.deadline_at is None or self.reminder_minutes <= 0:
            return None
        return self.deadline_at - self.reminder_minutes * 60.0

    def due_state(self, now: float) -> str:
        if self.deadline_at is None:
            return due_state_none
        if now >= self.deadline_at:
            return due_state_overdue
        near_at = self.near_at
        return due_state_near if near_at is not None and now >= near_at else due_state_upcoming


_goal_columns = (
    "id, content, content_key, kind, people_json, entry_id, deadline_at, deadline_is_date, "
    "reminder_minutes, status, revision, schedule_revision, canonical_id, dedup_state, "
    "dedup_candidate_id, dedup_queued_at, dedup_fallback_at, dedup_released_at, dedup_attempts, "
    "basis_changed_at, source, created_at, updated_at, completed_at, abandoned_at"
)


def _goal(row: Sequence[Any]) -> Goal:
    values = list(row)
    values[4] = tuple(json.loads(values[4]))
    values[7] = bool(values[7])
    return Goal(*values)


def load_goal(connection: apsw.Connection, goal_id: int) -> Goal | None:
    row = connection.execute(f"SELECT {_goal_columns} FROM host_goals WHERE id = ?", (goal_id,)).fetchone()
    return None if row is None else _goal(row)


# -- commands and outcomes -------------------------------------------------------------------


@dataclass(frozen=True)
class CreateGoal:
    """A validated ``POST /goals`` body plus who sent it.  ``all_scope``: the token may write
    global goals; ``allows``: its scope's ``allows``."""

    content: str
    kind: str
    people: tuple[str, ...]
    entry_id: str | None
    deadline: Deadline | None
    reminder_minutes: int | None
    host_key: str | None
    source: str
    all_scope: bool
    allows: Callable[[str], bool] = field(compare=False)


@dataclass(frozen=True)
class PatchGoal:
    """A validated ``PATCH /goals/{id}``.  ``deadline_given`` with ``deadline`` None clears it."""

    goal_id: int
    status: str | None
    deadline_given: bool
    deadline: Deadline | None
    reminder_minutes: int | None
    expected_revision: int | None
    source: str
    all_scope: bool
    allows: Callable[[str], bool] = field(compare=False)


@dataclass(frozen=True)
class GoalReply:
    """Success: the response document (a receipt for POST, the goal for PATCH)."""

    document: dict[str, Any]
    created: bool = False


@dataclass(frozen=True)
class GoalRefused:
    """Nothing changed: the HTTP status, the error code, and optional field / extra members."""

    status: int
    code: str
    field_path: str | None = None
    message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GoalsUnavailable:
    reason: str


class Refusal(Exception):
    """Raised inside a write job to roll the transaction back and answer ``refused``."""

    def __init__(self, refused: GoalRefused) -> None:
        super().__init__(refused.code)
        self.refused = refused


@dataclass
class Armed:
    """Reminder rows a committed job wrote (name, due) or deleted (name), to tell the scheduler."""

    set: list[tuple[str, float]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    judge: list[int] = field(default_factory=list)
    """Goals newly held for background judgement."""


# -- normalisation and similarity ------------------------------------------------------------

_punctuation = re.compile(r"[\s\W_]+", re.UNICODE)


def content_key(content: str) -> str:
    """Normalised content for exact dedup: NFKC, case-folded, without spaces or punctuation."""
    return _punctuation.sub("", unicodedata.normalize("NFKC", content).casefold())


def _bigrams(key: str) -> set[str]:
    return {key[index:index + 2] for index in range(len(key) - 1)} if len(key) > 1 else {key}


def similarity(left: str, right: str) -> float:
    """Dice coefficient of the character bigrams of two content keys (0..1)."""
    first, second = _bigrams(left), _bigrams(right)
    if not first or not second:
        return 0.0
    return 2.0 * len(first & second) / (len(first) + len(second))


# -- reminders -------------------------------------------------------------------------------


def reminder_name(goal_id: int, kind: str) -> str:
    return f"goal:{goal_id}:{kind}"


fallback_kind = "fallback"


def parse_reminder_name(name: str) -> tuple[int, str] | None:
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != "goal" or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2]


def _clear_reminders(connection: apsw.Connection, goal_id: int, armed: Armed, *, fallback: bool) -> None:
    kinds = (reminder_kind_near, reminder_kind_due, *((fallback_kind,) if fallback else ()))
    for kind in kinds:
        name = reminder_name(goal_id, kind)
        if reminder_delete(connection, goals_kind_name, goals_key, name):
            armed.deleted.append(name)


def publish(
    connection: apsw.Connection, goal: Goal, reminder_kind: str, scheduled_at: float, now: float
) -> int | None:
    """Insert the goal's ``reminder_kind`` notification for its current schedule; the id, or
    None when this schedule already published it."""
    connection.execute(
        "INSERT OR IGNORE INTO host_notifications (kind, goal_id, entry_id, reminder_kind, "
        "schedule_revision, deadline_at, scheduled_at, published_at, content, status) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (notification_kind_goal_reminder, goal.id, goal.entry_id, reminder_kind, goal.schedule_revision,
         goal.deadline_at, scheduled_at, now, goal.content, notification_status_pending),
    )
    return connection.last_insert_rowid() if connection.changes() else None


def schedule_reminders(connection: apsw.Connection, goal: Goal, now: float, armed: Armed) -> None:
    """(Re)make the near/due reminders of ``goal`` as it now stands (see the module docstring):
    future moments become reminder rows, a moment already past one immediate publication."""
    _clear_reminders(connection, goal.id, armed, fallback=False)
    if (goal.status != goal_status_active or goal.kind == goal_kind_question or goal.deadline_at is None
            or not goal.injectable):
        return
    near_at, due_at = goal.near_at, goal.deadline_at
    if due_at <= now:
        publish(connection, goal, reminder_kind_due, due_at, now)
        return
    if near_at is not None and near_at <= now:
        publish(connection, goal, reminder_kind_near, near_at, now)
    elif near_at is not None:
        _set_reminder(connection, goal, reminder_kind_near, near_at, armed)
    _set_reminder(connection, goal, reminder_kind_due, due_at, armed)


def _set_reminder(connection: apsw.Connection, goal: Goal, kind: str, due: float, armed: Armed) -> None:
    name = reminder_name(goal.id, kind)
    payload = {"goal_id": goal.id, "kind": kind, "schedule_revision": goal.schedule_revision}
    reminder_set(connection, goals_kind_name, goals_key, name, due, payload)
    armed.set.append((name, due))


def fire_reminder(connection: apsw.Connection, goal_id: int, kind: str, payload: Any, now: float,
                  armed: Armed) -> int | None:
    """A near/due reminder fired: publish it if its goal still wants it; the notification id."""
    goal = load_goal(connection, goal_id)
    if goal is None or goal.status != goal_status_active or goal.deadline_at is None:
        return None
    if goal.kind == goal_kind_question or not goal.injectable:
        return None
    if isinstance(payload, dict) and payload.get("schedule_revision") != goal.schedule_revision:
        return None  # an older schedule's timer (replaced rows never fire; kept for safety)
    if kind == reminder_kind_near:
        near_at = goal.near_at
        if near_at is None or now >= goal.deadline_at:
            return None  # the due reminder says it all now
        return publish(connection, goal, reminder_kind_near, near_at, now)
    name = reminder_name(goal.id, reminder_kind_near)
    if reminder_delete(connection, goals_kind_name, goals_key, name):
        armed.deleted.append(name)
    return publish(connection, goal, reminder_kind_due, goal.deadline_at, now)


def cancel_notifications(connection: apsw.Connection, goal_id: int, now: float) -> None:
    """A finished or merged goal's publications not yet taken become ``cancelled``."""
    connection.execute(
        "UPDATE host_notifications SET status = ?, cancelled_at = ? WHERE goal_id = ? AND status = ?",
        (notification_status_cancelled, now, goal_id, notification_status_pending),
    )


# -- documents -------------------------------------------------------------------------------


def goal_document(goal: Goal, zone: datetime.tzinfo, now: float) -> dict[str, Any]:
    """The contract's goal object, every time in the character's time zone ``zone``."""
    return {
        "id": goal.id,
        "content": goal.content,
        "kind": goal.kind,
        "people": list(goal.people),
        "entry_id": goal.entry_id,
        "deadline_at": iso_in(goal.deadline_at, zone),
        "deadline_is_date": goal.deadline_is_date,
        "reminder_minutes": goal.reminder_minutes,
        "near_at": iso_in(goal.near_at, zone) if goal.kind != goal_kind_question else None,
        "due_state": goal.due_state(now),
        "status": goal.status,
        "revision": goal.revision,
        "canonical_id": goal.canonical_id,
        "source": goal.source,
        "created_at": iso_in(goal.created_at, zone),
        "updated_at": iso_in(goal.updated_at, zone),
        "completed_at": iso_in(goal.completed_at, zone),
        "abandoned_at": iso_in(goal.abandoned_at, zone),
        "dedup_pending": goal.dedup_pending,
        "dedup_injectable": goal.injectable,
        "dedup_fallback_at": iso_in(goal.dedup_fallback_at, zone) if goal.dedup_pending else None,
    }


_hint_messages = {
    "deadline_near": "目标临近截止时间。",
    "deadline_passed": "目标已过截止时间，仍未完成。",
    "basis_changed": "目标的截止时间、提醒提前量或合并情况最近有变化。",
    "dedup_pending": "目标可能与已有目标重复，仍待复核。",
}


def goal_hints(goal: Goal, now: float) -> list[dict[str, str]]:
    """prepare/search hints of one goal: deadline, due and basis-changed."""
    codes = []
    state = goal.due_state(now)
    if state == due_state_near:
        codes.append("deadline_near")
    elif state == due_state_overdue:
        codes.append("deadline_passed")
    if goal.basis_changed_at is not None and now - goal.basis_changed_at < basis_changed_hint_seconds:
        codes.append("basis_changed")
    if goal.dedup_pending:
        codes.append("dedup_pending")
    return [{"code": code, "message": _hint_messages[code]} for code in codes]


def injected_goals(
    connection: apsw.Connection, *, now: float, allows: Callable[[str], bool], entry_id: str | None,
    limit: int, whole_scope: bool,
) -> list[dict[str, Any]]:
    """The ``goals`` section of prepare (``entry_id`` = the entry, global goals too) and search
    (``whole_scope``: every entry the token allows plus global goals, or ``entry_id`` and
    global ones): active injectable goals, soonest deadline first, then newest."""
    if limit <= 0:
        return []
    zone = character_time_zone(connection)
    place, parameters = "", [goal_status_active]
    if entry_id is not None or not whole_scope:
        place = "AND (entry_id IS NULL OR entry_id IS ?) "
        parameters.append(entry_id)
    rows = connection.execute(
        f"SELECT {_goal_columns} FROM host_goals WHERE status = ? {place}"
        "ORDER BY deadline_at IS NULL, deadline_at, id DESC", parameters)
    chosen: list[dict[str, Any]] = []
    for row in rows:
        goal = _goal(row)
        if not goal.injectable:
            continue
        if goal.entry_id is not None:
            if not allows(goal.entry_id):
                continue
            if not whole_scope or entry_id is not None:
                if goal.entry_id != entry_id:
                    continue
        chosen.append({**goal_document(goal, zone, now), "hints": goal_hints(goal, now)})
        if len(chosen) >= limit:
            break
    return chosen


@dataclass(frozen=True)
class GoalFilter:
    status: str | None = None
    kind: str | None = None
    due: str | None = None
    entry_id: str | None = None
    limit: int = goal_list_limit_default
    offset: int = 0


def list_goals(connection: apsw.Connection, query: GoalFilter, *, now: float,
               allows: Callable[[str], bool]) -> dict[str, Any]:
    """``GET /goals``: goals visible to the token (global ones and its entries'), filtered,
    ascending by id, paged.  The due filter is evaluated at ``now``."""
    conditions, parameters = [], []
    for column, value in (("status", query.status), ("kind", query.kind), ("entry_id", query.entry_id)):
        if value is not None:
            conditions.append(f"{column} = ?")
            parameters.append(value)
    if query.due == due_state_none:
        conditions.append("deadline_at IS NULL")
    elif query.due == due_state_overdue:
        conditions.append("deadline_at <= ?")
        parameters.append(now)
    elif query.due == due_state_near:
        conditions.append("deadline_at > ? AND reminder_minutes > 0 AND deadline_at - reminder_minutes * 60.0 <= ?")
        parameters += [now, now]
    elif query.due == due_state_upcoming:
        conditions.append("deadline_at > ? AND (reminder_minutes = 0 OR deadline_at - reminder_minutes * 60.0 > ?)")
        parameters += [now, now]
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    zone = character_time_zone(connection)
    items: list[dict[str, Any]] = []
    total = 0
    for row in connection.execute(f"SELECT {_goal_columns} FROM host_goals {where} ORDER BY id", parameters):
        goal = _goal(row)
        if goal.entry_id is not None and not allows(goal.entry_id):
            continue
        if query.offset <= total < query.offset + query.limit:
            items.append(goal_document(goal, zone, now))
        total += 1
    return {"items": items, "total": total, "limit": query.limit, "offset": query.offset}


# -- writes ----------------------------------------------------------------------------------


def _forbidden(path: str = "body.entry_id", message: str = "受限令牌不能创建或修改全局目标") -> Refusal:
    return Refusal(GoalRefused(403, "entry_forbidden", path, message))


def _insert_goal(connection: apsw.Connection, values: dict[str, Any]) -> Goal:
    names = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    connection.execute(f"INSERT INTO host_goals ({names}) VALUES ({marks})", tuple(values.values()))
    goal = load_goal(connection, connection.last_insert_rowid())
    assert goal is not None
    return goal


def _candidates(connection: apsw.Connection, entry_id: str | None, kind: str) -> list[Goal]:
    """Active goals the new one could duplicate: same kind, in its entry or global, newest first."""
    rows = connection.execute(
        f"SELECT {_goal_columns} FROM host_goals WHERE status = ? AND kind = ? "
        "AND (entry_id IS NULL OR entry_id IS ?) ORDER BY id DESC LIMIT ?",
        (goal_status_active, kind, entry_id, dedup_candidates_scan_max))
    return [_goal(row) for row in rows]


def merge_into(connection: apsw.Connection, canonical: Goal, people: Sequence[str], now: float) -> Goal:
    """Fold a duplicate into ``canonical``: its people joined, a new revision, basis changed."""
    merged_people = list(dict.fromkeys([*canonical.people, *people]))
    connection.execute(
        "UPDATE host_goals SET people_json = ?, revision = revision + 1, updated_at = ?, basis_changed_at = ? "
        "WHERE id = ?", (json.dumps(merged_people, ensure_ascii=False), now, now, canonical.id))
    goal = load_goal(connection, canonical.id)
    assert goal is not None
    return goal


def create_goal(connection: apsw.Connection, command: CreateGoal, now: float, *, judgement_enabled: bool,
                fallback_seconds: float, armed: Armed) -> GoalReply:
    """``POST /goals`` in one transaction (a ``Refusal`` rolls everything back)."""
    if command.host_key is not None:
        row = connection.execute(
            "SELECT goal_id, receipt_json FROM host_goal_receipts WHERE source = ? AND host_key = ?",
            (command.source, command.host_key)).fetchone()
        if row is not None:
            return GoalReply(json.loads(row[1]))
    if command.entry_id is None and not command.all_scope:
        raise _forbidden()
    zone = character_time_zone(connection)
    deadline_at = None if command.deadline is None else command.deadline.resolve(zone)
    key = content_key(command.content)
    candidates = _candidates(connection, command.entry_id, command.kind)
    exact = next((goal for goal in candidates if goal.content_key == key), None)
    reminder_minutes = reminder_minutes_default if command.reminder_minutes is None else command.reminder_minutes
    values: dict[str, Any] = {
        "content": command.content, "content_key": key, "kind": command.kind,
        "people_json": json.dumps(list(command.people), ensure_ascii=False), "entry_id": command.entry_id,
        "deadline_at": deadline_at, "deadline_is_date": int(command.deadline is not None and command.deadline.date is not None),
        "reminder_minutes": reminder_minutes, "status": goal_status_active, "dedup_state": dedup_state_none,
        "source": command.source, "created_at": now, "updated_at": now,
    }
    dedup: dict[str, Any] = {"result": dedup_result_created, "canonical_id": None, "candidate_id": None,
                             "judgement": judgement_not_needed, "fallback_at": None}
    if exact is not None:
        if exact.entry_id is None and not command.all_scope:
            raise _forbidden(message="受限令牌不能经去重合并修改全局目标")
        submitted = _insert_goal(connection, {**values, "status": goal_status_merged, "canonical_id": exact.id})
        kept = merge_into(connection, exact, command.people, now)
        dedup.update(result=dedup_result_merged, canonical_id=exact.id)
    else:
        similar = [goal for goal in candidates if command.all_scope or goal.entry_id is not None]
        best = max(similar, key=lambda goal: similarity(key, goal.content_key), default=None)
        if best is not None and similarity(key, best.content_key) >= dedup_similarity_min:
            dedup.update(result=dedup_result_possible_duplicate, candidate_id=best.id)
            if judgement_enabled:
                fallback_at = now + max(0.0, fallback_seconds)
                values.update(dedup_state=dedup_state_pending, dedup_candidate_id=best.id, dedup_queued_at=now,
                              dedup_fallback_at=fallback_at, dedup_released_at=now if fallback_seconds <= 0 else None)
                dedup.update(judgement=judgement_pending, fallback_at=iso_in(fallback_at, zone))
            else:
                values.update(dedup_candidate_id=best.id)
                dedup.update(judgement=judgement_disabled)
        submitted = kept = _insert_goal(connection, values)
        if kept.dedup_pending:
            armed.judge.append(kept.id)
            if not kept.injectable:
                assert kept.dedup_fallback_at is not None
                name = reminder_name(kept.id, fallback_kind)
                reminder_set(connection, goals_kind_name, goals_key, name, kept.dedup_fallback_at, {"goal_id": kept.id})
                armed.set.append((name, kept.dedup_fallback_at))
        schedule_reminders(connection, kept, now, armed)
    receipt = {"goal": goal_document(kept, zone, now), "submitted_id": submitted.id, "dedup": dedup}
    if command.host_key is not None:
        connection.execute(
            "INSERT INTO host_goal_receipts (source, host_key, goal_id, receipt_json, created_at) VALUES (?, ?, ?, ?, ?)",
            (command.source, command.host_key, submitted.id, json.dumps(receipt, ensure_ascii=False), now))
    return GoalReply(receipt, created=True)


def patch_goal(connection: apsw.Connection, command: PatchGoal, now: float, armed: Armed) -> GoalReply:
    """``PATCH /goals/{id}`` in one transaction."""
    goal = load_goal(connection, command.goal_id)
    if goal is None:
        raise Refusal(GoalRefused(404, "not_found", "path.goal_id", "目标不存在"))
    if goal.entry_id is None and not command.all_scope:
        raise _forbidden("path.goal_id")
    if goal.entry_id is not None and not command.allows(goal.entry_id):
        raise Refusal(GoalRefused(403, "entry_forbidden", "path.goal_id", "令牌无权访问该目标的入口"))
    if goal.status == goal_status_merged:
        raise Refusal(GoalRefused(409, "goal_merged", None, "目标已合并到保留对象，请读取保留对象后明确提交",
                                  {"canonical_id": goal.canonical_id}))
    if command.expected_revision is not None and command.expected_revision != goal.revision:
        raise Refusal(GoalRefused(409, "revision_conflict", "body.expected_revision",
                                  f"目标已被修改（当前修订号 {goal.revision}），请重新读取后再决定"))
    zone = character_time_zone(connection)
    finished = goal.status in (goal_status_completed, goal_status_abandoned)
    changes: dict[str, Any] = {}
    if command.status is not None and command.status != goal.status:
        if finished:
            raise Refusal(GoalRefused(400, "invalid_request", "body.status", "目标已结束，不能再改变状态"))
        changes["status"] = command.status
        changes["completed_at" if command.status == goal_status_completed else "abandoned_at"] = now
    schedule_changed = False
    if command.deadline_given:
        deadline_at = None if command.deadline is None else command.deadline.resolve(zone)
        is_date = command.deadline is not None and command.deadline.date is not None
        if deadline_at != goal.deadline_at or is_date != goal.deadline_is_date:
            changes.update(deadline_at=deadline_at, deadline_is_date=int(is_date))
            schedule_changed = True
    if command.reminder_minutes is not None and command.reminder_minutes != goal.reminder_minutes:
        changes["reminder_minutes"] = command.reminder_minutes
        schedule_changed = True
    if schedule_changed and finished:
        raise Refusal(GoalRefused(400, "invalid_request", "body", "目标已结束，不能修改截止时间或提醒提前量"))
    if not changes:
        return GoalReply(goal_document(goal, zone, now))
    changes.update(revision=goal.revision + 1, updated_at=now)
    if schedule_changed:
        changes.update(schedule_revision=goal.schedule_revision + 1, basis_changed_at=now)
    assignments = ", ".join(f"{name} = ?" for name in changes)
    connection.execute(f"UPDATE host_goals SET {assignments} WHERE id = ?", (*changes.values(), goal.id))
    updated = load_goal(connection, goal.id)
    assert updated is not None
    if updated.status != goal_status_active:
        _clear_reminders(connection, goal.id, armed, fallback=True)
        cancel_notifications(connection, goal.id, now)
    elif schedule_changed:
        schedule_reminders(connection, updated, now, armed)
    return GoalReply(goal_document(updated, zone, now))


def release_goal(connection: apsw.Connection, goal_id: int, now: float, armed: Armed) -> bool:
    """The fallback time of a held goal came: inject it with the pending mark and make its
    reminders (a missed near/due becomes one immediate reminder).  Whether it was released."""
    # The fallback reminder goes in this same transaction: the runtime deletes a fired reminder
    # only after the turn, and a crash between the two left a released goal holding it.
    name = reminder_name(goal_id, fallback_kind)
    if reminder_delete(connection, goals_kind_name, goals_key, name):
        armed.deleted.append(name)
    goal = load_goal(connection, goal_id)
    if goal is None or not goal.dedup_pending or goal.dedup_released_at is not None:
        return False
    connection.execute("UPDATE host_goals SET dedup_released_at = ? WHERE id = ?", (now, goal_id))
    released = load_goal(connection, goal_id)
    assert released is not None
    schedule_reminders(connection, released, now, armed)
    return True


def apply_verdict(connection: apsw.Connection, goal_id: int, duplicate: bool, now: float, armed: Armed) -> None:
    """A background judgement arrived for a held goal: merge it into its candidate (when the
    candidate is still active) or keep it as a goal of its own, released now."""
    goal = load_goal(connection, goal_id)
    if goal is None or not goal.dedup_pending:
        return
    if goal.status != goal_status_active:
        # Completed or abandoned while the judgement ran: only an explicit change may change a
        # finished goal, so the verdict just closes the review.
        connection.execute("UPDATE host_goals SET dedup_state = ?, dedup_fallback_at = NULL WHERE id = ?",
                           (dedup_state_none, goal.id))
        return
    candidate = None if goal.dedup_candidate_id is None else load_goal(connection, goal.dedup_candidate_id)
    name = reminder_name(goal.id, fallback_kind)
    if reminder_delete(connection, goals_kind_name, goals_key, name):
        armed.deleted.append(name)
    if duplicate and candidate is not None and candidate.status == goal_status_active:
        merge_into(connection, candidate, goal.people, now)
        connection.execute(
            "UPDATE host_goals SET status = ?, canonical_id = ?, dedup_state = ?, revision = revision + 1, "
            "updated_at = ? WHERE id = ?",
            (goal_status_merged, candidate.id, dedup_state_none, now, goal.id))
        _clear_reminders(connection, goal.id, armed, fallback=True)
        cancel_notifications(connection, goal.id, now)
        details = json.dumps({"canonical_id": candidate.id, "submitted_id": goal.id})
        connection.execute(
            "INSERT OR IGNORE INTO host_notifications (kind, goal_id, entry_id, reminder_kind, schedule_revision, "
            "deadline_at, scheduled_at, published_at, content, details_json, status) "
            "VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?)",
            (notification_kind_goal_dedup, goal.id, goal.entry_id, goal.schedule_revision, goal.deadline_at,
             now, now, goal.content, details, notification_status_pending))
        return
    was_held = not goal.injectable
    connection.execute(
        "UPDATE host_goals SET dedup_state = ?, dedup_fallback_at = NULL, dedup_released_at = COALESCE(dedup_released_at, ?), "
        "updated_at = ? WHERE id = ?", (dedup_state_none, now, now, goal.id))
    if was_held:
        released = load_goal(connection, goal.id)
        assert released is not None
        schedule_reminders(connection, released, now, armed)


def record_judgement_attempt(connection: apsw.Connection, goal_id: int) -> int:
    """One more judgement attempt without a verdict; the attempts so far (the fallback time
    never moves)."""
    connection.execute("UPDATE host_goals SET dedup_attempts = dedup_attempts + 1 WHERE id = ?", (goal_id,))
    row = connection.execute("SELECT dedup_attempts FROM host_goals WHERE id = ?", (goal_id,)).fetchone()
    return 0 if row is None else int(row[0])


def held_goal_ids(connection: apsw.Connection, limit: int, attempts_max: int) -> list[int]:
    """Goals still awaiting a verdict with attempts left (oldest first), to resume judgement
    after a restart."""
    rows = connection.execute(
        "SELECT id FROM host_goals WHERE dedup_state = ? AND status = ? AND dedup_attempts < ? ORDER BY id LIMIT ?",
        (dedup_state_pending, goal_status_active, attempts_max, limit))
    return [row[0] for row in rows]


def judgement_material(connection: apsw.Connection, goal_id: int) -> tuple[str, str] | None:
    """(new goal's content, candidate's content) for the model, or None if nothing to judge."""
    goal = load_goal(connection, goal_id)
    if goal is None or not goal.dedup_pending or goal.dedup_candidate_id is None:
        return None
    candidate = load_goal(connection, goal.dedup_candidate_id)
    return None if candidate is None else (goal.content, candidate.content)


__all__ = [
    "Armed",
    "CreateGoal",
    "Deadline",
    "Goal",
    "GoalFilter",
    "GoalRefused",
    "GoalReply",
    "GoalsUnavailable",
    "PatchGoal",
    "Refusal",
    "apply_verdict",
    "basis_changed_hint_seconds",
    "cancel_notifications",
    "content_key",
    "create_goal",
    "dedup_candidates_scan_max",
    "dedup_fallback_seconds_default",
    "dedup_result_created",
    "dedup_result_merged",
    "dedup_result_possible_duplicate",
    "dedup_similarity_min",
    "due_state_near",
    "due_state_none",
    "due_state_overdue",
    "due_state_upcoming",
    "due_states",
    "fallback_kind",
    "fire_reminder",
    "goal_content_characters_max",
    "goal_document",
    "goal_hints",
    "goal_list_limit_default",
    "goal_list_limit_max",
    "goal_list_offset_max",
    "goal_people_max",
    "goal_person_characters_max",
    "goals_key",
    "goals_kind_name",
    "held_goal_ids",
    "host_key_characters_max",
    "injected_goals",
    "judgement_disabled",
    "judgement_material",
    "judgement_not_needed",
    "judgement_pending",
    "list_goals",
    "load_goal",
    "merge_into",
    "parse_reminder_name",
    "patch_goal",
    "publish",
    "record_judgement_attempt",
    "release_goal",
    "reminder_minutes_default",
    "reminder_minutes_max",
    "reminder_name",
    "schedule_reminders",
    "similarity",
]
