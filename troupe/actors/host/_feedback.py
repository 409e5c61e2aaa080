"""``POST /feedback``: the memories a host actually used, strengthened once per recall.

Every rule is checked inside one write transaction, so that the engine's single writer
serialises two concurrent retries: the recall must exist (404), belong to the asking token
(403: recalls are per token) and be younger than 24 hours (400); every memory id must be one
this recall returned (400) and still exist (404).  Only then is each ``(recall, memory)`` pair
not yet strengthened marked and its memory's strength raised by one.  ``accepted`` lists the
request's ids (duplicates once, input order); ``strengthened`` lists those strengthened by
*this* request, so a retry answers the same ``accepted`` and an empty ``strengthened``.
An empty ``memory_ids`` (nothing was used) is accepted and strengthens nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from troupe.auth import TokenGrant

feedback_memory_ids_max = 1000


@dataclass(frozen=True)
class FeedbackApplied:
    recall_id: str
    accepted: tuple[int, ...]
    strengthened: tuple[int, ...]


@dataclass(frozen=True)
class FeedbackRefused:
    """Nothing changed.  ``reason`` is one of ``recall_not_found`` (404), ``recall_forbidden``
    (403), ``recall_expired`` (400), ``memory_not_in_recall`` (400), ``memory_not_found`` (404);
    ``positions`` are the offending indexes into ``memory_ids``."""

    reason: str
    positions: tuple[int, ...] = ()


def apply_feedback(
    connection: apsw.Connection, grant: TokenGrant, recall_id: str, memory_ids: Sequence[int], now: float
) -> FeedbackApplied | FeedbackRefused:
    """The write job (see the module docstring)."""
    assert len(memory_ids) <= feedback_memory_ids_max
    row = connection.execute(
        "SELECT token_id, expires_at FROM host_recalls WHERE recall_id = ?", (recall_id,)).fetchone()
    if row is None:
        return FeedbackRefused("recall_not_found")
    token_id, expires_at = row
    if token_id != str(grant.id):
        return FeedbackRefused("recall_forbidden")
    if now >= expires_at:
        return FeedbackRefused("recall_expired")
    returned = {
        memory_id: strengthened_at for memory_id, strengthened_at in connection.execute(
            "SELECT memory_id, strengthened_at FROM host_recall_memories WHERE recall_id = ?", (recall_id,))
    }
    outside = tuple(position for position, memory_id in enumerate(memory_ids) if memory_id not in returned)
    if outside:
        return FeedbackRefused("memory_not_in_recall", outside)
    accepted = tuple(dict.fromkeys(memory_ids))
    deleted = set()
    if accepted:
        marks = ", ".join("?" for _ in accepted)
        deleted = {memory_id for (memory_id,) in connection.execute(
            f"SELECT id FROM host_memories WHERE id IN ({marks}) AND deleted_at IS NOT NULL", accepted)}
        live = {memory_id for (memory_id,) in connection.execute(
            f"SELECT id FROM host_memories WHERE id IN ({marks})", accepted)}
        deleted |= set(accepted) - live
    if deleted:
        return FeedbackRefused(
            "memory_not_found",
            tuple(position for position, memory_id in enumerate(memory_ids) if memory_id in deleted),
        )
    strengthened = tuple(memory_id for memory_id in accepted if returned[memory_id] is None)
    for memory_id in strengthened:
        connection.execute(
            "UPDATE host_recall_memories SET strengthened_at = ? WHERE recall_id = ? AND memory_id = ?",
            (now, recall_id, memory_id))
        connection.execute("UPDATE host_memories SET strength = strength + 1 WHERE id = ?", (memory_id,))
    return FeedbackApplied(recall_id, accepted, strengthened)


__all__ = ["FeedbackApplied", "FeedbackRefused", "apply_feedback", "feedback_memory_ids_max"]
