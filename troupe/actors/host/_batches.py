"""Learning batches in storage: closing an entry's pending messages, claiming, finishing.

Why plain functions on a connection: every step of a batch's life must commit together with
what it implies, in the transaction of the actor that owns the step.  The entry actor closes a
batch (``pending`` messages become ``batched``, the batch row is ``waiting``) and, in the same
transaction, writes the durable ``claim`` reminder of the learner that will run it, so a
batch is never closed without someone being due to run it.  The learner claims it
(``running``), then finishes it (``succeeded`` / ``abandoned`` / ``refused``, messages
``learned`` or ``failed``) or releases it back to ``waiting`` when the model is paused.

A batch is assigned to one learner when it is closed: ``learner_key_for(entry_id)``, so the
batches of one entry are learned one after the other, in id order, by the same learner.  A
``running`` batch found by its learner after a restart is simply run again (it was claimed by
the previous life of that learner).

A batch's memories and its ``succeeded`` mark commit in one transaction (the memory store's
``in_transaction`` hook), so a crash either leaves the batch open to run again with no memory
stored, or finished with all of them: memories are never stored twice.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.storage import reminder_delete, reminder_set, state_get, state_put

from ._schema import learning_state_batched, learning_state_pending

batch_state_waiting = "waiting"
batch_state_running = "running"
batch_state_succeeded = "succeeded"
batch_state_abandoned = "abandoned"
batch_state_refused = "refused"
batch_states_open = (batch_state_waiting, batch_state_running)
batch_states_finished = (batch_state_succeeded, batch_state_abandoned, batch_state_refused)

learning_state_learned = "learned"
learning_state_failed = "failed"
"""Messages of an abandoned or refused batch: not learned, not pending either (the failure is
the batch's result)."""

trigger_count = "count"
trigger_idle = "idle"
trigger_max_wait = "max_wait"
trigger_learn = "learn"

learner_kind_name = "learner"
learner_workers_max = 2
"""Learners (actors ``("learner", "0")`` …): at most this many batches run at once."""
claim_reminder_name = "claim"
pace_reminder_name = "pace"

batch_messages_max = 2_000
"""Most messages one batch can hold: the pace count (≤ 1000) reached by one post of ≤ 1000."""

model_state_kind = "host"
model_state_key = "learning.model"
"""Where the learners keep the model's health (paused, last error, last success)."""

assert learner_workers_max >= 1


def learner_key_for(entry_id: str) -> str:
    """The learner that runs ``entry_id``'s batches (stable across processes)."""
    return str(zlib.crc32(entry_id.encode("utf-8")) % learner_workers_max)


@dataclass(frozen=True)
class ClosedBatch:
    batch_id: int
    learner_key: str
    message_count: int


@dataclass(frozen=True)
class PendingSummary:
    count: int
    oldest_received_at: float | None
    newest_received_at: float | None


def pending_summary(connection: apsw.Connection, entry_id: str) -> PendingSummary:
    count, oldest, newest = connection.execute(
        "SELECT count(*), min(received_at), max(received_at) FROM host_messages "
        "WHERE entry_id = ? AND learning_state = ?",
        (entry_id, learning_state_pending),
    ).fetchone()
    return PendingSummary(int(count), oldest, newest)


def close_batch(connection: apsw.Connection, entry_id: str, trigger: str, now: float) -> ClosedBatch | None:
    """All of ``entry_id``'s pending messages become one ``waiting`` batch, and its learner's
    ``claim`` reminder is written (due now).  None when nothing is pending."""
    rows = connection.execute(
        "SELECT id FROM host_messages WHERE entry_id = ? AND learning_state = ? ORDER BY id",
        (entry_id, learning_state_pending),
    ).fetchall()
    if not rows:
        return None
    assert len(rows) <= batch_messages_max, len(rows)
    learner_key = learner_key_for(entry_id)
    connection.execute(
        "INSERT INTO host_batches (entry_id, state, learner_key, trigger, message_count, "
        "first_message_id, last_message_id, created_at, attempts) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
        (entry_id, batch_state_waiting, learner_key, trigger, len(rows), rows[0][0], rows[-1][0], now),
    )
    batch_id = connection.last_insert_rowid()
    connection.execute(
        "UPDATE host_messages SET learning_state = ?, batch_id = ? WHERE entry_id = ? AND learning_state = ?",
        (learning_state_batched, batch_id, entry_id, learning_state_pending),
    )
    reminder_set(connection, learner_kind_name, learner_key, claim_reminder_name, now, None)
    return ClosedBatch(batch_id, learner_key, len(rows))


def clear_pace_reminder(connection: apsw.Connection, entry_kind: str, entry_id: str) -> None:
    reminder_delete(connection, entry_kind, entry_id, pace_reminder_name)


def set_pace_reminder(connection: apsw.Connection, entry_kind: str, entry_id: str, due_wall: float) -> None:
    reminder_set(connection, entry_kind, entry_id, pace_reminder_name, due_wall, {"due": due_wall})


@dataclass(frozen=True)
class ClaimedBatch:
    batch_id: int
    entry_id: str
    attempts: int
    message_ids: tuple[int, ...]


def claim_batch(connection: apsw.Connection, learner_key: str, now: float) -> ClaimedBatch | None:
    """The learner's oldest open batch, now ``running`` (a ``running`` one is from a previous
    life of this learner and runs again)."""
    placeholders = ", ".join("?" for _ in batch_states_open)
    row = connection.execute(
        f"SELECT id, entry_id, attempts FROM host_batches WHERE learner_key = ? AND state IN ({placeholders}) "
        "ORDER BY id LIMIT 1",
        (learner_key, *batch_states_open),
    ).fetchone()
    if row is None:
        return None
    batch_id, entry_id, attempts = row
    connection.execute(
        "UPDATE host_batches SET state = ?, started_at = ?, attempts = ? WHERE id = ?",
        (batch_state_running, now, attempts + 1, batch_id),
    )
    message_ids = tuple(
        message_id for (message_id,) in connection.execute(
            "SELECT id FROM host_messages WHERE batch_id = ? ORDER BY id", (batch_id,)
        )
    )
    return ClaimedBatch(batch_id, entry_id, attempts + 1, message_ids)


def open_batches_of(connection: apsw.Connection, learner_key: str) -> int:
    placeholders = ", ".join("?" for _ in batch_states_open)
    row = connection.execute(
        f"SELECT count(*) FROM host_batches WHERE learner_key = ? AND state IN ({placeholders})",
        (learner_key, *batch_states_open),
    ).fetchone()
    return int(row[0])


def release_batch(connection: apsw.Connection, batch_id: int, reason: str) -> None:
    """Back to ``waiting`` (the model is paused or failed, attempts remain)."""
    connection.execute(
        "UPDATE host_batches SET state = ?, reason = ? WHERE id = ?", (batch_state_waiting, reason, batch_id)
    )


def finish_batch(
    connection: apsw.Connection, batch_id: int, state: str, result: dict[str, Any], reason: str | None, now: float
) -> None:
    assert state in batch_states_finished, state
    connection.execute(
        "UPDATE host_batches SET state = ?, result_json = ?, reason = ?, finished_at = ? WHERE id = ?",
        (state, json.dumps(result, ensure_ascii=False, sort_keys=True), reason, now, batch_id),
    )
    message_state = learning_state_learned if state == batch_state_succeeded else learning_state_failed
    connection.execute(
        "UPDATE host_messages SET learning_state = ? WHERE batch_id = ?", (message_state, batch_id)
    )


def message_learning_states(
    connection: apsw.Connection, entry_id: str, message_ids: Iterable[int]
) -> dict[int, str]:
    """``message id → learning state`` for those of ``message_ids`` in ``entry_id``.  A message
    is ``unlearned`` (prepare's flag) unless its state is ``learned``."""
    states: dict[int, str] = {}
    ids = list(message_ids)
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        placeholders = ", ".join("?" for _ in chunk)
        for message_id, state in connection.execute(
            f"SELECT id, learning_state FROM host_messages WHERE entry_id = ? AND id IN ({placeholders})",
            (entry_id, *chunk),
        ):
            states[message_id] = state
    return states


def is_unlearned(learning_state: str) -> bool:
    return learning_state != learning_state_learned


# -- the model's health and usage ---------------------------------------------------------

usage_window_seconds = 86_400.0
model_calls_kept_seconds = 2 * usage_window_seconds


def model_state(connection: apsw.Connection) -> dict[str, Any]:
    stored = state_get(connection, model_state_kind, model_state_key)
    return dict(stored) if stored else {"paused": False, "reason": None}


def model_state_put(connection: apsw.Connection, **changes: Any) -> None:
    state = model_state(connection)
    state.update(changes)
    state_put(connection, model_state_kind, model_state_key, state)


def record_model_call(
    connection: apsw.Connection, *, at: float, seconds: float, outcome: str, purpose: str, entry_id: str
) -> None:
    """One model call (bounded history: rows older than two usage windows are dropped)."""
    connection.execute(
        "INSERT INTO host_model_calls (at, seconds, outcome, purpose, entry_id) VALUES (?, ?, ?, ?, ?)",
        (at, seconds, outcome, purpose, entry_id),
    )
    connection.execute("DELETE FROM host_model_calls WHERE at < ?", (at - model_calls_kept_seconds,))


def model_usage(connection: apsw.Connection, now: float) -> dict[str, Any]:
    """Calls in the last 24 hours (every entry), with latency figures in seconds."""
    rows = connection.execute(
        "SELECT seconds, outcome FROM host_model_calls WHERE at >= ? ORDER BY seconds",
        (now - usage_window_seconds,),
    ).fetchall()
    latencies = [seconds for seconds, _ in rows]
    failed = sum(1 for _, outcome in rows if outcome != "ok")
    return {
        "window_seconds": int(usage_window_seconds),
        "model_calls": len(rows),
        "failed_calls": failed,
        "latency_seconds": _latency(latencies),
    }


def _latency(sorted_seconds: Sequence[float]) -> dict[str, float | None]:
    if not sorted_seconds:
        return {"mean": None, "p50": None, "p95": None, "max": None}

    def quantile(share: float) -> float:
        index = min(len(sorted_seconds) - 1, int(share * len(sorted_seconds)))
        return round(sorted_seconds[index], 6)

    return {
        "mean": round(sum(sorted_seconds) / len(sorted_seconds), 6),
        "p50": quantile(0.5),
        "p95": quantile(0.95),
        "max": round(sorted_seconds[-1], 6),
    }


__all__ = [
    "ClaimedBatch",
    "ClosedBatch",
    "PendingSummary",
    "batch_messages_max",
    "batch_state_abandoned",
    "batch_state_refused",
    "batch_state_running",
    "batch_state_succeeded",
    "batch_state_waiting",
    "batch_states_finished",
    "batch_states_open",
    "claim_batch",
    "claim_reminder_name",
    "clear_pace_reminder",
    "close_batch",
    "finish_batch",
    "is_unlearned",
    "learner_key_for",
    "learner_kind_name",
    "learner_workers_max",
    "learning_state_failed",
    "learning_state_learned",
    "message_learning_states",
    "model_state",
    "model_state_put",
    "model_usage",
    "open_batches_of",
    "pace_reminder_name",
    "record_model_call",
    "release_batch",
    "set_pace_reminder",
    "trigger_count",
    "trigger_idle",
    "trigger_learn",
    "trigger_max_wait",
    "usage_window_seconds",
]
