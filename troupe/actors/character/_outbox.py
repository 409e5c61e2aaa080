"""The character outbox: a durable per-character task queue with claims, bounded retries and
cursors for the background loops.

Why: ``/cache`` must answer fast and never run extraction in the request path, yet a crash
must never lose the post-turn work it promised.  So the request's write job registers a task
(``register_task``) in the same transaction as the history it concerns; the character actor
later claims it (``claim_next``), runs it through ``start_task`` and finishes it with
``complete_task`` (or ``fail_task``).  A registered task survives any crash; completion is exactly once.

The exactly-once rule, precisely:
- A claim is ``"<task_id>#<n>"`` where ``n`` counts the task's claims (``claims``, never
  decremented), so every claim is distinct and a worker holding an older one is recognisably
  stale.  Each claim also uses one of the task's ``attempts``; ``release_claim`` (the worker
  hands an untouched task back, e.g. a release arrived between claim and start) gives the
  attempt back, a lost claim (crash) does not, so a task that keeps killing its worker ends
  ``failed`` instead of looping.
- ``complete_task(connection, task_id, claim, now)`` succeeds only when the task is ``running``
  under exactly that claim, and moves it to ``done`` in the caller's write job.  Any second
  completion (same claim again, a stale claim, a cancelled or failed task) returns ``False``.
  So a task reaches ``done`` at most once.  The worker must write the task's effects in the
  SAME write job as ``complete_task`` and apply them only when it returns ``True`` (call it first);
  then the effects are applied at most once too.
- Crash recovery: a ``running`` task's claim is lost when the process (or the actor) that
  held it died.  The character actor is the only claimant of its character's tasks, so on
  activation it calls ``recover_claims``: every ``running`` task of that character goes back
  to ``pending`` (or to ``failed`` when its attempts are used up) and can be claimed again
  under a NEW claim.  A worker of the dead incarnation that somehow still finishes holds the
  old claim and is refused.  A task that stays ``running`` longer than
  ``claim_lease_seconds`` (a hung worker) is also re-claimable by ``claim_next``; the hung
  worker's eventual ``complete_task`` is refused for the same reason.  Hence: a registered task is
  never lost, and never runs twice to completion.
- Cancellation (``cancel_tasks``: release of a character, ``/cancel_correction``) moves
  ``pending`` and ``running`` tasks to ``cancelled``; a running worker's later ``complete_task``
  is refused, so a released character's derived work never lands.

Bounds: ``outbox_active_tasks_per_character_max`` pending+running tasks per character
(``register_task`` returns ``None`` beyond it: the caller decides whether that is an error);
``dedupe_key`` coalesces repeated registrations of the same work while one is still active;
at most ``outbox_attempts_max`` attempts with exponential backoff; finished rows are kept
for diagnostics up to ``outbox_finished_tasks_per_character_max`` (oldest pruned; a pruned
task's completion is still refused because it no longer exists).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import apsw

outbox_task_kinds = (
    "post_turn_signal",
    "fact_extraction",
    "history_review",
    "recent_compression",
    "reflection_synthesis",
    "promotion",
    "correction",
    "index_catch_up",
)
"""The task kinds the character actor runs; another kind is a caller bug."""

task_state_pending = "pending"
task_state_running = "running"
task_state_done = "done"
task_state_failed = "failed"
task_state_cancelled = "cancelled"
task_states = (task_state_pending, task_state_running, task_state_done, task_state_failed,
               task_state_cancelled)
task_states_active = (task_state_pending, task_state_running)
task_states_finished = (task_state_done, task_state_failed, task_state_cancelled)

outbox_active_tasks_per_character_max = 1000
"""Pending plus running tasks per character; ``register_task`` refuses beyond it."""
outbox_finished_tasks_per_character_max = 1000
"""Finished (done/failed/cancelled) rows kept per character; the oldest are pruned."""
outbox_attempts_max = 5
"""The largest ``attempts_max`` a task may have (and the default)."""
outbox_payload_bytes_max = 262_144
"""A task payload's JSON encoding may be at most this many UTF-8 bytes."""
outbox_error_characters_max = 1000
"""``last_error`` is cut to this many characters (it is a diagnostic, not data)."""
retry_backoff_seconds = 5.0
"""The delay before a failed attempt's retry; doubles per attempt up to the maximum."""
retry_backoff_seconds_max = 600.0
claim_lease_seconds = 900.0
"""A task ``running`` longer than this is considered abandoned and may be claimed again."""
cursor_loop_characters_max = 64
assert retry_backoff_seconds <= retry_backoff_seconds_max
assert outbox_attempts_max >= 1


