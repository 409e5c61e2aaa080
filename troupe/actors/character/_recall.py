"""``/query_memory``: a character's structured recall over its facts, reflections and archive.

Why it exists: the companion's model calls ``query_memory`` as a tool in the user-visible loop,
so recall must be fast (p99 ≤ 20 ms at 100k facts, embedding excluded), never fail loudly, and
route exactly as the contract's table says.  The ranking engine is ``troupe.retrieval``'s
``MemoryIndex`` (BM25 + optional cosine + reciprocal-rank fusion, time windows in memory);
this module decides what goes into it and how a character's request maps onto it:

=====================  ===============================================================
query only             BM25 + optional cosine, fused with RRF (all three tiers)
query + valid time     hard filter to the window, then the same hybrid recall
time only              facts and reflections by distance to the window, ``score: null``,
                       the input ``time`` echoed
neither                empty ``results``
invalid time + query   the time is ignored: plain query recall
=====================  ===============================================================

What is indexed: active facts (tier ``fact``), archived facts (``fact_archive``) and active
reflections, i.e. ``pending`` and ``confirmed`` ones (``reflection``).  Promoted reflections
live on as persona entries; denied, merged and archived ones are not recalled.  Item key =
``tenant \\x1f id \\x1f changed_seq``: every change of a row in the store gets a new
``changed_seq`` (``_store.memory_version``), the old key is deleted and the new
one added, so a key is never reused (``retrieval_items.key`` is unique for ever, tombstones
included) and an index item always says which version of the row it holds.

Keeping in step: SQLite's ``character_facts`` / ``character_reflections`` are the truth; the
index follows their change sequence.  ``CharacterRecall.sync()`` reads the rows changed after
its cursor (and the removals in ``character_memory_tombstones``) and applies them.  It runs
when the handle is marked stale (``mark_stale``), not before every recall: the character actor
is the only writer of its facts and reflections and marks the handle after each write that can
change them (and a background ``index_catch_up`` task syncs right after), so a recall sees
every write acknowledged before it without a storage read of its own.  A handle starts stale:
the first use of a character reconciles the whole tenant (store rows against index keys), so
a crash between a store commit and its index write is repaired, and nothing is ever indexed
twice.

Sharing: ``MemoryIndex`` keeps caches that only its own writes update, so every surface of
one engine shares ONE index (``troupe.retrieval.shared_memory_indexes``; the host surface's
tenant is ``host``, a character's ``character:<name>``; recall never crosses tenants).
``CharacterRecallIndexes`` hands each character its own ``CharacterRecall`` over it (its
cursor, its key map, its lock).  Releasing a character (``release``) drops that handle: its
in-memory state is gone and the next use rebuilds it from storage, which is what
``/release_character`` and ``/reload`` need (the actor answers 503 meanwhile).

Speed (p99 ≤ 20 ms at 100k facts in one character, embedding excluded;
``bench/character_recall.py``): the cost is the index's, so the character path adds no
storage read per query (see above) and runs the hybrid recall with common-term pruning
(``character_recall_settings``): in one character's facts "主人" is in nearly every row, and
scoring it made every Chinese query rank 80k matches (~34 ms CPU).

Failures: no handle (released, not opened) → ``MemoryUnavailable`` (HTTP 503); anything that
goes wrong inside recall → an empty, successful answer with ``error_code:
"hybrid_recall_failed"``; the exception text never leaves the process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import apsw
import trio

from troupe.retrieval import (
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    RecallResult,
    RecallSettings,
    SharedMemoryIndexes,
    retrieval_migration_steps,
    shared_memory_indexes,
)
from troupe.retrieval._memory_index import add_batch_items_max, recall_query_characters_max

from ._protocol import MemoryHit, MemoryResults, MemoryUnavailable
from ._schema import character_migrations
from ._store import (
    MemoryRecord,
    iterate_memories,
    iterate_memories_limit_max,
    memory_changes,
    memory_version,
)
from ._time_tokens import naive_utc, parse_time_tokens, seconds_from_naive, time_text_characters_max

Tier = Literal["fact", "reflection", "fact_archive"]
recall_tiers: tuple[str, ...] = ("fact", "reflection", "fact_archive")
time_only_tiers: frozenset[str] = frozenset({"fact", "reflection"})
"""The contract's time-only route orders "facts and reflections" (the archive stays out)."""

recallable_reflection_statuses: tuple[str, ...] = ("pending", "confirmed")
recall_tenant_prefix = "character:"
recall_failed_error_code = "hybrid_recall_failed"

