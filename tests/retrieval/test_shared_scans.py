"""Recall's text-index shortcuts give exactly the answers of the full definitions.

A shortcut saves whole scans of the text index: the facet pre-filter is dropped when the
filter's candidates are every item there is.  (The context-weighted list is left out when no
allowed item has a context: that is a ranking rule since issue 14, tested in
``test_fusion_context.py``, no longer a shortcut.)  Each test
compares recall with the shortcuts against recall with them switched off, before and after
the writes that must turn them off (an item of another tenant, an item with a context), and
after a reopen that rebuilds the bitmaps from the tables.
"""

import datetime

import pytest

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter
from troupe.retrieval._filters import FacetBitmaps

from .conftest import open_test_engine

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
words = ["星星", "望远镜", "寿司", "hiking", "coffee", "猫咪", "火锅"]
queries = ["看星星", "望远镜 寿司", "hiking coffee", "猫咪和火锅", "星星 coffee 火锅"]


def items(first: int, count: int, *, tenant: str = "host", context: bool = False) -> list[MemoryItem]:
    made = []
    for number in range(first, first + count):
        chosen = [words[(number * step) % len(words)] for step in (1, 3)]
        made.append(MemoryItem(
            key=f"{tenant}-{number}",
            text=f"第{number}条：{chosen[0]}和{chosen[1]}" + " 星星" * (number % 3),
            tenant=tenant,
            scope=f"entry-{number % 2}",
            created_at=base + datetime.timedelta(minutes=number),
            context=f"前文提到{words[number % len(words)]}" if context else "",
        ))
    return made


async def answers(index: MemoryIndex, monkeypatch: pytest.MonkeyPatch, *, shortcuts: bool) -> list:
    with monkeypatch.context() as patch:
        if not shortcuts:
            patch.setattr(FacetBitmaps, "admits_every_item", lambda self, candidates: False)
        found = []
        for query in queries:
            for recall_filter in (RecallFilter("host"), RecallFilter("host", scopes=frozenset({"entry-1"}))):
                result = await index.recall(query, recall_filter=recall_filter, limit=20)
                found.append([(hit.key, hit.ranks) for hit in result.hits])
        return found


async def assert_shortcuts_agree(index: MemoryIndex, monkeypatch: pytest.MonkeyPatch) -> list:
    fast = await answers(index, monkeypatch, shortcuts=True)
    assert fast == await answers(index, monkeypatch, shortcuts=False)
    assert any(fast), "the queries must find something, or the comparison proves nothing"
    return fast


async def test_shortcuts_agree_and_turn_off_after_the_writes_that_matter(tmp_path, monkeypatch):
    engine = await open_test_engine(tmp_path / "data")
    try:
        index = await MemoryIndex.open(engine)
        await index.add(items(0, 120))
        bitmaps = index._bitmaps
        every = bitmaps.candidates(RecallFilter("host"))
        assert bitmaps.admits_every_item(every) and not bitmaps.any_with_context(bitmaps.allowed(RecallFilter("host")))
        await assert_shortcuts_agree(index, monkeypatch)

        # Another tenant: the facet pre-filter is needed again, and its items never leak.
        # (bm25's statistics span the whole text index, so the scores move: compare the
        # two paths, not before and after.)
        await index.add(items(0, 60, tenant="other"))
        assert not bitmaps.admits_every_item(bitmaps.candidates(RecallFilter("host")))
        before = await assert_shortcuts_agree(index, monkeypatch)

        # Items with a context: the context list is its own scan again and ranks differently.
        await index.add(items(200, 60, context=True))
        assert bitmaps.any_with_context(bitmaps.allowed(RecallFilter("host")))
        after = await assert_shortcuts_agree(index, monkeypatch)
        assert any(ranks.get("text") != ranks.get("context") for answer in after for _, ranks in answer)
        assert all(key.startswith("host-") for answer in after for key, _ in answer)

        # Deleting or forgetting every item with a context brings the one-scan path back.
        with_context = [f"host-{number}" for number in range(200, 260)]
        await index.forget(with_context[:30])
        await index.delete(with_context[30:])
        assert not bitmaps.any_with_context(bitmaps.allowed(RecallFilter("host")))
        before = await assert_shortcuts_agree(index, monkeypatch)
    finally:
        await engine.aclose()

    # A reopen rebuilds the same bitmaps from the tables.
    engine = await open_test_engine(tmp_path / "data")
    try:
        reopened = await MemoryIndex.open(engine)
        assert reopened._bitmaps.every_item == bitmaps.every_item
        # A deletion blanks the stored context; in memory the tombstone already hides it.
        assert reopened._bitmaps.with_context == bitmaps.with_context - bitmaps.deleted
        assert await assert_shortcuts_agree(reopened, monkeypatch) == before
    finally:
        await engine.aclose()
