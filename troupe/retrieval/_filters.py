"""Which items a recall may see, as roaring bitmaps over integer item ids.

Why it exists: every surface recalls inside a tenant, often inside scopes, kinds and an
entry's visibility, and never sees deleted or (unless asked) forgotten items.  Evaluating that
per candidate in SQL would put the filter inside every ranking query; instead the facets live
in memory as bitmaps and a filter becomes one set expression, computed once per recall and
applied to every candidate list (text, vectors, time) the same way — so a filtered-out item
cannot appear through any path.

Item times live here too, as two dense ``float64`` arrays indexed by item id (ids are
SQLite rowids, hence dense): a time window then filters the allowed ids with one vectorised
comparison instead of a SQL range scan, which at a million items read every row of the
tenant older than the window's end (tens of milliseconds, and one more thread hop).

Trade-offs: the bitmaps are a cache of ``retrieval_items`` built at start-up (a few seconds
per million items) and updated after each committed write; memory is a few bytes per item
per facet, plus 16 bytes per item id for the times.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy
from pyroaring import BitMap

from ._query import is_stop_term
from ._store import visibility_separator
from ._tokenizer import query_terms

speaker_name_terms_max = 4
# Initial capacity (item ids) of the time arrays; they grow by doubling.
time_array_ids_initial = 1024


def speaker_terms(speaker: str) -> list[str]:
    """The terms by which a query can name a speaker ("Caroline", "小天")."""
    terms = [term for term in query_terms(speaker) if not is_stop_term(term)]
    return terms[:speaker_name_terms_max]


@dataclass(frozen=True)
class RecallFilter:
    """What a recall may return.

    ``tenant`` is mandatory: recall never crosses tenants (surfaces, users).  ``scopes`` and
    ``kinds`` are alternatives (any of them; ``None`` means no restriction).  ``viewer`` is the
    entry asking: it sees items visible to everyone plus items whose visibility names it;
    ``None`` means no entry restriction (the tenant's own, server-side recall).
    """

    tenant: str
    scopes: frozenset[str] | None = None
    kinds: frozenset[str] | None = None
    viewer: str | None = None
    include_forgotten: bool = False


facet_prefilter_share_max = 0.5
"""The text index's facet pre-filter is used only for filters whose candidates are fewer than
this share of the live items (measured at 100k knowledge items, 88% in one scope: the bm25
top-270 of a four-term query took 5-17 ms with the pre-filter and half that without)."""


class FacetBitmaps:
    """Per-facet bitmaps of item ids, plus the forgotten and deleted tombstones."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, BitMap] = {}
        self.by_scope: dict[tuple[str, str], BitMap] = {}
        self.by_kind: dict[tuple[str, str], BitMap] = {}
        self.by_viewer: dict[str, BitMap] = {}
        # (tenant, name term) -> items said by a speaker whose name contains that term.
        self.by_speaker_term: dict[tuple[str, str], BitMap] = {}
        self.visible_to_all = BitMap()
        # Items whose ``context`` is not empty: without any among the allowed ids, the
        # context-weighted text list ranks exactly like the text list (see
        # ``MemoryIndex._recall_hybrid``), so recall scans the text index once, not twice.
        self.with_context = BitMap()
        # Every item ever loaded or added (deleted ones included): a filter whose candidates
        # are all of them needs no facet pre-filter in the text index.
        self.every_item = BitMap()
        self.forgotten = BitMap()
        self.deleted = BitMap()
        self.highest_id = 0
        # Seconds since the epoch per item id: the item's interval [start, end].  Ids never
        # written stay NaN, which no window comparison admits.
        self._time_start = numpy.full(time_array_ids_initial, numpy.nan)
        self._time_end = numpy.full(time_array_ids_initial, numpy.nan)

    def _time_capacity(self, highest_id: int) -> None:
        if highest_id < len(self._time_start):
            return
        capacity = max(highest_id + 1, 2 * len(self._time_start))
        for name in ("_time_start", "_time_end"):
            grown = numpy.full(capacity, numpy.nan)
            old = getattr(self, name)
            grown[: len(old)] = old
            setattr(self, name, grown)

    def set_times(self, ids: numpy.ndarray, starts: numpy.ndarray, ends: numpy.ndarray) -> None:
        """Records items' intervals (vectorised: the start-up load passes every item at once)."""
        ids = numpy.asarray(ids, dtype=numpy.int64)
        if len(ids) == 0:
            return
        self._time_capacity(int(ids.max()))
        self._time_start[ids] = starts
        self._time_end[ids] = ends

    def in_window(self, allowed: BitMap, start: float, end: float) -> BitMap:
        """The ids of ``allowed`` whose interval overlaps ``[start, end)``."""
        keys = _bitmap_ids(allowed)
        keys = keys[keys < len(self._time_start)]
        inside = (self._time_start[keys] < end) & (self._time_end[keys] >= start)
        return BitMap(keys[inside].astype(numpy.uint32))

    def nearest_in_time(
        self, allowed: BitMap, start: float, end: float, limit: int
    ) -> list[tuple[int, float]]:
        """Up to ``limit`` ``(id, distance seconds)`` of ``allowed`` nearest to
        ``[start, end)``: overlapping items first (distance 0), then by distance to the
        window's nearer edge; ties go to the later item (then the higher id), since recent
        memories are the likelier referent."""
        keys = _bitmap_ids(allowed)
        keys = keys[keys < len(self._time_start)]
        starts, ends = self._time_start[keys], self._time_end[keys]
        known = ~numpy.isnan(starts)
        keys, starts, ends = keys[known], starts[known], ends[known]
        distance = numpy.maximum(numpy.maximum(starts - end, start - ends), 0.0)
        if len(keys) > limit:
            # Only items as near as the ``limit``-th nearest can be in the answer (ties
            # included, so the tie-breaks below see every candidate): a linear partition
            # instead of sorting every allowed item.
            nearest = numpy.partition(distance, limit - 1)[limit - 1]
            near = distance <= nearest
            keys, starts, distance = keys[near], starts[near], distance[near]
        order = numpy.lexsort((-keys, -starts, distance))[:limit]
        return [(int(keys[i]), float(distance[i])) for i in order]

    def add(
        self,
        item_id: int,
        tenant: str,
        scope: str,
        kind: str,
        visibility: Iterable[str],
        speaker: str = "",
        has_context: bool = False,
    ) -> None:
        self.every_item.add(item_id)
        if has_context:
            self.with_context.add(item_id)
        self.by_tenant.setdefault(tenant, BitMap()).add(item_id)
        self.by_scope.setdefault((tenant, scope), BitMap()).add(item_id)
        self.by_kind.setdefault((tenant, kind), BitMap()).add(item_id)
        viewers = list(visibility)
        if not viewers:
            self.visible_to_all.add(item_id)
        for viewer in viewers:
            self.by_viewer.setdefault(viewer, BitMap()).add(item_id)
        for term in speaker_terms(speaker):
            self.by_speaker_term.setdefault((tenant, term), BitMap()).add(item_id)
        self.highest_id = max(self.highest_id, item_id)

    def add_row(
        self,
        item_id: int,
        tenant: str,
        scope: str,
        kind: str,
        speaker: str,
        visibility: str,
        forgotten: int,
        deleted: int,
        has_context: int = 0,
    ) -> None:
        """Loads one ``facet_rows`` row (visibility still joined)."""
        viewers = filter(None, visibility.split(visibility_separator))
        self.add(item_id, tenant, scope, kind, viewers, speaker, bool(has_context))
        if forgotten:
            self.forgotten.add(item_id)
        if deleted:
            self.deleted.add(item_id)

    def load_rows(self, rows: Iterable[tuple]) -> None:
        """Loads ``facet_rows`` rows: the facets one by one, the times in one assignment."""
        ids, starts, ends = [], [], []
        for row in rows:
            self.add_row(*row[:8], *row[10:11])
            ids.append(row[0])
            starts.append(row[8])
            ends.append(row[9])
        self.set_times(numpy.asarray(ids), numpy.asarray(starts), numpy.asarray(ends))

    def speakers_mentioned(self, tenant: str, terms: Iterable[str]) -> tuple[list[str], BitMap]:
        """The query terms that name a speaker of this tenant, and the items those speakers
        said."""
        named = [term for term in terms if (tenant, term) in self.by_speaker_term]
        said = BitMap.union(BitMap(), *(self.by_speaker_term[(tenant, term)] for term in named))
        return named, said

    def allowed(self, recall_filter: RecallFilter) -> BitMap:
        """The ids ``recall_filter`` admits; a new bitmap the caller may modify."""
        allowed = self.candidates(recall_filter)
        if recall_filter.viewer is not None:
            allowed &= self.visible_to_all | self.by_viewer.get(recall_filter.viewer, BitMap())
        allowed -= self.deleted
        if not recall_filter.include_forgotten:
            allowed -= self.forgotten
        return allowed

    def admits_every_item(self, candidates: BitMap) -> bool:
        """Whether ``candidates`` (from ``candidates``) is every item there is: the text
        index's facet pre-filter would then only cost time (intersecting the longest posting
        list of all), never remove a match."""
        return len(candidates) == len(self.every_item)

    def admits_most_items(self, candidates: BitMap) -> bool:
        """Whether ``candidates`` hold at least ``facet_prefilter_share_max`` of the live
        items: the text index's facet pre-filter then costs more than it saves, since it
        walks a posting list about as long as the index to remove few matches, and
        filtering the ranked rows by the bitmap (over-fetching by the selectivity) finds the
        same hits."""
        live = len(self.every_item) - len(self.deleted)
        return len(candidates) >= facet_prefilter_share_max * live

    def any_with_context(self, allowed: BitMap) -> bool:
        """Whether any id of ``allowed`` has a non-empty ``context``."""
        return self.with_context.intersection_cardinality(allowed) > 0

    def candidates(self, recall_filter: RecallFilter) -> BitMap:
        """The ids of the filter's tenant, scopes and kinds: what the text index can
        pre-filter by itself (``facet_match_expression``)."""
        tenant = recall_filter.tenant
        allowed = BitMap(self.by_tenant.get(tenant, BitMap()))
        if recall_filter.scopes is not None:
            allowed &= BitMap.union(
                BitMap(), *(self.by_scope.get((tenant, s), BitMap()) for s in recall_filter.scopes)
            )
        if recall_filter.kinds is not None:
            allowed &= BitMap.union(
                BitMap(), *(self.by_kind.get((tenant, k), BitMap()) for k in recall_filter.kinds)
            )
        return allowed


def _bitmap_ids(bitmap: BitMap) -> numpy.ndarray:
    """A bitmap's ids as an ``int64`` array (through the buffer, not a Python list)."""
    return numpy.frombuffer(bitmap.to_array(), dtype=numpy.uint32).astype(numpy.int64)
