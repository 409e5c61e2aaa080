import datetime
import os

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import (
    ConversationTurn,
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    _vector_index,
    conversation_items,
)
from troupe.retrieval._filters import FacetBitmaps
from troupe.retrieval._vector_index import VectorIndex

from .conftest import open_test_engine

base = datetime.datetime(2026, 5, 1, 9)


def item(key, text, *, tenant="t", days=0, **fields) -> MemoryItem:
    return MemoryItem(
        key=key, text=text, tenant=tenant, created_at=base + datetime.timedelta(days=days), **fields
    )


class WarmingEmbedder(HashedEmbedder):
    """Not ready until told: an embedder still loading its weights."""

    def __init__(self) -> None:
        super().__init__(dimensions=64)
        self.warm = False

    def ready(self) -> bool:
        return self.warm


foods = [
    item("sushi", "我最喜欢吃寿司", days=0),
    item("stars", "昨晚一起看星星", days=1),
    item("paint", "Melanie painted a sunset by the lake", days=2),
    item("run", "Running every morning helps me de-stress", days=3),
    item("ramen", "Ramen in Tokyo was the best meal of the trip", days=40),
]


async def test_query_only_is_hybrid_and_two_character_chinese_matches(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add(foods)
    result = await index.recall("寿司", recall_filter=RecallFilter(tenant="t"))
    assert result.route == "hybrid" and result.degraded is None
    assert result.hits[0].key == "sushi"
    assert set(result.hits[0].ranks) >= {"text", "vector"}
    result = await index.recall("who painted the sunset?", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "paint"


async def test_routing_by_time(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add(foods)
    everyone = RecallFilter(tenant="t")
    # Query + valid time: a hard filter, even for the best text match outside it.
    result = await index.recall("ramen sushi 寿司", time="2026-06", recall_filter=everyone)
    assert [hit.key for hit in result.hits] == ["ramen"]
    # Time only: by distance to the window, those inside first.
    result = await index.recall(None, time="2026-05-02/2026-05-03", recall_filter=everyone)
    assert result.route == "time"
    # Inside [May 2, May 4): latest first; then run (9 h after the end), sushi (15 h before).
    assert [hit.key for hit in result.hits] == ["paint", "stars", "run", "sushi", "ramen"]
    assert all(hit.score is None for hit in result.hits)
    # Neither: empty.
    result = await index.recall("  ", time=None, recall_filter=everyone)
    assert result.route == "empty" and result.hits == []
    # Invalid time with a query: the time is ignored.
    result = await index.recall("寿司", time="last week", recall_filter=everyone)
    assert result.time_ignored and result.hits[0].key == "sushi"
    # Invalid time alone: nothing to route on.
    result = await index.recall(None, time="2026-13", recall_filter=everyone)
    assert result.route == "empty" and result.time_ignored


async def test_degrades_to_bm25_while_the_embedder_warms_up(engine):
    embedder = WarmingEmbedder()
    index = await MemoryIndex.open(engine, embedder=embedder)
    await index.add(foods)
    result = await index.recall("寿司", recall_filter=RecallFilter("t"))
    assert result.degraded == "embedder_unavailable"
    assert result.hits[0].key == "sushi" and "vector" not in result.hits[0].ranks
    embedder.warm = True
    assert await index.embed_pending() == len(foods)
    assert await index.embed_pending() == 0
    result = await index.recall("寿司", recall_filter=RecallFilter("t"))
    assert result.degraded is None and "vector" in result.hits[0].ranks
    without = await MemoryIndex.open(engine, embedder=None)
    result = await without.recall("寿司", recall_filter=RecallFilter("t"))
    assert result.degraded == "embedder_unavailable" and result.hits[0].key == "sushi"


async def test_vector_file_rebuilt_when_deleted_or_corrupt_and_caught_up(engine, tmp_path):
    path = str(tmp_path / "vectors.usearch")
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    await index.add(foods[:3])
    index.save_vectors()
    await index.add(foods[3:])  # written after the file: caught up at the next open
    reopened = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    assert not reopened.vector_index_rebuilt
    result = await reopened.recall("ramen tokyo", recall_filter=RecallFilter("t"))
    assert result.hits[0].ranks.get("vector") == 1
    os.remove(path)
    rebuilt = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    assert rebuilt.vector_index_rebuilt
    result = await rebuilt.recall("ramen tokyo", recall_filter=RecallFilter("t"))
    assert result.hits[0].ranks.get("vector") == 1
    rebuilt.save_vectors()
    with open(path, "wb") as corrupt:
        corrupt.write(b"not an index" * 10)
    again = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    assert again.vector_index_rebuilt
    other = await MemoryIndex.open(
        engine, embedder=HashedEmbedder(dimensions=128), vector_path=path
    )
    assert other.vector_index_rebuilt  # another fingerprint never loads this file


async def test_deleted_items_never_come_back(tmp_path):
    data = tmp_path / "data"
    path = str(tmp_path / "vectors.usearch")
    engine = await open_test_engine(data)
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    await index.add(foods)
    index.save_vectors()  # the file still holds the vector of the item deleted below
    assert await index.delete(["sushi"]) == 1
    assert await index.delete(["sushi"]) == 0
    for query in ("寿司", "我最喜欢吃寿司"):
        result = await index.recall(query, recall_filter=RecallFilter("t", include_forgotten=True))
        assert "sushi" not in [hit.key for hit in result.hits]
    result = await index.recall(None, time="2026-05-01", recall_filter=RecallFilter("t"))
    assert "sushi" not in [hit.key for hit in result.hits]
    await engine.aclose()
    engine = await open_test_engine(data)
    reopened = await MemoryIndex.open(engine, embedder=HashedEmbedder(), vector_path=path)
    result = await reopened.recall("我最喜欢吃寿司", recall_filter=RecallFilter("t"))
    assert "sushi" not in [hit.key for hit in result.hits]
    await engine.aclose()


async def test_forgotten_items_hidden_unless_asked(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add(foods)
    await index.forget(["stars"])
    result = await index.recall("星星", recall_filter=RecallFilter("t"))
    assert "stars" not in [hit.key for hit in result.hits]
    result = await index.recall("星星", recall_filter=RecallFilter("t", include_forgotten=True))
    assert result.hits[0].key == "stars"
    await index.forget(["stars"], forgotten=False)
    result = await index.recall("星星", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "stars"


async def test_filters_never_leak_and_top_k_is_filled(engine):
    embedder = HashedEmbedder(dimensions=64)
    index = await MemoryIndex.open(engine, embedder=embedder)
    items = []
    for number in range(300):
        items.append(
            item(
                f"m{number}",
                f"shared words about cats and 猫咪 number {number}",
                tenant=f"tenant{number % 2}",
                scope=f"scope{number % 5}",
                kind="fact" if number % 3 else "reflection",
                visibility=frozenset({f"entry{number % 7}"}) if number % 4 == 0 else frozenset(),
                days=number % 30,
            )
        )
    await index.add(items)
    by_key = {entry.key: entry for entry in items}
    filters = [
        RecallFilter("tenant0"),
        RecallFilter("tenant1", scopes=frozenset({"scope3"})),
        RecallFilter("tenant0", scopes=frozenset({"scope1", "scope2"}), kinds=frozenset({"fact"})),
        RecallFilter("tenant1", viewer="entry3"),
        RecallFilter("tenant0", kinds=frozenset({"reflection"}), viewer="entry0"),
        RecallFilter("nobody"),
    ]
    for recall_filter in filters:
        admitted = [entry for entry in items if admits(recall_filter, entry)]
        for query, time in (("cats 猫咪", None), ("cats", "2026-05-03/2026-05-20"), (None, "2026")):
            result = await index.recall(query, time=time, recall_filter=recall_filter, limit=20)
            keys = [hit.key for hit in result.hits]
            assert all(admits(recall_filter, by_key[key]) for key in keys), recall_filter
            if time is None:
                assert len(keys) == min(20, len(admitted))


def admits(recall_filter: RecallFilter, entry: MemoryItem) -> bool:
    return (
        entry.tenant == recall_filter.tenant
        and (recall_filter.scopes is None or entry.scope in recall_filter.scopes)
        and (recall_filter.kinds is None or entry.kind in recall_filter.kinds)
        and (
            recall_filter.viewer is None
            or not entry.visibility
            or recall_filter.viewer in entry.visibility
        )
    )


facet = st.sampled_from(["a", "b", "c"])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(facet, facet, facet, st.sets(facet, max_size=2), st.booleans()),
        min_size=1,
        max_size=60,
    ),
    tenant=facet,
    scopes=st.none() | st.frozensets(facet, min_size=1),
    kinds=st.none() | st.frozensets(facet, min_size=1),
    viewer=st.none() | facet,
    query_seed=st.integers(0, 1000),
)
def test_filtered_vector_search_never_leaks(rows, tenant, scopes, kinds, viewer, query_seed):
    bitmaps = FacetBitmaps()
    vectors = VectorIndex(8, "test")
    generator = numpy.random.default_rng(query_seed)
    entries = {}
    for item_id, (row_tenant, scope, kind, visibility, deleted) in enumerate(rows, start=1):
        bitmaps.add(item_id, row_tenant, scope, kind, visibility)
        if deleted:
            bitmaps.deleted.add(item_id)
        entries[item_id] = MemoryItem(
            key=str(item_id),
            text="",
            tenant=row_tenant,
            created_at=base,
            scope=scope,
            kind=kind,
            visibility=frozenset(visibility),
        )
    vectors.upsert(numpy.arange(1, len(rows) + 1), generator.normal(size=(len(rows), 8)))
    recall_filter = RecallFilter(tenant, scopes=scopes, kinds=kinds, viewer=viewer)
    allowed = bitmaps.allowed(recall_filter)
    expected = BitMap(
        item_id
        for item_id, entry in entries.items()
        if admits(recall_filter, entry) and item_id not in bitmaps.deleted
    )
    assert allowed == expected
    found = vectors.search(generator.normal(size=8), 5, allowed=allowed)
    assert {item_id for item_id, _ in found} <= set(expected)
    assert len(found) == min(5, len(expected))


def test_large_filtered_vector_search_fills_top_k(monkeypatch):
    monkeypatch.setattr(_vector_index, "vector_exact_search_items_max", 100)
    vectors = VectorIndex(16, "test")
    generator = numpy.random.default_rng(7)
    vectors.upsert(numpy.arange(1, 6_001), generator.normal(size=(6_000, 16)))
    allowed = BitMap(range(3, 6_001, 3))  # 2000 of 6000: the over-fetching path
    found = vectors.search(generator.normal(size=16), 50, allowed=allowed)
    assert len(found) == 50 and all(item_id in allowed for item_id, _ in found)
    rare = BitMap(range(5, 6_001, 1200))  # five items: the exact path
    found = vectors.search(generator.normal(size=16), 10, allowed=rare)
    assert sorted(item_id for item_id, _ in found) == list(rare)


async def test_conversation_context_and_speaker_facet(engine):
    at = datetime.datetime(2023, 5, 8, 13, 56)
    turns = [
        ConversationTurn("D1:1", "Caroline", "Have you been to the support group?", at),
        ConversationTurn("D1:2", "Melanie", "Yes, twice last month!", at),
        ConversationTurn("D1:3", "Caroline", "I love painting sunsets.", at),
        ConversationTurn("D2:1", "Melanie", "Thanks Caroline, I painted too.", at.replace(day=20)),
    ]
    items = conversation_items(turns, tenant="t", turns_before=1, turns_after=1)
    assert items[1].context.startswith("Caroline: Have you been")
    assert items[3].context == ""  # another day's conversation never leaks in
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add(items)
    result = await index.recall("support group", recall_filter=RecallFilter("t"))
    assert {hit.key for hit in result.hits[:2]} == {"D1:1", "D1:2"}
    result = await index.recall("What did Caroline paint?", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "D1:3"


async def test_duplicate_keys_are_rejected(engine):
    from troupe.retrieval import DuplicateItem

    index = await MemoryIndex.open(engine)
    await index.add(foods[:1])
    with pytest.raises(DuplicateItem):
        await index.add(foods[:1])
