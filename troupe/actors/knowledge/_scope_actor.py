"""The scope actor ``("knowledge_scope", scope)``: the one writer of a scope's receipts,
evidence, versions and lifecycle contexts, and the runner of its structuring.

Why one actor per scope: a receipt and a version need exactly one writer, or two identical
retries race past the receipt check and two updates race past ``expected_version``.  Turns
are one at a time, so every write of a scope (``WriteMemory``, ``UpdateKnowledge``,
``RecordLifecycle``, ``RecoverIdempotency``, ``PromoteContexts``) is serialised here, while
different scopes write in parallel (the engine's group commit batches them).

A write, in order (contract §3.1):

1. the sensitivity detector runs first (before any receipt): a failure answers 503
   ``SENSITIVITY_CHECK_FAILED`` and a sensitive ``shared:*`` write 422
   ``SENSITIVE_SHARED_SCOPE``, both with nothing stored;
2. ONE write job (``_store.write_evidence``): take the receipt, insert the evidence, queue its
   structuring, complete the receipt with the response, and set the scope's durable
   ``structuring`` reminder.  An acknowledged write is durable and a retry never makes a
   second evidence: either all of it committed (the retry replays the first response) or none
   (the retry runs afresh).  If the job fails, a second job marks the receipt FAILED
   (``receipt_fail``): its outcome is unknown to the caller, so only an operator's recovery
   authorises one more try;
3. after the reply's job, the structuring task (``start_task``) turns the scope's queued
   evidence into knowledge (``Structurer``, the recall slice's ``structure_evidence``) and
   announces ``memory_ready`` and ``conflict_detected`` through the events hub.  The queue and
   the reminder are durable: after a crash the reminder re-activates the actor, which runs
   what is left (the reminder is due ``structuring_reminder_delay_seconds`` after the write:
   it is the crash net, the write itself starts the task).  On activation, receipts still
   IN_PROGRESS (left by a crashed incarnation) turn FAILED.  A run takes up to
   ``scope_structuring_batch_max`` queued rows at once: a ``BatchStructurer`` (the default)
   writes the batch's conversation turns' knowledge in one job (anything else one by one)
   and then refreshes the index once for all of them before announcing any; each write also
   finishes its evidence's task, so the per-evidence cost is its share of one job.

Updates and lifecycle events follow the same shape with their own receipt namespaces.  An
update also records, in its write job, one conflict row per changed body field
(``explicit_update_changes`` of the item as it was, ``WriteOutcome.previous``: NEW_WINS, since
the update applied the new value) and announces them as ``conflict_detected``; its structuring
task then rebuilds the item's entities, relations and vector and announces ``memory_ready``.
Recovery (§3.2c) authorises one retry of a FAILED receipt; the next identical request
consumes it inside its write job.

The recall index follows the store: after every commit that changes an item (an update, a
promotion, an archive) the actor calls ``KnowledgeIndexPort.refresh`` before it replies, so
the next recall sees the new version (or no longer sees an archived item).  A refresh that
fails is logged, not answered: the commit stands, and the item's next refresh or the index's
reconciliation at start-up repairs it.

Requests the store would refuse as our own misuse are answered 400 ``INVALID_REQUEST``
here first, before any receipt: ``raw``/``context``/``provenance``, a lifecycle's ``data``
and an update's body over their stored byte limits, a title over its character limit.  The
simulator's fault point ``sensitivity_check_fails`` makes the detector unavailable.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import apsw
import trio

from troupe.runtime import Actor, ActorContext, ActorKind, TaskEnded
from troupe.storage import StorageError, reminder_set

from ._conflicts import explicit_update_changes, stored_value
from ._events_hub import publish_event
from ._lifecycle import (
    lifecycle_problem,
    promotable,
    promote_problem,
    promoted_raw,
    promotion_source_type,
)
from ._protocol import (
    ArchiveKnowledge,
    ConflictDetected,
    ContextsPromoted,
    KnowledgeArchived,
    KnowledgeRefused,
    KnowledgeUpdated,
    LifecycleRecorded,
    MemoryWritten,
    PromoteContexts,
    RecordLifecycle,
    RecoverIdempotency,
    RetryAuthorized,
    UpdateKnowledge,
    WriteMemory,
    scope_kind_name,
)
from ._receipts import (
    receipt_fail,
    receipt_recover,
    receipts_fail_in_progress,
    recovery_response,
    request_hash,
)
from ._scopes import parse_scope
from ._sensitivity import (
    SensitivityCheckFailed,
    SensitivityDetector,
    SensitivityVerdict,
    local_sensitivity_detector,
)
from ._store import (
    ContextDraft,
    EvidenceDraft,
    KnowledgeUpdateDraft,
    WriteOutcome,
    evidence_quality_score,
    evidence_raw_bytes_max,
    evidence_side_bytes_max,
    get_contexts,
    get_knowledge,
    insert_conflict,
    insert_evidence,
    knowledge_body_bytes_max,
    knowledge_ids_for_evidence,
    knowledge_status_active,
    knowledge_status_archived,
    knowledge_title_characters_max,
    mark_context_promoted,
    record_lifecycle,
    set_knowledge_status,
    stored_json_bytes,
    structuring_done,
    structuring_due,
    structuring_failed,
    structuring_next_at,
    update_knowledge,
    write_evidence,
)

logger = logging.getLogger(__name__)

structuring_task_name = "structuring"
structuring_reminder_name = "structuring"
scope_structuring_batch_max = 64
"""Evidence rows one structuring run takes from the scope's queue."""
structuring_runs_max = 100
"""Batches one structuring task runs before it ends and the actor restarts it (so a busy scope
still passivates and hears its other messages' ``TaskEnded``)."""
structuring_evidence_seconds_max = 60.0
"""One evidence's structuring, at most (the model call inside is bounded too)."""
structuring_retry_seconds = 5.0
"""Backoff before a failed structuring is tried again (the store counts attempts)."""
structuring_reminder_delay_seconds = 5.0
"""A write's durable structuring reminder is due this long after the write.  The reminder is
the crash net only: the write itself starts the structuring task at once (``_pump``), so a
reminder due at once fired into a scope already structuring, as one more turn in its mailbox
and one more write job per write (measured: 2,774 reminder deliveries for 3,808 writes).  Each
write pushes it on (same job, same row); the task's end cancels it; after a crash it fires this
long after the last write, or at once on a restart later than that."""
scope_mailbox_messages_max = 1_024
sensitivity_fault_point = "sensitivity_check_fails"
"""The simulator's fault point (``troupe.runtime.domain_fault_point_names``): the detector is
unavailable for this write."""
receipt_failure_text = "the request failed before its outcome was recorded"
crashed_incarnation_text = "the scope actor stopped while the request was in progress"

