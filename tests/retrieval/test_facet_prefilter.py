"""The text index's facet pre-filter is left out when a filter admits most of the live items
(``facet_prefilter_share_max``), and recall answers exactly as with it: the ranked rows are
filtered by the bitmap, over-fetched by its selectivity, and never leak another tenant's,
another scope's, a deleted or a forgotten item."""

import datetime

import pytest
from pyroaring import BitMap

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter
from troupe.retrieval._filters import FacetBitmaps, facet_prefilter_share_max

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
words = ["星星", "望远镜", "寿司", "hiking", "coffee", "猫咪", "火锅", "budget", "电网"]
queries = ["看星星", "望远镜 寿司", "hiking coffee budget", "猫咪和火锅", "星星 coffee 电网"]
filters = [RecallFilter("main"), RecallFilter("main", scopes=frozenset({"big"})),
           RecallFilter("main", scopes=frozenset({"small"})), RecallFilter("main", kinds=frozenset({"clean"}))]


def items(first: int, count: int, *, tenant: str, scope: str) -> list[MemoryItem]:
    return [
        MemoryItem(
            key=f"{tenant}-{scope}-{number}",
            text=" ".join(words[(number * step) % len(words)] for step in (1, 2, 5)) + f" 第{number}条",
            tenant=tenant, scope=scope, kind="clean" if number % 4 else "sensitive",
            created_at=base + datetime.timedelta(minutes=number),
        )
        for number in range(first, first + count)
    ]


async def answers(index: MemoryIndex, monkeypatch: pytest.MonkeyPatch, *, shortcut: bool) -> list:
    with monkeypatch.context() as patch:
        if not shortcut:
            patch.setattr(FacetBitmaps, "admits_most_items", lambda self, candidates: False)
        found = []
        for query in queries:
            for recall_filter in filters:
                for limit in (3, 40):
                    result = await index.recall(query, recall_filter=recall_filter, limit=limit)
                    found.append([(hit.key, hit.ranks) for hit in result.hits])
        return found


async def test_leaving_the_prefilter_out_changes_no_answer(engine, monkeypatch):
    index = await MemoryIndex.open(engine)
    await index.add(items(0, 150, tenant="main", scope="big"))
    await index.add(items(0, 20, tenant="main", scope="small"))
    await index.add(items(0, 40, tenant="other", scope="big"))
    bitmaps = index._bitmaps
    big = bitmaps.candidates(filters[1])
    assert bitmaps.admits_most_items(big) and not bitmaps.admits_every_item(big)
    assert not bitmaps.admits_most_items(bitmaps.candidates(filters[2]))
    assert len(big) >= facet_prefilter_share_max * len(bitmaps.every_item)
    fast = await answers(index, monkeypatch, shortcut=True)
    assert fast == await answers(index, monkeypatch, shortcut=False)
    assert all(fast[:4]), "the queries must find something, or the comparison proves nothing"
    assert all(key.startswith("main-") for answer in fast for key, _ in answer)

    # Deleted and forgotten items stay out either way.
    await index.delete([f"main-big-{number}" for number in range(0, 150, 3)])
    await index.forget([f"main-big-{number}" for number in range(1, 150, 7)])
    after = await answers(index, monkeypatch, shortcut=True)
    assert after == await answers(index, monkeypatch, shortcut=False)
    gone = {f"main-big-{number}" for number in [*range(0, 150, 3), *range(1, 150, 7)]}
    assert not gone & {key for answer in after for key, _ in answer}


def test_the_share_is_measured_against_live_items():
    bitmaps = FacetBitmaps()
    bitmaps.every_item.update(range(1, 101))
    bitmaps.deleted.update(range(1, 41))
    assert bitmaps.admits_most_items(BitMap(range(41, 71)))  # 30 of 60 live
    assert not bitmaps.admits_most_items(BitMap(range(41, 70)))  # 29 of 60
