"""One ``MemoryIndex`` per storage engine, shared by every surface of the process.

Why it exists: ``MemoryIndex`` keeps caches (facet bitmaps, the vector graph) that only its
own writes update, and it loads every item of the retrieval tables at open.  Two instances
over one engine would each miss the other's writes (a stale bitmap hides a new item or
returns a deleted one) and each hold a copy of everything.  So the host surface (tenant
``host``) and the character surface (tenants ``character:<name>``) get their index from one
registry, ``shared_memory_indexes.index_for(engine, embedder)``; tenants keep their items
apart, recall never crosses them.

What a surface still does itself: repairing its own tenant after a crash between its SQL
commit and the index add (the host's ``catch_up_index``, the character recall's
reconciliation).  The registry only opens the index; it knows no surface's tables.

The registry is keyed weakly by the engine, so a simulator lifetime (or a test) with a new
engine gets a new index.  The first caller's embedder is the index's embedder: every caller
passes its Env's, which is the same object in one process.

``TokenizedDatabase`` wraps an engine so that every connection a job touches has the FTS5
tokenizer registered (once per connection) even when the server did not open the engine with
``connection_setup``; the retrieval migration registers it on the writer itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import apsw
import trio

from ._memory_index import MemoryIndex
from ._tokenizer import register_tokenizer


class TokenizedDatabase:
    """An engine whose connections get the retrieval tokenizer before a job touches them."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._ready: weakref.WeakSet[apsw.Connection] = weakref.WeakSet()

    def _prepared(self, function: Callable[[apsw.Connection], Any]) -> Callable[[apsw.Connection], Any]:
        def job(connection: apsw.Connection) -> Any:
            if connection not in self._ready:
                register_tokenizer(connection)
                self._ready.add(connection)
            return function(connection)

        return job

    async def write(self, function: Callable[[apsw.Connection], Any]) -> Any:
        return await self.engine.write(self._prepared(function))

    async def read(self, function: Callable[[apsw.Connection], Any]) -> Any:
        return await self.engine.read(self._prepared(function))


class SharedMemoryIndexes:
    """One ``MemoryIndex`` per engine, opened on first use (see the module docstring).

    The index lives in the engine's ``attachments``, so it goes when the engine goes: a
    registry keyed by engine would hold every engine ever opened, because the index itself
    references its engine (the simulator opens one per simulated restart)."""

    attachment_key = "troupe.retrieval.shared_index"
    lock_key = "troupe.retrieval.shared_index_lock"

    async def index_for(self, engine: Any, embedder: Any = None) -> MemoryIndex:
        """The engine's index; concurrent first callers wait for one open."""
        attachments = engine.attachments
        index = attachments.get(self.attachment_key)
        if index is not None:
            return index
        lock = attachments.setdefault(self.lock_key, trio.Lock())
        async with lock:
            index = attachments.get(self.attachment_key)
            if index is None:
                index = await MemoryIndex.open(
                    TokenizedDatabase(engine),
                    embedder=embedder,
                    executor=getattr(engine, "executor", None),
                )
                attachments[self.attachment_key] = index
        return index

    def opened(self, engine: Any) -> MemoryIndex | None:
        """The engine's index if one is open."""
        return engine.attachments.get(self.attachment_key)

    def forget_engine(self, engine: Any) -> None:
        """Drop the index of an engine that is closing (tests, restarts)."""
        engine.attachments.pop(self.attachment_key, None)


shared_memory_indexes = SharedMemoryIndexes()
"""The process's registry: every surface's recall over one engine goes through it."""


__all__ = ["SharedMemoryIndexes", "TokenizedDatabase", "shared_memory_indexes"]