assert scope_structuring_batch_max >= 1 and structuring_runs_max >= 1


class Structurer(Protocol):
    """Turns one committed evidence row into knowledge; returns the events to announce
    (anything with ``encode()``), empty when there is nothing new.  Safe to run twice.  The
    actor finishes the structuring tasks of a batch's successes in one job afterwards, unless
    the structurer says (a true ``finishes_tasks`` attribute) that its own writes do."""

    async def structure(self, context: ActorContext, evidence_id: str) -> Sequence[Any]: ...


class BatchStructurer(Protocol):
    """A ``Structurer`` that also structures several evidence rows at once, sharing what can
    be shared (one index refresh for the batch).  Returns, per evidence and in order, its
    events or the exception that failed it alone; raising fails the whole batch."""

    async def structure(self, context: ActorContext, evidence_id: str) -> Sequence[Any]: ...

    async def structure_batch(self, context: ActorContext, evidence_ids: Sequence[str]
                              ) -> list[Sequence[Any] | Exception]: ...


class _DeferredRefresh:
    """Stands in for the knowledge index inside a batch: collects what to refresh."""

    def __init__(self) -> None:
        self.knowledge_ids: list[str] = []
        self.reindex_ids: list[str] = []

    async def refresh(self, knowledge_ids: Sequence[str], *, reindex: bool = False) -> int:
        (self.reindex_ids if reindex else self.knowledge_ids).extend(knowledge_ids)
        return 0


