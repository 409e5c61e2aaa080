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

Leases (``RecallLease``, ``RecallLeases``): the character's turn only admits a query and
lends the handle; the recall runs outside the turn (the HTTP route), read-only, so queries of
one character run side by side on both cores.  Bounded: ``character_leased_queries_max``
reading per character and ``process_leased_queries_max`` per process, ``lease_waiters_max``
waiting for at most ``lease_wait_seconds_max`` (then 503).  A release or reload drains them
first (``RecallLeases.drain``: waits ``lease_drain_seconds_max``, then revokes; a revoked lease
answers 503 and never a result), so no handle is read after the release answered.  The leases
live beside the handles in the engine's ``attachments``: they outlive an actor crash.

Speed (p99 ≤ 20 ms at 100k facts in one character, embedding excluded;
``bench/character_recall.py``): the cost is the index's, so the character path adds no
storage read per query (see above) and runs the hybrid recall with common-term pruning
(``character_recall_settings``): in one character's facts "主人" is in nearly every row, and
scoring it made every Chinese query rank 80k matches (~34 ms CPU).

Failures: no handle (released, not opened), a revoked lease or no lease slot in time →
``MemoryUnavailable`` (HTTP 503 with ``Retry-After``); anything that
goes wrong inside recall → an empty, successful answer with ``error_code:
"hybrid_recall_failed"``; the exception text never leaves the process.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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

    async def recall(self, query: str | None, time: str | None, *, limit: int,
                     sync_stale: bool = True) -> RecallResult:
        """Syncs when marked stale (unless ``sync_stale`` is off: a leased recall is
        read-only, its admission synced), then runs the routed recall (see the module
        docstring)."""
        if sync_stale and self.stale:
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



# -- leases: recall outside the actor's turn -------------------------------------------------

character_leased_queries_max = 4
"""Leased recalls of one character that read at once; more wait for a slot (in arrival
order).  Two cores serve two reads; a few more hide the hops between the event loop and the
read threads.  Measured against 2 (bench, 100k facts, 4 connections, shared machine): no
difference beyond the noise (in-flight recalls stretch each other either way).  Revisit
on an idle machine."""
process_leased_queries_max = 16
"""Leased recalls of the whole process that read at once (the engine has a few read
connections; more would only queue there)."""
lease_waiters_max = 256
"""Leased queries that may wait for a slot at once (process-wide); one more answers 503."""
lease_wait_seconds_max = 5.0
"""A leased query that found no slot within this answers 503 with ``Retry-After``."""
lease_drain_seconds_max = 2.0
"""``/release_character`` and a reload wait this long for the character's leased recalls
that are reading; then those leases are revoked (their queries answer 503, never a result
read after the release answered)."""
lease_exit_seconds_max = 1.0
"""After revoking, how long a release waits for a revoked recall to leave its read: a
cancelled read returns at its next checkpoint, a SQLite statement already in a read thread
finishes first (milliseconds)."""
lease_retry_after_seconds = 1.0
"""``Retry-After`` of the 503 of a query that found no slot or whose lease was revoked."""

assert character_leased_queries_max <= process_leased_queries_max <= lease_waiters_max
assert 0 < lease_drain_seconds_max + lease_exit_seconds_max < 30.0  # inside one actor turn


@dataclass
class RecallLeaseStatistics:
    """What ``RecallLeases.statistics()`` reports (the bench prints it)."""

    leased: int = 0
    """Leases handed out."""
    reading: int = 0
    """Leased recalls reading now."""
    reading_max: int = 0
    """The most leased recalls seen reading at once."""
    waiting: int = 0
    """Leased queries waiting for a slot now."""
    busy: int = 0
    """Queries answered 503 because no slot came (or too many waited)."""
    revoked: int = 0
    """Leases a release or reload revoked."""
    reading_seconds: float = 0.0
    """The integral of ``reading`` over trio's clock: divided by a phase's length it is the
    mean number of leased recalls in flight."""
    changed_at: float = 0.0
    """When ``reading`` last changed (trio's clock)."""

    def reading_changed(self, delta: int) -> None:
        now = trio.current_time()
        self.reading_seconds += self.reading * (now - self.changed_at)
        self.changed_at = now
        self.reading += delta
        self.reading_max = max(self.reading_max, self.reading)


