"""``/agent/lifecycle`` and ``/memory/flow/promote``: agent lifecycle hooks become short- or
mid-term contexts, and chosen contexts become long-term knowledge.

Why the server chooses the tier: the contract (§3.2b) makes the tier a function of the event
(TURN_START/TURN_END → SHORT_TERM, the rest → MID_TERM) so a caller cannot keep a turn's
scratch notes for a week; ``expires_at`` follows from the tier (``tier_lifetimes_seconds``,
counted from the server's clock when the context is recorded, not from the caller's
``occurred_at``, which may be old or skewed).

Why promotion is explicit: lifecycle contexts are never made permanent automatically; the
agent's policy layer names the contexts to keep (§3.2b: "需要晋升的 context_id 由 Module E/
策略层显式提交"), so the sensitivity check, summary choice and user policy have one review
point: here.  A promoted context is written as a new evidence row of its scope
(``promotion_source_type``, raw = the context's data with a title), structured at once (the
contract answers with the knowledge ids) and marked PROMOTED with its knowledge id, so
promoting it again answers the same id and creates nothing.  Contexts that are unknown, of
another scope, of another tier, expired or no longer ACTIVE are skipped without saying why
(no existence leak across scopes); sensitive data is never promoted into a ``shared:*`` scope.

Both run inside the scope actor (``("knowledge_scope", scope)``), the one writer of the
scope's receipts, contexts and versions.  This module holds the pure rules; the actor does
the storage jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._protocol import (
    PromoteContexts,
    RecordLifecycle,
    lifecycle_events,
    lifecycle_tiers,
    promote_context_ids_max,
    tier_lifetimes_seconds,
    turn_lifecycle_events,
)
from ._store import context_status_active, lifecycle_data_bytes_max, stored_json_bytes

promotion_source_type = "MANUAL_CONFIG"
"""The evidence source type of a promoted context: a deliberate, reviewed decision to keep
something, not a conversation turn or a tool result."""
lifecycle_data_characters_max = lifecycle_data_bytes_max
"""A lifecycle ``data`` object as the store keeps it (compact JSON), at most: the store's byte
limit, checked here so that a larger one is the caller's 400, not the store's error."""
promoted_title_characters_max = 200

assert all(tier in tier_lifetimes_seconds for tier in lifecycle_tiers.values())


def lifecycle_problem(request: RecordLifecycle) -> str | None:
    """Why ``request`` is not a valid lifecycle event (the HTTP layer checks the same before
    asking; the actor checks again because it trusts no caller), or ``None``."""
    if request.event not in lifecycle_events:
        return f"event must be one of: {', '.join(lifecycle_events)}"
    if not isinstance(request.data, Mapping) or not request.data:
        return "data must be a non-empty object"
    if stored_json_bytes(dict(request.data)) > lifecycle_data_bytes_max:
        return f"data is larger than {lifecycle_data_bytes_max} bytes as compact JSON"
    if request.event in turn_lifecycle_events and not request.turn_id:
        return f"{request.event} needs turn_id"
    if not request.session_id:
        return "session_id is required"
    return None


def context_tier(event: str) -> str:
    """The tier the server chooses for ``event``."""
    return lifecycle_tiers[event]


def context_expires_at(event: str, now: float) -> int:
    """``expires_at`` (integer Unix seconds) of a context recorded at ``now``."""
    return int(now) + tier_lifetimes_seconds[context_tier(event)]


def promote_problem(request: PromoteContexts) -> str | None:
    if request.source not in tier_lifetimes_seconds:
        return f"source must be one of: {', '.join(tier_lifetimes_seconds)}"
    if not request.context_ids:
        return "context_ids must not be empty"
    if len(request.context_ids) > promote_context_ids_max:
        return f"at most {promote_context_ids_max} context_ids"
    return None


def promotable(context: Mapping[str, Any], request: PromoteContexts, now: float) -> bool:
    """Whether a stored context (a row as a mapping: scope, tier, status, expires_at) may be
    promoted by ``request`` at ``now``.  A PROMOTED one is not "promotable" but is answered
    with its knowledge id by the caller."""
    return (context["scope"] == request.scope and context["tier"] == request.source
            and context["status"] == context_status_active and context["expires_at"] > now)


def promoted_raw(context: Mapping[str, Any]) -> dict[str, Any]:
    """The evidence ``raw`` a promoted context becomes: a title naming where it came from, the
    context's data as the body, and its lifecycle identity for provenance."""
    data = context["data"]
    summary = data.get("summary") if isinstance(data, Mapping) else None
    title = summary if isinstance(summary, str) and summary.strip() else (
        f"{context['event']} {context['session_id']}")
    return {
        "title": title.strip()[:promoted_title_characters_max],
        "body": data,
        "context_id": context["id"],
        "event": context["event"],
        "session_id": context["session_id"],
    }


__all__ = [
    "context_expires_at",
    "context_tier",
    "lifecycle_data_characters_max",
    "lifecycle_problem",
    "promotable",
    "promote_problem",
    "promoted_raw",
    "promoted_title_characters_max",
    "promotion_source_type",
]
