"""The monitor actor ``("knowledge_monitor", "main")``: owns the configuration and the
directory watcher, and turns captured files into evidence.

Why one actor: the configuration and the running watcher are state that must change together
(a PUT persists, logs ``state_changed`` and swaps the watched directories at once, without a
restart), and captures must not race a reconfiguration.  The watcher runs as the actor's task
(``start_task``), which also keeps the actor active while it watches; it only ``tell``s the
actor ``FilesChanged`` batches, and the actor ingests them one turn at a time.

Ingest rules for a changed path (in order; each outcome is one log row and one
``capture_event``, except the silent ones):
- hidden files (a path component starting with ``.``) and editor leftovers are skipped
  silently;
- unreadable, vanished, non-regular, larger than ``monitor_file_bytes_max``, binary (a NUL byte
  or not UTF-8) → ``ignored``;
- content identical to what was last captured from that path → skipped silently (a touch or
  a metadata change is not a new memory);
- otherwise the text is written through the scope actor of the local user's scope
  (``WriteMemory``, source type ``MANUAL_CONFIG``, ``context.source = "directory"``) with an
  idempotency key derived from the path and the content hash, so a capture retried after a
  crash never makes a second evidence.  The scope actor's sensitivity check decides:
  sensitive → ``sensitive_quarantined`` (stored with its sensitivity, so agent contexts and
  insights never show it; the summary names the file only), else ``ingested``.  A refused
  write (the detector unavailable, ...) → ``ignored``.

Catch-up: when the watch starts (server start, a PUT, a restart after a failure) the task
first scans the watched directories once (at most ``catch_up_files_max`` files) and ingests,
by the same rules, every file whose size or modification time differs from what was last
seen (``knowledge_monitor_files``): files written while the server was down are captured
after the restart, exactly once (the content hash and the idempotency key still decide).
Ignored files are remembered too (with no hash), so a restart does not log them again.
Configured directories that do not exist are looked for again on a doubling backoff
(``missing_retry_seconds_min`` to ``missing_retry_seconds_max``); when one appears the watch
restarts, which catches it up.

Why ``MANUAL_CONFIG``: the evidence ``source_type`` enum is closed (OCR, TOOL_RESULT,
USER_BEHAVIOR, MANUAL_CONFIG, CONVERSATION; anything else is 400 for every writer), and
``directory`` is a value of the monitor's own log and ``capture_event`` ``source`` enum
(§3.20, §4.5), which is what the issue's "source ``directory``" and the digest's per-source
counts (§3.25) read.  Of the five evidence sources, a file the user chose to have captured by
a monitor they configured is manual configuration, not behaviour observed (USER_BEHAVIOR is
the ``behavior`` collector's) nor a tool's result (the contract forbids passing other sources
off as TOOL_RESULT); ``context.source = "directory"`` keeps the origin visible on the evidence.

Sources other than ``directory`` (clipboard, behaviour, screenshots) have no collector on
this platform (a headless server has no display or input session to observe): the
configuration keeps their switches, and ``source_status`` says so.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.knowledge._events_hub import publish_event
from troupe.actors.knowledge._protocol import KnowledgeRefused, WriteMemory, scope_kind_name
from troupe.actors.knowledge._scopes import local_user_scope
from troupe.runtime import Actor, ActorContext, ActorKind, Overloaded, TaskEnded, Unavailable

from ._config import MonitorConfig, decode_stored_config, monitor_sources
from ._log import (
    CaptureEvent,
    MonitorLogEntry,
    append_log,
    status_ignored,
    status_ingested,
    status_quarantined,
    status_state_changed,
)
from ._watcher import FileRead, Scan, directory_watcher_of

logger = logging.getLogger(__name__)

monitor_kind_name = "knowledge_monitor"
monitor_key = "main"
monitor_file_bytes_max = 256 * 1024
"""A captured file's size; larger ones are ``ignored`` (the evidence limit is 1 MiB of JSON,
and escapes can double a text)."""
monitor_paths_per_batch_max = 256
"""Paths one ``FilesChanged`` carries; the rest of a larger batch is told in further batches."""
monitor_mailbox_messages_max = 64
monitor_write_timeout_seconds = 60.0
watch_task_name = "directory_watch"
watch_restart_seconds = 5.0
"""After the watcher failed, how long until it is started again."""
catch_up_files_max = 10_000
"""Files one catch-up scan looks at (at watch start); a larger tree is caught up partly and
the rest is captured when it next changes."""
catch_up_batch_timeout_seconds = 600.0
"""One catch-up batch (``monitor_paths_per_batch_max`` files, each a write) end to end."""
missing_retry_seconds_min = 1.0
missing_retry_seconds_max = 60.0
"""A configured directory that does not exist is looked for again after the first delay,
doubling up to the second, until it appears (then the watch restarts and catches up)."""
missing_retry_timer = "retry_missing"
stat_query_paths_max = 500
"""Paths one catch-up ``IN (...)`` query compares (SQLite's variable limit is far above)."""
capture_scope = local_user_scope
capture_source_type = "MANUAL_CONFIG"
capture_key_prefix = "monitor:directory:"
unavailable_reason = "no collector for this source on this platform (a headless server has no display or input session)"
skipped_suffixes = ("~", ".swp", ".swx", ".tmp", ".part", ".crdownload")

assert monitor_file_bytes_max * 2 < 1_048_576
assert catch_up_files_max >= monitor_paths_per_batch_max
assert 0 < missing_retry_seconds_min <= missing_retry_seconds_max


# -- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GetMonitorConfig:
    """→ ``MonitorConfigView``."""


@dataclass(frozen=True)
class PutMonitorConfig:
    """A full replacement, already parsed.  → ``MonitorConfigView``."""

    config: MonitorConfig


@dataclass(frozen=True)
class FilesChanged:
    """Told by the watcher task (asked by tests).  → the log entries it made."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class EnsureMonitor:
    """Activates the actor (and so the watcher) at start-up.  → None."""


@dataclass(frozen=True)
class RestartWatch:
    """The watcher failed earlier; start it again.  → None."""


@dataclass(frozen=True)
class WatchStarted:
    """Told by the watcher task once it watches: ``missing`` directories are looked for again
    on a backoff."""

    missing: tuple[str, ...]


@dataclass(frozen=True)
class RetryMissing:
    """The missing-directory timer fired: look whether they exist now."""


@dataclass(frozen=True)
class MonitorConfigView:
    config: MonitorConfig
    source_status: dict[str, dict[str, Any]]

    def encode(self) -> dict[str, Any]:
        return {**self.config.encode(), "source_status": self.source_status}


# -- the actor --------------------------------------------------------------------------------


class MonitorActor(Actor):
    def __init__(self, context: ActorContext) -> None:
        super().__init__(context)
        self.config = MonitorConfig()
        self.watching: tuple[str, ...] = ()
        self.missing: tuple[str, ...] = ()
        self.watch_error: str | None = None
        self.missing_retry_seconds = missing_retry_seconds_min

    async def on_activate(self) -> None:
        def read(connection: apsw.Connection) -> str | None:
            row = connection.execute("SELECT config_json FROM knowledge_monitor_config WHERE id = 1").fetchone()
            return None if row is None else row[0]

        self.config = decode_stored_config(await self.context.storage.read(read))
        self._apply()

    async def receive(self, message: Any) -> Any:
        if isinstance(message, GetMonitorConfig):
            return self._view()
        if isinstance(message, PutMonitorConfig):
            return await self._put(message.config)
        if isinstance(message, FilesChanged):
            return await self._ingest_all(message.paths)
        if isinstance(message, EnsureMonitor):
            return None
        if isinstance(message, RestartWatch):
            self._apply(force=True)
            return None
        if isinstance(message, WatchStarted):
            self.missing = message.missing
            if message.missing:
                self.context.start_timer(missing_retry_timer, self.missing_retry_seconds, RetryMissing())
            return None
        if isinstance(message, RetryMissing):
            return await self._retry_missing()
        if isinstance(message, TaskEnded):
            if message.name == watch_task_name and message.error is not None:
                self.watch_error = type(message.error).__name__
                logger.warning("the directory watcher failed: %r", message.error)
                self.watching = ()
                self.context.start_timer("restart_watch", watch_restart_seconds, RestartWatch())
            return None
        raise TypeError(f"the monitor does not handle {type(message).__name__}")

    # -- configuration ----------------------------------------------------------------------

    async def _put(self, config: MonitorConfig) -> MonitorConfigView:
        now = self.context.env.clock.wall()
        entry = MonitorLogEntry(int(now), "system", status_state_changed, _change_summary(self.config, config))

        def job(connection: apsw.Connection) -> None:
            connection.execute(
                "INSERT INTO knowledge_monitor_config (id, config_json, updated_at) VALUES (1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET config_json = excluded.config_json, updated_at = excluded.updated_at",
                (config.to_json(), now))
            append_log(connection, entry)

        await self.context.storage.write(job)
        self.config = config
        publish_event(self.context.system, CaptureEvent(entry))
        self._apply()
        return self._view()

    def _apply(self, *, force: bool = False) -> None:
        """Make the running watcher match the configuration (no restart when it already does)."""
        wanted = self.config.watched_directories
        running = self.context.task_running(watch_task_name)
        if wanted == self.watching and (running or not wanted) and not force:
            return
        if running:
            self.context.cancel_task(watch_task_name)
        self.context.cancel_timer(missing_retry_timer)
        self.missing_retry_seconds = missing_retry_seconds_min
        self.watching, self.missing, self.watch_error = wanted, (), None
        if wanted:
            self.context.start_task(watch_task_name, self._watch)

    async def _watch(self) -> None:
        import trio

        watcher = directory_watcher_of(self.context.env)
        me = self.context.ref(monitor_kind_name, monitor_key)

        async def changed(paths: Sequence[str]) -> None:
            for start in range(0, len(paths), monitor_paths_per_batch_max):
                try:
                    me.tell(FilesChanged(tuple(paths[start:start + monitor_paths_per_batch_max])))
                except (Overloaded, Unavailable):
                    logger.warning("monitor mailbox full; %d changed paths dropped", len(paths))

        async with trio.open_nursery() as nursery:
            self.missing = tuple(await nursery.start(watcher.watch, self.watching, changed))
            me.tell(WatchStarted(self.missing))
            await self._catch_up(watcher, me)

    async def _catch_up(self, watcher: Any, me: Any) -> None:
        """Ingest what changed while nothing watched (the server was down, the directory was
        missing): one bounded scan, then only files whose size or modification time differ
        from what was last seen; the content hash still decides whether it is new."""
        present = [directory for directory in self.watching if directory not in self.missing]
        scan: Scan = await watcher.scan(present, catch_up_files_max) if present and hasattr(watcher, "scan") else Scan()
        seen = await self.context.storage.read(lambda connection: _seen_stats(connection, scan))
        changed = [file.path for file in scan.files if seen.get(file.path) != (file.size_bytes, file.mtime_ns)]
        self.context.trace("monitor_catch_up", files=len(scan.files), changed=len(changed), truncated=scan.truncated)
        if scan.truncated:
            logger.warning("monitor catch-up looked at the first %d files only", catch_up_files_max)
        for start in range(0, len(changed), monitor_paths_per_batch_max):
            await me.ask(FilesChanged(tuple(changed[start:start + monitor_paths_per_batch_max])),
                         timeout=catch_up_batch_timeout_seconds)

    async def _retry_missing(self) -> None:
        if not self.missing or not self.context.task_running(watch_task_name):
            return
        watcher = directory_watcher_of(self.context.env)
        found = await watcher.present(self.missing) if hasattr(watcher, "present") else ()
        if found:
            logger.info("monitor: %d configured directories appeared; watching them now", len(found))
            self._apply(force=True)
            return
        self.missing_retry_seconds = min(self.missing_retry_seconds * 2, missing_retry_seconds_max)
        self.context.start_timer(missing_retry_timer, self.missing_retry_seconds, RetryMissing())

    def _view(self) -> MonitorConfigView:
        status: dict[str, dict[str, Any]] = {}
        for source in monitor_sources:
            if source != "directory":
                status[source] = {"active": False, "reason": unavailable_reason}
                continue
            active = bool(self.watching) and self.context.task_running(watch_task_name)
            reason = None
            if not self.config.enabled:
                reason = "monitoring is switched off"
            elif not self.config.sources["directory"]:
                reason = "the directory source is switched off"
            elif not self.config.directories:
                reason = "no directories configured"
            elif self.watch_error is not None:
                reason = f"the watcher failed ({self.watch_error}); it restarts shortly"
            elif self.missing:
                reason = "not found: " + ", ".join(self.missing)
            status[source] = {"active": active, "reason": reason}
        return MonitorConfigView(self.config, status)

    # -- ingest -----------------------------------------------------------------------------

    async def _ingest_all(self, paths: Sequence[str]) -> list[MonitorLogEntry]:
        entries = []
        for path in paths[:monitor_paths_per_batch_max]:
            directory = self._directory_of(path)
            if directory is None or _skipped(path[len(directory):]):
                continue
            entry = await self._ingest(path)
            if entry is not None:
                entries.append(entry)
        return entries

    def _directory_of(self, path: str) -> str | None:
        """The watched directory ``path`` lies under, or None (a stale batch after a PUT)."""
        for directory in self.watching:
            if path.startswith(directory.rstrip("/") + "/"):
                return directory.rstrip("/")
        return None

    async def _ingest(self, path: str) -> MonitorLogEntry | None:
        name = posixpath.basename(path)
        read: FileRead = await directory_watcher_of(self.context.env).read_file(path, monitor_file_bytes_max)
        if read.problem == "missing":
            return None  # created and removed again before we looked: nothing to say
        seen = _Seen(path, "", read.size_bytes, read.mtime_ns)
        if read.content is None:
            reason = {"too_large": f"超过 {monitor_file_bytes_max // 1024} KB", "not_a_file": "不是普通文件"}.get(
                read.problem or "", "无法读取")
            return await self._log(MonitorLogEntry(self._now(), "directory", status_ignored,
                                                   f"忽略文件 {name}（{reason}）"),
                                   seen=seen if read.problem == "too_large" else None)
        text = _text_of(read.content)
        if text is None or not text.strip():
            reason = "不是文本" if text is None else "空文件"
            return await self._log(MonitorLogEntry(self._now(), "directory", status_ignored,
                                                   f"忽略文件 {name}（{reason}）"), seen=seen)
        digest = hashlib.sha256(read.content).hexdigest()
        seen = _Seen(path, digest, read.size_bytes, read.mtime_ns)
        before = await self._seen_before(path)
        if before is not None and before[0] == digest:
            if before[1:] != (seen.size_bytes, seen.mtime_ns):
                await self.context.storage.write(seen.record)  # a touch: remember the new time only
            return None
        return await self._capture(path, name, text, seen)

    async def _seen_before(self, path: str) -> tuple[str, int | None, int | None] | None:
        def read(connection: apsw.Connection) -> tuple[str, int | None, int | None] | None:
            row = connection.execute("SELECT content_sha256, size_bytes, mtime_ns FROM knowledge_monitor_files "
                                     "WHERE path = ?", (path,)).fetchone()
            return None if row is None else (row[0], row[1], row[2])

        return await self.context.storage.read(read)

    async def _capture(self, path: str, name: str, text: str, seen: _Seen) -> MonitorLogEntry:
        digest = seen.content_sha256
        path_hash = hashlib.sha256(os.fsencode(path)).hexdigest()[:24]
        write = WriteMemory(
            source_type=capture_source_type,
            raw={"title": posixpath.splitext(name)[0] or name, "file_name": name, "content": text},
            scope=capture_scope,
            context={"source": "directory", "trigger_event": "DIRECTORY_CAPTURE", "path": path,
                     "content_sha256": digest},
            idempotency_key=f"{capture_key_prefix}{path_hash}:{digest[:48]}")
        reply = await self.context.ref(scope_kind_name, capture_scope).ask(
            write, timeout=monitor_write_timeout_seconds)
        if isinstance(reply, KnowledgeRefused):
            return await self._log(MonitorLogEntry(self._now(), "directory", status_ignored,
                                                   f"忽略文件 {name}（未能写入：{reply.code}）"))
        if reply.sensitivity > 0:
            entry = MonitorLogEntry(self._now(), "directory", status_quarantined,
                                    f"隔离敏感文件 {name}（内容已脱敏，不显示）", evidence_id=reply.evidence_id)
        else:
            entry = MonitorLogEntry(self._now(), "directory", status_ingested, f"记住文件 {name}",
                                    evidence_id=reply.evidence_id)
        return await self._log(entry, seen=seen)

    async def _log(self, entry: MonitorLogEntry, *, seen: _Seen | None = None) -> MonitorLogEntry:
        now = self.context.env.clock.wall()

        def job(connection: apsw.Connection) -> None:
            append_log(connection, entry)
            if seen is not None:
                seen.record(connection, evidence_id=entry.evidence_id, now=now)

        await self.context.storage.write(job)
        self.context.trace("monitor_capture", status=entry.status)
        publish_event(self.context.system, CaptureEvent(entry))
        return entry

    def _now(self) -> int:
        return int(self.context.env.clock.wall())


@dataclass(frozen=True)
class _Seen:
    """What the monitor remembers of a file it has read: its content hash (empty when nothing
    was captured: an ignored file), size and modification time."""

    path: str
    content_sha256: str
    size_bytes: int | None
    mtime_ns: int | None

    def record(self, connection: apsw.Connection, *, evidence_id: str | None = None, now: float = 0.0) -> None:
        """Upsert; a touch (no ``evidence_id``) keeps the row's evidence and capture time."""
        connection.execute(
            "INSERT INTO knowledge_monitor_files (path, content_sha256, evidence_id, captured_at, size_bytes, mtime_ns) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE SET content_sha256 = excluded.content_sha256, "
            "evidence_id = coalesce(excluded.evidence_id, evidence_id), "
            "captured_at = CASE WHEN excluded.evidence_id IS NULL THEN captured_at ELSE excluded.captured_at END, "
            "size_bytes = excluded.size_bytes, mtime_ns = excluded.mtime_ns",
            (self.path, self.content_sha256, evidence_id, now, self.size_bytes, self.mtime_ns))


def _seen_stats(connection: apsw.Connection, scan: Scan) -> dict[str, tuple[int | None, int | None]]:
    paths = [file.path for file in scan.files]
    seen: dict[str, tuple[int | None, int | None]] = {}
    for start in range(0, len(paths), stat_query_paths_max):
        chunk = paths[start:start + stat_query_paths_max]
        marks = ",".join("?" * len(chunk))
        for path, size_bytes, mtime_ns in connection.execute(
                f"SELECT path, size_bytes, mtime_ns FROM knowledge_monitor_files WHERE path IN ({marks})", chunk):
            seen[path] = (size_bytes, mtime_ns)
    return seen


def _skipped(relative_path: str) -> bool:
    """Hidden files and directories (below the watched directory) and editor leftovers."""
    parts = relative_path.split("/")
    return any(part.startswith(".") for part in parts if part) or relative_path.endswith(skipped_suffixes)


def _text_of(content: bytes) -> str | None:
    """The content as text, or None when it looks binary."""
    if b"\x00" in content:
        return None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text


def _change_summary(old: MonitorConfig, new: MonitorConfig) -> str:
    """A user-readable line about what the PUT changed (no paths: they may be private)."""
    if old.enabled != new.enabled:
        head = "监控已开启" if new.enabled else "监控已关闭"
    else:
        head = "监控配置已更新"
    on = [name for name in monitor_sources if new.sources[name]]
    return f"{head}（数据源：{'、'.join(on) if on else '无'}；目录 {len(new.directories)} 个）"


def monitor_actor_kind() -> ActorKind:
    return ActorKind(monitor_kind_name, MonitorActor, mailbox_messages_max=monitor_mailbox_messages_max)


__all__ = [
    "EnsureMonitor",
    "FilesChanged",
    "GetMonitorConfig",
    "MonitorActor",
    "MonitorConfigView",
    "PutMonitorConfig",
    "RestartWatch",
    "RetryMissing",
    "WatchStarted",
    "capture_key_prefix",
    "capture_scope",
    "capture_source_type",
    "catch_up_batch_timeout_seconds",
    "catch_up_files_max",
    "missing_retry_seconds_max",
    "missing_retry_seconds_min",
    "monitor_actor_kind",
    "monitor_file_bytes_max",
    "monitor_key",
    "monitor_kind_name",
    "monitor_mailbox_messages_max",
    "monitor_paths_per_batch_max",
    "monitor_write_timeout_seconds",
    "unavailable_reason",
    "watch_restart_seconds",
    "watch_task_name",
]
