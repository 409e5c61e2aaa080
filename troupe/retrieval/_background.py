"""The background work recall needs: warming the embedder, embedding what has no vector of the
current model yet, and saving the vector graph now and then.

Why a supervised service: changing the embedder (or a neural model still loading) must never
block recall.  ``MemoryIndex`` degrades to BM25 for items without a vector; this service fills
them in, batch by batch, through the same ``embed_pending`` the tests use, and the runtime's
supervisor restarts it if it crashes.  Trade-off: the vector file is saved at most every
``save_interval_seconds``; after a crash the index catches up from SQLite (the source of
truth), so a late save costs start-up time, never data.
"""

from __future__ import annotations

from typing import Any

import trio

from troupe.runtime import ChildSpec

from ._memory_index import MemoryIndex

embed_batch_items_default = 256
idle_poll_seconds = 5.0
"""How often an idle service looks for items without vectors."""

save_interval_seconds = 60.0
"""The longest a changed vector graph waits before it is written to its file."""


class EmbeddingService:
    """Keeps ``index``'s vectors complete for its current embedder."""

    def __init__(
        self,
        index: MemoryIndex,
        *,
        executor: Any = None,
        batch_items: int = embed_batch_items_default,
        name: str = "retrieval.embedding",
    ) -> None:
        assert batch_items >= 1
        self.index = index
        self.name = name
        self._executor = executor
        self._batch_items = batch_items
        self.embedded = 0
        self.saves = 0

    def child_spec(self) -> ChildSpec:
        return ChildSpec(self.name, self.run)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        embedder = self.index.embedder
        warm_up = getattr(embedder, "warm_up", None)
        if warm_up is not None:
            await warm_up()  # recall runs on BM25 meanwhile
        unsaved = False
        last_save = trio.current_time()
        try:
            while True:
                embedded = await self.index.embed_pending(self._batch_items)
                self.embedded += embedded
                unsaved = unsaved or embedded > 0
                if unsaved and trio.current_time() - last_save >= save_interval_seconds:
                    await self._save()
                    unsaved, last_save = False, trio.current_time()
                if embedded == 0:
                    await trio.sleep(idle_poll_seconds)
                else:
                    await trio.lowlevel.checkpoint()
        finally:
            if unsaved:
                with trio.CancelScope(shield=True):
                    await self._save()

    async def _save(self) -> None:
        if self._executor is None:
            self.index.save_vectors()
        else:
            await self._executor.run_sync(self.index.save_vectors)
        self.saves += 1
