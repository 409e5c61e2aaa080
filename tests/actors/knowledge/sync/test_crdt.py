"""The CRDT's rules as properties: any arrival order gives the same winner and the same state,
a tombstone is never undone, concurrent edits from one version resolve by the stable order."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from troupe.actors.knowledge.sync._crdt import (
    Operation,
    canonical_json,
    contiguous_counter,
    kind_tombstone,
    kind_upsert,
    merge,
    merge_all,
    missing_from,
    next_lamport,
    operation_digest,
    order_key,
    set_digest,
)

devices = ("dev_a", "dev_b", "dev_c")


def op(origin: str, counter: int, lamport: int, kind: str = kind_upsert, title: str = "t") -> Operation:
    payload = None if kind == kind_tombstone else {"title": title, "body": {"v": lamport}, "status": "ACTIVE"}
    return Operation(origin=origin, counter=counter, knowledge_id="knw_1", scope="shared:home",
                     lamport=lamport, kind=kind, clock={origin: counter}, payload=payload, created_at=1.0)


operations_strategy = st.lists(
    st.tuples(st.sampled_from(devices), st.integers(1, 6), st.sampled_from((kind_upsert, kind_upsert, kind_tombstone)),
              st.text(max_size=3)),
    min_size=1, max_size=12,
).map(lambda rows: list({(origin, counter): op(origin, counter, lamport, kind, title)
                         for origin, lamport, kind, title in rows
                         for counter in [lamport]}.values()))


@settings(max_examples=200, deadline=None)
@given(operations_strategy, st.randoms(use_true_random=False))
def test_any_arrival_order_converges_to_one_state(operations, random):
    expected = merge_all(operations)
    shuffled = list(operations)
    random.shuffle(shuffled)
    doubled = shuffled + shuffled[: len(shuffled) // 2]  # duplicates delivered again
    state = merge_all(doubled)
    assert state is not None and expected is not None
    assert state.winner == expected.winner
    assert state.clock == expected.clock
    assert state.operations == expected.operations


@settings(max_examples=200, deadline=None)
@given(operations_strategy, st.randoms(use_true_random=False))
def test_a_tombstone_is_never_undone(operations, random):
    random.shuffle(operations)
    state = None
    seen_tombstone = False
    for operation in operations:
        state, _ = merge(state, operation)
        seen_tombstone = seen_tombstone or operation.kind == kind_tombstone
        assert state.tombstone == seen_tombstone


@settings(max_examples=100, deadline=None)
@given(operations_strategy)
def test_the_winner_is_the_greatest_by_the_stable_order(operations):
    state = merge_all(operations)
    assert state is not None
    assert order_key(state.winner) == max(order_key(operation) for operation in operations)


def test_concurrent_edits_from_one_version_pick_the_same_winner_in_every_order():
    base = op("dev_a", 1, 1, title="v1")
    left = op("dev_a", 2, 2, title="left")
    right = op("dev_b", 1, 2, title="right")
    winners = {merge_all(order).winner.op_id for order in itertools.permutations([base, left, right])}
    assert winners == {"dev_b:1"}  # same lamport: the greater origin wins


def test_a_later_edit_beats_an_older_one_and_a_tombstone_beats_a_later_edit():
    old, new = op("dev_b", 1, 1), op("dev_a", 1, 2)
    assert merge_all([new, old]).winner is new
    forget = op("dev_c", 1, 1, kind=kind_tombstone)
    assert merge_all([forget, op("dev_a", 2, 9)]).winner is forget


def test_digests_are_stable_and_signatures_are_not_part_of_them():
    operation = op("dev_a", 1, 1)
    signed = Operation(**{**operation.__dict__, "signature": "c2lnbmF0dXJl"})
    assert operation_digest(operation) == operation_digest(signed)
    assert len(operation_digest(operation)) == 64
    assert Operation.decode(signed.encode()) == signed
    assert set_digest(["b", "a", "a"]) == set_digest(["a", "b"])
    assert canonical_json({"b": 1, "a": "中"}) == '{"a":"中","b":1}'.encode()


def test_decode_refuses_malformed_operations():
    good = op("dev_a", 1, 1).encode()
    for broken in ({**good, "counter": "1"}, {**good, "counter": True}, {**good, "kind": "other"},
                   {**good, "payload": None}, {key: value for key, value in good.items() if key != "scope"}):
        try:
            Operation.decode(broken)
        except ValueError:
            continue
        raise AssertionError(broken)


def test_lamport_and_version_vectors():
    assert next_lamport(None, 1) == 1
    assert next_lamport(merge_all([op("dev_a", 1, 4)]), 2) == 5
    assert next_lamport(merge_all([op("dev_a", 1, 4)]), 7) == 7
    assert contiguous_counter(2, [3, 4, 6]) == 4
    assert missing_from({"dev_a": 5, "dev_b": 1}, {"dev_a": 3, "dev_b": 1}) == {"dev_a": 3}
