import pytest

from troupe.retrieval import RankedList, reciprocal_rank_fusion


def test_rrf_on_hand_built_rankings():
    fused = reciprocal_rank_fusion(
        [RankedList("text", ["a", "b", "c"]), RankedList("vector", ["c", "a", "d"])],
        rank_constant=60,
    )
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [key for key, _ in fused] == ["a", "c", "b", "d"]


def test_weights_and_rank_constant():
    lists = [RankedList("text", ["a", "b"], weight=1.0), RankedList("vector", ["b", "a"], 3.0)]
    assert [key for key, _ in reciprocal_rank_fusion(lists)] == ["b", "a"]
    assert reciprocal_rank_fusion(lists, rank_constant=0)[0] == ("b", pytest.approx(1 / 2 + 3))


def test_ties_break_by_best_rank_then_list_order_and_duplicates_count_once():
    fused = reciprocal_rank_fusion(
        [RankedList("one", ["x", "x", "y"]), RankedList("two", ["y", "x"])], limit=1
    )
    assert fused == [("x", pytest.approx(1 / 61 + 1 / 62))]
    tie = reciprocal_rank_fusion([RankedList("one", ["p"]), RankedList("two", ["q"])])
    assert [key for key, _ in tie] == ["p", "q"]


def test_empty_lists():
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([RankedList("text", [])]) == []
