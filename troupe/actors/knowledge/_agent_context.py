"""``/agent/context``: a budgeted, traceable memory context for one agent turn (§3.2a).

Why it exists: an OS agent asks for memory before every turn and pastes what it gets into its
prompt, so the answer must be small (``max_chars``), safe (scope is a hard filter; any item
with an evidence of ``sensitivity > 0`` is excluded, and the client cannot loosen that), and
traceable (every item names its knowledge id, version and evidence ids, and an item whose
evidence cannot be found is dropped: fail closed).

How: ``KnowledgeIndex.recall`` with the scope and ``clean_only`` as index filters (sensitive
items never even rank), over-fetching ``top_k * candidate_overfetch_factor`` candidates; one
storage read then fetches the candidates' knowledge rows, evidence links with sensitivity,
and conflict states, and re-checks every filter against SQLite (the index is a cache: an item
forgotten, superseded or made sensitive since is dropped, not trusted).  ``freshness_seconds``
only labels items ``fresh``/``stale``; it never widens or narrows what is returned.

Budget: each item is one line ``- {title}: {body as JSON} [knowledge=…; evidence=…]``; lines
are added best first while they fit.  The first line that does not fit is cut (its body
shortened, its reference tag kept, so even a cut item stays traceable) when at least
``line_characters_min`` remain, otherwise left out; either way ``truncated`` is true, and
``items`` lists exactly the items whose line is in ``context``.  ``len(context) <=
max_chars`` always.

Performance: one recall (bitmap filters, BM25 top-k, one ANN search, and beside it the
graph's indexed reads) plus one storage read for at most ``top_k *
candidate_overfetch_factor`` items: the target is p99 ≤ 50 ms at 100k knowledge items.
``bench/knowledge_agent_context.py`` measures it (CPU time, 100k items, 90% of
them in the asked scope); what dominated was bm25 scoring every match of the query's terms,
doubled by the text index's scope pre-filter (now skipped when the scope holds most of the
index), and the graph's filter query walking the scope index (now on the primary key).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import apsw

from ._conflicts import conflict_status_of
from ._protocol import (
    AgentContext,
    AgentContextItem,
    agent_context_characters_default,
    agent_context_characters_max,
    agent_context_characters_min,
    agent_context_top_k_default,
    agent_context_top_k_max,
    agent_context_top_k_min,
    freshness_seconds_default,
)
from ._query import KnowledgeView, knowledge_views, query_text_characters_max
from ._scopes import scope_problem

top_k_min = agent_context_top_k_min
top_k_max = agent_context_top_k_max
top_k_default = agent_context_top_k_default
max_chars_min = agent_context_characters_min
max_chars_max = agent_context_characters_max
max_chars_default = agent_context_characters_default
freshness_seconds_max = 10 * 365 * 86_400
query_characters_max = query_text_characters_max
identifier_characters_max = 256
"""``session_id`` and ``turn_id``: echoed back, so bounded."""
candidate_overfetch_factor = 3
line_characters_min = 48
"""A cut line shorter than this would be mostly its reference tag: leave it out instead."""
evidence_ids_per_item_max = 20
newest_scan_items_max = 200
"""An empty query lists the scope's newest items; this bounds the rows it reads."""

assert top_k_min <= top_k_default <= top_k_max
assert max_chars_min <= max_chars_default <= max_chars_max
assert line_characters_min < max_chars_min
assert top_k_max * candidate_overfetch_factor <= 200  # the recall depth


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def agent_context_problem(
    *, query: Any, scope: Any, session_id: Any, turn_id: Any, top_k: Any, max_chars: Any,
    freshness_seconds: Any,
) -> str | None:
    """Why a request is the caller's error (400 ``INVALID_REQUEST``), or ``None``; the HTTP
    layer's pydantic schema checks the same limits, this is the domain's own guard."""
    if not isinstance(query, str) or len(query) > query_characters_max:
        return f"query must be a string of at most {query_characters_max} characters"
    problem = scope_problem(scope)
    if problem is not None:
        return problem
    for name, value in (("session_id", session_id), ("turn_id", turn_id)):
        if not isinstance(value, str) or not value.strip() or len(value) > identifier_characters_max:
            return f"{name} is required (1 to {identifier_characters_max} characters)"
    if not _is_int(top_k) or not top_k_min <= top_k <= top_k_max:
        return f"top_k must be an integer from {top_k_min} to {top_k_max}"
    if not _is_int(max_chars) or not max_chars_min <= max_chars <= max_chars_max:
        return f"max_chars must be an integer from {max_chars_min} to {max_chars_max}"
    if not _is_int(freshness_seconds) or not 0 <= freshness_seconds <= freshness_seconds_max:
        return f"freshness_seconds must be an integer from 0 to {freshness_seconds_max}"
    return None


