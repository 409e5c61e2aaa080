"""The directory watcher port: how the monitor learns that files changed and reads them.

Why a port: the watcher is real I/O (inotify and the user's files), which the simulator must
replace to stay deterministic.  The monitor reaches it through ``directory_watcher_of(env)``:
``env.extras["directory_watcher"]`` when the Env provides one (the simulator, tests), else the
production ``WatchfilesWatcher``.

Production uses ``watchfiles`` (the Rust ``notify`` crate: inotify on Linux) through its
anyio API, which runs its blocking wait in a worker thread and works under trio.  Trade-offs:
changes arrive debounced (``watch_debounce_milliseconds``) in batches; a stop event ends the
wait within ``watch_step_milliseconds`` and the worker thread wakes every
``watch_wait_milliseconds`` so that a cancellation is delivered promptly; directories that do
not exist when the watch starts are left out (``WatchStarted.missing``) rather than failing
the whole watch.  File reads run in a worker thread and never read more than the caller's
limit plus one byte (to tell "too large" from "exactly at the limit").

``scan`` walks the watched directories once (bounded by the caller's file count) so the
monitor can catch up on what changed while the server was down; ``present`` tells which of
the configured directories exist now (a directory created after it was configured is picked
up on the monitor's retry).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

directory_watcher_extra = "directory_watcher"
watch_debounce_milliseconds = 300
watch_step_milliseconds = 50
watch_wait_milliseconds = 500


@dataclass(frozen=True)
class FileRead:
    """A read's outcome: ``content`` (at most the limit), or why there is none."""

    content: bytes | None = None
    problem: str | None = None
    """``missing`` | ``unreadable`` | ``too_large`` | ``not_a_file``."""
    size_bytes: int | None = None
    mtime_ns: int | None = None
    """The file's size and modification time when it was read (catch-up compares them)."""


@dataclass(frozen=True)
class ScannedFile:
    path: str
    size_bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class Scan:
    """What one catch-up walk found: regular files (at most the caller's limit, hidden ones
    left out) and whether the walk stopped at that limit."""

    files: tuple[ScannedFile, ...] = ()
    truncated: bool = False


Changed = Callable[[Sequence[str]], Awaitable[None]]


class DirectoryWatcher(Protocol):
    async def watch(self, directories: Sequence[str], changed: Changed, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Watch ``directories`` (recursively) until cancelled; call ``changed`` with each batch
        of paths created or modified.  ``task_status.started(missing)`` once watching, with
        the directories that could not be watched."""

    async def read_file(self, path: str, bytes_max: int) -> FileRead: ...

    async def scan(self, directories: Sequence[str], files_max: int) -> Scan:
        """The regular files under ``directories`` now (recursively, hidden ones skipped), at
        most ``files_max``."""

    async def present(self, directories: Sequence[str]) -> tuple[str, ...]:
        """Those of ``directories`` that exist now."""


def _read_bounded(path: str, bytes_max: int) -> FileRead:
    try:
        if not os.path.isfile(path):
            return FileRead(problem="missing" if not os.path.exists(path) else "not_a_file")
        with open(path, "rb") as handle:
            status = os.fstat(handle.fileno())
            content = handle.read(bytes_max + 1)
    except FileNotFoundError:
        return FileRead(problem="missing")
    except OSError:
        return FileRead(problem="unreadable")
    if len(content) > bytes_max:
        return FileRead(problem="too_large", size_bytes=status.st_size, mtime_ns=status.st_mtime_ns)
    return FileRead(content=content, size_bytes=status.st_size, mtime_ns=status.st_mtime_ns)


def _scan(directories: Sequence[str], files_max: int) -> Scan:
    """Walk ``directories`` (sorted, so the same tree gives the same list), hidden entries
    skipped; unreadable directories are left out, as the watcher leaves them out."""
    files: list[ScannedFile] = []
    for directory in directories:
        for root, subdirectories, names in os.walk(directory, onerror=lambda error: None):
            subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
            for name in sorted(names):
                if name.startswith("."):
                    continue
                path = os.path.join(root, name)
                try:
                    status = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(status.st_mode):
                    continue
                if len(files) >= files_max:
                    return Scan(tuple(files), truncated=True)
                files.append(ScannedFile(path, status.st_size, status.st_mtime_ns))
    return Scan(tuple(files))


class WatchfilesWatcher:
    """The production watcher (see the module docstring)."""

    async def watch(self, directories: Sequence[str], changed: Changed, *,
                    task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        import anyio
        from watchfiles import Change, awatch

        present = [directory for directory in directories if os.path.isdir(directory)]
        missing = tuple(directory for directory in directories if directory not in present)
        if not present:
            task_status.started(missing)
            await trio.sleep_forever()
        stop = anyio.Event()
        try:
            watching = awatch(*present, stop_event=stop, debounce=watch_debounce_milliseconds,
                              step=watch_step_milliseconds, rust_timeout=watch_wait_milliseconds,
                              ignore_permission_denied=True)
            async def pump() -> None:
                async for batch in watching:
                    paths = sorted({path for change, path in batch if change != Change.deleted})
                    if paths:
                        await changed(paths)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump)
                # The generator registers its inotify watches synchronously on its first step;
                # one short sleep lets ``pump`` take that step before we report "watching".
                await trio.sleep(watch_step_milliseconds / 1000)
                task_status.started(missing)
        finally:
            stop.set()

    async def read_file(self, path: str, bytes_max: int) -> FileRead:
        return await trio.to_thread.run_sync(_read_bounded, path, bytes_max)

    async def scan(self, directories: Sequence[str], files_max: int) -> Scan:
        return await trio.to_thread.run_sync(_scan, tuple(directories), files_max)

    async def present(self, directories: Sequence[str]) -> tuple[str, ...]:
        return await trio.to_thread.run_sync(
            lambda: tuple(directory for directory in directories if os.path.isdir(directory)))


def directory_watcher_of(env: Any) -> DirectoryWatcher:
    watcher = getattr(env, "extras", {}).get(directory_watcher_extra)
    return watcher if watcher is not None else WatchfilesWatcher()


__all__ = [
    "Changed",
    "DirectoryWatcher",
    "FileRead",
    "Scan",
    "ScannedFile",
    "WatchfilesWatcher",
    "directory_watcher_extra",
    "directory_watcher_of",
    "watch_debounce_milliseconds",
    "watch_step_milliseconds",
    "watch_wait_milliseconds",
]
