"""Structuring: turning committed evidence into knowledge (entities, relations, vectors).

Why it exists: ``/memory/write`` acknowledges once the evidence row is durable (§3.1: "同步落
evidence 后立即 ACK，结构化处理异步执行"); everything that makes the evidence findable —
a knowledge item with a title and a body, its entities and relations for the graph, its text
and vector in the shared ``MemoryIndex``, conflict detection against what is already known —
runs afterwards, from durable work the actor re-runs after a crash.  This module is that work
as steps the scope actor composes:

1. ``extract_structure(source_type, raw)``: the local, offline extractor (pure): a title, the
   body, the indexable text, entities and relations.  Explicit ``raw.entities`` /
   ``raw.relations`` are kept as given; conversation turns and tool results get entities from
   quoted names, ASCII proper nouns and CJK runs the model port names.
2. ``structure_with_model(model, ...)``: asks the Model port (JSON mode) for entities and
   relations when the model can converse; the LocalModel cannot, so its answer is step 1 —
   deterministic, and what the simulator replays.
3. ``structure_evidence(...)``: one storage write (re-checks that the evidence still exists and
   is not structured yet; finds the ACTIVE knowledge of the same subject in the same scope;
   detects conflicts; creates the knowledge or a new version of the existing one; links the
   evidence; stores entities, relations and conflicts), then the index update (old version's
   key deleted, the new one added), then the events to announce.

Idempotence: a second run for the same evidence finds it linked and returns the recorded
outcome with ``already_structured=True`` and no events, so a replayed outbox entry never
creates a second knowledge item.  A crash between the storage write and the index update is
repaired by ``KnowledgeIndex``'s reconciliation at open (``_query``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import apsw
import trio

from troupe.models import ChatMessage, CompletionRequest, ModelError

from ._conflicts import detect_conflicts, normalised_subject, stored_value
from ._protocol import ConflictDetected, MemoryReady
from ._store import (
    Evidence,
    KnowledgeItem,
    Relation,
    create_knowledge,
    entities_per_knowledge_max,
    entity_characters_max,
    evidence_origin_update,
    get_evidence,
    get_knowledge,
    insert_conflict,
    knowledge_entities,
    knowledge_ids_for_evidence,
    knowledge_relations,
    knowledge_status_active,
    knowledge_title_characters_max,
    link_evidence,
    relation_type_characters_max,
    relations_per_knowledge_max,
    replace_structure,
    structuring_done,
)

# The structure limits are the store's (``replace_structure`` refuses anything over them).
title_characters_max = knowledge_title_characters_max
indexed_text_characters_max = 20_000
"""Text of one knowledge item handed to the index (BM25 and the embedder)."""
structuring_model_timeout_seconds = 20.0

assert entity_characters_max <= title_characters_max


@dataclass(frozen=True)
class Structure:
    """What structuring makes of one evidence row."""

    title: str
    body: Any
    text: str
    entities: tuple[str, ...]
    relations: tuple[Relation, ...]


@dataclass(frozen=True)
class StructuringResult:
    """The outcome of structuring one evidence row; ``events`` are what to broadcast (empty
    when the evidence was structured before or has been forgotten meanwhile)."""

    evidence_id: str
    knowledge_id: str | None
    version: int
    title: str
    scope: str
    created: bool
    already_structured: bool
    conflicts: tuple[ConflictDetected, ...] = ()

    @property
    def events(self) -> tuple[MemoryReady | ConflictDetected, ...]:
        if self.already_structured or self.knowledge_id is None:
            return ()
        ready = MemoryReady(
            evidence_id=self.evidence_id, knowledge_id=self.knowledge_id, title=self.title,
            scope=self.scope,
        )
        return (ready, *self.conflicts)


_quoted = re.compile(r"[「『《“\"]([^「」『』《》“”\"\n]{1,64})[」』》”\"]")
_ascii_name = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:[ .-][A-Z][A-Za-z0-9]*)*\b")
_number_like = re.compile(r"^[\d\s.,:/+\-%¥$€元]*$")
_first_sentence = re.compile(r"^(.+?)(?:[。！？!?；;\n]|\.\s|$)")
_title_words_max = 40
"""Characters of the first sentence a derived title keeps."""
_entity_leaf_characters_max = 24
"""A body's short string leaves (``"vendor": "国家电网"``) are entities; longer ones are prose."""


