"""Neighbour expansion, pseudo-relevance feedback and entity lists (issue 14), and the limits
of their settings at and just over each boundary."""

import datetime

import pytest

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import (
    CandidateLists,
    FusionWeights,
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    RecallSettings,
    fuse_candidates,
)
from troupe.retrieval._expansion import (
    entity_terms,
    feedback_hits_max,
    feedback_terms,
    feedback_terms_max,
    neighbour_gap_seconds_max,
    neighbour_hits_max,
    neighbour_list,
    neighbour_turns_max,
)

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def around(table):
    return lambda item_id, turns: table.get(item_id, ())


def test_neighbour_list_keeps_hit_order_and_leaves_hits_out():
    table = {1: (2, 9), 2: (3, 1), 5: (6, 4)}
    assert neighbour_list([1, 2, 5], around(table), 1) == [9, 3, 6, 4]


def test_neighbours_of_strong_hits_get_their_own_list():
    lists = CandidateLists(text=[1, 2, 3, 4], context=[1, 2, 3, 4])
    off = fuse_candidates(lists, FusionWeights(), around({1: (7,)}))
    assert 7 not in dict(off.ranking) and [entry.name for entry in off.lists] == ["text", "context"]
    on = fuse_candidates(lists, FusionWeights(neighbour_weight=0.5, neighbour_hits=1), around({1: (7,)}))
    assert dict(on.ranking)[7] == pytest.approx(0.5 / 61)
    assert on.lists[-1].name == "neighbour" and list(on.lists[-1].keys) == [7]


def test_speaker_list_follows_the_fused_order():
    lists = CandidateLists(text=[1, 2, 3], context=[1, 2, 3], said=frozenset({3, 2}))
    fused = fuse_candidates(lists, FusionWeights(speaker_weight=1.0))
    assert list(fused.lists[-1].keys) == [2, 3]
    assert fused.ranking[0][0] == 2


def test_feedback_terms_are_shared_by_hits_and_new_to_the_query():
    hits = ["tents by the lake", "the lake and the tents, camping", "a lake cabin", "violin"]
    assert feedback_terms(hits, ["camping"], terms_max=5) == ["lake", "tents"]
    assert feedback_terms(hits, ["camping"], terms_max=1) == ["lake"]
    assert feedback_terms(["one lake", "two rivers"], [], terms_max=5) == []
    feedback_terms(hits, [], terms_max=feedback_terms_max)
    with pytest.raises(AssertionError):
        feedback_terms(hits, [], terms_max=feedback_terms_max + 1)


def test_entity_terms_are_capitalised_non_speaker_words():
    terms = ["melanie", "sweden", "visit", "when"]
    assert entity_terms("When did Melanie visit Sweden?", terms, ["melanie"]) == ["sweden"]
    assert entity_terms("Sweden is far", ["sweden", "far"], []) == []


@pytest.mark.parametrize(
    ("field", "limit"),
    [("feedback_hits", feedback_hits_max), ("feedback_terms", feedback_terms_max),
     ("neighbour_hits", neighbour_hits_max), ("neighbour_turns", neighbour_turns_max)],
)
def test_settings_limits_at_and_over_the_boundary(field, limit):
    RecallSettings(**{field: limit})
    with pytest.raises(AssertionError):
        RecallSettings(**{field: limit + 1})
    with pytest.raises(AssertionError):
        RecallSettings(**{field: 0})


@pytest.mark.parametrize("field", ["neighbour_weight", "feedback_weight", "entity_weight"])
def test_settings_weights_are_not_negative(field):
    RecallSettings(**{field: 0.0})
    with pytest.raises(AssertionError):
        RecallSettings(**{field: -0.1})


def item(key: str, text: str, seconds: float, tenant: str = "t") -> MemoryItem:
    return MemoryItem(key, text, tenant, base + datetime.timedelta(seconds=seconds))


async def test_neighbours_are_adjacent_allowed_items_of_the_same_sitting(engine):
    settings = RecallSettings(neighbour_weight=0.3, expansions_without_context=True)
    index = await MemoryIndex.open(engine, settings=settings)
    gap = neighbour_gap_seconds_max
    ids = await index.add([item("a", "one", 0), item("b", "two", 1), item("c", "three", 2),
                           item("d", "four", 2 + gap + 1)])
    other = await index.add([item("x", "other tenant", 3, tenant="u")])
    lists, neighbours_of = await index.recall_candidates("two", recall_filter=RecallFilter("t"))
    a, b, c, d = ids
    assert list(neighbours_of(b, 1)) == [c, a]
    assert list(neighbours_of(c, 1)) == [b]  # d is another sitting (just over the gap)
    assert list(neighbours_of(c, 2)) == [b, a]
    assert other[0] not in neighbours_of(c, 8)
    assert list(neighbours_of(other[0], 1)) == []  # not allowed by this filter


async def test_feedback_finds_an_item_by_the_words_of_the_first_hits(engine):
    settings = RecallSettings(feedback_weight=1.0, feedback_hits=2, expansions_without_context=True)
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder(), settings=settings)
    await index.add([
        item("camp1", "went camping, tents by the lake", 0),
        item("camp2", "camping again: tents at the lake", 10),
        item("target", "we pitched our tents near the lake", 20),
        item("noise", "the violin concert was long", 30),
    ])
    result = await index.recall("camping", recall_filter=RecallFilter("t"))
    ranks = {hit.key: hit.ranks for hit in result.hits}
    assert "feedback" in ranks["target"] and "text" not in ranks["target"]
    plain = await index.recall("camping", recall_filter=RecallFilter("t"),
                               settings=RecallSettings(feedback_weight=1.0))  # facts: off
    assert all("feedback" not in hit.ranks for hit in plain.hits)


async def test_entity_list_ranks_by_the_names_alone(engine):
    settings = RecallSettings(entity_weight=1.0, expansions_without_context=True)
    index = await MemoryIndex.open(engine, settings=settings)
    await index.add([item("a", "a trip to Sweden", 0), item("b", "a trip to the beach", 1)])
    result = await index.recall("When was the trip to Sweden?", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "a" and result.hits[0].ranks.get("entity") == 1


async def test_in_a_conversation_only_turns_are_neighbours(engine):
    index = await MemoryIndex.open(engine, settings=RecallSettings(neighbour_weight=0.3))
    ids = await index.add([
        MemoryItem("a", "one", "t", base, context="x"),
        MemoryItem("b", "two", "t", base + datetime.timedelta(seconds=1)),
        MemoryItem("c", "three", "t", base + datetime.timedelta(seconds=2), context="y"),
    ])
    _, neighbours_of = await index.recall_candidates("one", recall_filter=RecallFilter("t"))
    assert list(neighbours_of(ids[0], 2)) == [ids[2]]
    assert list(neighbours_of(ids[1], 1)) == []


async def test_expansions_are_off_by_default(engine):
    settings = RecallSettings()
    assert (settings.neighbour_weight, settings.feedback_weight, settings.entity_weight) == (0, 0, 0)
    index = await MemoryIndex.open(engine)
    await index.add([MemoryItem("a", "one", "t", base, context="x")])
    _, neighbours_of = await index.recall_candidates("one", recall_filter=RecallFilter("t"))
    assert list(neighbours_of(1, 1)) == []
