"""``POST /entries/{entry_id}/prepare``: what a host should know before it replies.

The eight sections and where each comes from today:

- ``persona``: the current version an operator set with ``troupe persona set`` (``_persona``);
  its fields are null until one is set, so hosts can rely on the section's shape;
- ``memories``: hybrid recall on the query (``relevant``), then memories about the
  participants (``person_highlight``), minus ``known_memory_ids``, forgotten and deleted ones,
  optionally judged by the model, then cut to ``memory_limit`` and ``token_budget`` (a memory
  that does not fit is skipped whole, never truncated);
- ``recent_messages``: this entry's last ``recent_limit`` messages in order, ``unlearned``
  unless their learning succeeded;
- ``state``: the host-reported state as ``GET /state`` shows it, ``{}`` when idle;
- ``goals``: the entry's and the global active goals that are injectable (``_goals.injected_goals``),
  each with its deadline / due / basis-changed hints;
- ``hints``: degradations (judgment, recall) and ``other_entries_pending``;
- ``entry_profile``: null (no profile generation yet);
- ``people``: ``[]`` (no published person summaries yet; ``people_limit`` is validated).

``text`` omitted builds the query from the entry's latest messages; ``""`` means no query
text at all (only person highlights can then be chosen).  A model failure, timeout or
unusable judgment never fails the request: the unjudged memories are returned with a hint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import trio

from troupe.auth import TokenGrant
from troupe.models import ChatMessage, CompletionRequest
from troupe.retrieval import MemoryIndex, RecallFilter

from ._goals import injected_goals
from ._memories import MemoryRecord, TokenizedDatabase, load_memories, memory_tenant
from ._persona import persona_section
from ._recall import (
    SourceLookup,
    current_state,
    learned_state,
    memory_document,
    other_entries_pending,
    recall_degraded_hint,
    recall_fetch_limit,
    recall_memory_ids,
    record_recall,
    source_lookup,
)

recent_limit_default, recent_limit_max = 20, 100
memory_limit_default, memory_limit_max = 8, 8
token_budget_default, token_budget_max = 1500, 1500
goal_limit_default, goal_limit_max = 10, 10
people_limit_default, people_limit_max = 3, 3
judge_budget_seconds_default = 10.0
participants_max = 100
participant_names_max = 100
known_memory_ids_max = 1000
auto_query_messages = 5
auto_query_characters_max = 1000
speaker_messages_for_people = 20
"""Without explicit participants, people are the senders of this many latest messages."""
judgment_output_tokens_max = 256

assert memory_limit_max <= recall_fetch_limit
assert 0 < judge_budget_seconds_default

_token_pattern = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\s\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def estimated_tokens(text: str) -> int:
    """One token per CJK character and per other word or symbol run (a cheap upper-ish guess)."""
    return len(_token_pattern.findall(text))


@dataclass(frozen=True)
class PrepareQuery:
    """A validated prepare body (defaults applied)."""

    text: str | None = None
    """None when omitted (auto query), "" for no query text."""
    participants: tuple[str, ...] | None = None
    participant_names: dict[str, str] | None = None
    people_limit: int = people_limit_default
    known_memory_ids: frozenset[int] = frozenset()
    recent_limit: int = recent_limit_default
    memory_limit: int = memory_limit_default
    token_budget: int = token_budget_default
    goal_limit: int = goal_limit_default
    judge: bool = True
    judge_budget_seconds: float = judge_budget_seconds_default

    def __post_init__(self) -> None:
        assert 0 <= self.recent_limit <= recent_limit_max
        assert 0 <= self.memory_limit <= memory_limit_max
        assert 0 <= self.token_budget <= token_budget_max
        assert 0 < self.judge_budget_seconds <= judge_budget_seconds_default


_recent_sql = (
    "SELECT id, kind, sender, account_id, content, occurred_at, quote_author, quote_content, "
    "learning_state FROM host_messages WHERE entry_id = ? ORDER BY id DESC LIMIT ?"
)


def _recent(connection: apsw.Connection, entry_id: str, limit: int) -> list[dict[str, Any]]:
    rows = list(connection.execute(_recent_sql, (entry_id, limit)))
    rows.reverse()
    media: dict[int, list[str]] = {}
    if rows:
        marks = ", ".join("?" for _ in rows)
        for message_id, media_id in connection.execute(
            f"SELECT message_id, media_id FROM host_message_media WHERE message_id IN ({marks}) "
            "ORDER BY message_id, position", tuple(row[0] for row in rows),
        ):
            media.setdefault(message_id, []).append(media_id)
    return [
        {"id": message_id, "kind": kind, "sender": sender, "account_id": account_id, "content": content,
         "occurred_at": occurred_at, "quote_author": quote_author, "quote_content": quote_content,
         "media_ids": media.get(message_id, []), "unlearned": state != learned_state}
        for message_id, kind, sender, account_id, content, occurred_at, quote_author, quote_content, state in rows
    ]


@dataclass(frozen=True)
class _Context:
    recent: list[dict[str, Any]]
    latest: list[dict[str, Any]]
    """The latest messages for the auto query and the speakers (may exceed ``recent``)."""


def _read_context(connection: apsw.Connection, entry_id: str, query: PrepareQuery) -> _Context:
    latest = _recent(connection, entry_id, speaker_messages_for_people)
    if query.recent_limit <= len(latest):
        recent = latest[len(latest) - query.recent_limit:]
    else:
        recent = _recent(connection, entry_id, query.recent_limit)
    return _Context(recent, latest)


def auto_query_text(latest: Sequence[dict[str, Any]]) -> str:
    """The query built from the entry's latest messages (newest last), bounded in characters."""
    text = " ".join(message["content"] for message in latest[-auto_query_messages:] if message["content"])
    return text[-auto_query_characters_max:]