def _clean(text: str, characters_max: int) -> str:
    return " ".join(text.split())[:characters_max]


def _leaves(value: Any, depth: int = 0) -> list[tuple[str, Any]]:
    """``(key, value)`` of every scalar leaf, in document order (keys of list items are the
    list's key)."""
    if depth > 16:
        return []
    if isinstance(value, dict):
        found: list[tuple[str, Any]] = []
        for key, item in value.items():
            if isinstance(item, dict | list):
                found.extend(_leaves(item, depth + 1))
            else:
                found.append((str(key), item))
        return found
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item, depth + 1)]
    return [("", value)]


def body_text(body: Any) -> str:
    """The readable text of a body: its string and number leaves, in order."""
    if isinstance(body, str):
        return body
    parts = []
    for key, value in _leaves(body):
        if isinstance(value, bool) or value is None:
            continue
        parts.append(f"{key} {value}".strip() if isinstance(value, int | float) else str(value))
    return " ".join(parts)


def _derived_title(text: str) -> str:
    match = _first_sentence.match(text.strip())
    sentence = match.group(1) if match else text
    return _clean(sentence, _title_words_max)


def _entities(raw: Mapping[str, Any], body: Any, text: str, *, leaves: bool) -> list[str]:
    entities: list[str] = []

    def add(name: Any) -> None:
        if not isinstance(name, str):
            return
        name = _clean(name, entity_characters_max)
        if name and not _number_like.match(name) and name not in entities:
            entities.append(name)

    declared = raw.get("entities")
    if isinstance(declared, list):
        for name in declared:
            add(name)
    if leaves and not isinstance(body, str):
        for _, value in _leaves(body):
            if isinstance(value, str) and len(value) <= _entity_leaf_characters_max:
                add(value)
    for match in _quoted.finditer(text):
        add(match.group(1))
    for match in _ascii_name.finditer(text):
        if len(match.group(0)) > 1:
            add(match.group(0))
    return entities[:entities_per_knowledge_max]


def _relations(raw: Mapping[str, Any]) -> list[Relation]:
    declared = raw.get("relations")
    if not isinstance(declared, list):
        return []
    relations: list[Relation] = []
    for item in declared:
        if not isinstance(item, dict):
            continue
        source, target, kind = item.get("from"), item.get("to"), item.get("type", "RELATED_TO")
        if not (isinstance(source, str) and isinstance(target, str) and isinstance(kind, str)):
            continue
        relation = Relation(
            _clean(source, entity_characters_max),
            _clean(target, entity_characters_max),
            _clean(kind, relation_type_characters_max) or "RELATED_TO",
        )
        if relation.source and relation.target and relation not in relations:
            relations.append(relation)
    return relations[:relations_per_knowledge_max]


def extract_structure(source_type: str, raw: Mapping[str, Any]) -> Structure:
    """The local offline extractor (see the module docstring); pure and deterministic.

    A conversation turn's body is the turn itself (``user``/``assistant``) and its title the
    user's first sentence; any other source's title is ``raw.title`` (or its text's first
    sentence) and its body ``raw.body`` (or the raw object without the structuring keys).
    Relations whose ends are not entities yet make them entities.
    """
    if source_type == "CONVERSATION":
        user = str(raw.get("user", ""))
        assistant = str(raw.get("assistant", ""))
        body: Any = {"user": user, "assistant": assistant}
        text = f"{user}\n{assistant}"
        title = _derived_title(user) or _derived_title(assistant)
    else:
        if "body" in raw:
            body = raw["body"]
        else:
            body = {
                key: value
                for key, value in raw.items()
                if key not in ("title", "entities", "relations")
            }
        text = body_text(body)
        declared_title = raw.get("title")
        title = (
            _clean(declared_title, title_characters_max)
            if isinstance(declared_title, str) and declared_title.strip()
            else _derived_title(text)
        )
        text = f"{title}\n{text}" if title else text
    title = title or source_type.lower()
    # A conversation's body is prose: its leaves are sentences, not names.
    entities = _entities(raw, body, text, leaves=source_type != "CONVERSATION")
    relations = _relations(raw)
    for relation in relations:
        for name in (relation.source, relation.target):
            if name not in entities and len(entities) < entities_per_knowledge_max:
                entities.append(name)
    return Structure(
        title=title[:title_characters_max],
        body=body,
        text=text[:indexed_text_characters_max],
        entities=tuple(entities),
        relations=tuple(relations),
    )