@dataclass(frozen=True)
class OutboxTask:
    """One outbox task as stored.  Times are wall-clock seconds.  ``claim`` is the current
    claim while ``running`` (``None`` otherwise); ``generation`` is the character's identity
    generation the task was registered under."""

    task_id: str
    name: str
    kind: str
    payload: dict[str, Any]
    state: str
    attempts: int
    attempts_max: int
    generation: int
    created_at: float
    available_at: float
    dedupe_key: str | None = None
    claim: str | None = None
    claimed_at: float | None = None
    finished_at: float | None = None
    last_error: str | None = None
    seq: int = field(default=0, compare=False)


_columns = ("seq, task_id, name, kind, payload_json, state, attempts, attempts_max, generation, "
            "created_at, available_at, dedupe_key, claim, claimed_at, finished_at, last_error")


def _task(row: tuple) -> OutboxTask:
    (seq, task_id, name, kind, payload_json, state, attempts, attempts_max, generation,
     created_at, available_at, dedupe_key, claim, claimed_at, finished_at, last_error) = row
    return OutboxTask(task_id=task_id, name=name, kind=kind, payload=json.loads(payload_json),
                state=state, attempts=attempts, attempts_max=attempts_max,
                generation=generation, created_at=created_at, available_at=available_at,
                dedupe_key=dedupe_key, claim=claim, claimed_at=claimed_at,
                finished_at=finished_at, last_error=last_error, seq=seq)


def task_claim(task_id: str, number: int) -> str:
    """The claim of a task's ``number``-th claim (distinct per claim)."""
    return f"{task_id}#{number}"


def register_task(connection: apsw.Connection, name: str, *, task_id: str, kind: str,
                  payload: Mapping[str, Any], generation: int, now: float,
                  attempts_max: int = outbox_attempts_max, dedupe_key: str | None = None,
                  available_at: float | None = None, coalesce_pending: bool = False) -> OutboxTask | None:
    """Register a task inside the caller's write job (so it commits with what it concerns).

    With a ``dedupe_key``, an active (pending or running) task of the same kind and key is
    returned instead of a new one.  With ``coalesce_pending``, a still ``pending`` task of the
    same kind and generation is returned instead of a new one: for the kinds whose worker reads
    everything past a cursor when it runs (the post-turn signal), a task not yet claimed
    already covers what this registration concerns, while a running one may have read before
    it (so it does not coalesce).  Returns ``None`` when the character already has
    ``outbox_active_tasks_per_character_max`` active tasks.  A bad kind, payload or attempts
    count is our own bug (``ValueError``).
    """
    if kind not in outbox_task_kinds:
        raise ValueError(f"unknown outbox task kind {kind!r}")
    if not 1 <= attempts_max <= outbox_attempts_max:
        raise ValueError(f"attempts_max must be in 1..{outbox_attempts_max}")
    payload_json = json.dumps(dict(payload), ensure_ascii=False, separators=(",", ":"))
    if len(payload_json.encode()) > outbox_payload_bytes_max:
        raise ValueError("outbox payload too large")
    if dedupe_key is not None:
        existing = connection.execute(
            f"SELECT {_columns} FROM character_outbox WHERE name = ? AND kind = ? "
            "AND dedupe_key = ? AND state IN ('pending', 'running')",
            (name, kind, dedupe_key),
        ).fetchone()
        if existing is not None:
            return _task(existing)
    if coalesce_pending:
        existing = connection.execute(
            f"SELECT {_columns} FROM character_outbox WHERE name = ? AND state = 'pending' "
            "AND kind = ? AND generation = ? ORDER BY seq LIMIT 1",
            (name, kind, generation),
        ).fetchone()
        if existing is not None:
            return _task(existing)
    if active_task_count(connection, name) >= outbox_active_tasks_per_character_max:
        return None
    start = now if available_at is None else available_at
    connection.execute(
        "INSERT INTO character_outbox (task_id, name, kind, payload_json, state, attempts, "
        "attempts_max, generation, dedupe_key, created_at, available_at) "
        "VALUES (?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?)",
        (task_id, name, kind, payload_json, attempts_max, generation, dedupe_key, now, start),
    )
    return get_task(connection, task_id)


