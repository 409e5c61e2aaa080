"""The shared recall index lives as long as its engine, no longer: the simulator opens an
engine per simulated restart, and a registry that outlived them leaked gigabytes in a sweep."""

from __future__ import annotations

import gc
import weakref

from troupe.models import HashedEmbedder
from troupe.retrieval import shared_memory_indexes

from .conftest import open_test_engine


async def test_a_closed_engine_and_its_index_are_collected(tmp_path):
    engine = await open_test_engine(tmp_path / "data")
    index = await shared_memory_indexes.index_for(engine, HashedEmbedder())
    assert await shared_memory_indexes.index_for(engine) is index
    engine_gone, index_gone = weakref.ref(engine), weakref.ref(index)
    await engine.aclose()
    del engine, index
    gc.collect()
    assert engine_gone() is None and index_gone() is None