class RecallLease:
    """A bounded permission to read one character's recall handle outside the actor's turn.

    The character's turn hands it out (``QueryMemory(leased=True)``) after the same checks a
    query always had; the caller runs ``query()`` wherever it is (the HTTP route), so the
    actor's mailbox keeps moving and two queries use two cores.  A lease is registered in
    the engine's ``RecallLeases`` (not in the actor), so a release or reload, also by the next
    incarnation of a crashed actor, finds it: one that has not started reading is revoked at
    once, one that reads is waited for (``lease_drain_seconds_max``), then revoked.  A revoked
    lease never returns a result: its query answers 503 ``MemoryUnavailable``.  A leased
    recall only reads (its admission synced the handle), so cancelling it is harmless.
    """

    def __init__(self, leases: RecallLeases, recall: CharacterRecall, number: int,
                 trace: Callable[..., None] | None = None) -> None:
        self.recall = recall
        self.number = number
        self.revoked = False
        self.reading = False
        self.ended = trio.Event()
        self._leases = leases
        self._trace = trace
        self._scope = trio.CancelScope()
        self._used = False

    @property
    def name(self) -> str:
        return self.recall.name

    def revoke(self) -> None:
        """No result from now on; a read in progress is cancelled."""
        if self.revoked or self.ended.is_set():
            return
        self.revoked = True
        self._leases.counts.revoked += 1
        self._scope.cancel()

    async def query(self, query: str | None, time: str | None, *, clock: Any,
                    limit: int = query_memory_results_max) -> MemoryResults | MemoryUnavailable:
        """Runs the leased recall (``query_memory``); once only."""
        assert not self._used, "a lease runs one query"
        self._used = True
        reply: MemoryResults | MemoryUnavailable = MemoryUnavailable(
            "the character was released while the query waited", retry_after_seconds=lease_retry_after_seconds)
        outcome = "revoked"
        try:
            with self._scope:
                if not await self._leases.acquire(self):
                    outcome = "busy"
                    return MemoryUnavailable("too many memory queries wait",
                                             retry_after_seconds=lease_retry_after_seconds)
                try:
                    if self.revoked or self.recall.closed:
                        return reply
                    self.reading = True
                    self._record("character_lease_read")
                    answer = await query_memory(self.recall, query, time, clock=clock, limit=limit,
                                                sync_stale=False)
                    if not self.revoked:
                        reply, outcome = answer, "answered"
                finally:
                    self._leases.release_slots(self)
        finally:
            self._end(outcome)
        return reply

    def _record(self, event: str, **fields: Any) -> None:
        if self._trace is not None:
            self._trace(event, lease=self.number, **fields)

    def _end(self, outcome: str) -> None:
        if self.reading:
            self._record("character_lease_end", outcome=outcome)
            self.reading = False
            self._leases.counts.reading_changed(-1)
        self._leases.forget(self)
        self.ended.set()


class RecallLeases:
    """The engine's leased recalls: slots per character and per process, and every lease
    handed out and not yet ended (weakly held: a lease whose caller dropped it unstarted, e.g.
    a cancelled request, just disappears).  Kept in the engine's ``attachments`` beside the
    recall handles, so it outlives any one actor incarnation."""

    def __init__(self, *, character_max: int = character_leased_queries_max,
                 process_max: int = process_leased_queries_max, waiters_max: int = lease_waiters_max,
                 wait_seconds_max: float = lease_wait_seconds_max,
                 drain_seconds_max: float = lease_drain_seconds_max) -> None:
        assert 1 <= character_max <= process_max
        self.character_max = character_max
        self.waiters_max = waiters_max
        self.wait_seconds_max = wait_seconds_max
        self.drain_seconds_max = drain_seconds_max
        self.counts = RecallLeaseStatistics()
        self._process = trio.Semaphore(process_max)
        self._characters: dict[str, trio.Semaphore] = {}
        self._held: dict[int, tuple[trio.Semaphore, ...]] = {}
        self._leases: dict[str, weakref.WeakSet[RecallLease]] = {}
        self._numbers = itertools.count(1)

    def lease(self, recall: CharacterRecall, trace: Callable[..., None] | None = None) -> RecallLease:
        lease = RecallLease(self, recall, next(self._numbers), trace)
        self._leases.setdefault(recall.name, weakref.WeakSet()).add(lease)
        self.counts.leased += 1
        return lease

    def leases_of(self, name: str) -> list[RecallLease]:
        """The character's leases not yet ended, oldest first."""
        return sorted(self._leases.get(name, ()), key=lambda lease: lease.number)

    async def acquire(self, lease: RecallLease) -> bool:
        """Takes the lease's character slot and a process slot, waiting at most
        ``wait_seconds_max``; False when none came or ``waiters_max`` wait already."""
        character = self._characters.get(lease.name)
        if character is None:
            character = self._characters[lease.name] = trio.Semaphore(self.character_max)
        deadline = trio.current_time() + self.wait_seconds_max
        taken: list[trio.Semaphore] = []
        try:
            for slot in (character, self._process):
                if not await self._take(slot, deadline):
                    self.counts.busy += 1
                    return False
                taken.append(slot)
        finally:
            if len(taken) < 2:
                for slot in taken:
                    slot.release()
        self._held[lease.number] = tuple(taken)
        self.counts.reading_changed(+1)
        return True

    async def _take(self, slot: trio.Semaphore, deadline: float) -> bool:
        try:
            slot.acquire_nowait()
            return True
        except trio.WouldBlock:
            pass
        if self.counts.waiting >= self.waiters_max:
            return False
        self.counts.waiting += 1
        try:
            with trio.move_on_at(deadline):
                await slot.acquire()
                return True
            return False
        finally:
            self.counts.waiting -= 1

    def release_slots(self, lease: RecallLease) -> None:
        for slot in self._held.pop(lease.number, ()):
            slot.release()
        if not lease.reading:
            # Took its slots but never read (revoked meanwhile): not counted by ``_end``.
            self.counts.reading_changed(-1)
        character = self._characters.get(lease.name)
        if character is not None and character.value == self.character_max \
                and not character.statistics().tasks_waiting:
            del self._characters[lease.name]

    def forget(self, lease: RecallLease) -> None:
        leases = self._leases.get(lease.name)
        if leases is not None:
            leases.discard(lease)
            if not leases:
                del self._leases[lease.name]

    async def drain(self, name: str, *, seconds_max: float | None = None,
                    exit_seconds_max: float = lease_exit_seconds_max) -> int:
        """Ends the character's leases before its handle is released: revokes those not
        reading at once, waits up to ``seconds_max`` (default ``drain_seconds_max``) for
        those reading, revokes the rest and waits up to ``exit_seconds_max`` for them to
        leave.  Returns how many were revoked."""
        seconds_max = self.drain_seconds_max if seconds_max is None else seconds_max
        leases = self.leases_of(name)
        revoked = 0
        for lease in leases:
            if not lease.reading:
                lease.revoke()
                revoked += 1
        reading = [lease for lease in leases if lease.reading]
        with trio.move_on_after(seconds_max):
            for lease in reading:
                await lease.ended.wait()
        late = [lease for lease in reading if not lease.ended.is_set()]
        for lease in late:
            lease.revoke()
        with trio.move_on_after(exit_seconds_max):
            for lease in late:
                await lease.ended.wait()
        return revoked + len(late)

    def statistics(self) -> RecallLeaseStatistics:
        """A copy of the counters, ``reading_seconds`` brought up to now."""
        counts = replace(self.counts)
        counts.reading_changed(0)
        return counts