query_memory_results_max = 10
"""Results per ``/query_memory`` answer."""
query_characters_max = recall_query_characters_max
"""A longer ``query`` is the caller's error (400)."""
time_characters_max = time_text_characters_max
sync_batch_rows = 2_000
"""Store rows read and indexed per step of a sync (bounds one read and one index write)."""

assert sync_batch_rows <= add_batch_items_max
assert query_memory_results_max <= 200  # MemoryIndex's recall_limit_max

_key_separator = "\x1f"

character_recall_settings = RecallSettings(common_term_share_max=0.5)
"""Hybrid recall as the character surface runs it: the index's defaults plus common-term
pruning (in one character's facts "主人" is in nearly every row; see
``troupe.retrieval._memory_index``)."""

character_surface_migrations = (*retrieval_migration_steps, *character_migrations)
"""Everything the character surface needs in the engine: the retrieval tables (the very
objects the host surface declares, so the server runs them once) and the character
component."""


def recall_tenant(character_name: str) -> str:
    """The retrieval tenant of one character (prefixed: a character named ``host`` must not
    share the host surface's tenant)."""
    return recall_tenant_prefix + character_name


def query_memory_problem(query: Any, time: Any) -> str | None:
    """Why a ``/query_memory`` body is the caller's error (HTTP 400), or ``None``.

    Both fields are optional strings; an invalid *time* is not a problem (the router ignores
    it or answers empty), only the wrong type or an over-long field is.
    """
    if query is not None and not isinstance(query, str):
        return "query must be a string"
    if time is not None and not isinstance(time, str):
        return "time must be a string"
    if query is not None and len(query) > query_characters_max:
        return f"query is longer than {query_characters_max} characters"
    if time is not None and len(time) > time_characters_max:
        return f"time is longer than {time_characters_max} characters"
    return None


@dataclass(frozen=True)
class RecallDocument:
    """One store row as the index holds it."""

    id: str
    text: str
    tier: Tier
    entity: str
    created_at: float
    event_start_at: float | None
    event_end_at: float | None
    changed_seq: int


def _index_key(tenant: str, item_id: str, changed_seq: int) -> str:
    return f"{tenant}{_key_separator}{item_id}{_key_separator}{changed_seq}"


def _split_key(key: str) -> tuple[str, int]:
    """``(item id, changed_seq)`` of an index key."""
    _, item_id, changed_seq = key.split(_key_separator)
    return item_id, int(changed_seq)


def _memory_item(tenant: str, document: RecallDocument) -> MemoryItem:
    return MemoryItem(
        key=_index_key(tenant, document.id, document.changed_seq),
        text=document.text,
        tenant=tenant,
        created_at=naive_utc(document.created_at),
        scope=document.entity,
        kind=document.tier,
        event_start=None if document.event_start_at is None else naive_utc(document.event_start_at),
        event_end=None if document.event_end_at is None else naive_utc(document.event_end_at),
    )


# -- reading the store and the index (plain sync functions, run in engine reads) ------------


def _document(record: MemoryRecord) -> RecallDocument:
    tier = record.tier if record.tier in recall_tiers else "fact"
    return RecallDocument(
        record.id,
        record.text,
        tier,  # type: ignore[arg-type]
        record.entity,
        record.created_at,
        record.event_start_at,
        record.event_end_at,
        record.changed_seq,
    )


def recallable_documents(connection: apsw.Connection, name: str) -> list[RecallDocument]:
    """Everything the index should hold for the character (the rebuild walk)."""
    documents: list[RecallDocument] = []
    for tier in recall_tiers:
        after_id = ""
        while True:
            page = iterate_memories(connection, name, tier, after_id, iterate_memories_limit_max)
            documents.extend(_document(record) for record in page)
            if len(page) < iterate_memories_limit_max:
                break
            after_id = page[-1].id
    return documents


def indexed_keys(connection: apsw.Connection, tenant: str) -> dict[str, str]:
    """``{id: key}`` of the tenant's live index items (the index's own table)."""
    keys: dict[str, str] = {}
    for (key,) in connection.execute(
        "SELECT key FROM retrieval_items WHERE tenant = ? AND deleted = 0", (tenant,)
    ):
        item_id, _ = _split_key(key)
        keys[item_id] = key
    return keys


# -- one character's view ----------------------------------------------------------------


