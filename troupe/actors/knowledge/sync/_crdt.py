"""The replication CRDT: pure functions over signed operations, with no I/O and no clock.

Why pure: the simulator, the hypothesis properties and the sync actor must all agree on who
wins, so the rules live in one place that cannot read time, randomness or storage.

The model.  Each knowledge item in a ``shared:*`` scope is a register.  A change made on a
device becomes an ``Operation``: ``(origin, counter)`` names it (``counter`` is the origin's
own sequence, 1, 2, 3, … with no gaps), ``lamport`` is the item's logical time (one more than
the highest the origin had seen for the item, and never below the item's stored version),
``clock`` is the item's version vector at the origin after the change (device → highest
counter of that device's operations on the item), and ``kind`` is ``upsert`` (the item's
title, body, status and evidence in ``payload``) or ``tombstone`` (forgotten; no payload).

Who wins (``order_key``): a tombstone beats every upsert, whatever its time (a forgotten item
is never resurrected, even by an edit made offline before the forget was heard of); among
operations of the same kind the greater ``(lamport, origin, digest)`` wins.  ``lamport`` keeps
causality (an edit made after seeing another has a greater lamport), and ``origin`` then the
operation's own SHA-256 digest break ties between concurrent edits made from the same version,
so the winner is a function of the SET of operations, never of the order they arrived in.
``merge`` is therefore commutative, associative and idempotent (the hypothesis properties in
``tests/actors/knowledge/sync/test_crdt.py`` check it).

What is signed: ``digest`` is SHA-256 over the operation's canonical JSON without its
signature; the origin signs the digest with its Ed25519 key (``_identity``).  The item's
``operation_digest`` (``/sync/state``) is ``set_digest`` over the digests of the operations
the device holds for it that no other held one covers causally (``_oplog.item_sync_state``):
two replicas holding the same operations answer the same digest, compacted or not.

Version vectors of devices (``VersionVector``) summarise what a replica holds from each origin
(the highest counter below which it holds every operation); anti-entropy compares them to find
what the other side misses (``missing_from``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

OperationKind = Literal["upsert", "tombstone"]
kind_upsert = "upsert"
kind_tombstone = "tombstone"
operation_kinds: tuple[str, ...] = (kind_upsert, kind_tombstone)
_kind_rank = {kind_upsert: 0, kind_tombstone: 1}

digest_characters = 64
"""A SHA-256 hex digest."""


def canonical_json(value: Any) -> bytes:
    """The one byte form that is hashed and signed: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


@dataclass(frozen=True)
class Operation:
    """One signed change of one knowledge item (see the module docstring)."""

    origin: str
    counter: int
    knowledge_id: str
    scope: str
    lamport: int
    kind: str
    clock: Mapping[str, int]
    payload: Mapping[str, Any] | None
    created_at: float
    signature: str = ""

    def __post_init__(self) -> None:
        assert self.kind in operation_kinds, self.kind
        assert self.counter >= 1 and self.lamport >= 1
        assert (self.payload is None) == (self.kind == kind_tombstone)

    @property
    def op_id(self) -> str:
        return f"{self.origin}:{self.counter}"

    def unsigned(self) -> dict[str, Any]:
        """The signed content: everything but the signature."""
        return {
            "origin": self.origin, "counter": self.counter, "knowledge_id": self.knowledge_id,
            "scope": self.scope, "lamport": self.lamport, "kind": self.kind,
            "clock": dict(sorted(self.clock.items())), "payload": self.payload,
            "created_at": self.created_at,
        }

    def encode(self) -> dict[str, Any]:
        return {**self.unsigned(), "signature": self.signature}

    @classmethod
    def decode(cls, document: Mapping[str, Any]) -> Operation:
        """An operation from its ``encode()``; raises ``ValueError`` on anything malformed."""
        try:
            clock = {str(key): int(value) for key, value in dict(document["clock"]).items()}
            payload = document["payload"]
            operation = cls(
                origin=_text(document["origin"]), counter=_integer(document["counter"]),
                knowledge_id=_text(document["knowledge_id"]), scope=_text(document["scope"]),
                lamport=_integer(document["lamport"]), kind=_text(document["kind"]), clock=clock,
                payload=None if payload is None else dict(payload),
                created_at=float(document["created_at"]), signature=_text(document.get("signature", "")),
            )
        except (KeyError, TypeError, AssertionError) as exc:
            raise ValueError("malformed operation") from exc
        return operation


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("not an integer")
    return value


def operation_digest(operation: Operation) -> str:
    """SHA-256 (hex) of the operation's canonical JSON without its signature."""
    return hashlib.sha256(canonical_json(operation.unsigned())).hexdigest()


