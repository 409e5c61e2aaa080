import numpy

from troupe.models._embedder import Embedder
from troupe.models._hashed_embedder import HashedEmbedder


async def test_hashed_embedder_is_a_deterministic_normalised_embedder():
    embedder = HashedEmbedder(dimensions=128)
    assert isinstance(embedder, Embedder) and embedder.ready()
    texts = ["我喜欢吃寿司", "寿司很好吃", "I painted a sunset", "painting sunsets", ""]
    first = await embedder.embed(texts, purpose="document")
    again = await embedder.embed(texts, purpose="query")
    assert first.dtype == numpy.float32 and first.shape == (5, 128)
    assert numpy.array_equal(first, again)
    assert numpy.allclose(numpy.linalg.norm(first[:4], axis=1), 1.0, atol=1e-5)
    assert not first[4].any()
    similarity = first @ first.T
    assert similarity[0, 1] > similarity[0, 2]  # shared Chinese bigram 寿司
    assert similarity[2, 3] > similarity[2, 1]  # shared stem and trigrams
