"""A fault-injecting SQLite VFS for the simulator: I/O errors, disk full, process death at any
I/O, and power loss that drops, keeps part of, or tears what was never synced.  All seeded.

Why: "no acknowledged write is lost" is only a claim until the disk misbehaves under test.
``FaultyVFS`` inherits SQLite's default VFS and lets every file consult a ``FaultPlan`` before
xWrite, xSync and xTruncate (and xRead when asked).  An injected fault raises the apsw
exception SQLite maps to the real error code (``apsw.IOError`` → SQLITE_IOERR,
``apsw.FullError`` → SQLITE_FULL), so SQLite runs its genuine error paths.

Process death (``FaultPlan.crash_after``): the plan counts the I/O operations of every file
(writes, syncs, truncates) plus the job boundaries the engine reports between the jobs of a
batch; when the N-th one comes it calls the simulator's crash instead of performing it, and
from then on every read, write, sync and truncate of that plan fails with ``apsw.IOError``:
the process is gone and nothing more reaches the disk.  ``revive()`` is the next process.

Power loss (``FaultyVFS.power_loss``): writes go through to the real file (the operating
system's page cache, which survives a process crash), and the VFS keeps, per file path, an
undo log of the pre-images of every region written or truncated away since that file's last
xSync; xSync empties the file's log.  A power loss, once every connection is closed, rewinds
each file: it drops every un-synced operation, keeps a random prefix of them (in the order
they were written), or keeps a prefix and tears the next write (its first sectors new, the
rest old), and forgets the logs.

What the model does not cover, honestly:
- Directory entries are always durable: a file created since the last sync survives (empty if
  none of its writes were synced) and a deleted file stays deleted.  SQLite syncs directories
  itself where it needs to, so this only hides bugs of SQLite's, not of troupe's.
- Within one file, un-synced writes survive in write order (a prefix); a disk that reorders
  writes inside a file between syncs is not modelled.  Files are rewound independently of
  each other, so cross-file reordering is.
- Tearing is at 512-byte sector granularity (power-safe overwrite, which SQLite assumes of
  the unix VFS); a write of one sector or less is atomic.
- The ``-shm`` wal-index is not written through xWrite (SQLite maps it), so it is never
  rewound; that is what SQLite expects, since the first connection to open a database
  rebuilds the wal-index from the WAL.  ``power_loss`` must run only after every connection
  is closed, which also is what makes SQLite treat the next connection as the first.
- Temporary files (opened without a name) are not tracked: they do not outlive a process.

The plan draws from a random source passed in (anything with ``.random()``), never from the
``random`` module, so the same seed and the same inline executor give the same faults at the
same places.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import apsw

sector_bytes = 512
power_loss_modes = ("drop", "prefix", "torn")
"""``drop``: every un-synced operation is lost; ``prefix``: a random prefix of them survives;
``torn``: a random prefix survives and the write after it is torn at a sector boundary."""

# The VFS each registered FaultyVFS answers for, so the engine can report job boundaries to
# the plan of the VFS its env names (production names no faulty VFS and pays a dict miss).
_plans_by_vfs_name: dict[str, FaultPlan] = {}


class UniformSource(Protocol):
    def random(self) -> float: ...


def _below(source: UniformSource, stop: int) -> int:
    """A number in ``0..stop-1`` from ``source.random()`` alone (the narrowest protocol)."""
    assert stop >= 1
    return min(int(source.random() * stop), stop - 1)


@dataclass
class FaultPlan:
    """Which faults to inject, how often, and how many were injected.

    ``disk_full_probability`` applies to writes and truncates; ``io_error_probability`` to
    writes, syncs, truncates, and reads when ``read_faults`` is set.  Nothing is drawn from the
    random source while ``enabled`` is false, so toggling the plan keeps runs reproducible.
    ``io_operations`` counts every write, sync, truncate and engine job boundary consulted,
    enabled or not: it is the clock ``crash_after`` counts on.
    """

    random: UniformSource
    io_error_probability: float = 0.0
    disk_full_probability: float = 0.0
    read_faults: bool = False
    enabled: bool = True
    io_errors_injected: int = 0
    disk_full_injected: int = 0
    io_operations: int = 0
    crashed: bool = False
    crashes_injected: int = 0
    crash_operation: str = ""
    observer: Callable[[str, str], None] | None = None
    """Told ``(fault, operation)`` before an injected fault is raised: the simulator records
    each one in its trace, so a violation can be matched to the fault that caused it."""
    _crash_at_operation: int | None = field(default=None, init=False, repr=False)
    _on_crash: Callable[[], None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        total = self.io_error_probability + self.disk_full_probability
        if not (0.0 <= self.io_error_probability and 0.0 <= self.disk_full_probability):
            raise ValueError("fault probabilities must not be negative")
        if total > 1.0:
            raise ValueError("fault probabilities must sum to at most 1")

    def crash_after(self, operations: int, on_crash: Callable[[], None]) -> None:
        """Die at the ``operations``-th operation from now (1 = the very next one).

        That operation does not happen: ``on_crash()`` is called in its place (from whatever
        thread runs the I/O), and it and every later I/O of this plan raise ``apsw.IOError``
        until ``revive()``.  Replaces a crash armed earlier.
        """
        if operations < 1:
            raise ValueError("crash_after needs operations >= 1")
        self._crash_at_operation = self.io_operations + operations
        self._on_crash = on_crash

    def revive(self) -> None:
        """A new process: I/O works again, and no crash is armed any more."""
        self.crashed = False
        self._crash_at_operation = None
        self._on_crash = None

    def consult(self, operation: str, may_be_full: bool) -> None:
        """Count one write, sync or truncate; die or raise the fault chosen for it, if any."""
        self._check_alive(operation)
        self._count(operation)
        if self.crashed:
            raise apsw.IOError(f"the process crashed before {operation}")
        if not self.enabled:
            return
        source = self.random  # the injected seeded source, never the global random module
        draw = source.random()
        full_threshold = self.disk_full_probability if may_be_full else 0.0
        if draw < full_threshold:
            self.disk_full_injected += 1
            self._observe("disk_full", operation)
            raise apsw.FullError(f"injected disk full on {operation}")
        if draw < full_threshold + self.io_error_probability:
            self.io_errors_injected += 1
            self._observe("io_error", operation)
            raise apsw.IOError(f"injected I/O error on {operation}")

    def consult_read(self) -> None:
        """Reads fail after a crash, and draw a fault only when ``read_faults`` is set."""
        self._check_alive("read")
        if self.read_faults:
            self.consult_without_counting("read")

    def consult_without_counting(self, operation: str) -> None:
        if not self.enabled:
            return
        source = self.random
        if source.random() < self.io_error_probability:
            self.io_errors_injected += 1
            self._observe("io_error", operation)
            raise apsw.IOError(f"injected I/O error on {operation}")

    def _observe(self, fault: str, operation: str) -> None:
        if self.observer is not None:
            self.observer(fault, operation)

    def job_boundary(self) -> None:
        """The engine is between two jobs of a batch: counts as an operation, so a crash can
        land there.  Never raises; the engine sees its own ``crash()`` was called."""
        if not self.crashed:
            self._count("job boundary")

    def _check_alive(self, operation: str) -> None:
        if self.crashed:
            raise apsw.IOError(f"the process crashed; no {operation} reaches the disk")

    def _count(self, operation: str) -> None:
        self.io_operations += 1
        if self._crash_at_operation is None or self.io_operations < self._crash_at_operation:
            return
        on_crash = self._on_crash
        self._crash_at_operation = None
        self._on_crash = None
        self.crashed = True
        self.crashes_injected += 1
        self.crash_operation = operation
        assert on_crash is not None
        on_crash()


def fault_plan_for(vfs_name: str | None) -> FaultPlan | None:
    """The plan of the registered ``FaultyVFS`` called ``vfs_name``, if there is one."""
    if vfs_name is None:
        return None
    return _plans_by_vfs_name.get(vfs_name)


@dataclass
class _Undo:
    """How to put back the bytes one operation changed: write ``before`` at ``offset``, then
    cut the file to ``size_before``."""

    offset: int
    before: bytes
    size_before: int
    written: bytes


class _VolatileFile:
    """The un-synced operations of one file path, oldest first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.operations: list[_Undo] = []
        self._descriptor: int | None = None

    def _pread(self, length: int, offset: int) -> tuple[bytes, int]:
        """The bytes at ``offset`` (short at the end of the file) and the file's size."""
        if self._descriptor is None:
            try:
                self._descriptor = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return b"", 0
        size = os.fstat(self._descriptor).st_size
        return (os.pread(self._descriptor, length, offset) if length else b""), size

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def before_write(self, data: bytes, offset: int) -> None:
        before, size = self._pread(len(data), offset)
        self.operations.append(_Undo(offset, before, size, bytes(data)))

    def before_truncate(self, new_size: int) -> None:
        _, size = self._pread(0, 0)
        before, _ = self._pread(max(size - new_size, 0), new_size)
        self.operations.append(_Undo(new_size, before, size, b""))

    def synced(self) -> None:
        self.operations.clear()

    def rewind(self, keep: int, tear_next: bool, source: UniformSource) -> int:
        """Undo every operation after the first ``keep``; with ``tear_next`` the first undone
        one, if it is a write of more than a sector, is left half done.  Returns 1 if a page
        was torn."""
        if keep >= len(self.operations):
            return 0
        try:
            descriptor = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return 0
        try:
            for undo in reversed(self.operations[keep:]):
                os.pwrite(descriptor, undo.before, undo.offset)
                os.ftruncate(descriptor, undo.size_before)
            torn = self.operations[keep]
            sectors = -(-len(torn.written) // sector_bytes)
            if not tear_next or sectors < 2:
                return 0
            # The disk got the first sectors of the write and not the rest.
            cut = sector_bytes * (1 + _below(source, sectors - 1))
            os.pwrite(descriptor, torn.written[:cut], torn.offset)
            return 1
        finally:
            os.close(descriptor)


class FaultyVFSFile(apsw.VFSFile):
    """A file of the default VFS that asks the plan before touching the disk and records what
    it overwrites until the next sync."""

    def __init__(self, base_vfs: str, filename: Any, flags: list[int], plan: FaultPlan,
                 volatile: _VolatileFile | None = None, real_sync: bool = False) -> None:
        super().__init__(base_vfs, filename, flags)
        self._plan = plan
        self._volatile = volatile
        self._real_sync = real_sync or volatile is None

    def xWrite(self, data: bytes, offset: int) -> None:  # noqa: N802 - apsw's method name
        self._plan.consult("write", may_be_full=True)
        if self._volatile is not None:
            self._volatile.before_write(data, offset)
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:  # noqa: N802
        self._plan.consult("sync", may_be_full=False)
        if self._real_sync:
            super().xSync(flags)
        if self._volatile is not None:
            self._volatile.synced()

    def xTruncate(self, newsize: int) -> None:  # noqa: N802
        self._plan.consult("truncate", may_be_full=True)
        if self._volatile is not None:
            self._volatile.before_truncate(newsize)
        super().xTruncate(newsize)

    def xRead(self, amount: int, offset: int) -> bytes:  # noqa: N802
        self._plan.consult_read()
        return super().xRead(amount, offset)


class FaultyVFS(apsw.VFS):
    """Registers under ``name`` (unique per simulator run); call ``unregister()`` when done.

    Use as a context manager to unregister automatically.  Connections must be closed before
    unregistering.  With ``real_sync`` false (the default) xSync only marks the file synced in
    the model and skips the real fsync: the simulator's files are scratch, durability is what
    ``power_loss`` models, and an fsync per commit would only slow the runs down.
    """

    def __init__(self, name: str, plan: FaultPlan, base: str = "", *,
                 real_sync: bool = False) -> None:
        self.name = name
        self.plan = plan
        self._base = base
        self._real_sync = real_sync
        self._volatile: dict[str, _VolatileFile] = {}
        super().__init__(name, base)
        _plans_by_vfs_name[name] = plan

    def xOpen(self, name: Any, flags: list[int]) -> FaultyVFSFile:  # noqa: N802
        if self.plan.crashed:
            raise apsw.IOError("the process crashed; no file opens")
        path = name.filename() if isinstance(name, apsw.URIFilename) else name
        volatile = None
        if path:
            volatile = self._volatile.get(path)
            if volatile is None:
                volatile = self._volatile[path] = _VolatileFile(path)
        return FaultyVFSFile(self._base, name, flags, self.plan, volatile, self._real_sync)

    def xDelete(self, filename: str, syncdir: bool) -> None:  # noqa: N802
        super().xDelete(filename, syncdir)
        # Directory entries are durable in this model: a deleted file's history is moot.
        volatile = self._volatile.pop(filename, None)
        if volatile is not None:
            volatile.close()

    def unsynced_operations(self) -> int:
        """How many writes and truncates would a power loss now put at risk."""
        return sum(len(volatile.operations) for volatile in self._volatile.values())

    def power_loss(self, random: UniformSource, mode: str | None = None) -> dict[str, int]:
        """Lose power: rewind every file to what its last sync, plus maybe some of the later
        operations, left on the platter.  Call only once every connection using this VFS is
        closed (the engine crashed and its connections abandoned).

        ``mode`` is one of ``power_loss_modes``; ``None`` draws one per file.  Returns counts:
        ``files`` rewound, ``operations_kept``, ``operations_dropped``, ``pages_torn``.
        """
        if mode is not None and mode not in power_loss_modes:
            raise ValueError(f"mode must be one of {power_loss_modes}")
        counts = {"files": 0, "operations_kept": 0, "operations_dropped": 0, "pages_torn": 0}
        for path in sorted(self._volatile):
            volatile = self._volatile[path]
            pending = len(volatile.operations)
            if not pending:
                continue
            chosen = mode or power_loss_modes[_below(random, len(power_loss_modes))]
            if chosen == "drop":
                keep = 0
            elif chosen == "prefix":
                keep = _below(random, pending + 1)
            else:
                keep = _below(random, pending)
            torn = volatile.rewind(keep, chosen == "torn", random)
            counts["files"] += 1
            counts["operations_kept"] += keep
            counts["operations_dropped"] += pending - keep - torn
            counts["pages_torn"] += torn
            volatile.synced()
        return counts

    def unregister(self) -> None:
        for volatile in self._volatile.values():
            volatile.close()
        if _plans_by_vfs_name.get(self.name) is self.plan:
            del _plans_by_vfs_name[self.name]
        super().unregister()

    def __enter__(self) -> FaultyVFS:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unregister()
