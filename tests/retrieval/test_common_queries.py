"""Common queries (``RecallSettings.common_query_scored_rows``): in a large store, when every
matching term of a recall's text query is in more than ``common_query_term_share_min`` of the
items, its bm25 lists rank only the newest matches, each exactly as a full ranking scores it
(bm25's document frequencies still count the whole table), and the window grows until it
yields enough allowed hits; when rarer terms match too, the common ones leave the query.
Small stores and ``None`` rank every match as before.  Also: time-only recall's partial
sort gives the full sort's answer."""

import datetime
import random

import numpy
import pytest
from pyroaring import BitMap

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter, RecallSettings, _store
from troupe.retrieval import _memory_index as memory_index_module
from troupe.retrieval._filters import FacetBitmaps

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
words = ["寿司", "火锅", "咖啡", "披萨"]


def rows(count: int) -> list[_store.ItemRow]:
    """Every item names 寿司 or 火锅 (each in half of them); lengths vary, so bm25 differs."""
    return [
        _store.ItemRow(
            key=f"item-{number}",
            tenant="t",
            scope="s",
            kind="",
            speaker="",
            visibility=frozenset(),
            text=f"第{number}次说喜欢{words[number % 2]}" + "，真的" * (number % 5),
            context="",
            time_words="",
            created_at=1_700_000_000.0 + number,
            event_start=None,
            event_end=None,
        )
        for number in range(count)
    ]


def full_ranking(connection, expression: str) -> list[int]:
    return _store.text_search(connection, expression, allowed=None, depth=10_000)


def test_a_bounded_search_ranks_the_newest_matches_exactly(connection):
    ids = _store.insert_items(connection, rows(300))
    expression = '"寿司"'  # ids 1, 3, 5, ... (150 matches)
    matches = sorted((item_id for item_id in ids if item_id % 2 == 1), reverse=True)
    assert _store.newest_match_bound(connection, expression, 150) == matches[149]
    assert _store.newest_match_bound(connection, expression, 151) is None  # one over: fewer match
    everything = full_ranking(connection, expression)
    for window in (20, 60, 149):
        bounded = _store.text_search(connection, expression, allowed=None, depth=15, scored_rows=window)
        lowest = matches[window - 1]
        assert bounded == [item_id for item_id in everything if item_id >= lowest][:15]
    # At the number of matches (and above) the bound admits every match: the full ranking.
    for window in (150, 151, 10_000):
        assert _store.text_search(connection, expression, allowed=None, depth=15, scored_rows=window) == everything[:15]
    assert _store.text_search(connection, expression, allowed=None, depth=15, scored_rows=None) == everything[:15]


def test_the_window_grows_until_enough_allowed_hits(connection):
    ids = _store.insert_items(connection, rows(300))
    expression = '"寿司"'
    everything = full_ranking(connection, expression)
    # Only old items are allowed: the newest 20 matches hold none of them.
    allowed = BitMap(item_id for item_id in ids if item_id <= 100)
    found = _store.text_search(
        connection, expression, allowed=allowed, depth=10, candidates=300, scored_rows=20
    )
    assert len(found) == 10 and all(item_id in allowed for item_id in found)
    # The window that yielded them ranks exactly: each hit's order is the full ranking's.
    assert found == sorted(found, key=everything.index)
    lists = _store.text_search_lists(
        connection, expression, allowed=allowed, depth=10,
        column_weights=[(1.0, 0.15, 0.5), (1.0, 0.5, 0.5)], facet_expression=None,
        candidates=300, scored_rows=20,
    )
    assert all(len(found_list) == 10 and all(i in allowed for i in found_list) for found_list in lists)
    # Unbounded, with every item allowed: the single scan equals the per-list search.
    every = BitMap(ids)
    single = _store.text_search_lists(
        connection, expression, allowed=every, depth=10,
        column_weights=[(1.0, 0.15, 0.5), (1.0, 0.5, 0.5)], facet_expression=None,
        candidates=300, scored_rows=40,
    )
    assert single[0] == _store.text_search(
        connection, expression, allowed=every, depth=10, column_weights=(1.0, 0.15, 0.5),
        candidates=300, scored_rows=40,
    )


def items(count: int, first: int = 0) -> list[MemoryItem]:
    made = []
    for number in range(first, first + count):
        word = "鳗鱼" if number == 3 else words[number % 2]
        made.append(MemoryItem(
            key=f"fact-{number}",
            text=f"第{number}次说喜欢{word}" + "，真的" * (number % 5),
            tenant="character:小天",
            created_at=base + datetime.timedelta(minutes=number),
        ))
    return made


bounded = RecallSettings(candidate_depth=5, common_query_scored_rows=8, vector_weight=0.0)
unbounded = RecallSettings(candidate_depth=5, common_query_scored_rows=None, vector_weight=0.0)


async def keys(index: MemoryIndex, query: str, settings: RecallSettings) -> list[str]:
    result = await index.recall(query, recall_filter=RecallFilter("character:小天"), limit=5, settings=settings)
    return [hit.key for hit in result.hits]


@pytest.fixture
def small_minimum(monkeypatch):
    monkeypatch.setattr(memory_index_module, "common_query_items_min", 40)