def digest_and_document(operation: Operation) -> tuple[str, bytes]:
    """The operation's digest and its stored document (``canonical_json(encode())``) from ONE
    encoding: ``"signature"`` sorts after every other key, so the signed document is the
    unsigned one with the signature spliced in before its closing brace."""
    unsigned = canonical_json(operation.unsigned())
    document = unsigned[:-1] + b',"signature":' + canonical_json(operation.signature) + b"}"
    return hashlib.sha256(unsigned).hexdigest(), document


OrderKey = tuple[int, int, str, str]


def order_key(operation: Operation, digest: str | None = None) -> OrderKey:
    """The stable total order: greater wins (tombstones first, then lamport, origin, digest)."""
    return (_kind_rank[operation.kind], operation.lamport, operation.origin,
            digest if digest is not None else operation_digest(operation))


def wins(candidate: Operation, current: Operation) -> bool:
    """Whether ``candidate`` replaces ``current`` as the item's winner."""
    return order_key(candidate) > order_key(current)


def clock_merge(left: Mapping[str, int], right: Mapping[str, int]) -> dict[str, int]:
    """The pointwise maximum of two version vectors (sorted by device)."""
    merged = dict(left)
    for device, counter in right.items():
        merged[device] = max(merged.get(device, 0), counter)
    return dict(sorted(merged.items()))


@dataclass(frozen=True)
class ItemState:
    """A replica's CRDT state of one item: the winner, the merged clock, how many operations."""

    knowledge_id: str
    winner: Operation
    winner_digest: str
    clock: Mapping[str, int] = field(default_factory=dict)
    operations: int = 1

    @property
    def tombstone(self) -> bool:
        return self.winner.kind == kind_tombstone

    @property
    def lamport(self) -> int:
        return self.winner.lamport


def merge(state: ItemState | None, operation: Operation, digest: str | None = None) -> tuple[ItemState, bool]:
    """Fold one NEW operation (the caller dedupes by ``op_id``) into an item's state; returns
    the state and whether the operation became the winner (then it is materialised).
    ``digest``: the operation's, when the caller has it already."""
    digest = digest or operation_digest(operation)
    if state is None:
        return ItemState(operation.knowledge_id, operation, digest, clock_merge({}, operation.clock)), True
    assert state.knowledge_id == operation.knowledge_id
    clock = clock_merge(state.clock, operation.clock)
    won = order_key(operation, digest) > order_key(state.winner, state.winner_digest)
    winner, winner_digest = (operation, digest) if won else (state.winner, state.winner_digest)
    return ItemState(state.knowledge_id, winner, winner_digest, clock, state.operations + 1), won


def merge_all(operations: Iterable[Operation]) -> ItemState | None:
    """The state a set of operations of one item converges to (duplicates by ``op_id`` count
    once)."""
    state: ItemState | None = None
    seen: set[str] = set()
    for operation in operations:
        if operation.op_id in seen:
            continue
        seen.add(operation.op_id)
        state, _ = merge(state, operation)
    return state


def next_lamport(state: ItemState | None, stored_version: int) -> int:
    """The lamport of a new local change: above everything seen for the item and never below
    the version the store already shows."""
    seen = 0 if state is None else state.lamport
    return max(seen + 1, stored_version)


def set_digest(digests: Iterable[str]) -> str:
    """SHA-256 over the sorted operation digests of an item: equal sets, equal digests."""
    hasher = hashlib.sha256()
    for digest in sorted(set(digests)):
        hasher.update(digest.encode())
    return hasher.hexdigest()


VersionVector = Mapping[str, int]
"""Device → the highest counter below which this replica holds every operation of it."""


def contiguous_counter(current: int, held: Iterable[int]) -> int:
    """Advance a contiguous counter over the counters held beyond it."""
    pending = set(held)
    while current + 1 in pending:
        current += 1
    return current


def missing_from(ours: VersionVector, theirs: VersionVector) -> dict[str, int]:
    """For each origin where we hold more than they do: the counter they hold up to (we send
    them our operations of that origin above it)."""
    return {origin: theirs.get(origin, 0) for origin, counter in sorted(ours.items())
            if counter > theirs.get(origin, 0)}


def content_hash(title: str, body: Any, status: str) -> str:
    """What a local row says, hashed: the capture compares it to the last materialised one."""
    return hashlib.sha256(canonical_json({"title": title, "body": body, "status": status})).hexdigest()


__all__ = [
    "ItemState",
    "Operation",
    "OperationKind",
    "OrderKey",
    "VersionVector",
    "canonical_json",
    "clock_merge",
    "content_hash",
    "contiguous_counter",
    "digest_and_document",
    "digest_characters",
    "kind_tombstone",
    "kind_upsert",
    "merge",
    "merge_all",
    "missing_from",
    "next_lamport",
    "operation_digest",
    "operation_kinds",
    "order_key",
    "set_digest",
    "wins",
]
