"""The embedding service: a changed embedder re-embeds in the background; recall never waits."""

import trio

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import EmbeddingService, MemoryIndex, RecallFilter, _store
from troupe.runtime import ActorSystem

from .conftest import make_env, open_test_engine
from .test_memory_index import foods


async def vector_count(engine, index):
    count, _ = await engine.read(lambda connection: _store.vector_summary(connection, index.vector_fingerprint))
    return count


async def test_changing_the_embedder_re_embeds_in_the_background(tmp_path, autojump_clock):
    engine = await open_test_engine(tmp_path / "data")
    first = await MemoryIndex.open(engine, embedder=HashedEmbedder(dimensions=64))
    await first.add(foods)
    assert await vector_count(engine, first) == len(foods)

    # A new model: its vectors do not exist yet, but recall answers at once (BM25 + what is embedded).
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder(dimensions=96))
    assert await vector_count(engine, index) == 0
    result = await index.recall("寿司", recall_filter=RecallFilter("t"))
    assert result.hits[0].key == "sushi" and "vector" not in result.hits[0].ranks

    service = EmbeddingService(index, batch_items=2)
    system = ActorSystem(make_env(tmp_path / "data"), [], services=[service.child_spec()])
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        while await vector_count(engine, index) < len(foods):
            await trio.sleep(1)
        assert service.embedded == len(foods)
        result = await index.recall("寿司", recall_filter=RecallFilter("t"))
        assert result.hits[0].key == "sushi" and "vector" in result.hits[0].ranks
        nursery.cancel_scope.cancel()
    await engine.aclose()


async def test_the_service_saves_the_vector_file_when_it_stops(tmp_path, autojump_clock):
    engine = await open_test_engine(tmp_path / "data")
    path = str(tmp_path / "vectors.usearch")
    index = await MemoryIndex.open(engine, embedder=HashedEmbedder(dimensions=64), vector_path=path)
    before = HashedEmbedder(dimensions=64)
    before.ready = lambda: False  # items arrive while the model is not ready: no vectors yet
    index._embedder = before
    await index.add(foods)
    index._embedder = HashedEmbedder(dimensions=64)
    service = EmbeddingService(index)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert service.embedded == len(foods) and service.saves == 1
    reopened = await MemoryIndex.open(engine, embedder=HashedEmbedder(dimensions=64), vector_path=path)
    assert not reopened.vector_index_rebuilt
    await engine.aclose()