class RecallStructurer:
    """The default: the recall slice's ``structure_evidence`` over the engine's knowledge
    index (imported late: the recall slice pulls in the retrieval engine).

    ``structure_batch`` (``structure_evidence_batch``) structures the batch's conversation
    turns in one read and one write job, everything else one by one, and refreshes the index
    ONCE for the whole batch, before any event is returned: one read, one text-index job and
    one vector batch instead of one each per evidence, and ``memory_ready`` still only
    announces an item the index already holds.

    ``finishes_tasks``: ``structure_evidence`` finishes an evidence's structuring task in the
    same write as its outcome, so the actor needs no job of its own to finish the batch's."""

    finishes_tasks = True

    async def structure(self, context: ActorContext, evidence_id: str) -> Sequence[Any]:
        from ._query import knowledge_indexes
        from ._structuring import structure_evidence

        env = context.env
        knowledge_index = await knowledge_indexes.open(context.storage, getattr(env, "embedder", None))
        result = await structure_evidence(context.storage, knowledge_index, env, evidence_id)
        return tuple(result.events)

    async def structure_batch(self, context: ActorContext, evidence_ids: Sequence[str]
                              ) -> list[Sequence[Any] | Exception]:
        from ._query import knowledge_indexes
        from ._structuring import structure_evidence_batch

        env = context.env
        knowledge_index = await knowledge_indexes.open(context.storage, getattr(env, "embedder", None))
        deferred = _DeferredRefresh()
        outcomes: list[Sequence[Any] | Exception] = []
        results = await structure_evidence_batch(context.storage, deferred, env, list(evidence_ids))
        for result in results:
            if isinstance(result, Exception):
                outcomes.append(result)
                continue
            if result.knowledge_id is not None:
                # Also when structured before (a retry after a failed refresh): refresh is
                # a no-op for an item whose version the index already holds.
                deferred.knowledge_ids.append(result.knowledge_id)
            outcomes.append(tuple(result.events))
        if deferred.knowledge_ids:
            await knowledge_index.refresh(list(dict.fromkeys(deferred.knowledge_ids)))
        if deferred.reindex_ids:
            await knowledge_index.refresh(list(dict.fromkeys(deferred.reindex_ids)), reindex=True)
        return outcomes


class KnowledgeIndexPort(Protocol):
    """Makes the recall index match the store for some items, right after a commit."""

    async def refresh(self, context: ActorContext, knowledge_ids: Sequence[str]) -> None: ...


class RecallIndexRefresher:
    """The default: the engine's ``KnowledgeIndex`` (``_query.knowledge_indexes``)."""

    async def refresh(self, context: ActorContext, knowledge_ids: Sequence[str]) -> None:
        from ._query import knowledge_indexes

        knowledge_index = await knowledge_indexes.open(context.storage, getattr(context.env, "embedder", None))
        await knowledge_index.refresh(knowledge_ids)


@dataclass(frozen=True)
class ScopeSettings:
    sensitivity: SensitivityDetector = local_sensitivity_detector
    structurer: Structurer = field(default_factory=RecallStructurer)
    index: KnowledgeIndexPort = field(default_factory=RecallIndexRefresher)
    structuring_retry_seconds: float = structuring_retry_seconds
    structuring_evidence_seconds_max: float = structuring_evidence_seconds_max


def _refused(outcome: WriteOutcome) -> KnowledgeRefused:
    assert outcome.refusal is not None
    refusal = outcome.refusal
    return KnowledgeRefused(refusal.code, refusal.message, refusal.status)


def _too_large(value: Any, bytes_max: int, name: str) -> str | None:
    if value is not None and stored_json_bytes(value) > bytes_max:
        return f"{name} is larger than {bytes_max} bytes as compact JSON"
    return None


def write_problem(request: WriteMemory) -> str | None:
    """Why the store would refuse ``request`` as too large (the caller's 400), or ``None``."""
    provenance = None if request.provenance is None else request.provenance.encode()
    return (_too_large(request.raw, evidence_raw_bytes_max, "raw")
            or _too_large(request.context, evidence_side_bytes_max, "context")
            or _too_large(provenance, evidence_side_bytes_max, "provenance"))


def update_problem(request: UpdateKnowledge) -> str | None:
    """Why the store would refuse ``request`` (the caller's 400), or ``None``."""
    if request.title is None and request.body is None:
        return "title or body is required"
    if request.title is not None and len(request.title) > knowledge_title_characters_max:
        return f"title is longer than {knowledge_title_characters_max} characters"
    provenance = None if request.provenance is None else request.provenance.encode()
    raw = {name: value for name, value in (("title", request.title), ("body", request.body)) if value is not None}
    return (_too_large(request.body, knowledge_body_bytes_max, "body")
            or _too_large(raw, evidence_raw_bytes_max, "the update")
            or _too_large(provenance, evidence_side_bytes_max, "provenance"))


