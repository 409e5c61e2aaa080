"""A fault-injecting SQLite VFS for the simulator: I/O errors and disk full on demand, seeded.

Why: "no acknowledged write is lost" is only a claim until the disk misbehaves under test.
``FaultyVFS`` inherits SQLite's default VFS and lets every file consult a ``FaultPlan`` before
xWrite, xSync and xTruncate (and xRead when asked).  An injected fault raises the apsw
exception SQLite maps to the real error code (``apsw.IOError`` → SQLITE_IOERR,
``apsw.FullError`` → SQLITE_FULL), so SQLite runs its genuine error paths.

Trade-off: faults are clean refusals (the write does not happen); torn writes and lost
un-synced data after power loss are not modelled, since with ``synchronous=NORMAL`` the engine
promises durability across process crashes, not power loss.  The plan draws from a random
source passed in (anything with ``.random()``), never from the ``random`` module, so the same
seed and the same inline executor give the same faults at the same places.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import apsw


class UniformSource(Protocol):
    def random(self) -> float: ...


@dataclass
class FaultPlan:
    """Which faults to inject, how often, and how many were injected.

    ``disk_full_probability`` applies to writes and truncates; ``io_error_probability`` to
    writes, syncs, truncates, and reads when ``read_faults`` is set.  Nothing is drawn from the
    random source while ``enabled`` is false, so toggling the plan keeps runs reproducible.
    """

    random: UniformSource
    io_error_probability: float = 0.0
    disk_full_probability: float = 0.0
    read_faults: bool = False
    enabled: bool = True
    io_errors_injected: int = 0
    disk_full_injected: int = 0

    def __post_init__(self) -> None:
        total = self.io_error_probability + self.disk_full_probability
        if not (0.0 <= self.io_error_probability and 0.0 <= self.disk_full_probability):
            raise ValueError("fault probabilities must not be negative")
        if total > 1.0:
            raise ValueError("fault probabilities must sum to at most 1")

    def consult(self, operation: str, may_be_full: bool) -> None:
        """Raise the fault chosen for this operation, if any."""
        if not self.enabled:
            return
        source = self.random  # the injected seeded source, never the global random module
        draw = source.random()
        full_threshold = self.disk_full_probability if may_be_full else 0.0
        if draw < full_threshold:
            self.disk_full_injected += 1
            raise apsw.FullError(f"injected disk full on {operation}")
        if draw < full_threshold + self.io_error_probability:
            self.io_errors_injected += 1
            raise apsw.IOError(f"injected I/O error on {operation}")


class FaultyVFSFile(apsw.VFSFile):
    """A file of the default VFS that asks the plan before touching the disk."""

    def __init__(self, base_vfs: str, filename: Any, flags: list[int], plan: FaultPlan) -> None:
        super().__init__(base_vfs, filename, flags)
        self._plan = plan

    def xWrite(self, data: bytes, offset: int) -> None:  # noqa: N802 - apsw's method name
        self._plan.consult("write", may_be_full=True)
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:  # noqa: N802
        self._plan.consult("sync", may_be_full=False)
        super().xSync(flags)

    def xTruncate(self, newsize: int) -> None:  # noqa: N802
        self._plan.consult("truncate", may_be_full=True)
        super().xTruncate(newsize)

    def xRead(self, amount: int, offset: int) -> bytes:  # noqa: N802
        if self._plan.read_faults:
            self._plan.consult("read", may_be_full=False)
        return super().xRead(amount, offset)


class FaultyVFS(apsw.VFS):
    """Registers under ``name`` (unique per simulator run); call ``unregister()`` when done.

    Use as a context manager to unregister automatically.  Connections must be closed before
    unregistering.
    """

    def __init__(self, name: str, plan: FaultPlan, base: str = "") -> None:
        self.name = name
        self.plan = plan
        self._base = base
        super().__init__(name, base)

    def xOpen(self, name: Any, flags: list[int]) -> FaultyVFSFile:  # noqa: N802
        return FaultyVFSFile(self._base, name, flags, self.plan)

    def __enter__(self) -> FaultyVFS:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unregister()
