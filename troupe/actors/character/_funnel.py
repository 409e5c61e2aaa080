"""The funnel: a durable per-character log of memory state transitions and its ten counters.

Why a log and not ten counters: ``/api/memory/funnel/{name}`` asks how many transitions
happened over an arbitrary ``[since, until]`` window, which only timestamped events can
answer.  Every event is appended by the store function that makes the transition, inside the
same write job (hence the same transaction): a fact that was added always has its
``facts_added`` event and an event never describes a transition that rolled back.  Callers
outside the store (a background worker that counts something itself) use ``record_event``
inside their own write job for the same reason.

Trade-offs: one row per event (``amount`` lets a batch be one row: ``add_facts`` of 5 facts is
one ``facts_added`` row of amount 5).  The log is bounded per character
(``funnel_events_per_character_max``): beyond it the oldest rows are pruned, so a window that
reaches back further than the retained log under-counts; at one event per turn that is years
of history.  The per-character row count lives in ``character_profiles.events_count`` so the
bound costs no ``COUNT(*)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

funnel_event_kinds = (
    "facts_added",
    "reflections_synthesized",
    "reflections_confirmed",
    "reflections_promoted",
    "reflections_merged",
    "reflections_denied",
    "reflections_archived",
    "persona_entries_added",
    "persona_entries_rewritten",
    "persona_entries_archived",
)
"""The ten counters, in the contract's order (``counts`` keeps this order)."""

funnel_events_per_character_max = 100_000
"""Events kept per character (the newest); older rows are pruned at append."""
funnel_subject_characters_max = 256
"""A subject id longer than this is a caller bug (ids are short)."""
funnel_amount_max = 100_000
"""One event row may stand for at most this many transitions (a batch)."""
funnel_default_window_seconds = 7 * 24 * 3600.0
"""The contract's default window: the last seven days."""
assert funnel_amount_max <= 10 * funnel_events_per_character_max


@dataclass(frozen=True)
class FunnelEvent:
    """One logged transition.  ``at`` is wall-clock seconds; ``subject_id`` the fact,
    reflection or persona entry it concerns ("" for a batch)."""

    seq: int
    name: str
    kind: str
    at: float
    subject_id: str
    amount: int


def record_event(connection: apsw.Connection, name: str, kind: str, at: float,
                 subject_id: str = "", amount: int = 1) -> None:
    """Append one event inside the caller's write job (prunes the oldest beyond the bound).

    An unknown kind, a negative amount or an over-long subject is our own bug: ``ValueError``
    fails the job, so the transition it belongs to rolls back with it.
    """
    if kind not in funnel_event_kinds:
        raise ValueError(f"unknown funnel event kind {kind!r}")
    if not 1 <= amount <= funnel_amount_max:
        raise ValueError(f"funnel amount must be in 1..{funnel_amount_max}")
    if len(subject_id) > funnel_subject_characters_max:
        raise ValueError("funnel subject id too long")
    connection.execute(
        "INSERT INTO character_events (name, kind, at, subject_id, amount) VALUES (?, ?, ?, ?, ?)",
        (name, kind, at, subject_id, amount),
    )
    connection.execute(
        "INSERT INTO character_profiles (name, created_at, events_count) VALUES (?, ?, 1) "
        "ON CONFLICT (name) DO UPDATE SET events_count = events_count + 1",
        (name, at),
    )
    (count,) = connection.execute(
        "SELECT events_count FROM character_profiles WHERE name = ?", (name,)
    ).fetchone()
    if count > funnel_events_per_character_max:
        excess = count - funnel_events_per_character_max
        connection.execute(
            "DELETE FROM character_events WHERE seq IN (SELECT seq FROM character_events "
            "WHERE name = ? ORDER BY seq LIMIT ?)",
            (name, excess),
        )
        connection.execute(
            "UPDATE character_profiles SET events_count = events_count - ? WHERE name = ?",
            (excess, name),
        )


def funnel_counts(connection: apsw.Connection, name: str, since: float,
                  until: float) -> dict[str, int]:
    """The ten counters over ``since <= at <= until`` (both ends inclusive), every key
    present (0 when nothing happened, also for an unknown character).  ``since > until`` is
    the caller's job to refuse (400); here it simply counts nothing."""
    counts = dict.fromkeys(funnel_event_kinds, 0)
    rows = connection.execute(
        "SELECT kind, SUM(amount) FROM character_events WHERE name = ? AND at >= ? AND at <= ? "
        "GROUP BY kind",
        (name, since, until),
    )
    for kind, total in rows:
        if kind in counts:
            counts[kind] = int(total)
    return counts


def read_events(connection: apsw.Connection, name: str, after_seq: int = 0,
                limit: int = 1000) -> list[FunnelEvent]:
    """Events after ``after_seq`` in append order (at most ``limit``; for diagnostics and
    the simulator's checker)."""
    return [
        FunnelEvent(seq, event_name, kind, at, subject_id, amount)
        for seq, event_name, kind, at, subject_id, amount in connection.execute(
            "SELECT seq, name, kind, at, subject_id, amount FROM character_events "
            "WHERE name = ? AND seq > ? ORDER BY seq LIMIT ?",
            (name, after_seq, limit),
        )
    ]


__all__ = [
    "FunnelEvent",
    "funnel_amount_max",
    "funnel_counts",
    "funnel_default_window_seconds",
    "funnel_event_kinds",
    "funnel_events_per_character_max",
    "funnel_subject_characters_max",
    "read_events",
    "record_event",
]