class CharacterRecall:
    """One character's recall: its tenant on the engine's shared ``MemoryIndex``, its cursor
    into the store's change sequence and its ``{id: index key}`` map.  Get it from
    ``CharacterRecallIndexes.open_character``."""

    def __init__(self, engine: Any, index: MemoryIndex, name: str) -> None:
        self._engine = engine
        self.index = index
        self.name = name
        self.tenant = recall_tenant(name)
        self.cursor = 0
        self.closed = False
        self._keys: dict[str, str] = {}
        self._lock = trio.Lock()
        self._reconciled = False
        self._marks = 1
        self._synced_marks = 0

    def mark_stale(self) -> None:
        """The store's rows may have changed: the next recall syncs first.  Whoever writes
        the character's facts or reflections calls it after the write (the actor does, after
        every write job that can change them)."""
        self._marks += 1

    @property
    def stale(self) -> bool:
        return self._marks != self._synced_marks

    @property
    def reconciled(self) -> bool:
        """The first sync (the whole tenant against the store) is done: from now on a recall
        catches up inline (a few changed rows), it never indexes the character from scratch."""
        return self._reconciled

    async def sync(self) -> int:
        """Applies every store change after the cursor to the index; returns how many items
        were added or removed.  Reconciles the whole tenant on first use."""
        async with self._lock:
            # Marks counted before the read: a write marked while this sync runs keeps the
            # handle stale, so the next recall reads again.
            marks = self._marks
            if not self._reconciled:
                changed = await self._reconcile()
                self._reconciled = True
                changed += await self._catch_up()
            else:
                changed = await self._catch_up()
            self._synced_marks = marks
            return changed

    async def _reconcile(self) -> int:
        """Makes the tenant's index items exactly the store's recallable rows (the first use
        after start-up or release, and whenever the change log cannot bridge the gap)."""
        name, tenant = self.name, self.tenant

        def read(connection: apsw.Connection) -> tuple[int, list[RecallDocument], dict[str, str]]:
            return (
                memory_version(connection, name),
                recallable_documents(connection, name),
                indexed_keys(connection, tenant),
            )

        version, documents, keys = await self._engine.read(read)
        wanted = {_index_key(tenant, document.id, document.changed_seq) for document in documents}
        stale = [key for key in keys.values() if key not in wanted]
        self._keys = {item_id: key for item_id, key in keys.items() if key in wanted}
        changed = 0
        for start in range(0, len(stale), sync_batch_rows):
            changed += await self.index.delete(stale[start : start + sync_batch_rows])
        missing = [document for document in documents if document.id not in self._keys]
        for start in range(0, len(missing), sync_batch_rows):
            changed += await self._apply(missing[start : start + sync_batch_rows], [])
        self.cursor = max(self.cursor, version)
        return changed

    async def _catch_up(self) -> int:
        """Follows the store's change log from the cursor, page by page."""
        changed = 0
        name = self.name
        while True:
            cursor = self.cursor
            changes = await self._engine.read(
                lambda connection, cursor=cursor: memory_changes(connection, name, cursor)
            )
            if not changes.complete:
                # Removals we would need were pruned from the log: rebuild instead.
                return changed + await self._reconcile()
            if changes.through_seq <= cursor:
                return changed
            documents = [_document(record) for record in changes.upserts]
            for start in range(0, max(len(documents), 1), sync_batch_rows):
                removals = changes.removals if start == 0 else []
                changed += await self._apply(documents[start : start + sync_batch_rows], removals)
            self.cursor = changes.through_seq

    async def _apply(self, documents: Sequence[RecallDocument], removed_ids: Sequence[str]) -> int:
        """Deletes the old versions of changed and removed rows, adds the new versions."""
        tenant = self.tenant
        fresh = [
            document
            for document in documents
            if self._keys.get(document.id) != _index_key(tenant, document.id, document.changed_seq)
        ]
        gone_ids = {document.id for document in documents} | set(removed_ids)
        outdated = [self._keys[item_id] for item_id in gone_ids if item_id in self._keys]
        outdated = [
            key
            for key in outdated
            if key not in {_index_key(tenant, d.id, d.changed_seq) for d in documents}
        ]
        changed = 0
        if outdated:
            await self.index.delete(outdated)
            for key in outdated:
                item_id, _ = _split_key(key)
                if self._keys.get(item_id) == key:
                    del self._keys[item_id]
            changed += len(outdated)
        if fresh:
            await self.index.add([_memory_item(tenant, document) for document in fresh])
            for document in fresh:
                self._keys[document.id] = _index_key(tenant, document.id, document.changed_seq)
            changed += len(fresh)
        return changed

    async def recall(self, query: str | None, time: str | None, *, limit: int) -> RecallResult:
        """Syncs when marked stale, then runs the routed recall (see the module docstring)."""
        if self.stale:
            await self.sync()
        query_text = (query or "").strip()
        kinds = None if query_text else time_only_tiers
        return await self.index.recall(
            query_text or None,
            time=time,
            recall_filter=RecallFilter(self.tenant, kinds=kinds),
            limit=limit,
            settings=character_recall_settings,
        )

    @property
    def indexed_count(self) -> int:
        return len(self._keys)