def participant_people(query: PrepareQuery, latest: Sequence[dict[str, Any]]) -> list[str]:
    """Whose memories are person highlights: explicit participants in order, else the senders
    of the latest messages from newest to oldest (not the character's own outputs)."""
    if query.participants is not None:
        return list(dict.fromkeys(query.participants))
    senders = [message["sender"] for message in reversed(latest)
               if message["kind"] == "message" and message["sender"].strip()]
    return list(dict.fromkeys(senders))


def _person_memory_ids(
    connection: apsw.Connection, people: Sequence[str], per_person: int, total_max: int
) -> list[int]:
    """Each person's newest memories (at most ``per_person``), person by person, stopping
    once ``total_max`` ids are found: prepare can use no more than that many (the rest would
    be cut by ``memory_limit`` after known, duplicate and recalled ids are set aside)."""
    found: list[int] = []
    distinct: set[int] = set()
    for person in people:
        if len(distinct) >= total_max:
            break
        rows = [row[0] for row in connection.execute(
            "SELECT p.memory_id FROM host_memory_people p JOIN host_memories m ON m.id = p.memory_id "
            "WHERE p.person = ? AND m.deleted_at IS NULL AND m.forgotten = 0 "
            "ORDER BY p.memory_id DESC LIMIT ?", (person, per_person))]
        found.extend(rows)
        distinct.update(rows)
    return found


def _usable(record: MemoryRecord | None, known: frozenset[int]) -> bool:
    return record is not None and not record.deleted and not record.forgotten and record.id not in known