async def test_only_large_stores_and_common_queries_are_bounded(engine, small_minimum):
    index = await MemoryIndex.open(engine)
    await index.add(items(39))  # one below the minimum: every match ranked
    assert await keys(index, "寿司", bounded) == await keys(index, "寿司", unbounded)
    await index.add(items(1, first=39))  # at the minimum
    full, newest = await keys(index, "寿司", unbounded), await keys(index, "寿司", bounded)
    assert full != newest
    # The newest 8 of the 20 matches (ids 40, 38, ... 26) are ranked, each as it scores in full.
    assert all(int(key.split("-")[1]) >= 25 for key in newest)
    result = await index.recall("寿司", recall_filter=RecallFilter("character:小天"), limit=40,
                                settings=RecallSettings(candidate_depth=40, vector_weight=0.0))
    everything = [hit.key for hit in result.hits]
    assert newest == [key for key in everything if int(key.split("-")[1]) >= 25][:5]
    # A term that matches nothing changes nothing: still bounded.
    assert await keys(index, "寿司 冲绳", bounded) == newest
    # A rarer matching term (鳗鱼: 1 of 40 items, at most 5% = 2) decides alone: the common
    # term leaves the query (its matches would only have followed the rare one's).
    assert (await keys(index, "寿司 鳗鱼", unbounded))[0] == "fact-3"
    assert await keys(index, "寿司 鳗鱼", bounded) == ["fact-3"]
    # Off: every match ranked, whatever the store's size.
    assert await keys(index, "寿司", unbounded) == full


async def test_the_share_boundary(engine, small_minimum, monkeypatch):
    index = await MemoryIndex.open(engine)
    await index.add(items(40))
    # 寿司 is in 20 of 40 items.  At a share of exactly 20/40 it is not over it: unbounded.
    at_share = RecallSettings(candidate_depth=5, common_query_scored_rows=8, vector_weight=0.0,
                              common_query_term_share_min=0.5)
    assert await keys(index, "寿司", at_share) == await keys(index, "寿司", unbounded)
    index._term_counts.clear()
    just_under = RecallSettings(candidate_depth=5, common_query_scored_rows=8, vector_weight=0.0,
                                common_query_term_share_min=19 / 40)
    assert await keys(index, "寿司", just_under) != await keys(index, "寿司", unbounded)


def test_the_settings_are_checked():
    with pytest.raises(AssertionError):
        RecallSettings(candidate_depth=100, common_query_scored_rows=99)
    with pytest.raises(AssertionError):
        RecallSettings(common_query_term_share_min=0.0)
    assert RecallSettings().common_query_scored_rows == memory_index_module.common_query_scored_rows_default


def test_nearest_in_time_partial_sort_matches_a_full_sort():
    generator = random.Random(3)
    bitmaps = FacetBitmaps()
    count = 2000
    ids = numpy.arange(1, count + 1)
    starts = numpy.array([float(generator.randrange(0, 50)) * 3600 for _ in ids])  # many ties
    ends = starts + numpy.array([float(generator.choice((0, 0, 1800, 7200))) for _ in ids])
    bitmaps.set_times(ids, starts, ends)
    allowed = BitMap(int(item_id) for item_id in ids if item_id % 7 != 0)

    def reference(start: float, end: float, limit: int) -> list[tuple[int, float]]:
        keys = numpy.array(sorted(allowed), dtype=numpy.int64)
        key_starts, key_ends = bitmaps._time_start[keys], bitmaps._time_end[keys]
        distance = numpy.maximum(numpy.maximum(key_starts - end, start - key_ends), 0.0)
        order = numpy.lexsort((-keys, -key_starts, distance))[:limit]
        return [(int(keys[i]), float(distance[i])) for i in order]

    for start, end, limit in ((0.0, 3600.0, 10), (20 * 3600.0, 21 * 3600.0, 1), (100 * 3600.0, 101 * 3600.0, 37),
                              (-5000.0, -4000.0, 10), (0.0, 1e9, 10), (0.0, 1.0, 5000)):
        assert bitmaps.nearest_in_time(allowed, start, end, limit) == reference(start, end, limit)


def test_matches_outside_the_allowed_span_are_never_needed(connection):
    ids = _store.insert_items(connection, rows(300))
    expression = '"寿司" OR "火锅"'
    everything = full_ranking(connection, expression)
    band = BitMap(item_id for item_id in ids if 100 <= item_id <= 180 and item_id % 3)
    for scored_rows in (None, 10, 1000):
        found = _store.text_search(
            connection, expression, allowed=band, depth=12, candidates=300, scored_rows=scored_rows
        )
        if scored_rows is None or scored_rows >= 300:
            assert found == [item_id for item_id in everything if item_id in band][:12]
        assert len(found) == 12 and all(item_id in band for item_id in found)
    newest = _store.newest_matches(
        connection, expression, allowed=band, depth=5, facet_expression=None, candidates=300
    )
    assert newest == sorted(band, reverse=True)[:5]


def test_a_bounded_window_reads_at_most_a_few_times_its_rows():
    assert _store._scored_window(None, 0.5) is None
    assert _store._scored_window(100, 1.0) == 100
    assert _store._scored_window(100, 0.5) == 200
    growth = _store.text_scored_window_growth_max
    assert _store._scored_window(100, 0.01) == 100 * growth  # not 10,000
    assert _store._scored_window(100_000, 0.01) == _store.text_search_rows_max