def get_task(connection: apsw.Connection, task_id: str) -> OutboxTask | None:
    row = connection.execute(
        f"SELECT {_columns} FROM character_outbox WHERE task_id = ?", (task_id,)
    ).fetchone()
    return None if row is None else _task(row)


_kind_column = _columns.split(", ").index("kind")
_task_id_column = _columns.split(", ").index("task_id")
_attempts_column = _columns.split(", ").index("attempts")
_attempts_max_column = _columns.split(", ").index("attempts_max")


def active_task_count(connection: apsw.Connection, name: str) -> int:
    (count,) = connection.execute(
        "SELECT COUNT(*) FROM character_outbox WHERE name = ? AND state IN ('pending', 'running')",
        (name,),
    ).fetchone()
    return count


def active_tasks(connection: apsw.Connection, name: str,
                 kinds: Iterable[str] | None = None) -> list[OutboxTask]:
    """Pending and running tasks of ``name`` in registration order (optionally of ``kinds``)."""
    tasks = [
        _task(row) for row in connection.execute(
            f"SELECT {_columns} FROM character_outbox WHERE name = ? "
            "AND state IN ('pending', 'running') ORDER BY seq",
            (name,),
        )
    ]
    if kinds is None:
        return tasks
    wanted = set(kinds)
    return [task for task in tasks if task.kind in wanted]


def claim_next(connection: apsw.Connection, name: str, now: float,
               kinds: Iterable[str] | None = None, *,
               preferred_kinds: Iterable[str] = ()) -> OutboxTask | None:
    """Claim the oldest claimable task of ``name`` (optionally of ``kinds``) and return it
    ``running`` under a fresh claim, or ``None``.  Claimable: ``pending`` with
    ``available_at <= now``, or ``running`` with a claim older than ``claim_lease_seconds``.
    A claimable task of ``preferred_kinds`` (which must be among ``kinds``) goes before any
    older one of another kind (the settle compression before derived work), in the same scan.
    Run it inside a write job: the claim is durable before the work starts."""
    wanted = None if kinds is None else set(kinds)
    preferred = set(preferred_kinds)
    assert wanted is None or preferred <= wanted, "a preferred kind must be claimable"
    chosen: tuple | None = None
    for row in _claimable_rows(connection, name, now):
        kind = row[_kind_column]
        if wanted is not None and kind not in wanted:
            continue  # before decoding the payload: most rows a kind filter skips are cheap
        if row[_attempts_column] >= row[_attempts_max_column]:
            # An abandoned claim on the last attempt: nothing left to try.
            _finish(connection, _task(row), task_state_failed, now, "attempts exhausted")
            continue
        if kind in preferred:
            chosen = row
            break
        if chosen is None:
            chosen = row
            if not preferred:
                break
    if chosen is None:
        return None
    # One statement: the claim number is the old count plus one (SET sees the old row).
    row = connection.execute(
        "UPDATE character_outbox SET state = 'running', attempts = attempts + 1, "
        "claims = claims + 1, claim = task_id || '#' || (claims + 1), claimed_at = ? "
        f"WHERE task_id = ? RETURNING {_columns}",
        (now, chosen[_task_id_column]),
    ).fetchone()
    return _task(row)


