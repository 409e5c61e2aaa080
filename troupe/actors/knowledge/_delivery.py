"""``/delivery/insights`` and ``/delivery/digest``: what the welcome page and the daily
briefing show (§3.24, §3.25); server rules, no model.

Insights: ACTIVE knowledge created in the last ``insights_window_seconds`` in the local user's
scope, scored by the best ``quality_score`` of its linked evidence, best first; any item with
a linked evidence of ``sensitivity > 0`` is left out; the summary is the title plus the first
``insight_summary_body_characters`` characters of the body's text (never the raw evidence).
While any MANUAL conflict is pending the list is empty (the user must decide first).

Digest: one local calendar day (``date`` strictly ``YYYY-MM-DD``, default today in the
server's zone), its capture-log counts (only ``ingested`` counts as new memories, grouped by
source; ``sensitive_quarantined`` counted apart; ``ignored``/``state_changed`` not at all),
rendered by a template from counts only — no event's own text ever reaches the summary.  The
counts come from the caller (``DigestCounts``; the HTTP read side reads them from the monitor's
log with ``troupe.actors.knowledge.monitor.day_counts``) and an empty day says "当日无新记忆".
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import apsw

from ._protocol import (
    Digest,
    Insight,
    insights_limit_default,
    insights_limit_max,
    insights_limit_min,
    insights_window_seconds,
)
from ._query import knowledge_views
from ._scopes import local_user_scope
from ._store import manual_conflicts_pending
from ._structuring import body_text

insight_summary_body_characters = 60
insights_scope_default = local_user_scope
insight_kind_recent = "recent"
insight_candidates_max = 1_000
"""Recent items scored per request (the newest first); a day rarely holds more."""
digest_sources: tuple[str, ...] = ("directory", "clipboard", "behavior", "screenshot", "system")
digest_source_names: Mapping[str, str] = {
    "directory": "目录",
    "clipboard": "剪贴板",
    "behavior": "行为",
    "screenshot": "截图",
    "system": "系统",
}
digest_empty_summary = "当日无新记忆"
utc_offset_seconds_max = 14 * 3600

assert insights_limit_min <= insights_limit_default <= insights_limit_max
assert set(digest_source_names) == set(digest_sources)

_date_pattern = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class DigestCounts:
    """One day's capture-log counts: ``ingested`` per source, and quarantined ones."""

    ingested: Mapping[str, int] = field(default_factory=dict)
    quarantined: int = 0


def insights_limit_problem(limit: Any) -> str | None:
    """Why ``limit`` is the caller's error (400), or ``None``."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        return "limit must be an integer"
    if not insights_limit_min <= limit <= insights_limit_max:
        return f"limit must be from {insights_limit_min} to {insights_limit_max}"
    return None


def parse_digest_date(text: str) -> datetime.date | None:
    """``text`` as a calendar date when it is strictly ``YYYY-MM-DD`` and a real day."""
    if not isinstance(text, str) or not _date_pattern.fullmatch(text):
        return None
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


def local_zone(utc_offset_seconds: int) -> datetime.timezone:
    assert abs(utc_offset_seconds) <= utc_offset_seconds_max
    return datetime.timezone(datetime.timedelta(seconds=utc_offset_seconds))


def local_day_bounds(day: datetime.date, zone: datetime.tzinfo) -> tuple[float, float]:
    """``[start, end)`` of the local day in epoch seconds."""
    start = datetime.datetime.combine(day, datetime.time(), tzinfo=zone)
    end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(), tzinfo=zone)
    return start.timestamp(), end.timestamp()


def local_today(now: float, zone: datetime.tzinfo) -> datetime.date:
    return datetime.datetime.fromtimestamp(now, zone).date()


def digest_summary(counts: DigestCounts) -> str:
    """The template summary, from counts only (no event's text)."""
    ingested = {source: counts.ingested.get(source, 0) for source in digest_sources}
    total = sum(ingested.values())
    if total == 0 and counts.quarantined == 0:
        return digest_empty_summary
    parts = []
    if total:
        detail = "、".join(
            f"{digest_source_names[source]} {count}" for source, count in ingested.items() if count
        )
        parts.append(f"当日新增 {total} 条记忆（{detail}）")
    else:
        parts.append("当日无新记忆")
    if counts.quarantined:
        parts.append(f"另有 {counts.quarantined} 条敏感内容已隔离")
    return "，".join(parts)


def digest(day: datetime.date, counts: DigestCounts) -> Digest:
    """The ``/delivery/digest`` body for one day."""
    return Digest(date=day.isoformat(), summary=digest_summary(counts))


def insight_summary(title: str, body: Any) -> str:
    """Title plus the first ``insight_summary_body_characters`` characters of the body text."""
    text = " ".join(body_text(body).split())
    cut = text[:insight_summary_body_characters]
    if len(text) > insight_summary_body_characters:
        cut += "…"
    return f"{title}：{cut}" if cut else title


def _recent_ids(connection: apsw.Connection, scope: str, since: float) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT id FROM knowledge_items WHERE scope = ? AND status = 'ACTIVE' AND created_at >= ? "
        "ORDER BY created_at DESC, id LIMIT ?",
        (scope, since, insight_candidates_max),
    )]


async def insights(engine: Any, env: Any, *, limit: int = insights_limit_default,
                   scope: str = insights_scope_default) -> list[Insight]:
    """The insights stream (see the module docstring), best quality first; ties go to the
    newer item."""
    assert insights_limit_problem(limit) is None
    since = env.clock.wall() - insights_window_seconds

    def read(connection: apsw.Connection) -> list[Insight]:
        if manual_conflicts_pending(connection) > 0:
            return []
        ids = _recent_ids(connection, scope, since)
        views = knowledge_views(connection, ids)
        candidates = [
            views[knowledge_id]
            for knowledge_id in ids
            if knowledge_id in views and views[knowledge_id].evidence and not views[knowledge_id].sensitive
        ]
        candidates.sort(key=lambda view: (-view.quality, -view.created_at, view.knowledge_id))
        return [
            Insight(
                title=view.title,
                summary=insight_summary(view.title, view.body),
                knowledge_id=view.knowledge_id,
                score=round(view.quality, 4),
                kind=insight_kind_recent,
            )
            for view in candidates[:limit]
        ]

    return await engine.read(read)


__all__ = [
    "DigestCounts",
    "digest",
    "digest_empty_summary",
    "digest_source_names",
    "digest_sources",
    "digest_summary",
    "insight_candidates_max",
    "insight_kind_recent",
    "insight_summary",
    "insight_summary_body_characters",
    "insights",
    "insights_limit_problem",
    "insights_scope_default",
    "local_day_bounds",
    "local_today",
    "local_zone",
    "parse_digest_date",
    "utc_offset_seconds_max",
]
