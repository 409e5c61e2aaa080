"""An executor that runs blocking storage calls inline on the event loop: the simulator's.

Why: worker threads are not deterministic, so the simulator runs SQLite calls right where they
are awaited.  Trade-off: the event loop stalls for the duration of each call, which is fine
under a mock clock and wrong in production (use ``ThreadExecutor`` from the real Env there).
``run_sync`` deliberately contains no checkpoint: a storage batch is atomic with respect to the
other trio tasks, which is what makes ``Engine.crash`` exact under this executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class InlineExecutor:
    async def run_sync(self, function: Callable[..., Any], *args: Any) -> Any:
        return function(*args)