async def judge_memories(
    model: Any, context_text: str, records: Sequence[MemoryRecord], budget_seconds: float
) -> tuple[list[MemoryRecord], dict[str, Any], dict[str, str] | None]:
    """Ask the model which memories help; returns (kept, judgment, hint or None).

    A failure or timeout keeps every memory (status ``degraded`` plus a hint); an answer
    without a usable ``keep`` list (a model that cannot judge) keeps every memory too
    (status ``skipped``)."""
    if not records:
        return [], {"status": "skipped", "reason": "no_candidates"}, None
    if model is None:
        return list(records), {"status": "skipped", "reason": "no_model"}, None
    listing = "\n".join(f"[{record.id}] {record.content}" for record in records)
    request = CompletionRequest(
        messages=(
            ChatMessage("system", "你是召回判断器。根据对话判断哪些记忆对回复有帮助，"
                                  "只输出 JSON：{\"keep\": [记忆编号]}。"),
            ChatMessage("user", f"对话：\n{context_text}\n\n候选记忆：\n{listing}"),
        ),
        response_format="json",
        max_output_tokens=judgment_output_tokens_max,
    )
    degraded = {"status": "degraded", "reason": "model_failed", "budget_seconds": budget_seconds}
    hint = {"code": "judgment_degraded", "message": "召回判断未完成，已返回未经判断的记忆。"}
    try:
        with trio.move_on_after(budget_seconds) as scope:
            completion = await model.complete(request)
    except Exception:  # any model failure becomes a hint, never a failed prepare
        return list(records), degraded, hint
    if scope.cancelled_caught:
        return list(records), {**degraded, "reason": "timeout"}, hint
    try:
        answer = json.loads(completion.text)
    except ValueError:
        return list(records), {**degraded, "reason": "invalid_answer"}, hint
    keep = answer.get("keep") if isinstance(answer, dict) else None
    if not isinstance(keep, list) or not all(isinstance(item, int) for item in keep):
        return list(records), {"status": "skipped", "reason": "model_cannot_judge"}, None
    kept = [record for record in records if record.id in set(keep)]
    return kept, {"status": "applied", "budget_seconds": budget_seconds, "dropped": len(records) - len(kept)}, None


def within_budget(records: Sequence[MemoryRecord], memory_limit: int, token_budget: int) -> list[MemoryRecord]:
    """At most ``memory_limit`` memories whose estimated tokens add up to ``token_budget``;
    one that does not fit is skipped whole and smaller later ones may still fit."""
    chosen: list[MemoryRecord] = []
    used = 0
    for record in records:
        if len(chosen) >= memory_limit:
            break
        tokens = estimated_tokens(record.content)
        if used + tokens > token_budget:
            continue
        chosen.append(record)
        used += tokens
    return chosen


def _ordered_memories(
    connection: apsw.Connection, candidates: Sequence[int], highlights: Sequence[int], query: PrepareQuery
) -> list[tuple[MemoryRecord, str]]:
    """The usable memories in answer order (recalled, then person highlights), each once,
    cut to ``memory_limit``."""
    records = load_memories(connection, [*dict.fromkeys([*candidates, *highlights])])
    ordered: list[tuple[MemoryRecord, str]] = []
    seen: set[int] = set()
    for memory_id, reason in [*((i, "relevant") for i in candidates), *((i, "person_highlight") for i in highlights)]:
        record = records.get(memory_id)
        if memory_id in seen or not _usable(record, query.known_memory_ids):
            continue
        seen.add(memory_id)
        ordered.append((record, reason))  # type: ignore[arg-type]
    return ordered[:query.memory_limit]


@dataclass(frozen=True)
class _Shown:
    """Everything prepare shows besides the recall, read in one snapshot."""

    ordered: list[tuple[MemoryRecord, str]]
    lookup: SourceLookup
    pending: dict[str, Any] | None
    state: dict[str, Any]
    persona: dict[str, Any]
    goals: list[dict[str, Any]]