def _record_update_conflicts(connection: apsw.Connection, outcome: WriteOutcome, request: UpdateKnowledge,
                             conflict_ids: Sequence[str], evidence_id: str, now: float) -> list[ConflictDetected]:
    """One conflict row per body field the update changed (inside the update's job)."""
    previous, knowledge = outcome.previous, outcome.knowledge
    if previous is None or knowledge is None or request.body is None:
        return []
    events = []
    for position, change in enumerate(explicit_update_changes(previous.body, request.body)):
        # The item moved between the read and the job (a structuring merged into it): the
        # extra changes get ids derived from this update's unique evidence id.
        conflict_id = (conflict_ids[position] if position < len(conflict_ids)
                       else f"cfl_{evidence_id.removeprefix('evd_')}_{position}")
        old_value, new_value = stored_value(change.old_value), stored_value(change.new_value)
        insert_conflict(connection, conflict_id=conflict_id, knowledge_id=knowledge.id, field=change.field,
                        old_value=old_value, new_value=new_value, resolution=change.resolution, now=now)
        events.append(ConflictDetected(conflict_id=conflict_id, knowledge_title=knowledge.title, field=change.field,
                                       old_value=old_value, new_value=new_value, resolution=change.resolution))
    return events


class KnowledgeScopeActor(Actor):
    """See the module docstring."""

    def __init__(self, context: ActorContext, settings: ScopeSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.scope = parse_scope(context.key)
        assert self.scope.text == context.key, "a scope actor's key is a canonical scope"

    # -- activation and background work ------------------------------------------------------

    async def on_activate(self) -> None:
        scope, now = self.scope.text, self.context.env.clock.wall()
        failed = await self.context.storage.write(
            lambda connection: receipts_fail_in_progress(connection, scope=scope, error=crashed_incarnation_text,
                                                         now=now))
        if failed:
            self.context.trace("knowledge_receipts_failed", count=failed)
        self._pump()

    async def on_reminder(self, name: str, payload: Any) -> None:
        if name == structuring_reminder_name:
            # The payload is the time the reminder was set for: the reminder service fires on
            # its own clock, which never goes back, so after a backward wall-clock jump it
            # fires "early" by ours; what was due by its clock is due now (else the reminder
            # fires, nothing is due, the reminder is set again and fires at once: a livelock).
            self._pump(payload if isinstance(payload, int | float) else None)

    def _pump(self, due_by: float | None = None) -> None:
        if not self.context.task_running(structuring_task_name):
            self.context.start_task(structuring_task_name, lambda: self._structure_queue(due_by))

    async def _structure_queue(self, due_by: float | None = None) -> int:
        """Structure this scope's queued evidence due by the wall clock (or by ``due_by``, a
        fired reminder's own time); runs beside the turns.  An evidence is tried once per run:
        its retry waits for the next run (a reminder after its backoff)."""
        storage, env, scope = self.context.storage, self.context.env, self.scope.text
        tried: set[str] = set()
        for _ in range(structuring_runs_max):
            now = max(env.clock.wall(), due_by or -math.inf)
            tasks = await storage.read(lambda connection, now=now: structuring_due(
                connection, now, limit=scope_structuring_batch_max + len(tried), scope=scope))
            fresh = [task for task in tasks if task.evidence_id not in tried]
            if not fresh:
                break
            tried.update(task.evidence_id for task in fresh)
            structured = await self._structure_tasks([task.evidence_id for task in fresh])
            if structured and not getattr(self.settings.structurer, "finishes_tasks", False):
                # One job finishes the batch's tasks, not one job (and one commit wait) per
                # evidence.  A crash before it re-runs them: structuring is safe to run twice.
                await storage.write(lambda connection, done=structured: _structuring_done_all(connection, done))
        return len(tried)

    async def _structure_tasks(self, evidence_ids: list[str]) -> list[str]:
        """Structure a batch (together when the structurer can, else one by one); returns the
        evidence ids that succeeded (their tasks are still to finish)."""
        batch = getattr(self.settings.structurer, "structure_batch", None)
        if batch is None:
            return [evidence_id for evidence_id in evidence_ids if await self._structure_one(evidence_id)]
        try:
            with trio.fail_after(self.settings.structuring_evidence_seconds_max * len(evidence_ids)):
                outcomes = await batch(self.context, evidence_ids)
        except Exception as error:
            outcomes = [error] * len(evidence_ids)
        assert len(outcomes) == len(evidence_ids)
        structured = []
        for evidence_id, outcome in zip(evidence_ids, outcomes, strict=True):
            if isinstance(outcome, Exception):
                await self._structuring_failed(evidence_id, outcome)
                continue
            self._announce(evidence_id, outcome)
            structured.append(evidence_id)
        return structured

    async def _structuring_failed(self, evidence_id: str, error: Exception) -> None:
        storage, env = self.context.storage, self.context.env
        logger.warning("structuring %s in %s failed: %s", evidence_id, self.scope.text, type(error).__name__)
        retry_at, reason = env.clock.wall() + self.settings.structuring_retry_seconds, type(error).__name__
        counted = not isinstance(error, StorageError)  # the storage's failure, not the evidence's
        await storage.write(lambda connection: structuring_failed(
            connection, evidence_id, error=reason, retry_at=retry_at, counted=counted))

    def _announce(self, evidence_id: str, events: Sequence[Any]) -> None:
        for event in events:
            publish_event(self.context.system, event)
        self.context.trace("knowledge_structured", evidence=evidence_id, events=len(events))

    async def _structure_one(self, evidence_id: str) -> bool:
        """Structure one evidence and announce its events; False when it failed (its retry is
        recorded).  The caller finishes the successful tasks in one job per batch."""
        try:
            with trio.fail_after(self.settings.structuring_evidence_seconds_max):
                events = await self.settings.structurer.structure(self.context, evidence_id)
        except Exception as error:
            await self._structuring_failed(evidence_id, error)
            return False
        self._announce(evidence_id, events)
        return True

    async def _structuring_ended(self, ended: TaskEnded) -> None:
        scope, now = self.scope.text, self.context.env.clock.wall()
        if ended.error is not None:
            logger.error("the structuring task of %s failed: %s", scope, type(ended.error).__name__)
        due = await self.context.storage.read(lambda connection: structuring_next_at(connection, scope))
        if due is None:
            await self.context.cancel_reminder(structuring_reminder_name)
        elif due <= now and ended.error is None:
            self._pump()
        else:
            at = max(due, now + self.settings.structuring_retry_seconds)
            await self.context.set_reminder(structuring_reminder_name, at, at)

    # -- dispatch ----------------------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        if isinstance(message, TaskEnded):
            if message.name == structuring_task_name:
                await self._structuring_ended(message)
            return None
        if isinstance(message, WriteMemory):
            return await self._write(message)
        if isinstance(message, UpdateKnowledge):
            return await self._update(message)
        if isinstance(message, RecordLifecycle):
            return await self._record_lifecycle(message)
        if isinstance(message, RecoverIdempotency):
            return await self._recover(message)
        if isinstance(message, PromoteContexts):
            return await self._promote(message)
        if isinstance(message, ArchiveKnowledge):
            return await self._archive(message)
        raise TypeError(f"the knowledge scope actor does not handle {type(message).__name__}")

    # -- the idempotent writes ---------------------------------------------------------------

    def _check(self, value: Any) -> SensitivityVerdict | KnowledgeRefused:
        """The sensitivity verdict, or the refusal: run before any receipt is taken."""
        if self.context.env.fault_points.fires(sensitivity_fault_point):
            self.context.trace("knowledge_sensitivity_unavailable", point=sensitivity_fault_point)
            return KnowledgeRefused("SENSITIVITY_CHECK_FAILED", "the sensitivity check is unavailable")
        try:
            verdict = self.settings.sensitivity.detect(value)
        except SensitivityCheckFailed:
            return KnowledgeRefused("SENSITIVITY_CHECK_FAILED", "the sensitivity check is unavailable")
        except Exception as error:  # a detector bug must fail closed too
            logger.error("the sensitivity detector raised %s", type(error).__name__)
            return KnowledgeRefused("SENSITIVITY_CHECK_FAILED", "the sensitivity check is unavailable")
        if verdict.is_sensitive and self.scope.is_shared:
            return KnowledgeRefused("SENSITIVE_SHARED_SCOPE", "sensitive content cannot be written to a shared scope")
        return verdict

    def _latency_ms(self, started: float) -> int:
        return max(0, int((self.context.env.clock.monotonic() - started) * 1000))

    async def _run_idempotent(self, request: Any, job: Any) -> WriteOutcome:
        """Run the write job; when it fails, mark the request's receipt FAILED in a second job
        (the caller cannot know the outcome) and let the error crash the turn (500)."""
        try:
            return await self.context.storage.write(job)
        except Exception:
            key = request.idempotency_key
            if key is not None:
                now, scope = self.context.env.clock.wall(), self.scope.text
                hashed = request_hash(request.operation, request.canonical())
                try:
                    await self.context.storage.write(lambda connection: receipt_fail(
                        connection, request.namespace, key, scope=scope, operation=request.operation,
                        request_hash=hashed, error=receipt_failure_text, now=now))
                except Exception as error:
                    logger.error("could not mark receipt %s failed: %s", key, type(error).__name__)
            raise

    def _arm_structuring(self, connection: apsw.Connection, now: float) -> None:
        """Inside a write's job: the durable crash net for the structuring it queued."""
        reminder_set(connection, scope_kind_name, self.scope.text, structuring_reminder_name,
                     now + structuring_reminder_delay_seconds, None)

    def _structuring_armed(self, now: float) -> None:
        """After the job of ``_arm_structuring`` committed: the scheduler learns the due time."""
        self.context.reminder_armed(structuring_reminder_name, now + structuring_reminder_delay_seconds)

    def _after_fresh_write(self, outcome: WriteOutcome, now: float) -> None:
        if outcome.refusal is None and not outcome.replayed:
            self._structuring_armed(now)
            self._pump()

    async def _write(self, request: WriteMemory) -> MemoryWritten | KnowledgeRefused:
        assert request.scope == self.scope.text, (request.scope, self.scope.text)
        problem = write_problem(request)
        if problem is not None:
            return KnowledgeRefused("INVALID_REQUEST", problem)
        verdict = self._check(request.raw)
        if isinstance(verdict, KnowledgeRefused):
            return verdict
        env = self.context.env
        started, now = env.clock.monotonic(), env.clock.wall()
        evidence_id = env.ids.new_id("evd_")
        hashed = None if request.idempotency_key is None else request_hash(request.operation, request.canonical())
        draft = EvidenceDraft(
            scope=request.scope, source_type=request.source_type, raw=request.raw, context=request.context,
            provenance=None if request.provenance is None else request.provenance.encode(),
            sensitivity=verdict.sensitivity, sensitivity_categories=verdict.categories,
            quality_score=evidence_quality_score(request.source_type, request.raw),
            idempotency_key=request.idempotency_key)
        latency_ms = self._latency_ms(started)

        def job(connection: apsw.Connection) -> WriteOutcome:
            outcome = write_evidence(connection, draft, evidence_id=evidence_id, now=now, latency_ms=latency_ms,
                                     request_hash=hashed)
            if outcome.evidence is not None:
                self._arm_structuring(connection, now)
            return outcome

        outcome = await self._run_idempotent(request, job)
        if outcome.refusal is not None:
            return _refused(outcome)
        self._after_fresh_write(outcome, now)
        response = outcome.response()
        assert response is not None
        return MemoryWritten(evidence_id=response["evidence_id"], quality_score=response["quality_score"],
                             sensitivity=response["sensitivity"], latency_ms=response["latency_ms"],
                             status=response["status"])

    async def _update(self, request: UpdateKnowledge) -> KnowledgeUpdated | KnowledgeRefused:
        assert request.scope == self.scope.text, (request.scope, self.scope.text)
        problem = update_problem(request)
        if problem is not None:
            return KnowledgeRefused("INVALID_REQUEST", problem)
        changed = {name: value for name, value in (("title", request.title), ("body", request.body))
                   if value is not None}
        verdict = self._check(changed)
        if isinstance(verdict, KnowledgeRefused):
            return verdict
        env, storage = self.context.env, self.context.storage
        started = env.clock.monotonic()
        # Conflict ids are made on the event loop (the Env's id source is not for the writer's
        # thread), for the changes the item as read now would give; the job diffs the item as
        # it is at commit (``WriteOutcome.previous``), the same unless a structuring moved it.
        before = await storage.read(lambda connection: get_knowledge(connection, request.knowledge_id))
        expected = (explicit_update_changes(before.body, request.body)
                    if before is not None and request.body is not None and before.scope == request.scope else ())
        conflict_ids = [env.ids.new_id("cfl_") for _ in expected]
        now = env.clock.wall()
        evidence_id = env.ids.new_id("evd_")
        hashed = None if request.idempotency_key is None else request_hash(request.operation, request.canonical())
        agent = request.provenance is not None
        draft = KnowledgeUpdateDraft(
            knowledge_id=request.knowledge_id, expected_version=request.expected_version, scope=request.scope,
            title=request.title, body=request.body,
            provenance=None if request.provenance is None else request.provenance.encode(),
            sensitivity=verdict.sensitivity, sensitivity_categories=verdict.categories,
            quality_score=evidence_quality_score("TOOL_RESULT" if agent else "MANUAL_CONFIG", changed),
            idempotency_key=request.idempotency_key)
        latency_ms = self._latency_ms(started)
        detected: list[ConflictDetected] = []

        def job(connection: apsw.Connection) -> WriteOutcome:
            detected.clear()
            outcome = update_knowledge(connection, draft, evidence_id=evidence_id, now=now, latency_ms=latency_ms,
                                       request_hash=hashed,
                                       source_type="TOOL_RESULT" if agent else "MANUAL_CONFIG")
            if outcome.evidence is not None:
                self._arm_structuring(connection, now)
                detected.extend(_record_update_conflicts(connection, outcome, request, conflict_ids, evidence_id, now))
            return outcome

        outcome = await self._run_idempotent(request, job)
        if outcome.refusal is not None:
            return _refused(outcome)
        response = outcome.response()
        assert response is not None
        if not outcome.replayed:
            # Conflicts first, then the index, then the rebuild (which ends in memory_ready).
            for event in detected:
                publish_event(self.context.system, event)
            await self._refresh([response["knowledge_id"]])
        self._after_fresh_write(outcome, now)
        return KnowledgeUpdated(knowledge_id=response["knowledge_id"], evidence_id=response["evidence_id"],
                                version=response["version"], latency_ms=response["latency_ms"],
                                status=response["status"])

    async def _refresh(self, knowledge_ids: Sequence[str]) -> None:
        """The index follows a commit (see the module docstring); a failure is logged."""
        if not knowledge_ids:
            return
        try:
            await self.settings.index.refresh(self.context, list(knowledge_ids))
        except Exception as error:
            logger.warning("refreshing the knowledge index of %s failed: %s", self.scope.text, type(error).__name__)
            self.context.trace("knowledge_index_refresh_failed", count=len(knowledge_ids))

    async def _archive(self, request: ArchiveKnowledge) -> KnowledgeArchived | KnowledgeRefused:
        """An ACTIVE item of this scope leaves recall for good (its rows stay, ARCHIVED); an
        archived one answers the same again.  Another scope's item is 404 like a missing one."""
        assert request.scope == self.scope.text, (request.scope, self.scope.text)
        now, scope = self.context.env.clock.wall(), self.scope.text

        def job(connection: apsw.Connection) -> tuple[str, int] | None:
            item = get_knowledge(connection, request.knowledge_id)
            if item is None or item.scope != scope:
                return None
            if item.status == knowledge_status_active:
                set_knowledge_status(connection, item.id, knowledge_status_archived, now)
                return knowledge_status_archived, item.version
            return item.status, item.version

        outcome = await self.context.storage.write(job)
        if outcome is None:
            return KnowledgeRefused("NOT_FOUND", f"knowledge {request.knowledge_id!r} not found")
        status, version = outcome
        if status != knowledge_status_archived:
            return KnowledgeRefused("KNOWLEDGE_NOT_ACTIVE", f"knowledge {request.knowledge_id!r} is {status}")
        await self._refresh([request.knowledge_id])
        return KnowledgeArchived(knowledge_id=request.knowledge_id, version=version, status=status)

    async def _record_lifecycle(self, request: RecordLifecycle) -> LifecycleRecorded | KnowledgeRefused:
        assert request.scope == self.scope.text, (request.scope, self.scope.text)
        problem = lifecycle_problem(request)
        if problem is not None:
            return KnowledgeRefused("INVALID_REQUEST", problem)
        env = self.context.env
        now, context_id = env.clock.wall(), env.ids.new_id("ctx_")
        hashed = request_hash(request.operation, request.canonical())
        draft = ContextDraft(scope=request.scope, event=request.event, session_id=request.session_id,
                             data=request.data, occurred_at=float(request.occurred_at), run_id=request.run_id,
                             turn_id=request.turn_id, idempotency_key=request.idempotency_key)
        outcome = await self._run_idempotent(request, lambda connection: record_lifecycle(
            connection, draft, context_id=context_id, now=now, request_hash=hashed))
        if outcome.refusal is not None:
            return _refused(outcome)
        response = outcome.response()
        assert response is not None
        return LifecycleRecorded(event=response["event"], context_id=response["context_id"], tier=response["tier"],
                                 expires_at=response["expires_at"], status=response["status"])

    async def _recover(self, request: RecoverIdempotency) -> RetryAuthorized | KnowledgeRefused:
        original = request.original
        assert original.scope == self.scope.text, (original.scope, self.scope.text)
        key = original.idempotency_key
        if key is None:
            return KnowledgeRefused("IDEMPOTENCY_KEY_REQUIRED", "the original request has no idempotency_key")
        hashed = request_hash(original.operation, original.canonical())
        now = self.context.env.clock.wall()
        decision = await self.context.storage.write(lambda connection: receipt_recover(
            connection, original.operation, key, scope=original.scope, request_hash=hashed,
            reason=request.reason, now=now))
        if decision.action != "proceed":
            return KnowledgeRefused(decision.code, decision.message, decision.status)
        body = recovery_response(decision.receipt)
        return RetryAuthorized(operation=body["operation"], idempotency_key=body["idempotency_key"],
                               recovery_count=body["recovery_count"], authorized_at=body["authorized_at"])

    # -- promotion ---------------------------------------------------------------------------

    async def _promote(self, request: PromoteContexts) -> ContextsPromoted | KnowledgeRefused:
        assert request.scope == self.scope.text, (request.scope, self.scope.text)
        problem = promote_problem(request)
        if problem is not None:
            return KnowledgeRefused("INVALID_REQUEST", problem)
        env, storage = self.context.env, self.context.storage
        started, now = env.clock.monotonic(), env.clock.wall()
        ids = list(dict.fromkeys(request.context_ids))
        stored = await storage.read(lambda connection: get_contexts(connection, ids))
        knowledge_ids: list[str] = []
        promoted = 0
        for context_id in ids:
            context = stored.get(context_id)
            if context is None or context.scope != request.scope or context.tier != request.source:
                continue  # unknown or another scope's: skipped without saying which
            if context.promoted_knowledge_id is not None:
                knowledge_ids.append(context.promoted_knowledge_id)
                promoted += 1
                continue
            row = {"id": context.id, "scope": context.scope, "tier": context.tier, "status": context.status,
                   "expires_at": context.expires_at, "event": context.event, "session_id": context.session_id,
                   "data": context.data}
            if not promotable(row, request, now):
                continue
            knowledge_id = await self._promote_one(row, now)
            if knowledge_id is not None:
                knowledge_ids.append(knowledge_id)
                promoted += 1
        await self._refresh(list(dict.fromkeys(knowledge_ids)))
        return ContextsPromoted(promoted_count=promoted, knowledge_ids=tuple(dict.fromkeys(knowledge_ids)),
                                latency_ms=self._latency_ms(started))

    async def _promote_one(self, context: dict[str, Any], now: float) -> str | None:
        """Write the context as evidence, structure it now, mark the context PROMOTED."""
        raw = promoted_raw(context)
        verdict = self._check(raw)
        if isinstance(verdict, KnowledgeRefused):
            return None  # sensitive for a shared scope, or the check failed: not promoted
        evidence_id = self.context.env.ids.new_id("evd_")
        draft = EvidenceDraft(scope=self.scope.text, source_type=promotion_source_type, raw=raw,
                              sensitivity=verdict.sensitivity, sensitivity_categories=verdict.categories,
                              quality_score=evidence_quality_score(promotion_source_type, raw))

        def write(connection: apsw.Connection) -> None:
            insert_evidence(connection, draft, evidence_id=evidence_id, now=now, origin="promotion", structure=True)
            self._arm_structuring(connection, now)

        await self.context.storage.write(write)
        self._structuring_armed(now)
        events = await self.settings.structurer.structure(self.context, evidence_id)
        linked = await self.context.storage.read(lambda connection: knowledge_ids_for_evidence(connection, evidence_id))
        if not linked:
            return None  # structuring did not land: the queued task retries it later
        knowledge_id = linked[0]

        def mark(connection: apsw.Connection) -> None:
            mark_context_promoted(connection, context["id"], knowledge_id, now)
            structuring_done(connection, evidence_id)

        await self.context.storage.write(mark)
        for event in events:
            publish_event(self.context.system, event)
        return knowledge_id


def _structuring_done_all(connection: apsw.Connection, evidence_ids: Sequence[str]) -> None:
    for evidence_id in evidence_ids:
        structuring_done(connection, evidence_id)


def scope_actor_kind(settings: ScopeSettings | None = None) -> ActorKind:
    chosen = settings or ScopeSettings()
    return ActorKind(scope_kind_name, lambda context: KnowledgeScopeActor(context, chosen),
                     mailbox_messages_max=scope_mailbox_messages_max)


__all__ = [
    "BatchStructurer",
    "KnowledgeIndexPort",
    "KnowledgeScopeActor",
    "RecallIndexRefresher",
    "RecallStructurer",
    "ScopeSettings",
    "Structurer",
    "crashed_incarnation_text",
    "receipt_failure_text",
    "scope_actor_kind",
    "scope_mailbox_messages_max",
    "scope_structuring_batch_max",
    "sensitivity_fault_point",
    "structuring_evidence_seconds_max",
    "structuring_reminder_delay_seconds",
    "structuring_reminder_name",
    "structuring_retry_seconds",
    "structuring_runs_max",
    "structuring_task_name",
    "update_problem",
    "write_problem",
]
