"""Event-sourced actor state: an append-only CBOR journal per actor plus one snapshot.

Why: an actor that records what happened (not only where it ended up) can be replayed and
audited, and the simulator can check invariants against the records.  Recovery reads the
snapshot and the records after it, so pruning at snapshot time keeps recovery time bounded by
the snapshot interval rather than by the actor's whole history.  Trade-off: pruned records are
gone; an actor that needs its full history must snapshot with ``prune=False``.

These are plain synchronous functions of a connection, called inside ``Engine.write`` /
``Engine.read`` jobs, so several of them compose into one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apsw

from ._codec import decode, encode


@dataclass(frozen=True)
class JournalState:
    """What recovery needs: the latest snapshot (or ``None``) and the records after it."""

    snapshot: Any
    snapshot_seq: int
    records: list[tuple[int, Any]]

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest record or snapshot (0 for a new actor)."""
        return self.records[-1][0] if self.records else self.snapshot_seq


def journal_last_seq(connection: apsw.Connection, kind: str, key: str) -> int:
    """The highest sequence number used by this actor, counting pruned records."""
    row = connection.execute(
        "SELECT max("
        " coalesce((SELECT max(seq) FROM journal WHERE kind = ?1 AND key = ?2), 0),"
        " coalesce((SELECT seq FROM snapshots WHERE kind = ?1 AND key = ?2), 0))",
        (kind, key),
    ).get
    return int(row)


def journal_append(connection: apsw.Connection, kind: str, key: str, payloads: Iterable[Any]) -> int:
    """Append ``payloads`` as consecutive records; return the last sequence number used."""
    sequence = journal_last_seq(connection, kind, key)
    rows = []
    for payload in payloads:
        sequence += 1
        rows.append((kind, key, sequence, encode(payload)))
    connection.executemany(
        "INSERT INTO journal (kind, key, seq, payload) VALUES (?, ?, ?, ?)", rows
    )
    return sequence


def journal_snapshot(
    connection: apsw.Connection, kind: str, key: str, seq: int, state: Any, prune: bool = True
) -> None:
    """Record ``state`` as the actor's state after record ``seq``; optionally prune up to it."""
    last = journal_last_seq(connection, kind, key)
    if seq > last:
        raise ValueError(f"snapshot at seq {seq} is past the journal's last seq {last}")
    connection.execute(
        "INSERT INTO snapshots (kind, key, seq, state) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (kind, key) DO UPDATE SET seq = excluded.seq, state = excluded.state",
        (kind, key, seq, encode(state)),
    )
    if prune:
        connection.execute(
            "DELETE FROM journal WHERE kind = ? AND key = ? AND seq <= ?", (kind, key, seq)
        )


def journal_load(connection: apsw.Connection, kind: str, key: str) -> JournalState:
    """The actor's snapshot and the records after it, decoded strictly, in sequence order."""
    snapshot_row = connection.execute(
        "SELECT seq, state FROM snapshots WHERE kind = ? AND key = ?", (kind, key)
    ).fetchone()
    snapshot, snapshot_seq = (None, 0)
    if snapshot_row is not None:
        snapshot_seq, snapshot = snapshot_row[0], decode(snapshot_row[1])
    records = [
        (seq, decode(payload))
        for seq, payload in connection.execute(
            "SELECT seq, payload FROM journal WHERE kind = ? AND key = ? AND seq > ? ORDER BY seq",
            (kind, key, snapshot_seq),
        )
    ]
    return JournalState(snapshot=snapshot, snapshot_seq=snapshot_seq, records=records)
