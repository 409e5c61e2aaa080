"""Common-term pruning (``RecallSettings.common_term_share_max``): a term most items contain
leaves the text query when the query has other terms and the store is large enough; the
ranking of the items that match another term is exactly the unpruned one; when only common
terms match, the newest matches stand in; small stores and the default settings are
untouched, and term counts are cached until the items change."""

import datetime

import pytest

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter, RecallSettings
from troupe.retrieval import _memory_index as memory_index_module

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
foods = ["拉面", "火锅", "咖啡", "披萨"]
pruning = RecallSettings(common_term_share_max=0.5)  # the default
unpruned = RecallSettings(common_term_share_max=None)


def facts(count: int, first: int = 0) -> list[MemoryItem]:
    """Every fact names 主人 (the character's word for the user); every tenth one 寿司."""
    made = []
    for number in range(first, first + count):
        food = "寿司" if number % 10 == 0 else foods[number % len(foods)]
        made.append(MemoryItem(
            key=f"fact-{number}",
            text=f"主人第{number}次说喜欢{food}" + "，真的" * (number % 3),
            tenant="character:小天",
            created_at=base + datetime.timedelta(minutes=number),
        ))
    return made


async def keys(index: MemoryIndex, query: str, settings: RecallSettings | None = None, limit: int = 50) -> list:
    result = await index.recall(query, recall_filter=RecallFilter("character:小天"), limit=limit, settings=settings)
    return [(hit.key, hit.ranks) for hit in result.hits]


@pytest.fixture
def small_minimum(monkeypatch):
    monkeypatch.setattr(memory_index_module, "common_term_pruning_items_min", 20)


async def test_a_common_term_leaves_and_the_ranking_stays(engine, small_minimum):
    index = await MemoryIndex.open(engine)
    await index.add(facts(60))
    full = await keys(index, "主人喜欢寿司", unpruned)
    pruned = await keys(index, "主人喜欢寿司", pruning)
    # 主人 (all 60) and 喜欢 (all 60) leave; 寿司 decides, ranked exactly as before.
    sushi = [entry for entry in full if int(entry[0].split("-")[1]) % 10 == 0]
    assert [key for key, _ in pruned] == [key for key, _ in sushi] and len(pruned) == 6
    assert [key for key, _ in full[:6]] == [key for key, _ in pruned]
    assert index._term_counts["主人"][0] > 30 and index._term_counts["寿司"][0] == 6


async def test_nothing_is_pruned_below_the_minimum_by_default_or_when_all_terms_are_common(engine, small_minimum):
    index = await MemoryIndex.open(engine)
    await index.add(facts(19))  # one below the minimum
    assert await keys(index, "主人喜欢寿司", pruning) == await keys(index, "主人喜欢寿司", unpruned)
    assert len(await keys(index, "主人喜欢寿司", pruning)) == 19
    await index.add(facts(1, first=19))  # at the minimum
    assert len(await keys(index, "主人喜欢寿司", pruning)) == 2
    assert len(await keys(index, "主人喜欢寿司", unpruned)) == 20  # None never prunes
    # The other terms match nothing (人喜), or every term is common: bm25 would weigh all
    # matches ~zero, so the newest matches stand in, unscored.
    for query in ("主人喜欢", "主人 喜欢"):
        newest = [key for key, _ in await keys(index, query, pruning)]
        assert newest == [f"fact-{number}" for number in range(19, -1, -1)]
    # A one-term query is never pruned.
    assert len(await keys(index, "主人", pruning)) == 20
    assert len(await keys(index, "主人", pruning)) == 20


async def test_term_counts_are_refreshed_after_enough_writes(engine, small_minimum, monkeypatch):
    monkeypatch.setattr(memory_index_module, "term_counts_refresh_items_min", 10)
    index = await MemoryIndex.open(engine)
    await index.add(facts(40))
    assert len(await keys(index, "主人喜欢寿司", pruning)) == 4
    # Now 寿司 is in most items: counted again only once enough items changed.
    sushi = [MemoryItem(key=f"sushi-{number}", text=f"寿司第{number}盘", tenant="character:小天",
                        created_at=base) for number in range(60)]
    await index.add(sushi[:5])
    assert index._term_counts["寿司"][0] == 4  # within the refresh allowance: cached
    await keys(index, "主人喜欢寿司", pruning)
    assert index._term_counts["寿司"][0] == 4
    await index.add(sushi[5:])
    found = await keys(index, "主人喜欢寿司", pruning)
    assert index._term_counts["寿司"][0] > 50  # counted again (capped at the limit)
    # Of 100 items 寿司 is in 64 now (common), 主人 and 喜欢 in 40: they decide.
    assert len(found) == 40 and all(key.startswith("fact-") for key, _ in found)


def test_the_share_is_checked():
    with pytest.raises(AssertionError):
        RecallSettings(common_term_share_max=0.0)
    with pytest.raises(AssertionError):
        RecallSettings(common_term_share_max=1.5)
    assert RecallSettings().common_term_share_max == 0.5
