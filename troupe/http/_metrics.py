"""Prometheus text exposition (format 0.0.4) of the runtime's and storage's statistics.

Why hand-written rather than ``prometheus_client``: the numbers already live in
``ActorSystem.statistics()`` and ``Engine.statistics()``; rendering them on each scrape is a
few dozen lines, keeps a dependency (and its global registry) out of the server, and means
the counters have exactly one owner.  Trade-off: no process metrics (CPU, RSS, open fds);
node-level exporters cover those.

``actors_document`` gives the same figures as a JSON-able dict for ``GET /actors``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from troupe.runtime import KindStatistics, turn_latency_buckets_seconds

from ._exceptions import MetricsError

content_type = "text/plain; version=0.0.4; charset=utf-8"

_name_pattern = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    """Builds the text: one ``family`` call per metric, then ``sample`` lines for it."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._families: set[str] = set()

    def family(self, name: str, metric_type: str, help_text: str) -> None:
        if not _name_pattern.fullmatch(name) or name in self._families:
            raise MetricsError(f"bad or duplicate metric family {name!r}")
        assert metric_type in ("counter", "gauge", "histogram", "summary", "untyped")
        self._families.add(name)
        escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self._lines.append(f"# HELP {name} {escaped}")
        self._lines.append(f"# TYPE {name} {metric_type}")

    def sample(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        if not _name_pattern.fullmatch(name):
            raise MetricsError(f"bad metric name {name!r}")
        if labels:
            rendered = ",".join(f'{key}="{_escape_label(str(text))}"' for key, text in labels.items())
            self._lines.append(f"{name}{{{rendered}}} {_format_value(value)}")
        else:
            self._lines.append(f"{name} {_format_value(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


_per_kind: tuple[tuple[str, str, str, str], ...] = (
    # (metric, type, KindStatistics field, help)
    ("troupe_actors_live", "gauge", "live", "Live (activated) actors per kind."),
    ("troupe_mailbox_depth", "gauge", "mailbox_depth", "Messages queued in live actors' mailboxes per kind."),
    ("troupe_actor_activations_total", "counter", "activations", "Actor activations per kind."),
    ("troupe_actor_passivations_total", "counter", "passivations", "Actor passivations per kind."),
    ("troupe_actor_turns_total", "counter", "turns", "Completed turns per kind."),
    ("troupe_actor_crashes_total", "counter", "crashes", "Turns that crashed per kind."),
    ("troupe_actor_restarts_total", "counter", "restarts", "Actor restarts after a crash per kind."),
    ("troupe_actor_escalations_total", "counter", "escalations", "Actors that exceeded their restart intensity per kind."),
    ("troupe_actor_poison_total", "counter", "poison", "Messages quarantined as poison per kind."),
    ("troupe_actor_overloaded_total", "counter", "overloaded", "Messages refused because a mailbox was full, per kind."),
    ("troupe_kind_available", "gauge", "available", "1 while the kind accepts messages, 0 while its supervisor recovers."),
)


def render_metrics(
    kinds: Mapping[str, KindStatistics],
    *,
    supervisor_restarts: int,
    supervisor_escalations: int,
    storage: Any | None,
) -> str:
    """The exposition text.  ``storage`` is an ``EngineStatistics`` (None before it opens)."""
    exposition = Exposition()
    for metric, metric_type, field_name, help_text in _per_kind:
        exposition.family(metric, metric_type, help_text)
        for kind, statistics in kinds.items():
            exposition.sample(metric, getattr(statistics, field_name), {"kind": kind})
    _render_turn_histogram(exposition, kinds)
    exposition.family("troupe_supervisor_restarts_total", "counter", "Children restarted by the root supervisor.")
    exposition.sample("troupe_supervisor_restarts_total", supervisor_restarts)
    exposition.family("troupe_supervisor_escalations_total", "counter", "Children the root supervisor gave up on (kind marked unavailable).")
    exposition.sample("troupe_supervisor_escalations_total", supervisor_escalations)
    if storage is not None:
        _render_storage(exposition, storage)
    return exposition.text()


def _render_turn_histogram(exposition: Exposition, kinds: Mapping[str, KindStatistics]) -> None:
    name = "troupe_actor_turn_seconds"
    exposition.family(name, "histogram", "Turn latency per kind (successful turns).")
    for kind, statistics in kinds.items():
        counts = statistics.turn_latency_counts
        assert len(counts) == len(turn_latency_buckets_seconds) + 1
        cumulative = 0
        for bound, count in zip(turn_latency_buckets_seconds, counts, strict=False):
            cumulative += count
            exposition.sample(f"{name}_bucket", cumulative, {"kind": kind, "le": _format_value(float(bound))})
        cumulative += counts[-1]
        exposition.sample(f"{name}_bucket", cumulative, {"kind": kind, "le": "+Inf"})
        exposition.sample(f"{name}_sum", float(statistics.turn_seconds_total), {"kind": kind})
        exposition.sample(f"{name}_count", cumulative, {"kind": kind})


def _render_storage(exposition: Exposition, storage: Any) -> None:
    exposition.family("troupe_storage_commits_total", "counter", "Group commits (write transactions) since the engine opened.")
    exposition.sample("troupe_storage_commits_total", storage.commits)
    exposition.family("troupe_storage_write_jobs_total", "counter", "Write jobs committed or failed since the engine opened.")
    exposition.sample("troupe_storage_write_jobs_total", storage.jobs)
    exposition.family("troupe_storage_commit_seconds", "summary", "Time of whole group-commit batches (begin, jobs, commit).")
    exposition.sample("troupe_storage_commit_seconds_sum", float(storage.commit_seconds_total))
    exposition.sample("troupe_storage_commit_seconds_count", storage.commits)
    exposition.family("troupe_storage_commit_seconds_last", "gauge", "Duration of the latest group commit.")
    exposition.sample("troupe_storage_commit_seconds_last", float(storage.commit_seconds_last))
    exposition.family("troupe_storage_commit_seconds_max", "gauge", "Longest group commit since the engine opened.")
    exposition.sample("troupe_storage_commit_seconds_max", float(storage.commit_seconds_max))
    exposition.family("troupe_storage_write_queue_depth", "gauge", "Write jobs waiting for the writer.")
    exposition.sample("troupe_storage_write_queue_depth", storage.write_queue_depth)
    exposition.family("troupe_storage_faults_total", "counter", "Disk I/O errors the engine has seen.")
    exposition.sample("troupe_storage_faults_total", storage.faults_seen)


def actors_document(
    kinds: Mapping[str, KindStatistics],
    *,
    supervisor_restarts: int,
    supervisor_escalations: int,
    storage: Any | None,
) -> dict[str, Any]:
    """The figures of ``render_metrics`` as a JSON-able dict."""
    document_kinds = {}
    for kind, statistics in kinds.items():
        figures = asdict(statistics)
        figures["turn_latency"] = {
            "buckets_seconds": list(turn_latency_buckets_seconds),
            "counts": figures.pop("turn_latency_counts"),
        }
        document_kinds[kind] = figures
    return {
        "kinds": document_kinds,
        "supervisor": {"restarts": supervisor_restarts, "escalations": supervisor_escalations},
        "storage": asdict(storage) if storage is not None else None,
    }


__all__ = ["Exposition", "actors_document", "content_type", "render_metrics"]
