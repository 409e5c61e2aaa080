"""``/forget``: natural-language forgetting with a confirmation step (§3.8, §4.3).

Why it exists: the user says "忘记那张4月支出清单"; the server must show what that would remove
(``confirm=false``: the knowledge items, and how many evidence rows and relations go with
them, ``irreversible: true``) and only remove it when asked again with ``confirm=true`` —
knowledge, evidence, entities, relations, conflicts, links and vectors, for good — then
broadcast ``forget_confirmation``.

Targets: the command's filler ("忘记", "忘掉", "删除", "forget", "那张", "关于", "the", ...) is
stripped, the rest is recalled over every scope's knowledge, and only items that share most
of the remaining words (``target_term_share_min`` of the query's terms appear in the item's
title or text) become targets: forgetting is irreversible, so a vector's vague similarity
alone never selects anything.

Confirmation: ``plan_forget`` keeps the plan durably (``_store.forget_request_put``: the
target ids, ``expires_at = now + forget_confirmation_seconds``) and answers it with its
``confirmation_token``.  ``confirm_forget`` finds the kept plan by that token, or else by the
same command (and scope) still pending, and removes exactly the kept targets — what the user
saw, not a fresh resolution — consuming the plan in the same transaction as the removal (one
use).  A kept plan that expired answers 408 ``CONFLICT_TIMEOUT``; an unknown or used token 404
``REQUEST_NOT_FOUND``; ``confirm=true`` with no kept plan at all resolves the targets afresh
and removes them (the caller confirmed explicitly).  After the removal the index drops the
items (text and vectors), and ``forget_confirmation`` is the event to broadcast.
"""

from __future__ import annotations

import re
from typing import Any

import apsw

from troupe.retrieval import text_query

from ._protocol import (
    ForgetConfirmation,
    ForgetPlan,
    ForgetTarget,
    Forgotten,
    KnowledgeRefused,
    forget_confirmation_seconds,
)
from ._query import knowledge_views
from ._store import (
    ForgetCascade,
    ForgetResult,
    forget_apply,
    forget_items_per_call_max,
    forget_plan,
    forget_request_confirm,
    forget_request_get,
    forget_request_pending,
    forget_request_put,
)

command_characters_max = 1_000
forget_targets_max = 20
target_term_share_min = 0.6
"""Share of the command's remaining terms an item must contain to be a target."""
forget_recall_depth = 50

assert forget_targets_max <= forget_recall_depth
assert forget_targets_max <= forget_items_per_call_max, "a plan's targets always fit one forget"

_filler = re.compile(
    r"请|帮我|麻烦|把|将|给我|忘记|忘掉|忘了|遗忘|删除|删掉|清除|移除|抹掉|不要再记得|不要记得|"
    r"那张|那个|这个|那条|这条|那些|这些|那份|这份|关于|有关|所有的|所有|全部|记忆|记录|的|吧|"
    r"\b(?:please|forget|delete|remove|erase|about|the|my|that|this|those|these|all|"
    r"everything|memory|memories|of|everything about)\b",
    re.IGNORECASE,
)


def command_terms(command: str) -> list[str]:
    """The command's content terms once the forgetting filler is gone."""
    stripped = _filler.sub(" ", command[:command_characters_max])
    return list(text_query(stripped).terms) if stripped.strip() else []


def command_key(command: str) -> str:
    """How a pending plan is matched by command: whitespace collapsed."""
    return " ".join(command.split())


async def resolve_targets(
    engine: Any, knowledge_index: Any, command: str, *, scope: str | None
) -> list[str]:
    """The knowledge ids the command names (see the module docstring), best first."""
    terms = command_terms(command)
    if not terms:
        return []
    candidates = await knowledge_index.recall(
        " ".join(terms),
        scopes=None if scope is None else frozenset({scope}),
        limit=forget_recall_depth,
    )
    ids = [candidate.knowledge_id for candidate in candidates]
    views = await engine.read(lambda connection: knowledge_views(connection, ids, entities=True))
    targets = []
    for knowledge_id in ids:
        view = views.get(knowledge_id)
        if view is None or (scope is not None and view.scope != scope):
            continue
        text = view.text.lower()
        share = sum(1 for term in terms if term in text) / len(terms)
        if share >= target_term_share_min:
            targets.append(knowledge_id)
    return targets[:forget_targets_max]


