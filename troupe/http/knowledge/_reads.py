"""The read side of the knowledge surface: recall, evidence, preferences, forget, conflicts,
delivery, answered by calling the recall slice's functions directly over the engine.

Why no read-side actor (``("knowledge_service", "main")`` in ``_protocol``): an actor runs one
turn at a time, and these requests hold no state of their own that needs one owner: every
one is a storage read (readers run in parallel beside the writer) plus, for forget and
preference extraction, one storage write job whose transaction is its own serialisation.  A
single service actor would queue every ``/agent/context`` behind every ``/memory/query``, on
the path whose target is p99 ≤ 50 ms.  The requests are still the protocol's messages
(``QueryMemory``, ``BuildAgentContext``, ...) and ``answer`` returns the protocol's replies, so
moving them behind an actor later changes one call site.

What stays with the actors: everything with receipts or versions (writes, updates, lifecycle,
recovery, promotion) goes to ``("knowledge_scope", scope)``; events go through the hub
(``publish_event``), e.g. the ``forget_confirmation`` a confirmed forget broadcasts.
"""

from __future__ import annotations

import datetime
from typing import Any

from troupe.actors.knowledge import (
    AgentContext,
    BuildAgentContext,
    BuildDigest,
    ConflictList,
    ConflictRecord,
    Digest,
    EvidenceRecord,
    ExtractPreferences,
    ForgetMemory,
    ForgetPlan,
    Forgotten,
    GetEvidence,
    GetPreferenceHistory,
    InsightList,
    KnowledgeRefused,
    ListConflicts,
    ListInsights,
    ListPreferences,
    MemoryAnswer,
    PreferenceHistory,
    PreferenceList,
    PreferenceRecord,
    PreferencesExtracted,
    PreferenceVersion,
    Provenance,
    QueryMemory,
    get_evidence,
    get_preference,
    list_conflicts,
    list_preferences,
    preference_history,
    publish_event,
)


