"""The approximate-nearest-neighbour half of recall: a usearch graph that is only a cache.

Why it exists: cosine search over every stored vector costs O(n) per query; usearch's HNSW
graph answers in well under a millisecond at 100k items.  SQLite keeps the vectors (with the
embedder fingerprint and a sequence number per write); this module keeps the graph, saves it
to a file with the highest sequence it contains, and is told at start-up to catch up from
there or to rebuild when the file is missing, unreadable, of another fingerprint or
inconsistent with the tables.

usearch has no filtered search in Python, so filtering is designed around it: the graph
over-fetches in proportion to how selective the filter is and grows the fetch until ``count``
allowed hits are found or the graph is exhausted; when that fetch would cost more than
scanning the allowed vectors themselves, the search is exact over exactly those (gathered
from a dense f16 mirror and scanned by usearch's SIMD brute force).  Measured on 2 cores,
384 dimensions: a graph search costs about 3.5 µs per result fetched, an exact scan under
1 µs per allowed item, so a filter admitting 1% of a million items (10k allowed, a 15k
fetch) is ~5× cheaper exact.  Removed keys are removed from the graph,
and callers filter by their tombstone bitmap as well, so a vector file saved before a
deletion can never resurrect the item.

Threads: recall runs ``search`` inside its storage read, and ``MemoryIndex`` runs writes'
``upsert``/``absorb`` through the Env executor too: on worker threads in production (usearch
releases the interpreter lock, so the event loop keeps serving meanwhile).  Every use of the
graph, the mirror and the high-water mark holds ``self._lock``, so a search never sees a
half-grown mirror or a key removed but not yet re-added, and two searches never share one of
usearch's per-thread search contexts.  Under the simulator everything runs inline and the
lock is never contended.

Trade-offs: ``f16`` halves memory at a recall cost too small to see with normalised vectors;
the graph lives in process memory (about ``dimensions * 2 + 200`` bytes per item).
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass

import numpy
from pyroaring import BitMap
from usearch.index import Index
from usearch.index import search as usearch_search

# Allowed sets this small are always searched exactly.
vector_exact_search_items_max = 4096
# Cost of one graph result fetched relative to one vector scanned exactly (measured ~4).
vector_graph_fetch_cost_per_exact_item = 4.0
# Vectors per ``get`` call when copying a loaded graph into the mirror (bounds the copy).
vector_mirror_load_batch_items = 65_536
vector_search_expansion_default = 128
vector_search_rounds_max = 6
# usearch's default (128) halves insert speed for no recall we could measure on our vectors.
vector_expansion_add = 32


@dataclass(frozen=True)
class VectorFileState:
    """What the sidecar of a saved vector file says about it."""

    fingerprint: str
    dimensions: int
    high_water_sequence: int
    count: int


class VectorIndex:
    """A usearch cosine index over integer item ids, with filtered search and a sidecar."""

    def __init__(self, dimensions: int, fingerprint: str, *, dtype: str = "f16") -> None:
        assert dimensions > 0
        self.dimensions = dimensions
        self.fingerprint = fingerprint
        self.dtype = dtype
        self.high_water_sequence = 0
        self._lock = threading.Lock()
        # A dense f16 mirror indexed by item id (ids are SQLite rowids, hence dense) for
        # exact search over small allowed sets: usearch's per-key ``get`` costs microseconds
        # per vector in Python, the mirror a fancy-indexing copy.
        self._mirror = numpy.zeros((0, dimensions), dtype=numpy.float16)
        self._present = numpy.zeros(0, dtype=bool)
        self._index = Index(
            ndim=dimensions,
            metric="cos",
            dtype=dtype,
            expansion_add=vector_expansion_add,
            expansion_search=vector_search_expansion_default,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @classmethod
    def load(cls, path: str, dimensions: int, fingerprint: str) -> VectorIndex | None:
        """The saved index at ``path`` if it is readable and of this space, else ``None``."""
        try:
            with open(path + ".json", encoding="utf-8") as sidecar:
                state = VectorFileState(**json.load(sidecar))
            if state.fingerprint != fingerprint or state.dimensions != dimensions:
                return None
            restored = Index.restore(path)
        except (OSError, ValueError, TypeError, RuntimeError):
            return None
        if restored is None or restored.ndim != dimensions or len(restored) != state.count:
            return None
        loaded = cls(dimensions, fingerprint)
        restored.expansion_search = vector_search_expansion_default
        loaded._index = restored
        loaded.high_water_sequence = state.high_water_sequence
        keys = numpy.asarray(restored.keys, dtype=numpy.uint64)
        if len(keys):
            loaded._mirror_capacity(int(keys.max()))
        for first in range(0, len(keys), vector_mirror_load_batch_items):
            batch = keys[first : first + vector_mirror_load_batch_items]
            loaded._mirror_store(batch, numpy.vstack(restored.get(batch, dtype=numpy.float16)))
        return loaded

    def _mirror_capacity(self, highest_id: int) -> None:
        highest = highest_id + 1
        if highest > len(self._present):
            capacity = max(highest, 2 * len(self._present), 1024)
            mirror = numpy.zeros((capacity, self.dimensions), dtype=numpy.float16)
            mirror[: len(self._mirror)] = self._mirror
            present = numpy.zeros(capacity, dtype=bool)
            present[: len(self._present)] = self._present
            self._mirror, self._present = mirror, present

    def _mirror_store(self, keys: numpy.ndarray, vectors: numpy.ndarray) -> None:
        self._mirror_capacity(int(keys.max()))
        self._mirror[keys.astype(numpy.int64)] = vectors
        self._present[keys.astype(numpy.int64)] = True

    def save(self, path: str) -> None:
        """Writes the graph, then its sidecar, each through a temporary file and a rename.

        A crash between the two leaves a sidecar whose count or sequence no longer matches,
        which ``load`` and the catch-up treat as stale: never as truth.
        """
        temporary = path + ".tmp"
        with self._lock:
            self._index.save(temporary)
            state = VectorFileState(
                self.fingerprint, self.dimensions, self.high_water_sequence, len(self._index)
            )
        os.replace(temporary, path)
        with open(temporary + ".json", "w", encoding="utf-8") as sidecar:
            json.dump(state.__dict__, sidecar)
        os.replace(temporary + ".json", path + ".json")

    def upsert(self, ids: numpy.ndarray, vectors: numpy.ndarray) -> None:
        with self._lock:
            self._upsert_locked(ids, vectors)

    def _upsert_locked(self, ids: numpy.ndarray, vectors: numpy.ndarray) -> None:
        keys = numpy.asarray(ids, dtype=numpy.uint64)
        if len(keys) == 0:
            return
        present = numpy.asarray(self._index.contains(keys), dtype=bool).reshape(-1)
        if present.any():
            self._index.remove(keys[present])
        vectors = numpy.asarray(vectors, dtype=numpy.float32)
        self._index.add(keys, vectors, threads=_threads_for(len(keys), vector_add_items_per_thread_min))
        self._mirror_store(keys, vectors)

    def absorb(self, ids: numpy.ndarray, vectors: numpy.ndarray, sequence: int) -> None:
        """Upsert vectors that SQLite stored up to ``sequence``, and move the high-water mark
        there: what a later catch-up starts after."""
        with self._lock:
            self._upsert_locked(ids, vectors)
            self.high_water_sequence = max(self.high_water_sequence, sequence)

    def raise_high_water(self, sequence: int) -> None:
        """Moves the high-water mark up to ``sequence`` (never down): for writers that upsert
        out of sequence order and know when every vector up to ``sequence`` is in."""
        with self._lock:
            self.high_water_sequence = max(self.high_water_sequence, sequence)

    def remove(self, ids: list[int]) -> None:
        with self._lock:
            keys = [key for key in ids if self._index.contains(key)]
            if keys:
                self._index.remove(numpy.asarray(keys, dtype=numpy.uint64))
                self._present[numpy.asarray(keys, dtype=numpy.int64)] = False

    def contains(self, item_id: int) -> bool:
        with self._lock:
            return self._index.contains(item_id)

    def search(
        self, query: numpy.ndarray, count: int, *, allowed: BitMap | None
    ) -> list[tuple[int, float]]:
        """Up to ``count`` ``(id, cosine distance)`` pairs from ``allowed``, nearest first
        (callable from a worker thread: see the module docstring)."""
        assert count > 0
        with self._lock:
            return self._search_locked(query, count, allowed)

    def _search_locked(
        self, query: numpy.ndarray, count: int, allowed: BitMap | None
    ) -> list[tuple[int, float]]:
        size = len(self._index)
        if size == 0 or (allowed is not None and len(allowed) == 0):
            return []
        query = numpy.asarray(query, dtype=numpy.float32).reshape(-1)
        if allowed is None:
            matches = self._index.search(query, min(count, size), threads=1)
            return list(zip(matches.keys.tolist(), matches.distances.tolist(), strict=True))
        selectivity = len(allowed) / max(size, len(allowed))
        fetch = min(size, math.ceil(count / selectivity * 1.5) + count)
        if (
            len(allowed) <= vector_exact_search_items_max
            or len(allowed) <= fetch * vector_graph_fetch_cost_per_exact_item
        ):
            return self._exact_search(query, count, allowed)
        for _ in range(vector_search_rounds_max):
            matches = self._index.search(query, fetch, threads=1)
            found = _allowed_matches(matches.keys, matches.distances, allowed)
            if len(found) >= count or fetch >= size:
                return found[:count]
            fetch = min(size, fetch * 4)
        # Still short after growing: the allowed items are far from the query in the graph;
        # an exact scan over them is the only way to fill ``count`` honestly.
        return self._exact_search(query, count, allowed)

    def _exact_search(
        self, query: numpy.ndarray, count: int, allowed: BitMap
    ) -> list[tuple[int, float]]:
        keys = numpy.frombuffer(allowed.to_array(), dtype=numpy.uint32).astype(numpy.int64)
        keys = keys[keys < len(self._present)]
        keys = keys[self._present[keys]]
        if len(keys) == 0:
            return []
        # usearch's brute force reads f16 directly (numpy would first widen every vector to
        # f32, which costs more than the scan); its keys are positions in ``keys``.
        matches = usearch_search(
            self._mirror[keys],
            query.astype(numpy.float16),
            min(count, len(keys)),
            metric="cos",
            exact=True,
            threads=_threads_for(len(keys), vector_exact_items_per_thread_min),
        )
        return list(zip(keys[matches.keys.astype(numpy.int64)].tolist(), matches.distances.tolist(), strict=True))


def _allowed_matches(
    keys: numpy.ndarray, distances: numpy.ndarray, allowed: BitMap
) -> list[tuple[int, float]]:
    """The ``(key, distance)`` pairs whose key is in ``allowed``, in order.  The membership
    test runs in C (a bitmap difference): per key in Python it cost ~0.1 ms per search at a
    fetch of 250, and when the filter admits the whole graph every key is allowed anyway."""
    found = list(zip(keys.tolist(), distances.tolist(), strict=True))
    if not found:
        return found
    outside = BitMap(keys.astype(numpy.uint32)) - allowed
    if not outside:
        return found
    return [pair for pair in found if pair[0] not in outside]


vector_add_items_per_thread_min = 1024
vector_exact_items_per_thread_min = 65536
"""Below these sizes usearch's thread start-up (a few milliseconds) costs more than the work:
one thread does it; above them usearch uses every core (``threads=0``)."""


def _threads_for(items: int, items_per_thread_min: int) -> int:
    return 1 if items < items_per_thread_min else 0