def _model_converses(model: Any) -> bool:
    capabilities = getattr(model, "capabilities", None)
    return model is not None and (capabilities is None or "converse" in capabilities)


_structuring_instruction = (
    "You structure one memory for a knowledge graph. Answer one JSON object: "
    '{"entities": [names], "relations": [{"from": name, "to": name, "type": UPPER_SNAKE}]}. '
    "Use only names that occur in the text."
)


async def structure_with_model(
    model: Any, source_type: str, raw: Mapping[str, Any]
) -> Structure:
    """``extract_structure``, enriched by the Model port when it can converse; any model
    failure falls back to the local answer (structuring never fails on the model).

    The model only adds entities and relations that occur in the text: a name it invents is
    dropped, so the graph never holds what the evidence does not say.
    """
    local = extract_structure(source_type, raw)
    if not _model_converses(model):
        return local
    request = CompletionRequest(
        messages=(
            ChatMessage("system", _structuring_instruction),
            ChatMessage("user", local.text[:indexed_text_characters_max]),
        ),
        response_format="json",
    )
    try:
        with trio.move_on_after(structuring_model_timeout_seconds):
            completion = await model.complete(request)
            proposed = json.loads(completion.text)
            return _enriched(local, proposed)
    except (ModelError, ValueError, TypeError, AttributeError):
        pass
    return local


def _enriched(local: Structure, proposed: Any) -> Structure:
    if not isinstance(proposed, dict):
        return local
    entities = list(local.entities)
    for name in proposed.get("entities") or []:
        if (
            isinstance(name, str)
            and name.strip()
            and name in local.text
            and name not in entities
            and len(entities) < entities_per_knowledge_max
        ):
            entities.append(_clean(name, entity_characters_max))
    relations = list(local.relations)
    for relation in _relations({"relations": proposed.get("relations")}):
        if (
            relation.source in entities
            and relation.target in entities
            and relation not in relations
            and len(relations) < relations_per_knowledge_max
        ):
            relations.append(relation)
    return replace(local, entities=tuple(entities), relations=tuple(relations))


@dataclass(frozen=True)
class SubjectItem:
    """The ACTIVE item a write's subject lands on, as read before planning."""

    knowledge_id: str
    version: int
    title: str
    body: Any


@dataclass(frozen=True)
class _Situation:
    """What structuring one evidence row finds before it plans."""

    evidence: Evidence | None
    linked_knowledge_id: str | None
    task_pending: bool


def _situation(connection: apsw.Connection, evidence_id: str) -> _Situation:
    evidence = get_evidence(connection, evidence_id)
    linked = knowledge_ids_for_evidence(connection, evidence_id)
    task = connection.execute(
        "SELECT 1 FROM knowledge_structuring WHERE evidence_id = ?", (evidence_id,)
    ).fetchone()
    return _Situation(evidence, linked[0] if linked else None, task is not None)


def read_subject_item(connection: apsw.Connection, scope: str, title: str) -> SubjectItem | None:
    """The newest ACTIVE item of ``scope`` with this title (same normalised subject)."""
    subject = normalised_subject(title)
    if not subject:
        return None
    for knowledge_id, version, stored_title, body_json in connection.execute(
        "SELECT id, version, title, body_json FROM knowledge_items "
        "WHERE scope = ? AND status = ? AND title = ? ORDER BY updated_at DESC, id",
        (scope, knowledge_status_active, title),
    ):
        if normalised_subject(stored_title) == subject:
            return SubjectItem(knowledge_id, int(version), stored_title, json.loads(body_json))
    return None


