"""The app-level shutdown signal that long-lived responses race.

hypercorn's graceful shutdown stops accepting, waits ``graceful_timeout`` and then cancels
whatever is still open, without telling the app first.  A stream cut that way ends without
its closing frame and looks like a crash to the client.  So the server sets this signal
*before* it triggers hypercorn's shutdown, and every stream waits inside ``signal.scope()``:
setting the signal cancels those scopes at once, and each stream ends cleanly (a last event,
then the end of the body) well within hypercorn's grace period.

Trade-off: streams must do their waiting inside ``scope()``; a stream that waits elsewhere is
only ended by hypercorn's cancellation.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import trio


class ShutdownSignal:
    """Set once; cancels every scope opened with ``scope()`` and wakes ``wait()``."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self._scopes: set[trio.CancelScope] = set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()
        for scope in list(self._scopes):
            scope.cancel()

    async def wait(self) -> None:
        await self._event.wait()

    @contextmanager
    def scope(self, *, timeout_seconds: float = math.inf) -> Iterator[trio.CancelScope]:
        """A cancel scope ended by shutdown or after ``timeout_seconds``; check
        ``is_set()`` afterwards to tell which (both leave ``cancelled_caught`` true)."""
        with trio.CancelScope(relative_deadline=timeout_seconds) as scope:
            if self.is_set():
                scope.cancel()
            self._scopes.add(scope)
            try:
                yield scope
            finally:
                self._scopes.discard(scope)

    @property
    def open_scopes(self) -> int:
        """How many scopes are waiting now (for tests and statistics)."""
        return len(self._scopes)


__all__ = ["ShutdownSignal"]