def reference_tag(view: KnowledgeView) -> str:
    evidence = ",".join(view.evidence_ids[:evidence_ids_per_item_max])
    return f" [knowledge={view.knowledge_id}; evidence={evidence}]"


def item_line(view: KnowledgeView) -> str:
    """``- {title}: {body as JSON} [knowledge=…; evidence=…]``."""
    body = json.dumps(view.body, ensure_ascii=False, separators=(", ", ": "))
    return f"- {view.title}: {body}{reference_tag(view)}"


def render_context(
    views: Sequence[KnowledgeView], max_chars: int
) -> tuple[str, list[KnowledgeView], bool]:
    """``(context, the views whose line is in it, truncated)`` within ``max_chars`` (see the
    module docstring)."""
    lines: list[str] = []
    used = 0
    for index, view in enumerate(views):
        separator = 1 if lines else 0
        line = item_line(view)
        room = max_chars - used - separator
        if len(line) <= room:
            lines.append(line)
            used += separator + len(line)
            continue
        tag = reference_tag(view)
        if room >= max(line_characters_min, len(tag) + 2):
            head = line[: len(line) - len(tag)]
            lines.append(head[: room - len(tag) - 1] + "…" + tag)
            return "\n".join(lines), list(views[: index + 1]), True
        return "\n".join(lines), list(views[:index]), True
    return "\n".join(lines), list(views), False


def _newest_ids(connection: apsw.Connection, scope: str, limit: int) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT id FROM knowledge_items WHERE scope = ? AND status = 'ACTIVE' "
        "ORDER BY updated_at DESC, id LIMIT ?",
        (scope, limit),
    )]


def admissible(view: KnowledgeView | None, scope: str) -> bool:
    """The hard filters, checked against SQLite: same scope exactly, ACTIVE, at least one
    real evidence, no evidence with ``sensitivity > 0``."""
    return (
        view is not None
        and view.scope == scope
        and view.active
        and bool(view.evidence)
        and not view.sensitive
    )


async def agent_context(
    engine: Any,
    knowledge_index: Any,
    env: Any,
    *,
    query: str,
    scope: str,
    session_id: str,
    turn_id: str,
    top_k: int = top_k_default,
    max_chars: int = max_chars_default,
    freshness_seconds: int = freshness_seconds_default,
) -> AgentContext:
    """Builds the context (see the module docstring).  Arguments are valid
    (``agent_context_problem`` returned ``None``).  An empty query lists the scope's newest
    admissible items."""
    assert top_k_min <= top_k <= top_k_max and max_chars_min <= max_chars <= max_chars_max
    started = env.clock.monotonic()
    depth = top_k * candidate_overfetch_factor
    relevance: dict[str, float] = {}
    if query.strip():
        candidates = await knowledge_index.recall(
            query, scopes=frozenset({scope}), limit=depth, clean_only=True
        )
        ids = [candidate.knowledge_id for candidate in candidates]
        best = candidates[0].score if candidates else 1.0
        relevance = {c.knowledge_id: (c.score / best if best > 0 else 0.0) for c in candidates}

        def read(connection: apsw.Connection) -> dict[str, KnowledgeView]:
            return knowledge_views(connection, ids)
    else:
        ids = []

        def read(connection: apsw.Connection) -> dict[str, KnowledgeView]:
            ids.extend(_newest_ids(connection, scope, min(depth, newest_scan_items_max)))
            return knowledge_views(connection, ids)

    views = await engine.read(read)
    chosen = [views[i] for i in ids if admissible(views.get(i), scope)][:top_k]
    context, included, truncated = render_context(chosen, max_chars)
    now = env.clock.wall()
    items = tuple(
        AgentContextItem(
            knowledge_id=view.knowledge_id,
            version=view.version,
            title=view.title,
            scope=view.scope,
            evidence_ids=view.evidence_ids[:evidence_ids_per_item_max],
            confidence=round(min(1.0, view.quality) * (0.5 + 0.5 * relevance.get(view.knowledge_id, 1.0)), 4),
            updated_at=int(view.updated_at),
            freshness="fresh" if now - view.updated_at <= freshness_seconds else "stale",
            conflict_status=conflict_status_of(view.conflicts),
        )
        for view in included
    )
    assert len(context) <= max_chars
    return AgentContext(
        session_id=session_id,
        turn_id=turn_id,
        context=context,
        items=items,
        truncated=truncated,
        latency_ms=max(0, round((env.clock.monotonic() - started) * 1000)),
    )


__all__ = [
    "admissible",
    "agent_context",
    "agent_context_problem",
    "candidate_overfetch_factor",
    "evidence_ids_per_item_max",
    "freshness_seconds_max",
    "identifier_characters_max",
    "item_line",
    "line_characters_min",
    "newest_scan_items_max",
    "reference_tag",
    "render_context",
]
