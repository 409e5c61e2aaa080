"""``/memory/query`` and the knowledge recall every read path shares.

Why it exists: the contract's recall is hybrid — BM25 over the knowledge text, nearest
vectors, and a relation graph over the stored entities/relations (§3.2) — and the agent
context, forget-target resolution and query all need the same candidates under the same hard
filters.  ``KnowledgeIndex`` is the knowledge surface's view of the engine's ONE shared
``MemoryIndex`` (``troupe.retrieval.shared_memory_indexes``): tenant ``knowledge``, the item's
scope as the index scope (a hard filter: recall never crosses scopes it was not given), the
item's sensitivity as the index kind (``clean`` / ``sensitive``, so the agent context filters
sensitive items before ranking, not after), key ``knowledge_id \\x1f version`` (a key is never
reused: an update deletes the old version's key and adds the new one).

Recall (``KnowledgeIndex.recall``) fuses ranked lists with reciprocal-rank fusion: the
index's own hybrid list (BM25 + vectors, one read), and the graph list (another read, run
beside the first) — knowledge items that mention
an entity the query names, then items one relation away from those entities.  Entities are
found by looking the query's words and CJK n-grams up in the stored entity names of the
allowed scopes (bounded lookups, no scan), so the graph costs a few indexed reads at 100k
items.

``query_knowledge`` then reads the winning items, and asks the Model port to answer from their
text only (the answer cites what it was given: ``source_evidence`` are the winners' evidence
ids, ``source_knowledge`` the best item); the LocalModel answers extractively (the most
central sentences of the sources), and any model failure falls back to that same extractive
answer — an answer never comes from anything but the cited sources.

Keeping in step: SQLite's knowledge rows are the truth.  The first use per engine reconciles
the tenant (ACTIVE items and versions against index keys), repairing a crash between a store
commit and its index write; after that the writers (structuring, update, forget) call
``put``/``remove`` right after their commits.  The graph list keeps only items the index
holds, so an item appears to every recall (query, agent context, forget planning) at the same
moment: when its index entry exists, not when its rows commit.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import trio

from troupe.models import ChatMessage, CompletionRequest, ModelError
from troupe.retrieval import (
    InvalidTimeWindow,
    MemoryIndex,
    MemoryItem,
    RankedList,
    RecallFilter,
    RecallSettings,
    parse_time_window,
    reciprocal_rank_fusion,
    shared_memory_indexes,
    text_query,
)
from troupe.retrieval._memory_index import add_batch_items_max, recall_limit_max
from troupe.retrieval._tokenizer import is_cjk, query_terms

from ._protocol import MemoryAnswer, query_top_k_default, query_top_k_max, query_top_k_min
from ._structuring import body_text

knowledge_tenant = "knowledge"
kind_clean = "clean"
kind_sensitive = "sensitive"
query_text_characters_max = 4_000
recall_depth_max = 200
"""Candidates one recall fuses (the agent context over-fetches to survive its filters)."""
graph_query_terms_max = 256
"""Query words and CJK n-grams looked up as entity names (one indexed lookup each)."""
graph_ngram_characters_max = 12
graph_neighbours_max = 200
"""Knowledge items the relation graph may contribute to one recall."""
graph_entities_max = 16
"""Entity names (matched plus one relation away) one recall follows."""
"""Entity names (matched plus one relation away) one recall follows."""
graph_rows_per_entity_max = 200
"""Items read per followed entity name (the newest ids): the graph's cost stays bounded
however common a name is."""
graph_candidate_rows_max = 400
"""Entity rows one recall's graph list reads in all, matched names and their neighbours
together: each name gets ``max(1, min(graph_rows_per_entity_max, budget // names))`` and the
neighbours what the matched names left.  Unbounded, 16 names × 200 rows re-checked in SQL were
the agent context's p99 (13 ms of its 25 ms CPU at 100k items, measured)."""
hybrid_weight = 1.0
graph_weight = 0.6
answer_sources_max = 5
answer_sentences_max = 3
answer_characters_max = 2_000
answer_model_timeout_seconds = 20.0
reconcile_batch_items = 2_000
sql_parameters_max = 500
"""Ids bound into one ``IN (...)`` (SQLite allows more; this keeps statements small)."""
no_answer_text = "没有找到相关记忆。"

assert query_top_k_max <= recall_depth_max <= recall_limit_max
assert graph_entities_max <= graph_candidate_rows_max
assert reconcile_batch_items <= add_batch_items_max

_key_separator = "\x1f"

knowledge_recall_settings = RecallSettings(common_term_share_max=0.5)
"""The shared index's defaults plus common-term pruning, like the character surface: a term in
more than half of the items weighs nothing in bm25 and costs a scan of most of the text index
(an agent's memories may all say "用户"); leaving it out changes no ranking among items that
match another term (``troupe.retrieval._memory_index``, "Common terms")."""


# -- what the store holds, as recall reads it -----------------------------------------------


@dataclass(frozen=True)
class EvidenceLink:
    evidence_id: str
    sensitivity: int
    quality_score: float
    created_at: float


@dataclass(frozen=True)
class KnowledgeView:
    """One knowledge row with its evidence links and conflict states (one read)."""

    knowledge_id: str
    scope: str
    status: str
    version: int
    title: str
    body: Any
    created_at: float
    updated_at: float
    evidence: tuple[EvidenceLink, ...]
    conflicts: tuple[tuple[str, bool], ...]
    entities: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.status == "ACTIVE"

    @property
    def sensitive(self) -> bool:
        return any(link.sensitivity > 0 for link in self.evidence)

    @property
    def quality(self) -> float:
        return max((link.quality_score for link in self.evidence), default=0.0)

    @property
    def evidence_ids(self) -> tuple[str, ...]:
        return tuple(link.evidence_id for link in self.evidence)

    @property
    def text(self) -> str:
        """What the index holds of the item: title, body text and entities."""
        parts = [self.title, body_text(self.body)]
        if self.entities:
            parts.append(" ".join(self.entities))
        return "\n".join(part for part in parts if part)


def _chunks(values: Sequence[Any], size: int = sql_parameters_max) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _marks(count: int) -> str:
    return ",".join("?" * count)


def knowledge_views(
    connection: apsw.Connection, knowledge_ids: Sequence[str], *, entities: bool = False
) -> dict[str, KnowledgeView]:
    """The rows of ``knowledge_ids`` that exist, with links (evidence that exists), conflicts
    and optionally entities; a plain read job."""
    ids = list(dict.fromkeys(knowledge_ids))
    rows: dict[str, tuple] = {}
    links: dict[str, list[EvidenceLink]] = {}
    conflicts: dict[str, list[tuple[str, bool]]] = {}
    names: dict[str, list[str]] = {}
    for chunk in _chunks(ids):
        marks = _marks(len(chunk))
        for row in connection.execute(
            "SELECT id, scope, status, version, title, body_json, created_at, updated_at "
            f"FROM knowledge_items WHERE id IN ({marks})",
            tuple(chunk),
        ):
            rows[row[0]] = row
        for knowledge_id, evidence_id, sensitivity, quality, created_at in connection.execute(
            "SELECT l.knowledge_id, e.id, e.sensitivity, e.quality_score, e.created_at "
            "FROM knowledge_links AS l JOIN knowledge_evidence AS e ON e.id = l.evidence_id "
            f"WHERE l.knowledge_id IN ({marks}) ORDER BY e.created_at, e.id",
            tuple(chunk),
        ):
            links.setdefault(knowledge_id, []).append(
                EvidenceLink(evidence_id, int(sensitivity), float(quality), float(created_at))
            )
        for knowledge_id, resolution, pending in connection.execute(
            "SELECT knowledge_id, resolution, pending FROM knowledge_conflicts "
            f"WHERE knowledge_id IN ({marks}) ORDER BY created_at, id",
            tuple(chunk),
        ):
            conflicts.setdefault(knowledge_id, []).append((resolution, bool(pending)))
        if entities:
            for knowledge_id, name in connection.execute(
                f"SELECT knowledge_id, name FROM knowledge_entities WHERE knowledge_id IN ({marks})",
                tuple(chunk),
            ):
                names.setdefault(knowledge_id, []).append(name)
    views = {}
    for knowledge_id in ids:
        row = rows.get(knowledge_id)
        if row is None:
            continue
        views[knowledge_id] = KnowledgeView(
            knowledge_id=row[0],
            scope=row[1],
            status=row[2],
            version=int(row[3]),
            title=row[4],
            body=json.loads(row[5]),
            created_at=float(row[6]),
            updated_at=float(row[7]),
            evidence=tuple(links.get(knowledge_id, ())),
            conflicts=tuple(conflicts.get(knowledge_id, ())),
            entities=tuple(sorted(names.get(knowledge_id, ()))),
        )
    return views


# -- the index -------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnowledgeDocument:
    """One ACTIVE knowledge version as the index holds it."""

    knowledge_id: str
    version: int
    scope: str
    text: str
    sensitive: bool
    created_at: float

    @classmethod
    def of(cls, view: KnowledgeView) -> KnowledgeDocument:
        return cls(
            view.knowledge_id, view.version, view.scope, view.text, view.sensitive, view.created_at
        )


@dataclass(frozen=True)
class Candidate:
    """One recalled knowledge item, best first; ``ranks`` say which lists found it."""

    knowledge_id: str
    score: float
    ranks: dict[str, int]


def index_key(knowledge_id: str, version: int, generation: int = 0) -> str:
    """``id \\x1f version \\x1f generation``: the generation counts earlier index entries of
    the same version (an item archived and re-activated, a crash repaired), because a
    retrieval key is never reused, not even after its deletion."""
    return f"{knowledge_id}{_key_separator}{version}{_key_separator}{generation}"


def _key_id(key: str) -> str:
    return key.split(_key_separator, 1)[0]


def _key_version(key: str | None) -> int | None:
    return None if key is None else int(key.split(_key_separator)[1])


def _next_generation(connection: apsw.Connection, knowledge_id: str, version: int) -> int:
    prefix = f"{knowledge_id}{_key_separator}{version}{_key_separator}"
    (count,) = connection.execute(
        "SELECT count(*) FROM retrieval_items WHERE key >= ? AND key < ?",
        (prefix, prefix + "\U0010ffff"),
    ).fetchone()
    return int(count)


def _naive_utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(tzinfo=None)


def _memory_item(document: KnowledgeDocument, key: str) -> MemoryItem:
    return MemoryItem(
        key=key,
        text=document.text,
        tenant=knowledge_tenant,
        created_at=_naive_utc(document.created_at),
        scope=document.scope,
        kind=kind_sensitive if document.sensitive else kind_clean,
    )


def _active_versions(connection: apsw.Connection) -> dict[str, int]:
    return {
        row[0]: int(row[1])
        for row in connection.execute(
            "SELECT id, version FROM knowledge_items WHERE status = 'ACTIVE' ORDER BY id"
        )
    }


def _indexed_keys(connection: apsw.Connection) -> dict[str, str]:
    return {
        _key_id(key): key
        for (key,) in connection.execute(
            "SELECT key FROM retrieval_items WHERE tenant = ? AND deleted = 0", (knowledge_tenant,)
        )
    }


def graph_terms(query: str) -> list[str]:
    """The query's candidate entity names: its words and every CJK substring of 2 to
    ``graph_ngram_characters_max`` characters, longest first, bounded."""
    terms: list[str] = []
    for word in re.findall(r"[^\W_]+", query):
        if all(is_cjk(character) for character in word):
            for length in range(min(len(word), graph_ngram_characters_max), 1, -1):
                terms.extend(word[start : start + length] for start in range(len(word) - length + 1))
        else:
            terms.append(word)
    terms.extend(term for term in query_terms(query) if not is_cjk(term))
    stripped = " ".join(query.split())
    if 0 < len(stripped) <= graph_ngram_characters_max * 4:
        terms.insert(0, stripped)
    return list(dict.fromkeys(terms))[:graph_query_terms_max]


def graph_list(
    connection: apsw.Connection,
    query: str,
    *,
    scopes: frozenset[str] | None,
    clean_only: bool,
    window: tuple[float, float] | None,
) -> list[str]:
    """The relation graph's ranked knowledge ids: items naming an entity the query names
    (most matched names first), then items naming an entity one relation away."""
    terms = graph_terms(query)
    if not terms:
        return []
    matched: dict[str, int] = {}
    names: list[str] = []
    for (name,) in connection.execute(
        f"SELECT DISTINCT name FROM knowledge_entities WHERE name IN ({_marks(len(terms))})",
        tuple(terms),
    ):
        names.append(name)
    names = sorted(names, key=lambda name: (-len(name), name))[:graph_entities_max]
    if not names:
        return []
    neighbours: list[str] = []
    marks = _marks(len(names))
    for source, target in connection.execute(
        "SELECT source, target FROM knowledge_relations "
        f"WHERE source IN ({marks}) OR target IN ({marks}) LIMIT ?",
        (*names, *names, graph_neighbours_max),
    ):
        for name in (source, target):
            if name not in names and name not in neighbours:
                neighbours.append(name)
    neighbours = neighbours[: max(0, graph_entities_max - len(names))]

    budget = {"rows": graph_candidate_rows_max}

    def mentioning(entity_names: list[str]) -> list[tuple[str, int]]:
        # Bounded per name through the (name, knowledge_id) index first, then filtered: a
        # common entity must not make the graph scan every item that names it, and all the
        # names together read at most ``graph_candidate_rows_max`` rows.
        hits: dict[str, int] = {}
        if not entity_names or budget["rows"] <= 0:
            return []
        per_name = max(1, min(graph_rows_per_entity_max, budget["rows"] // len(entity_names)))
        for name in entity_names:
            limit = min(per_name, budget["rows"])
            if limit <= 0:
                break
            for (knowledge_id,) in connection.execute(
                "SELECT knowledge_id FROM knowledge_entities WHERE name = ? "
                "ORDER BY knowledge_id DESC LIMIT ?",
                (name, limit),
            ):
                budget["rows"] -= 1
                hits[knowledge_id] = hits.get(knowledge_id, 0) + 1
        if not hits:
            return []
        ids = list(hits)
        # The unary ``+`` keeps SQLite on the primary key for the few ids at hand: left free,
        # it walks the (scope, status) index over the whole scope (14 ms instead of 0.9 ms at
        # 100k items, measured).
        conditions = [f"i.id IN ({_marks(len(ids))})", "+i.status = 'ACTIVE'"]
        parameters: list[Any] = list(ids)
        if scopes is not None:
            conditions.append(f"+i.scope IN ({_marks(len(scopes))})")
            parameters.extend(sorted(scopes))
        if window is not None:
            conditions.append("+i.created_at >= ? AND +i.created_at < ?")
            parameters.extend(window)
        if clean_only:
            conditions.append(
                "NOT EXISTS (SELECT 1 FROM knowledge_links AS l JOIN knowledge_evidence AS e "
                "ON e.id = l.evidence_id WHERE l.knowledge_id = i.id AND e.sensitivity > 0)"
            )
        kept = [
            (row[0], float(row[1]))
            for row in connection.execute(
                f"SELECT i.id, i.updated_at FROM knowledge_items AS i WHERE {' AND '.join(conditions)}",
                tuple(parameters),
            )
        ]
        kept.sort(key=lambda row: (-hits[row[0]], -row[1], row[0]))
        return [(knowledge_id, hits[knowledge_id]) for knowledge_id, _ in kept[:graph_neighbours_max]]

    for knowledge_id, hits in mentioning(names):
        matched[knowledge_id] = int(hits)
    ranked = list(matched)
    for knowledge_id, _ in mentioning(neighbours):
        if knowledge_id not in matched:
            ranked.append(knowledge_id)
    return ranked[:graph_neighbours_max]


class KnowledgeIndex:
    """The knowledge tenant of the engine's shared ``MemoryIndex``; get it from
    ``knowledge_indexes.open(engine, embedder)``.

    ``refresh(ids)`` is the one call writers make after committing anything that changes a
    knowledge item (structuring, update, promotion, forget): it reads the items' current rows
    and makes the index match them (ACTIVE → its current version indexed; anything else or
    gone → removed).
    """

    def __init__(self, engine: Any, index: MemoryIndex) -> None:
        self._engine = engine
        self.index = index
        self._keys: dict[str, str] = {}
        self._lock = trio.Lock()

    @property
    def indexed_count(self) -> int:
        return len(self._keys)

    def holds(self, knowledge_id: str) -> bool:
        """Whether recall can return the item now (its index entry exists)."""
        return knowledge_id in self._keys

    async def reconcile(self) -> int:
        """Makes the tenant's index items exactly the store's ACTIVE items (first use after
        start-up); returns how many items were added or removed."""
        async with self._lock:
            active, keys = await self._engine.read(
                lambda connection: (_active_versions(connection), _indexed_keys(connection))
            )
            self._keys = dict(keys)
            changed = 0
            gone = [knowledge_id for knowledge_id in keys if knowledge_id not in active]
            if gone:
                changed += await self._remove_locked(gone)
            # Missing items, and items indexed at an old version (a crash between a commit
            # and its index write), are refreshed from their rows.
            stale = [
                knowledge_id
                for knowledge_id, version in active.items()
                if _key_version(keys.get(knowledge_id)) != version
            ]
            for chunk in _chunks(stale, reconcile_batch_items):
                changed += await self._refresh_locked(list(chunk))
            return changed

    async def refresh(self, knowledge_ids: Sequence[str], *, reindex: bool = False) -> int:
        """Makes the index match the store for these items (see the class docstring).
        ``reindex`` re-adds items whose version is already indexed: their text changed
        without a version bump (an update's entities rebuilt after the update committed)."""
        async with self._lock:
            changed = 0
            for chunk in _chunks(list(dict.fromkeys(knowledge_ids)), reconcile_batch_items):
                changed += await self._refresh_locked(list(chunk), reindex=reindex)
            return changed

    async def remove(self, knowledge_ids: Sequence[str]) -> int:
        """Deletes items from the index for good: text, facets and vectors (forget)."""
        async with self._lock:
            return await self._remove_locked(list(knowledge_ids))

    async def _remove_locked(self, knowledge_ids: list[str]) -> int:
        keys = [self._keys[item] for item in knowledge_ids if item in self._keys]
        if not keys:
            return 0
        await self.index.delete(keys)
        for knowledge_id in knowledge_ids:
            self._keys.pop(knowledge_id, None)
        return len(keys)

    async def _refresh_locked(self, knowledge_ids: list[str], *, reindex: bool = False) -> int:
        def read(connection: apsw.Connection) -> tuple[dict[str, KnowledgeView], dict[str, int]]:
            views = knowledge_views(connection, knowledge_ids, entities=True)
            generations = {
                knowledge_id: _next_generation(connection, knowledge_id, view.version)
                for knowledge_id, view in views.items()
                if view.active and (reindex or _key_version(self._keys.get(knowledge_id)) != view.version)
            }
            return views, generations

        views, generations = await self._engine.read(read)
        wanted: list[tuple[KnowledgeDocument, str]] = []
        outdated: list[str] = []
        for knowledge_id in knowledge_ids:
            view = views.get(knowledge_id)
            current = self._keys.get(knowledge_id)
            if view is None or not view.active:
                if current is not None:
                    outdated.append(knowledge_id)
                continue
            if knowledge_id not in generations:
                continue  # this version is indexed
            if current is not None:
                outdated.append(knowledge_id)
            document = KnowledgeDocument.of(view)
            wanted.append((document, index_key(knowledge_id, view.version, generations[knowledge_id])))
        # The new keys go in before the old ones go out: recall does not take this lock, and
        # an item must never be missing from it while it is being re-indexed (a forget plan
        # or an agent context in that window would not find it).
        outdated_keys = [self._keys[knowledge_id] for knowledge_id in outdated if knowledge_id in self._keys]
        changed = 0
        if wanted:
            await self.index.add([_memory_item(document, key) for document, key in wanted])
            for document, key in wanted:
                self._keys[document.knowledge_id] = key
            changed += len(wanted)
        if outdated_keys:
            await self.index.delete(outdated_keys)
            replaced = {document.knowledge_id for document, _ in wanted}
            for knowledge_id in outdated:
                if knowledge_id not in replaced:
                    self._keys.pop(knowledge_id, None)
            changed += len(outdated_keys)
        return changed

    async def recall(
        self,
        query: str,
        *,
        scopes: frozenset[str] | None,
        limit: int,
        clean_only: bool = False,
        time: str | None = None,
    ) -> list[Candidate]:
        """Hybrid + graph recall (see the module docstring); ``scopes=None`` means every
        scope.  An empty query or one without any match gives an empty list."""
        assert 0 < limit <= recall_depth_max
        query = query.strip()[:query_text_characters_max]
        if not query:
            return []
        window = None
        if time is not None:
            try:
                parsed = parse_time_window(time)
                window = (parsed.start_seconds, parsed.end_seconds)
            except InvalidTimeWindow:
                time = None
        recall_filter = RecallFilter(
            knowledge_tenant,
            scopes=scopes,
            kinds=frozenset({kind_clean}) if clean_only else None,
        )
        found: dict[str, list[str]] = {}

        async def hybrid_list() -> None:
            result = await self.index.recall(query, time=time, recall_filter=recall_filter, limit=limit,
                                             settings=knowledge_recall_settings)
            # An item being re-indexed can briefly have two keys: one entry per item.
            found["hybrid"] = list(dict.fromkeys(_key_id(hit.key) for hit in result.hits))

        async def graph_list_read() -> None:
            ranked = await self._engine.read(
                lambda connection: graph_list(
                    connection, query, scopes=scopes, clean_only=clean_only, window=window
                )
            )
            # Only items the index holds: structuring commits an item's rows (the graph's
            # source) before it indexes the item, and an item seen by one list but not the
            # other in that window made a forget plan miss what /memory/query had just cited.
            # Every recall now sees an item from the moment its index entry exists.
            found["graph"] = [knowledge_id for knowledge_id in ranked if knowledge_id in self._keys]

        # The two lists are independent reads: side by side they cost one wait, not two.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hybrid_list)
            nursery.start_soon(graph_list_read)
        lists = [RankedList("hybrid", found["hybrid"], hybrid_weight),
                 RankedList("graph", found["graph"], graph_weight)]
        fused = reciprocal_rank_fusion(lists, limit=limit)
        positions = [
            {knowledge_id: rank for rank, knowledge_id in reversed(list(enumerate(ranked.keys, 1)))}
            for ranked in lists
        ]
        return [
            Candidate(
                str(knowledge_id),
                float(score),
                {
                    ranked.name: found[knowledge_id]
                    for ranked, found in zip(lists, positions, strict=True)
                    if knowledge_id in found
                },
            )
            for knowledge_id, score in fused
        ]


class KnowledgeIndexes:
    """One ``KnowledgeIndex`` per engine, reconciled on first use, kept in the engine's
    ``attachments`` (a registry keyed by engine would keep every engine ever opened: the
    index references its engine)."""

    index_key = "troupe.knowledge.index"
    lock_key = "troupe.knowledge.index_lock"

    async def open(self, engine: Any, embedder: Any = None) -> KnowledgeIndex:
        """The engine's knowledge index; the first caller opens and reconciles it, concurrent
        first callers wait for that."""
        attachments = engine.attachments
        knowledge_index = attachments.get(self.index_key)
        if knowledge_index is not None:
            return knowledge_index
        lock = attachments.setdefault(self.lock_key, trio.Lock())
        async with lock:
            knowledge_index = attachments.get(self.index_key)
            if knowledge_index is None:
                index = await shared_memory_indexes.index_for(engine, embedder)
                knowledge_index = KnowledgeIndex(engine, index)
                await knowledge_index.reconcile()
                attachments[self.index_key] = knowledge_index
        return knowledge_index

    def opened(self, engine: Any) -> KnowledgeIndex | None:
        return engine.attachments.get(self.index_key)

    def forget_engine(self, engine: Any) -> None:
        engine.attachments.pop(self.index_key, None)


knowledge_indexes = KnowledgeIndexes()


# -- /memory/query ---------------------------------------------------------------------------

_relative_ranges = (
    "today", "yesterday", "this_week", "last_week", "this_month", "last_month", "this_year",
    "last_year",
)


def time_range_window(time_range: str | None, now: float) -> str | None:
    """The recall time window (``troupe.retrieval`` grammar) of a ``context_hint.time_range``
    (``today``, ``yesterday``, ``this_week``, ``last_week``, ``this_month``, ``last_month``,
    ``this_year``, ``last_year``, or a literal window such as ``2026-04``); ``None`` when there
    is none or it is not understood (then recall is not time-filtered).  Days are UTC days."""
    if time_range is None or not time_range.strip():
        return None
    name = time_range.strip().lower().replace("-", "_").replace(" ", "_")
    today = datetime.datetime.fromtimestamp(now, datetime.UTC).date()
    if name in _relative_ranges:
        if name == "today":
            return today.isoformat()
        if name == "yesterday":
            return (today - datetime.timedelta(days=1)).isoformat()
        if name in ("this_week", "last_week"):
            monday = today - datetime.timedelta(days=today.weekday())
            if name == "last_week":
                monday -= datetime.timedelta(days=7)
            sunday = monday + datetime.timedelta(days=6)
            return f"{monday.isoformat()}/{sunday.isoformat()}"
        if name == "this_month":
            return f"{today.year:04d}-{today.month:02d}"
        if name == "last_month":
            first = today.replace(day=1) - datetime.timedelta(days=1)
            return f"{first.year:04d}-{first.month:02d}"
        if name == "this_year":
            return f"{today.year:04d}"
        return f"{today.year - 1:04d}"
    try:
        parse_time_window(time_range.strip())
    except InvalidTimeWindow:
        return None
    return time_range.strip()


_sentence_split = re.compile(r"(?<=[。！？!?；;\n])|(?<=\.)\s+")


def _sentences(view: KnowledgeView) -> list[str]:
    text = f"{view.title}。{body_text(view.body)}" if view.title else body_text(view.body)
    return [part.strip() for part in _sentence_split.split(text) if part and part.strip()]


def relevant_sentences(query: str, views: Sequence[KnowledgeView]) -> list[str]:
    """The sources' sentences that share the most query terms, best first (ties keep the
    sources' order); at most ``answer_sentences_max``."""
    terms = text_query(query).terms
    scored = []
    for source_index, view in enumerate(views):
        for sentence_index, sentence in enumerate(_sentences(view)):
            lowered = sentence.lower()
            hits = sum(1 for term in terms if term in lowered)
            if hits:
                scored.append((-hits, source_index, sentence_index, sentence))
    scored.sort()
    chosen = list(dict.fromkeys(sentence for *_, sentence in scored))[:answer_sentences_max]
    if not chosen and views:
        chosen = _sentences(views[0])[:1]
    return chosen


def term_coverage(query: str, views: Sequence[KnowledgeView]) -> float:
    """The share of the query's content terms found in the sources' text."""
    terms = text_query(query).terms
    if not terms:
        return 0.0
    text = " ".join(view.text.lower() for view in views)
    return sum(1 for term in terms if term in text) / len(terms)


_answer_instruction = (
    "Answer the question using ONLY the numbered sources below; if they do not contain the "
    "answer, say so. Be brief. Answer in the language of the question."
)


async def synthesise_answer(model: Any, query: str, views: Sequence[KnowledgeView]) -> str:
    """The answer from the sources only: a conversing model answers from them; otherwise (the
    LocalModel, which cannot converse) and on any model failure, the sources' sentences most
    relevant to the query are the answer."""
    sentences = relevant_sentences(query, views)
    extractive = "".join(
        sentence if sentence[-1] in "。！？!?；;." else sentence + "。" for sentence in sentences
    )[:answer_characters_max]
    capabilities = getattr(model, "capabilities", None)
    if model is None or (capabilities is not None and "converse" not in capabilities):
        # The LocalModel cannot answer; its summary of at most three sentences is those
        # sentences, so the extractive answer is already what it would say.
        return extractive
    sources = "\n".join(
        f"[{index}] {view.title}: {body_text(view.body)}"[:answer_characters_max]
        for index, view in enumerate(views, 1)
    )
    messages = (
        ChatMessage("system", _answer_instruction),
        ChatMessage("user", f"{sources}\n\nQuestion: {query}"),
    )
    try:
        with trio.move_on_after(answer_model_timeout_seconds):
            completion = await model.complete(CompletionRequest(messages=messages))
            answer = completion.text.strip()
            if answer:
                return answer[:answer_characters_max]
    except ModelError:
        pass
    return extractive


async def query_knowledge(
    engine: Any,
    knowledge_index: KnowledgeIndex,
    env: Any,
    text: str,
    *,
    scope: str | None,
    time_range: str | None = None,
    top_k: int = query_top_k_default,
    include_sensitive: bool = True,
) -> MemoryAnswer:
    """Runs one ``/memory/query`` (see the module docstring).  The caller validated ``text``
    (1..``query_text_characters_max``), ``scope`` and ``top_k``.  ``include_sensitive=False``
    leaves items with sensitive evidence out (the user's own query may read them)."""
    assert query_top_k_min <= top_k <= query_top_k_max
    started = env.clock.monotonic()
    scopes = None if scope is None else frozenset({scope})
    window = time_range_window(time_range, env.clock.wall())
    candidates = await knowledge_index.recall(
        text, scopes=scopes, limit=top_k, clean_only=not include_sensitive, time=window
    )
    ids = [candidate.knowledge_id for candidate in candidates]
    views = await engine.read(lambda connection: knowledge_views(connection, ids))
    usable = [
        views[knowledge_id]
        for knowledge_id in ids
        if knowledge_id in views
        and views[knowledge_id].active
        and views[knowledge_id].evidence
        and (scope is None or views[knowledge_id].scope == scope)
        and (include_sensitive or not views[knowledge_id].sensitive)
    ][:answer_sources_max]

    def elapsed_ms() -> int:
        return max(0, round((env.clock.monotonic() - started) * 1000))

    if not usable:
        return MemoryAnswer(
            answer=no_answer_text, source_evidence=(), source_knowledge=None, confidence=0.0,
            latency_ms=elapsed_ms(),
        )
    answer = await synthesise_answer(env.model, text, usable)
    confidence = round(0.5 * min(1.0, usable[0].quality) + 0.5 * term_coverage(text, usable), 2)
    evidence = tuple(dict.fromkeys(e for view in usable for e in view.evidence_ids))
    return MemoryAnswer(
        answer=answer,
        source_evidence=evidence,
        source_knowledge=usable[0].knowledge_id,
        confidence=confidence,
        latency_ms=elapsed_ms(),
    )


__all__ = [
    "Candidate",
    "EvidenceLink",
    "KnowledgeDocument",
    "KnowledgeIndex",
    "KnowledgeIndexes",
    "KnowledgeView",
    "graph_list",
    "graph_terms",
    "index_key",
    "kind_clean",
    "kind_sensitive",
    "knowledge_indexes",
    "knowledge_recall_settings",
    "knowledge_tenant",
    "knowledge_views",
    "query_knowledge",
    "query_text_characters_max",
    "recall_depth_max",
    "synthesise_answer",
    "time_range_window",
]