class CharacterRecallIndexes:
    """The engine's shared ``MemoryIndex`` and one ``CharacterRecall`` per open character.

    Kept in the engine's ``attachments`` (a simulator lifetime with a new engine gets new
    ones; a registry keyed by engine would keep every engine ever opened, because the handles
    reference their engine).
    """

    characters_key = "troupe.character.recalls"
    leases_key = "troupe.character.recall_leases"

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

    def leases_for(self, engine: Any) -> RecallLeases:
        """The engine's ``RecallLeases`` (created on first use)."""
        leases = engine.attachments.get(self.leases_key)
        if leases is None:
            leases = engine.attachments[self.leases_key] = RecallLeases()
        return leases

    def lease(self, engine: Any, recall: CharacterRecall, trace: Callable[..., None] | None = None) -> RecallLease:
        """A lease on ``recall`` for one query outside the actor's turn (``RecallLease``)."""
        return self.leases_for(engine).lease(recall, trace)

    async def release_after_leases(self, engine: Any, name: str, *,
                                   seconds_max: float | None = None) -> tuple[bool, int]:
        """``release`` once the character's leased recalls ended (``RecallLeases.drain``):
        (a handle was open, leases revoked)."""
        revoked = await self.leases_for(engine).drain(name, seconds_max=seconds_max)
        return self.release(engine, name), revoked

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
        engine.attachments.pop(self.leases_key, None)
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
    sync_stale: bool = True,
) -> MemoryResults | MemoryUnavailable:
    """Runs one ``/query_memory`` (see the module docstring for routing and failures).

    ``clock`` is the Env's clock (``monotonic()`` times ``elapsed_ms``).  The caller checked
    the body with ``query_memory_problem``.  ``sync_stale`` off: never write the index (a
    leased recall; its admission synced the handle).
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
        result = await recall.recall(query_text or None, time if interval is not None else None, limit=limit,
                                     sync_stale=sync_stale)
        hits = tuple(_hit(hit) for hit in result.hits)
    except Exception:  # the contract: degrade to an empty success, never leak the error
        return MemoryResults((), query, 0, elapsed_ms(), error_code=recall_failed_error_code)
    echoed_time = time if (not query_text and interval is not None) else None
    return MemoryResults(hits, query, result.candidates_total, elapsed_ms(), time=echoed_time)


__all__ = [
    "CharacterRecall",
    "CharacterRecallIndexes",
    "RecallDocument",
    "RecallLease",
    "RecallLeaseStatistics",
    "RecallLeases",
    "character_leased_queries_max",
    "lease_drain_seconds_max",
    "lease_exit_seconds_max",
    "lease_retry_after_seconds",
    "lease_wait_seconds_max",
    "lease_waiters_max",
    "process_leased_queries_max",
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