def _claimable_rows(connection: apsw.Connection, name: str, now: float) -> Iterator[tuple]:
    """The claimable rows of ``name`` in ``seq`` order, read lazily: the due ``pending`` ones
    and the ``running`` ones whose lease ran out.  Two range scans of the ``(name, state,
    seq)`` index merged here, because one query with ``state = ... OR state = ...`` makes
    SQLite read every row of the character (the finished ones kept for diagnostics too) and
    sort them, on every claim."""
    pending = connection.execute(
        f"SELECT {_columns} FROM character_outbox WHERE name = ? AND state = 'pending' "
        "AND available_at <= ? ORDER BY seq",
        (name, now),
    )
    running = connection.execute(
        f"SELECT {_columns} FROM character_outbox WHERE name = ? AND state = 'running' "
        "AND claimed_at <= ? ORDER BY seq",
        (name, now - claim_lease_seconds),
    )
    return heapq.merge(pending, running, key=lambda row: row[0])


def complete_task(connection: apsw.Connection, task_id: str, claim: str, now: float) -> bool:
    """Finish a task ``done``: ``True`` exactly once, for the current claim of a running task;
    ``False`` for a stale or repeated claim, a cancelled/failed/pruned task.  Call it first in
    the job that writes the task's effects and write them only on ``True``."""
    task = _running_under(connection, task_id, claim)
    if task is None:
        return False
    _finish(connection, task, task_state_done, now, None)
    return True


def fail_task(connection: apsw.Connection, task_id: str, claim: str, now: float,
         error: str) -> str | None:
    """Record a failed attempt.  Returns the task's new state: ``pending`` (retried after the
    backoff) or ``failed`` (attempts used up); ``None`` when the claim is not current."""
    task = _running_under(connection, task_id, claim)
    if task is None:
        return None
    message = error[:outbox_error_characters_max]
    if task.attempts >= task.attempts_max:
        _finish(connection, task, task_state_failed, now, message)
        return task_state_failed
    delay = min(retry_backoff_seconds * 2 ** (task.attempts - 1), retry_backoff_seconds_max)
    connection.execute(
        "UPDATE character_outbox SET state = 'pending', claim = NULL, claimed_at = NULL, "
        "available_at = ?, last_error = ? WHERE task_id = ?",
        (now + delay, message, task_id),
    )
    return task_state_pending


def release_claim(connection: apsw.Connection, task_id: str, claim: str, now: float) -> bool:
    """Hand an untouched running task back: ``pending`` again, available now, its attempt
    returned.  ``False`` when ``claim`` is not the task's current claim.  The released claim
    stays dead: the next claim has a new number."""
    task = _running_under(connection, task_id, claim)
    if task is None:
        return False
    connection.execute(
        "UPDATE character_outbox SET state = 'pending', attempts = attempts - 1, claim = NULL, "
        "claimed_at = NULL, available_at = ? WHERE task_id = ?",
        (now, task_id),
    )
    return True


def recover_claims(connection: apsw.Connection, name: str, now: float) -> int:
    """Crash recovery at activation: every ``running`` task of ``name`` lost its claim with
    the previous incarnation; put it back to ``pending`` (available now), or ``failed`` when
    its attempts are used up.  Returns how many tasks were recovered (either way)."""
    tasks = [
        _task(row) for row in connection.execute(
            f"SELECT {_columns} FROM character_outbox WHERE name = ? AND state = 'running'",
            (name,),
        )
    ]
    for task in tasks:
        if task.attempts >= task.attempts_max:
            _finish(connection, task, task_state_failed, now, "claim lost, attempts exhausted")
        else:
            connection.execute(
                "UPDATE character_outbox SET state = 'pending', claim = NULL, claimed_at = NULL, "
                "available_at = ? WHERE task_id = ?",
                (now, task.task_id),
            )
    return len(tasks)


def cancel_tasks(connection: apsw.Connection, name: str, now: float, *,
                 kinds: Iterable[str] | None = None, states: Iterable[str] = task_states_active,
                 generation_below: int | None = None) -> int:
    """Cancel ``name``'s tasks in ``states`` (default: pending and running), optionally only
    of ``kinds`` and only those registered under a generation below ``generation_below``.
    Returns how many were cancelled.  A cancelled running task's ``complete_task`` is refused."""
    wanted_states = set(states)
    if not wanted_states <= set(task_states_active):
        raise ValueError("only pending or running tasks can be cancelled")
    wanted_kinds = None if kinds is None else set(kinds)
    cancelled = 0
    for task in active_tasks(connection, name):
        if task.state not in wanted_states:
            continue
        if wanted_kinds is not None and task.kind not in wanted_kinds:
            continue
        if generation_below is not None and task.generation >= generation_below:
            continue
        _finish(connection, task, task_state_cancelled, now, None)
        cancelled += 1
    return cancelled