class CharacterRecallIndexes:
    """The engine's shared ``MemoryIndex`` and one ``CharacterRecall`` per open character.

    Kept in the engine's ``attachments`` (a simulator lifetime with a new engine gets new
    ones; a registry keyed by engine would keep every engine ever opened, because the handles
    reference their engine).
    """

    characters_key = "troupe.character.recalls"

    def __init__(self, shared: SharedMemoryIndexes | None = None) -> None:
        self._shared = shared if shared is not None else shared_memory_indexes

    def _characters_of(self, engine: Any) -> dict[str, CharacterRecall]:
        return engine.attachments.setdefault(self.characters_key, {})

    async def index_for(self, engine: Any, embedder: Any = None) -> MemoryIndex:
        """The engine's index, shared with every surface (``shared_memory_indexes``)."""
        return await self._shared.index_for(engine, embedder)

    async def open_character(self, engine: Any, name: str, *, embedder: Any = None) -> CharacterRecall:
        """The character's recall handle, created (and reconciled with the store) on first
        use after start-up or after ``release``."""
        characters = self._characters_of(engine)
        recall = characters.get(name)
        if recall is None:
            index = await self.index_for(engine, embedder)
            recall = characters.get(name)
            if recall is None:
                recall = CharacterRecall(engine, index, name)
                characters[name] = recall
        if recall.stale:
            await recall.sync()
        return recall

    def opened(self, engine: Any, name: str) -> CharacterRecall | None:
        """The character's handle if it is open (``None`` before first use or after
        ``release``)."""
        return self._characters_of(engine).get(name)

    def release(self, engine: Any, name: str) -> bool:
        """Drops the character's handle (its cursor and key map); True when one was open.
        The indexed items stay; the next ``open_character`` reconciles them with the store."""
        recall = self._characters_of(engine).pop(name, None)
        if recall is None:
            return False
        recall.closed = True
        return True

    def forget_engine(self, engine: Any) -> None:
        """Drops everything of an engine that is closing (tests, restarts)."""
        engine.attachments.pop(self.characters_key, None)
        self._shared.forget_engine(engine)


character_recall_indexes = CharacterRecallIndexes()


def _hit(result_hit: Any) -> MemoryHit:
    item_id, _ = _split_key(result_hit.key)
    tier = result_hit.kind if result_hit.kind in recall_tiers else "fact"
    score = result_hit.score
    if score is not None and not math.isfinite(score):
        score = None
    return MemoryHit(
        id=item_id,
        text=result_hit.text,
        tier=tier,
        entity=result_hit.scope or None,
        score=None if score is None else round(float(score), 6),
        created_at=seconds_from_naive(result_hit.created_at),
        event_start_at=None
        if result_hit.event_start is None
        else seconds_from_naive(result_hit.event_start),
        event_end_at=None if result_hit.event_end is None else seconds_from_naive(result_hit.event_end),
    )


async def query_memory(
    recall: CharacterRecall | None,
    query: str | None,
    time: str | None,
    *,
    clock: Any,
    limit: int = query_memory_results_max,
) -> MemoryResults | MemoryUnavailable:
    """Runs one ``/query_memory`` (see the module docstring for routing and failures).

    ``clock`` is the Env's clock (``monotonic()`` times ``elapsed_ms``).  The caller checked
    the body with ``query_memory_problem``.
    """
    if recall is None or recall.closed:
        return MemoryUnavailable()
    started = clock.monotonic()
    query_text = (query or "").strip()
    interval = parse_time_tokens(time)

    def elapsed_ms() -> float:
        return round((clock.monotonic() - started) * 1000.0, 3)

    if not query_text and interval is None:
        return MemoryResults((), query, 0, elapsed_ms())
    try:
        result = await recall.recall(query_text or None, time if interval is not None else None, limit=limit)
        hits = tuple(_hit(hit) for hit in result.hits)
    except Exception:  # the contract: degrade to an empty success, never leak the error
        return MemoryResults((), query, 0, elapsed_ms(), error_code=recall_failed_error_code)
    echoed_time = time if (not query_text and interval is not None) else None
    return MemoryResults(hits, query, result.candidates_total, elapsed_ms(), time=echoed_time)


__all__ = [
    "CharacterRecall",
    "CharacterRecallIndexes",
    "RecallDocument",
    "Tier",
    "character_recall_indexes",
    "query_characters_max",
    "query_memory",
    "query_memory_problem",
    "query_memory_results_max",
    "recall_failed_error_code",
    "recall_tenant",
    "recall_tiers",
    "time_characters_max",
]