def merged_structure(
    connection: apsw.Connection, knowledge_id: str, structure: Structure
) -> tuple[list[str], list[Relation]]:
    """The item's stored entities and relations plus the new ones (a merge keeps what was
    known), within the store's limits."""
    entities = list(knowledge_entities(connection, knowledge_id))
    for name in structure.entities:
        if name not in entities:
            entities.append(name)
    relations = list(knowledge_relations(connection, knowledge_id))
    for relation in structure.relations:
        if relation not in relations:
            relations.append(relation)
    return entities[:entities_per_knowledge_max], relations[:relations_per_knowledge_max]


def _store_relations(structure: Structure) -> list[Relation]:
    return [r for r in structure.relations]


class _SubjectMoved(Exception):
    """The subject item changed between planning and writing (another writer): plan again."""


structuring_plan_attempts_max = 3


async def structure_evidence(
    engine: Any, knowledge_index: Any, env: Any, evidence_id: str
) -> StructuringResult:
    """Structures one committed evidence row: storage write, index update, events (see the
    module docstring).  Safe to run again for the same evidence; it finishes the evidence's
    structuring task (``_store.structuring_done``) in the same write.

    - A write's evidence: conversation turns always become their own item (two turns that
      open with the same words are not one subject); other sources land on the ACTIVE item of
      the same subject in the same scope when there is one — a new version with the merged
      body, one conflict row per changed field — and otherwise create an item
      (``_store.create_knowledge``).
    - An update's evidence (``evidence.knowledge_id`` set; the update already bumped the
      version): the item's entities and relations are rebuilt from its current title and body,
      and its index entry (text, vector) follows.
    - Forgotten evidence: the task is dropped, nothing is announced.

    Ids are made on the event loop before the write (the Env's id source is not for worker
    threads); the write re-checks the subject's version and plans again when another writer
    moved it.  Whenever it returns, the evidence's structuring task is finished (its queue row
    deleted in the same write as the outcome, or found already gone).
    """
    for _ in range(structuring_plan_attempts_max):
        try:
            return await _structure_once(engine, knowledge_index, env, evidence_id)
        except _SubjectMoved:
            continue
    return await _structure_once(engine, knowledge_index, env, evidence_id, subject_lookup=False)


async def _structure_once(
    engine: Any, knowledge_index: Any, env: Any, evidence_id: str, *, subject_lookup: bool = True
) -> StructuringResult:
    situation = await engine.read(lambda connection: _situation(connection, evidence_id))
    evidence = situation.evidence
    if evidence is None:
        if situation.task_pending:
            await engine.write(lambda connection: structuring_done(connection, evidence_id))
        return StructuringResult(evidence_id, None, 0, "", "", created=False, already_structured=True)
    if evidence.knowledge_id is not None and evidence.origin == evidence_origin_update:
        return await _rebuild_updated(engine, knowledge_index, env, evidence, situation.task_pending)
    if situation.linked_knowledge_id is not None:
        if situation.task_pending:
            await engine.write(lambda connection: structuring_done(connection, evidence_id))
        return await _recorded_outcome(engine, evidence_id, situation.linked_knowledge_id)
    structure = await structure_with_model(env.model, evidence.source_type, evidence.raw)
    subject = None
    if subject_lookup and evidence.source_type != "CONVERSATION":
        subject = await engine.read(
            lambda connection: read_subject_item(connection, evidence.scope, structure.title)
        )
    now = env.clock.wall()
    knowledge_id = env.ids.new_id("knw_") if subject is None else subject.knowledge_id
    plan = None if subject is None else detect_conflicts(subject.body, structure.body)
    conflict_ids = [env.ids.new_id("cfl_") for _ in (plan.changes if plan else ())]

    def write(connection: apsw.Connection) -> StructuringResult | None:
        current = _situation(connection, evidence_id)
        if current.evidence is None or current.linked_knowledge_id is not None:
            return None  # forgotten or structured meanwhile: report what is recorded
        if subject is None:
            item, _ = create_knowledge(
                connection, knowledge_id=knowledge_id, evidence_id=evidence_id,
                title=structure.title, body=structure.body, entities=structure.entities,
                relations=_store_relations(structure), now=now,
            )
            assert item is not None
            return StructuringResult(evidence_id, item.id, item.version, item.title, item.scope,
                                     created=True, already_structured=False)
        assert plan is not None
        row = connection.execute(
            "SELECT version FROM knowledge_items WHERE id = ? AND status = ?",
            (knowledge_id, knowledge_status_active),
        ).fetchone()
        if row is None or int(row[0]) != subject.version:
            raise _SubjectMoved
        version = subject.version + 1
        connection.execute(
            "UPDATE knowledge_items SET version = ?, body_json = ?, updated_at = ? "
            "WHERE id = ? AND version = ?",
            (version, _json(plan.merged_body), now, knowledge_id, subject.version),
        )
        entities, relations = merged_structure(connection, knowledge_id, structure)
        replace_structure(connection, knowledge_id, entities, relations)
        link_evidence(connection, knowledge_id, evidence_id, now)
        conflicts = []
        for conflict_id, change in zip(conflict_ids, plan.changes, strict=True):
            old_value, new_value = stored_value(change.old_value), stored_value(change.new_value)
            insert_conflict(
                connection, conflict_id=conflict_id, knowledge_id=knowledge_id,
                field=change.field, old_value=old_value, new_value=new_value,
                resolution=change.resolution, now=now,
            )
            conflicts.append(ConflictDetected(
                conflict_id=conflict_id, knowledge_title=subject.title, field=change.field,
                old_value=old_value, new_value=new_value, resolution=change.resolution,
            ))
        structuring_done(connection, evidence_id)
        return StructuringResult(evidence_id, knowledge_id, version, subject.title, evidence.scope,
                                 created=False, already_structured=False,
                                 conflicts=tuple(conflicts))

    result = await engine.write(write)
    if result is None:
        return await _structure_once(engine, knowledge_index, env, evidence_id, subject_lookup=False)
    await knowledge_index.refresh([result.knowledge_id])
    return result