def _running_under(connection: apsw.Connection, task_id: str, claim: str) -> OutboxTask | None:
    task = get_task(connection, task_id)
    if task is None or task.state != task_state_running or task.claim != claim:
        return None
    return task


def _finish(connection: apsw.Connection, task: OutboxTask, state: str, now: float,
            error: str | None) -> None:
    connection.execute(
        "UPDATE character_outbox SET state = ?, claim = NULL, finished_at = ?, "
        "last_error = COALESCE(?, last_error) WHERE task_id = ?",
        (state, now, error, task.task_id),
    )
    connection.execute(
        "INSERT INTO character_profiles (name, created_at, outbox_finished_count) "
        "VALUES (?, ?, 1) ON CONFLICT (name) DO UPDATE SET "
        "outbox_finished_count = outbox_finished_count + 1",
        (task.name, now),
    )
    (count,) = connection.execute(
        "SELECT outbox_finished_count FROM character_profiles WHERE name = ?", (task.name,)
    ).fetchone()
    if count > outbox_finished_tasks_per_character_max:
        excess = count - outbox_finished_tasks_per_character_max
        # The oldest finished rows: one index range scan per finished state (each reads at
        # most ``excess`` rows), not a sort of every finished row of the character.
        per_state = " UNION ALL ".join(
            "SELECT * FROM (SELECT seq FROM character_outbox WHERE name = ?1 AND state = "
            f"'{state}' ORDER BY seq LIMIT ?2)"
            for state in task_states_finished
        )
        connection.execute(
            f"DELETE FROM character_outbox WHERE seq IN (SELECT seq FROM ({per_state}) "
            "ORDER BY seq LIMIT ?2)",
            (task.name, excess),
        )
        connection.execute(
            "UPDATE character_profiles SET outbox_finished_count = outbox_finished_count - ? "
            "WHERE name = ?",
            (excess, task.name),
        )


def cursor_get(connection: apsw.Connection, name: str, loop: str) -> int:
    """A background loop's position (0 when it never ran), e.g. the last raw row reviewed."""
    row = connection.execute(
        "SELECT position FROM character_cursors WHERE name = ? AND loop = ?", (name, loop)
    ).fetchone()
    return 0 if row is None else row[0]


def cursor_put(connection: apsw.Connection, name: str, loop: str, position: int,
               now: float) -> None:
    """Store a loop's position (write it in the same job as the work it covers)."""
    if not loop or len(loop) > cursor_loop_characters_max:
        raise ValueError("bad cursor loop name")
    connection.execute(
        "INSERT INTO character_cursors (name, loop, position, updated_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (name, loop) DO UPDATE SET position = excluded.position, "
        "updated_at = excluded.updated_at",
        (name, loop, position, now),
    )


__all__ = [
    "OutboxTask",
    "active_task_count",
    "active_tasks",
    "cancel_tasks",
    "claim_lease_seconds",
    "claim_next",
    "complete_task",
    "cursor_get",
    "cursor_loop_characters_max",
    "cursor_put",
    "fail_task",
    "get_task",
    "outbox_active_tasks_per_character_max",
    "outbox_attempts_max",
    "outbox_error_characters_max",
    "outbox_finished_tasks_per_character_max",
    "outbox_payload_bytes_max",
    "outbox_task_kinds",
    "recover_claims",
    "register_task",
    "release_claim",
    "retry_backoff_seconds",
    "retry_backoff_seconds_max",
    "task_claim",
    "task_state_cancelled",
    "task_state_done",
    "task_state_failed",
    "task_state_pending",
    "task_state_running",
    "task_states",
    "task_states_active",
    "task_states_finished",
]
