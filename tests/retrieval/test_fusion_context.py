"""Issue 14: no list ranks the same words twice when items have no conversation context."""

import datetime

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import (
    ConversationTurn,
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    conversation_items,
    fuse_candidates,
)

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def plain(number: int, text: str) -> MemoryItem:
    return MemoryItem(f"m{number}", text, "t", base + datetime.timedelta(minutes=number))


async def test_without_contexts_there_is_no_context_list(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add([plain(1, "the cat sleeps on the sofa"), plain(2, "a dog runs in the park")])
    result = await index.recall("cat sofa", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "m1"
    assert set(result.hits[0].ranks) == {"text", "vector"}
    lists, _ = await index.recall_candidates("cat sofa", recall_filter=RecallFilter("t"))
    assert list(lists.context) == [] and list(lists.text)
    # Text now weighs 1.0 against 0.5 for vectors (it was 1.0 + 0.7 through the context list).
    weights = index.settings.fusion_weights()
    score = dict(fuse_candidates(lists, weights).ranking)[lists.text[0]]
    vector_rank = list(lists.vector).index(lists.text[0]) + 1
    assert score == (
        weights.text_weight / (weights.rank_constant + 1)
        + weights.vector_weight / (weights.rank_constant + vector_rank)
    )


async def test_with_contexts_the_context_list_stays(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    turns = [
        ConversationTurn("a", "Ann", "have you been to the support group?", base),
        ConversationTurn("b", "Bo", "Yes, twice last month!", base + datetime.timedelta(seconds=1)),
    ]
    await index.add(conversation_items(turns, tenant="t"))
    result = await index.recall("support group", recall_filter=RecallFilter("t"))
    found = {hit.key: hit.ranks for hit in result.hits}
    assert "context" in found["b"]


async def test_recall_candidates_fuse_to_the_recall_ranking(engine):
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
    await index.add([plain(n, f"note {n} about {'tea' if n % 2 else 'coffee'} and cake") for n in range(30)])
    recall_filter = RecallFilter("t")
    result = await index.recall("tea cake", recall_filter=recall_filter, limit=10)
    lists, neighbours_of = await index.recall_candidates("tea cake", recall_filter=recall_filter)
    fused = fuse_candidates(lists, index.settings.fusion_weights(), neighbours_of)
    keys = {item_id: f"m{item_id - 1}" for item_id in range(1, 31)}
    assert [keys[item_id] for item_id, _ in fused.ranking[:10]] == [hit.key for hit in result.hits]