structuring_batch_source_types = frozenset({"CONVERSATION"})
"""Sources a batch structures together (one read and one write job for all of them): a turn
always becomes its own item (no subject lookup, no merge, no conflict), so nothing in one
turn's structuring depends on another's.  Every other source goes one by one
(``structure_evidence``)."""


def _batchable(situation: _Situation) -> bool:
    evidence = situation.evidence
    return (evidence is not None and situation.linked_knowledge_id is None and situation.task_pending
            and evidence.knowledge_id is None and evidence.source_type in structuring_batch_source_types)


async def structure_evidence_batch(
    engine: Any, knowledge_index: Any, env: Any, evidence_ids: list[str]
) -> list[StructuringResult | Exception]:
    """``structure_evidence`` for several evidence rows, per evidence and in order: its result
    or the exception that failed it alone.

    Conversation turns still to structure share ONE read (their situations) and ONE write job
    (each turn's ``create_knowledge`` in its own savepoint, so one that fails fails alone) —
    instead of a read and a write job, each with its thread hop and its share of a commit, per
    turn.  Every other evidence (another source, an update's, one structured or forgotten
    meanwhile) takes the one-by-one path, which handles every case.  The index is refreshed
    as ``structure_evidence`` does (through ``knowledge_index``, once for the batch's turns)."""
    situations = await engine.read(
        lambda connection: [_situation(connection, evidence_id) for evidence_id in evidence_ids])
    batched: dict[str, tuple[Structure, str]] = {}
    for evidence_id, situation in zip(evidence_ids, situations, strict=True):
        if _batchable(situation) and evidence_id not in batched:
            assert situation.evidence is not None
            structure = await structure_with_model(env.model, situation.evidence.source_type, situation.evidence.raw)
            batched[evidence_id] = (structure, env.ids.new_id("knw_"))
    now = env.clock.wall()

    def write(connection: apsw.Connection) -> dict[str, StructuringResult | Exception | None]:
        results: dict[str, StructuringResult | Exception | None] = {}
        for evidence_id, (structure, knowledge_id) in batched.items():
            if knowledge_ids_for_evidence(connection, evidence_id):
                results[evidence_id] = None  # structured meanwhile: the one-by-one path reports it
                continue
            connection.execute("SAVEPOINT structure_one")
            try:
                # It re-reads the evidence: forgotten meanwhile gives (None, False), nothing written.
                item, created = create_knowledge(
                    connection, knowledge_id=knowledge_id, evidence_id=evidence_id, title=structure.title,
                    body=structure.body, entities=structure.entities, relations=_store_relations(structure),
                    now=now)
            except (ValueError, apsw.ConstraintError) as error:
                connection.execute("ROLLBACK TO structure_one; RELEASE structure_one")
                results[evidence_id] = error
                continue
            connection.execute("RELEASE structure_one")
            results[evidence_id] = None if item is None or not created else StructuringResult(
                evidence_id, item.id, item.version, item.title, item.scope, created=True, already_structured=False)
        return results

    written = await engine.write(write) if batched else {}
    created = [result.knowledge_id for result in written.values()
               if isinstance(result, StructuringResult) and result.knowledge_id is not None]
    if created:
        await knowledge_index.refresh(created)
    outcomes: list[StructuringResult | Exception] = []
    for evidence_id in evidence_ids:
        result = written.get(evidence_id)
        if result is None:
            try:
                result = await structure_evidence(engine, knowledge_index, env, evidence_id)
            except Exception as error:
                result = error
        outcomes.append(result)
    return outcomes


