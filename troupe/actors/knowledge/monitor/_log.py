"""The monitor's activity log (§3.20), its ``capture_event`` (§4.5) and the digest's counts.

Why the log is a table and the event a copy of its row: ``/monitor/log`` must survive a restart
and ``/delivery/digest`` counts a past day, while the WebSocket event is a notification that a
client may miss; both carry the same fields, so the UI can append an event to the list it read.

The log is bounded (``monitor_log_rows_max``): each append drops what falls beyond the newest
rows, so a directory full of churning files cannot grow the database without end.  Summaries
are written by the server and never hold a file's content; a quarantined file's summary
names only the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.knowledge._delivery import DigestCounts

log_sources: tuple[str, ...] = ("directory", "clipboard", "behavior", "screenshot", "system")
log_statuses: tuple[str, ...] = ("ingested", "sensitive_quarantined", "ignored", "state_changed")
status_ingested, status_quarantined, status_ignored, status_state_changed = log_statuses
monitor_log_limit_default = 100
monitor_log_limit_min = 1
monitor_log_limit_max = 500
monitor_log_offset_max = 1_000_000
"""Beyond the log's size anyway; keeps ``OFFSET`` a small integer."""
monitor_log_rows_max = 100_000
"""Rows kept; older ones are dropped as new ones arrive."""
log_summary_characters_max = 200

assert monitor_log_limit_min <= monitor_log_limit_default <= monitor_log_limit_max
assert monitor_log_limit_max < monitor_log_rows_max


@dataclass(frozen=True)
class MonitorLogEntry:
    ts: int
    source: str
    status: str
    summary: str
    evidence_id: str | None = None
    knowledge_id: str | None = None

    def __post_init__(self) -> None:
        assert self.source in log_sources, self.source
        assert self.status in log_statuses, self.status

    def encode(self) -> dict[str, Any]:
        return {"ts": self.ts, "source": self.source, "status": self.status, "summary": self.summary,
                "evidence_id": self.evidence_id, "knowledge_id": self.knowledge_id}


@dataclass(frozen=True)
class CaptureEvent:
    """``capture_event`` for the ``/events`` hub: the log entry as its data."""

    entry: MonitorLogEntry

    def encode(self) -> dict[str, Any]:
        return {"event": "capture_event", "data": self.entry.encode()}


@dataclass(frozen=True)
class MonitorLog:
    """``GET /monitor/log``'s body."""

    events: tuple[MonitorLogEntry, ...]

    def encode(self) -> dict[str, Any]:
        return {"events": [entry.encode() for entry in self.events]}


def bounded_summary(text: str) -> str:
    return text if len(text) <= log_summary_characters_max else text[:log_summary_characters_max - 1] + "…"


def append_log(connection: apsw.Connection, entry: MonitorLogEntry, *,
               rows_max: int = monitor_log_rows_max) -> None:
    """Append ``entry`` and drop what falls beyond the newest ``rows_max`` rows."""
    connection.execute(
        "INSERT INTO knowledge_monitor_log (ts, source, status, summary, evidence_id, knowledge_id) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (entry.ts, entry.source, entry.status, bounded_summary(entry.summary), entry.evidence_id,
         entry.knowledge_id))
    newest = connection.last_insert_rowid()
    if newest > rows_max:
        connection.execute("DELETE FROM knowledge_monitor_log WHERE seq <= ?", (newest - rows_max,))


def list_log(connection: apsw.Connection, *, limit: int = monitor_log_limit_default,
             offset: int = 0) -> MonitorLog:
    """Newest first.  An entry whose evidence was structured since is shown with its
    knowledge id (read through the evidence row, so a forgotten item disappears from it)."""
    assert monitor_log_limit_min <= limit <= monitor_log_limit_max and 0 <= offset
    rows = connection.execute(
        "SELECT l.ts, l.source, l.status, l.summary, l.evidence_id, "
        "COALESCE(l.knowledge_id, e.knowledge_id, "
        "  (SELECT k.knowledge_id FROM knowledge_links k WHERE k.evidence_id = l.evidence_id LIMIT 1)) "
        "FROM knowledge_monitor_log l LEFT JOIN knowledge_evidence e ON e.id = l.evidence_id "
        "ORDER BY l.seq DESC LIMIT ? OFFSET ?", (limit, offset)).fetchall()
    return MonitorLog(tuple(MonitorLogEntry(int(ts), source, status, summary, evidence_id, knowledge_id)
                            for ts, source, status, summary, evidence_id, knowledge_id in rows))


def day_counts(connection: apsw.Connection, start: float, end: float) -> DigestCounts:
    """The digest's counts for ``[start, end)``: ``ingested`` per source, quarantined apart."""
    ingested: dict[str, int] = {}
    quarantined = 0
    for source, status, count in connection.execute(
            "SELECT source, status, COUNT(*) FROM knowledge_monitor_log WHERE ts >= ? AND ts < ? "
            "AND status IN (?, ?) GROUP BY source, status", (start, end, status_ingested, status_quarantined)):
        if status == status_ingested:
            ingested[source] = count
        else:
            quarantined += count
    return DigestCounts(ingested=ingested, quarantined=quarantined)


def monitor_log_limit_problem(value: Mapping[str, str]) -> str | None:
    """Why the query's ``limit``/``offset`` are the caller's error, or None."""
    for name, low, high in (("limit", monitor_log_limit_min, monitor_log_limit_max),
                            ("offset", 0, monitor_log_offset_max)):
        text = value.get(name)
        if text is None:
            continue
        if not text.isascii() or not text.isdigit() or len(text) > 7 or not low <= int(text) <= high:
            return f"field '{name}' must be an integer from {low} to {high}"
    return None


__all__ = [
    "CaptureEvent",
    "MonitorLog",
    "MonitorLogEntry",
    "append_log",
    "bounded_summary",
    "day_counts",
    "list_log",
    "log_sources",
    "log_statuses",
    "log_summary_characters_max",
    "monitor_log_limit_default",
    "monitor_log_limit_max",
    "monitor_log_limit_min",
    "monitor_log_limit_problem",
    "monitor_log_offset_max",
    "monitor_log_rows_max",
    "status_ignored",
    "status_ingested",
    "status_quarantined",
    "status_state_changed",
]