class KnowledgeReads:
    """Answers the read-side protocol requests (see the module docstring)."""

    def __init__(self, engine: Any, env: Any, system: Any) -> None:
        self.engine = engine
        self.env = env
        self.system = system

    async def index(self) -> Any:
        from troupe.actors.knowledge._query import knowledge_indexes

        return await knowledge_indexes.open(self.engine, getattr(self.env, "embedder", None))

    async def answer(self, message: Any) -> Any:
        handler = _handlers.get(type(message))
        if handler is None:
            raise TypeError(f"the knowledge read side does not handle {type(message).__name__}")
        return await handler(self, message)

    async def query(self, request: QueryMemory) -> MemoryAnswer:
        from troupe.actors.knowledge._query import query_knowledge

        return await query_knowledge(self.engine, await self.index(), self.env, request.text, scope=request.scope,
                                     time_range=request.time_range, top_k=request.top_k)

    async def agent_context(self, request: BuildAgentContext) -> AgentContext:
        from troupe.actors.knowledge._agent_context import agent_context

        return await agent_context(self.engine, await self.index(), self.env, query=request.query,
                                   scope=request.scope, session_id=request.session_id, turn_id=request.turn_id,
                                   top_k=request.top_k, max_chars=request.max_chars,
                                   freshness_seconds=request.freshness_seconds)

    async def evidence(self, request: GetEvidence) -> EvidenceRecord | KnowledgeRefused:
        evidence = await self.engine.read(lambda connection: get_evidence(connection, request.evidence_id))
        if evidence is None:
            return KnowledgeRefused("NOT_FOUND", "no such evidence")
        provenance = evidence.provenance
        return EvidenceRecord(
            id=evidence.id, source_type=evidence.source_type, raw=evidence.raw,
            quality_score=evidence.quality_score, sensitivity=evidence.sensitivity, scope=evidence.scope,
            created_at=int(evidence.created_at),
            provenance=Provenance.decode(provenance) if isinstance(provenance, dict) else None,
            context=evidence.context)

    async def extract_preferences(self, request: ExtractPreferences) -> PreferencesExtracted | KnowledgeRefused:
        from troupe.actors.knowledge._preferences import extract_preferences

        return await extract_preferences(self.engine, self.env, request.evidence_ids)

    async def preferences(self, request: ListPreferences) -> PreferenceList:
        rows = await self.engine.read(lambda connection: list_preferences(connection, request.scope))
        return PreferenceList(preferences=tuple(
            PreferenceRecord(id=row.id, category=row.category, key=row.key, value=row.value,
                             confidence=row.confidence, version=row.version, scope=row.scope,
                             created_at=int(row.created_at), updated_at=int(row.updated_at))
            for row in rows))

    async def preference_history(self, request: GetPreferenceHistory) -> PreferenceHistory | KnowledgeRefused:
        def read(connection: Any) -> Any:
            return get_preference(connection, request.preference_id), preference_history(
                connection, request.preference_id)

        preference, versions = await self.engine.read(read)
        if preference is None:
            return KnowledgeRefused("NOT_FOUND", "no such preference")
        return PreferenceHistory(id=preference.id, key=preference.key, current_version=preference.version,
                                 history=tuple(PreferenceVersion(version=item.version, value=item.value,
                                                                 updated_at=int(item.updated_at))
                                               for item in versions))

    async def forget(self, request: ForgetMemory) -> ForgetPlan | Forgotten | KnowledgeRefused:
        from troupe.actors.knowledge._forget import confirm_forget, plan_forget

        index = await self.index()
        if not request.confirm:
            return await plan_forget(self.engine, index, self.env, request.command, scope=request.scope)
        outcome = await confirm_forget(self.engine, index, self.env, request.command, scope=request.scope,
                                       confirmation_token=request.confirmation_token)
        if isinstance(outcome, KnowledgeRefused):
            return outcome
        done, event = outcome
        publish_event(self.system, event)
        return done

    async def conflicts(self, request: ListConflicts) -> ConflictList:
        rows = await self.engine.read(lambda connection: list_conflicts(connection, request.scope))
        return ConflictList(conflicts=tuple(
            ConflictRecord(id=conflict.id, target_knowledge=conflict.knowledge_id, field=conflict.field,
                           old_value=conflict.old_value, new_value=conflict.new_value,
                           resolution=conflict.resolution, created_at=int(conflict.created_at),
                           knowledge_title=title)
            for conflict, title in rows))

    async def insights(self, request: ListInsights) -> InsightList:
        from troupe.actors.knowledge._delivery import insights

        return InsightList(insights=tuple(await insights(self.engine, self.env, limit=request.limit)))

    async def digest(self, request: BuildDigest) -> Digest:
        from troupe.actors.knowledge._delivery import (
            digest,
            local_day_bounds,
            local_today,
            local_zone,
        )
        from troupe.actors.knowledge.monitor import day_counts

        zone = local_zone(request.utc_offset_seconds)
        day = (datetime.date.fromisoformat(request.date) if request.date is not None
               else local_today(self.env.clock.wall(), zone))
        start, end = local_day_bounds(day, zone)
        return digest(day, await self.engine.read(lambda connection: day_counts(connection, start, end)))


_handlers = {
    QueryMemory: KnowledgeReads.query,
    BuildAgentContext: KnowledgeReads.agent_context,
    GetEvidence: KnowledgeReads.evidence,
    ExtractPreferences: KnowledgeReads.extract_preferences,
    ListPreferences: KnowledgeReads.preferences,
    GetPreferenceHistory: KnowledgeReads.preference_history,
    ForgetMemory: KnowledgeReads.forget,
    ListConflicts: KnowledgeReads.conflicts,
    ListInsights: KnowledgeReads.insights,
    BuildDigest: KnowledgeReads.digest,
}


def local_utc_offset_seconds(now: float) -> int:
    """This machine's UTC offset at ``now`` (the digest's "local day")."""
    offset = datetime.datetime.fromtimestamp(now).astimezone().utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


__all__ = ["KnowledgeReads", "local_utc_offset_seconds"]