async def _rebuild_updated(
    engine: Any, knowledge_index: Any, env: Any, evidence: Evidence, task_pending: bool
) -> StructuringResult:
    """An update's evidence: rebuild the item's entities and relations from its current
    title and body, finish the task, and re-index the item."""
    knowledge_id = evidence.knowledge_id
    assert knowledge_id is not None
    item = await engine.read(lambda connection: get_knowledge(connection, knowledge_id))
    if item is None and task_pending:
        # The item is gone (forgotten): nothing to rebuild, the task is finished all the same.
        await engine.write(lambda connection: structuring_done(connection, evidence.id))
    if item is None or not task_pending:
        return await _recorded_outcome(engine, evidence.id, knowledge_id)
    raw = {"title": item.title, "body": item.body}
    if isinstance(evidence.raw, Mapping):
        raw.update({key: evidence.raw[key] for key in ("entities", "relations") if key in evidence.raw})
    structure = await structure_with_model(env.model, "MANUAL_CONFIG", raw)

    def write(connection: apsw.Connection) -> KnowledgeItem | None:
        current = get_knowledge(connection, knowledge_id)
        if current is not None and current.version == item.version:
            replace_structure(connection, knowledge_id, structure.entities, _store_relations(structure))
            structuring_done(connection, evidence.id)
            return current
        if current is None:
            structuring_done(connection, evidence.id)
        return current

    current = await engine.write(write)
    if current is not None and current.version != item.version:
        # A later update moved the item on: rebuild from its newest state.
        return await _rebuild_updated(engine, knowledge_index, env, evidence, task_pending)
    # The scope actor indexed the new version when the update committed, with the entities
    # it had then: the rebuilt ones change the indexed text, not the version.
    await knowledge_index.refresh([knowledge_id], reindex=True)
    if current is None:
        return StructuringResult(evidence.id, None, 0, "", evidence.scope, created=False,
                                 already_structured=True)
    return StructuringResult(evidence.id, knowledge_id, current.version, current.title,
                             current.scope, created=False, already_structured=False)


async def _recorded_outcome(engine: Any, evidence_id: str, knowledge_id: str) -> StructuringResult:
    item = await engine.read(lambda connection: get_knowledge(connection, knowledge_id))
    if item is None:
        return StructuringResult(evidence_id, None, 0, "", "", created=False, already_structured=True)
    return StructuringResult(evidence_id, knowledge_id, item.version, item.title, item.scope,
                             created=False, already_structured=True)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


__all__ = [
    "Structure",
    "StructuringResult",
    "SubjectItem",
    "body_text",
    "extract_structure",
    "indexed_text_characters_max",
    "merged_structure",
    "read_subject_item",
    "structure_evidence",
    "structure_evidence_batch",
    "structure_with_model",
    "structuring_batch_source_types",
    "structuring_model_timeout_seconds",
    "structuring_plan_attempts_max",
]