async def prepare_entry(
    engine: Any, index: MemoryIndex, model: Any, grant: TokenGrant, entry_id: str, query: PrepareQuery,
    *, recall_id: str, now: float,
) -> dict[str, Any]:
    """The prepare answer for ``entry_id`` (already scope-checked), recall recorded first.

    With ``text`` given, two storage jobs besides the index's own read: after the recall, one
    read of the entry's context (and the person highlights it implies), the chosen memories
    with their sources, the pending hint, the state, the persona and the goals; then the
    write, which holds only the recall record (plus a bounded sweep of expired ones): the
    write goes through the single writer and its group commit, so nothing that can be read
    elsewhere rides on it.  With ``text`` omitted the context is read first (the query is
    built from it), so that case has one read more."""
    database = TokenizedDatabase(engine)
    wanted = query.memory_limit + len(query.known_memory_ids)

    def read_context(connection: apsw.Connection) -> tuple[_Context, list[int]]:
        context = _read_context(connection, entry_id, query)
        people = participant_people(query, context.latest) if query.memory_limit > 0 else []
        # Recall returns at most ``min(wanted, recall_fetch_limit)`` ids, each of which may
        # hide one highlight as a duplicate.
        highlights_max = wanted + min(wanted, recall_fetch_limit)
        return context, _person_memory_ids(connection, people, wanted, highlights_max)

    def read_shown(connection: apsw.Connection, candidates: list[int], highlights: list[int]) -> _Shown:
        ordered = _ordered_memories(connection, candidates, highlights, query)
        return _Shown(
            ordered,
            source_lookup(connection, [record for record, _ in ordered]),
            other_entries_pending(connection, grant.scope, entry_id),
            current_state(connection, grant.scope, now),
            persona_section(connection, now),
            injected_goals(connection, now=now, allows=grant.scope.allows, entry_id=entry_id,
                           limit=query.goal_limit, whole_scope=False),
        )

    hints: list[dict[str, Any]] = []

    async def recall(text: str) -> list[int]:
        if not text or query.memory_limit == 0:
            return []
        recall_filter = RecallFilter(memory_tenant, viewer=entry_id)
        candidates, degraded = await recall_memory_ids(index, text, recall_filter, wanted)
        if degraded:
            hints.append(dict(recall_degraded_hint))
        return candidates

    if query.text is None:
        # The query comes from the entry's latest messages: read them first.
        context, highlights = await database.read(read_context)
        text = auto_query_text(context.latest)
        candidates = await recall(text)
        shown = await database.read(lambda connection: read_shown(connection, candidates, highlights))
    else:
        # The query is given: recall first, then everything else in one read (one thread hop
        # and one snapshot fewer; under load each hop waits for a worker and the interpreter).
        text = query.text.strip()
        candidates = await recall(text)

        def read_all(connection: apsw.Connection) -> tuple[_Context, _Shown]:
            context, highlights = read_context(connection)
            return context, read_shown(connection, candidates, highlights)

        context, shown = await database.read(read_all)
    ordered = shown.ordered
    if query.judge:
        context_text = auto_query_text(context.latest) or text
        kept, judgment, hint = await judge_memories(
            model, context_text, [record for record, _ in ordered], query.judge_budget_seconds)
        if hint is not None:
            hints.append(hint)
        kept_ids = {record.id for record in kept}
        ordered = [(record, reason) for record, reason in ordered if record.id in kept_ids]
    else:
        judgment = {"status": "disabled"}
    reasons = {record.id: reason for record, reason in ordered}
    chosen = within_budget([record for record, _ in ordered], query.memory_limit, query.token_budget)
    chosen_ids = [record.id for record in chosen]
    # Durable before the reply: feedback checks against exactly this record.
    await engine.write(lambda connection: record_recall(connection, recall_id, grant, entry_id, chosen_ids, now))
    return {
        "persona": shown.persona,
        "memories": [memory_document(record, reasons[record.id], grant.scope, shown.lookup) for record in chosen],
        "recent_messages": context.recent,
        "state": shown.state,
        "goals": shown.goals,
        "hints": [*hints, *([shown.pending] if shown.pending else [])],
        "entry_profile": None,
        "people": [],
        "judgment": judgment,
        "recall_id": recall_id,
    }


__all__ = [
    "PrepareQuery",
    "auto_query_text",
    "estimated_tokens",
    "goal_limit_default",
    "goal_limit_max",
    "judge_budget_seconds_default",
    "judge_memories",
    "known_memory_ids_max",
    "memory_limit_default",
    "memory_limit_max",
    "participant_names_max",
    "participants_max",
    "people_limit_default",
    "people_limit_max",
    "prepare_entry",
    "recent_limit_default",
    "recent_limit_max",
    "token_budget_default",
    "token_budget_max",
    "within_budget",
]