def _plan_reply(cascade: ForgetCascade, token: str, expires_at: float) -> ForgetPlan:
    return ForgetPlan(
        targets=tuple(
            ForgetTarget(type="knowledge", id=item.id, title=item.title) for item in cascade.knowledge
        ),
        evidence_count=len(cascade.evidence_ids),
        relation_count=cascade.relation_count,
        expires_at=int(expires_at),
        confirmation_token=token,
    )


async def plan_forget(
    engine: Any, knowledge_index: Any, env: Any, command: str, *, scope: str | None = None
) -> ForgetPlan:
    """``confirm=false``: resolves the targets, counts the cascade and keeps the plan for
    ``forget_confirmation_seconds`` (one write)."""
    targets = await resolve_targets(engine, knowledge_index, command, scope=scope)
    token = env.ids.new_id("fgt_")
    now = env.clock.wall()

    def write(connection: apsw.Connection) -> ForgetPlan:
        cascade = forget_plan(connection, targets)
        request = forget_request_put(
            connection, request_id=token, command=command_key(command), scope=scope,
            targets=[item.id for item in cascade.knowledge], now=now,
            seconds=forget_confirmation_seconds,
        )
        return _plan_reply(cascade, token, request.expires_at)

    return await engine.write(write)


def _pending_request_id(connection: apsw.Connection, command: str, scope: str | None) -> str | None:
    row = connection.execute(
        "SELECT id FROM knowledge_forget_requests WHERE command = ? AND scope IS ? AND state = ? "
        "ORDER BY created_at DESC, id DESC LIMIT 1",
        (command_key(command), scope, forget_request_pending),
    ).fetchone()
    return None if row is None else row[0]


async def confirm_forget(
    engine: Any,
    knowledge_index: Any,
    env: Any,
    command: str,
    *,
    scope: str | None = None,
    confirmation_token: str | None = None,
) -> tuple[Forgotten, ForgetConfirmation] | KnowledgeRefused:
    """``confirm=true``: removes the kept plan's targets (see the module docstring); returns
    the 200 body and the event to broadcast, or the refusal (404 / 408)."""
    started = env.clock.monotonic()
    fresh_targets: list[str] | None = None
    if confirmation_token is None:
        pending = await engine.read(lambda connection: _pending_request_id(connection, command, scope))
        if pending is None:
            fresh_targets = await resolve_targets(engine, knowledge_index, command, scope=scope)
        confirmation_token = pending
    now = env.clock.wall()
    token = confirmation_token

    def write(connection: apsw.Connection) -> tuple[ForgetResult, float] | KnowledgeRefused:
        if token is None:
            assert fresh_targets is not None
            return forget_apply(connection, fresh_targets, now), now
        request = forget_request_get(connection, token)
        if request is not None and request.command != command_key(command):
            return KnowledgeRefused("REQUEST_NOT_FOUND", "no pending forget request for this command")
        request, refusal = forget_request_confirm(connection, token, now)
        if refusal is not None:
            return KnowledgeRefused(refusal.code, refusal.message, refusal.status)
        assert request is not None
        return forget_apply(connection, list(request.targets), now), request.expires_at

    outcome = await engine.write(write)
    if isinstance(outcome, KnowledgeRefused):
        return outcome
    result, expires_at = outcome
    if result.knowledge_ids:
        await knowledge_index.remove(list(result.knowledge_ids))
    event = ForgetConfirmation(
        command=command,
        knowledge_ids=result.knowledge_ids,
        evidence_ids=result.evidence_ids,
        relation_count=result.relation_count,
        expires_at=int(expires_at),
        forgotten_ids=tuple(result.forgotten_ids),
    )
    done = Forgotten(
        forgotten_ids=tuple(result.forgotten_ids),
        latency_ms=max(0, round((env.clock.monotonic() - started) * 1000)),
    )
    return done, event


__all__ = [
    "command_characters_max",
    "command_key",
    "command_terms",
    "confirm_forget",
    "forget_recall_depth",
    "forget_targets_max",
    "plan_forget",
    "resolve_targets",
    "target_term_share_min",
]
