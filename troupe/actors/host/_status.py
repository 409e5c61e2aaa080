"""``GET /status``: a read-only snapshot of learning, the backlog and the model's health.

Why a read and not an actor: status is a diagnosis, polled often; one read transaction gives
a consistent snapshot of every entry at once, and no actor's mailbox waits behind it.  Status
never recalls or strengthens anything.

Scope: ``entries``, ``backlog`` and ``batches`` only cover entries the token may reach (the
filter runs before anything is counted); ``usage`` and ``model_health`` are global figures (the
contract: the global usage and the per-entry details have different ranges).

Bounds: ``batches`` holds every waiting / running batch plus, per entry, the
``finished_batches_per_entry`` most recent finished ones (highest ids), returned ascending by
id; ``entries`` lists at most ``status_entries_max`` entries (by entry id).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

import apsw

from troupe.auth import TokenScope

from ._batches import batch_states_finished, batch_states_open, model_state, model_usage
from ._schema import learning_state_batched, learning_state_pending

finished_batches_per_entry = 20
status_entries_max = 10_000

_batch_columns = (
    "id, entry_id, state, trigger, message_count, first_message_id, last_message_id, created_at, "
    "started_at, finished_at, attempts, reason, result_json"
)


def _time(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="milliseconds")


def batch_document(row: tuple) -> dict[str, Any]:
    (batch_id, entry_id, state, trigger, message_count, first_id, last_id, created_at, started_at,
     finished_at, attempts, reason, result_json) = row
    return {
        "id": batch_id,
        "entry_id": entry_id,
        "state": state,
        "trigger": trigger,
        "message_count": message_count,
        "first_message_id": first_id,
        "last_message_id": last_id,
        "created_at": _time(created_at),
        "started_at": _time(started_at),
        "finished_at": _time(finished_at),
        "attempts": attempts,
        "reason": reason,
        "result": json.loads(result_json) if result_json else None,
    }


def _marks(values: tuple) -> str:
    return ", ".join("?" for _ in values)


def status_batches(connection: apsw.Connection, scope: TokenScope) -> list[dict[str, Any]]:
    """Open batches plus each entry's last finished ones, within ``scope``, ascending by id."""
    rows = connection.execute(
        f"SELECT {_batch_columns} FROM host_batches WHERE state IN ({_marks(batch_states_open)}) "
        f"UNION ALL SELECT {_batch_columns} FROM (SELECT *, row_number() OVER "
        "(PARTITION BY entry_id ORDER BY id DESC) AS recent FROM host_batches "
        f"WHERE state IN ({_marks(batch_states_finished)})) WHERE recent <= ? ORDER BY id",
        (*batch_states_open, *batch_states_finished, finished_batches_per_entry),
    )
    return [batch_document(row) for row in rows if scope.allows(row[1])]


def _entry_counts(connection: apsw.Connection) -> dict[str, dict[str, Any]]:
    counts: dict[str, dict[str, Any]] = {}
    for entry_id, state, count, oldest, newest in connection.execute(
        "SELECT entry_id, learning_state, count(*), min(received_at), max(received_at) FROM host_messages "
        "WHERE learning_state IN (?, ?) GROUP BY entry_id, learning_state",
        (learning_state_pending, learning_state_batched),
    ):
        entry = counts.setdefault(entry_id, {"pending": 0, "batched": 0, "oldest": None, "newest": None})
        entry[state] = count
        entry["oldest"] = oldest if entry["oldest"] is None else min(entry["oldest"], oldest)
        entry["newest"] = newest if entry["newest"] is None else max(entry["newest"], newest)
    return counts


def status_document(
    connection: apsw.Connection,
    scope: TokenScope,
    now: float,
    *,
    model_name: str,
    timeouts_seconds: Mapping[str, float],
) -> dict[str, Any]:
    batches = status_batches(connection, scope)
    counts = _entry_counts(connection)
    current: dict[str, dict] = {}
    latest: dict[str, dict] = {}
    for batch in batches:
        target = current if batch["state"] in batch_states_open else latest
        target.setdefault(batch["entry_id"], batch)  # the oldest open one is the current one
        if batch["state"] not in batch_states_open:
            latest[batch["entry_id"]] = batch  # ascending ids: the last one wins
    entries = []
    for entry_id, name, kind, pace_name, count, idle_seconds, max_wait_seconds in connection.execute(
        "SELECT entry_id, name, kind, pace_name, pace_count, pace_idle_seconds, pace_max_wait_seconds "
        "FROM host_entries ORDER BY entry_id"
    ):
        if not scope.allows(entry_id):
            continue
        if len(entries) >= status_entries_max:
            break
        figures = counts.get(entry_id, {"pending": 0, "batched": 0, "oldest": None, "newest": None})
        entries.append({
            "entry_id": entry_id,
            "name": name,
            "kind": kind,
            "pace": {"name": pace_name, "count": count, "idle_seconds": idle_seconds,
                     "max_wait_seconds": max_wait_seconds},
            "pending_count": figures["pending"] + figures["batched"],
            "pending_messages": figures["pending"],
            "batched_messages": figures["batched"],
            "oldest_unlearned_received_at": _time(figures["oldest"]),
            "newest_unlearned_received_at": _time(figures["newest"]),
            "current_batch": current.get(entry_id),
            "latest_batch": latest.get(entry_id),
        })
    in_scope = [figures | {"entry_id": entry_id} for entry_id, figures in counts.items() if scope.allows(entry_id)]
    oldest = [figures["oldest"] for figures in in_scope if figures["oldest"] is not None]
    newest = [figures["newest"] for figures in in_scope if figures["newest"] is not None]
    backlog = {
        "entries_with_backlog": len(in_scope),
        "pending_messages": sum(figures["pending"] for figures in in_scope),
        "batched_messages": sum(figures["batched"] for figures in in_scope),
        "waiting_batches": sum(1 for batch in batches if batch["state"] == "waiting"),
        "running_batches": sum(1 for batch in batches if batch["state"] == "running"),
        "oldest_received_at": _time(min(oldest)) if oldest else None,
        "newest_received_at": _time(max(newest)) if newest else None,
        "time_basis": "received_at",
    }
    model = model_state(connection)
    paused = bool(model.get("paused"))
    model_health = {
        "model": model_name,
        "state": "paused" if paused else "available",
        "paused": paused,
        "reason": model.get("reason") if paused else None,
        "paused_since": _time(model.get("paused_since")) if paused else None,
        "last_error": model.get("last_error"),
        "last_failure_at": _time(model.get("last_failure_at")),
        "last_success_at": _time(model.get("last_success_at")),
    }
    return {
        "health": "degraded" if paused else "ok",
        "time": _time(now),
        "model_health": model_health,
        "usage": model_usage(connection, now),
        "timeouts_seconds": dict(timeouts_seconds),
        "entries": entries,
        "backlog": backlog,
        "batches": batches,
    }


__all__ = ["batch_document", "finished_batches_per_entry", "status_batches", "status_document", "status_entries_max"]
