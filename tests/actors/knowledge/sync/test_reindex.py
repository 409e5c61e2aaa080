"""The recall-index queue of the sync actor: a first materialisation is indexed without a
forced re-index (nothing to replace), an overwritten item with one (a concurrent winner can
keep the version), removals never wait, and a bulk catch-up (``reindex_bulk_items_min``
upserts waiting or more) waits for received batches to pause (``reindex_quiet_seconds``), at
most ``reindex_delay_seconds_max``."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import trio

from tests.actors.knowledge.sync.test_materialise import _remote
from troupe.actors.knowledge.sync import (
    Materialised,
    Operation,
    SyncActor,
    SyncSettings,
    digest_and_document,
    materialise_many,
    reindex_bulk_items_min,
    reindex_delay_seconds_max,
    reindex_quiet_seconds,
)
from troupe.http.knowledge import new_knowledge_surface
from troupe.runtime import real_env
from troupe.storage import Engine


class RecordingIndex:
    def __init__(self) -> None:
        self.calls: list[tuple[float, tuple[str, ...], bool]] = []

    async def refresh(self, context: Any, knowledge_ids: Any, *, reindex: bool = True) -> None:
        self.calls.append((trio.current_time(), tuple(knowledge_ids), reindex))


class Context:
    """What the actor's index queue uses of its context: the clock and the task beside turns."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.env = SimpleNamespace(clock=SimpleNamespace(monotonic=trio.current_time))
        self.nursery = nursery
        self.running: set[str] = set()
        self.key = "inbound"

    def task_running(self, name: str) -> bool:
        return name in self.running

    def start_task(self, name: str, function: Any) -> None:
        async def run() -> None:
            try:
                await function()
            finally:
                self.running.discard(name)

        self.running.add(name)
        self.nursery.start_soon(run)


def _actor(nursery: trio.Nursery) -> tuple[SyncActor, RecordingIndex]:
    index = RecordingIndex()
    actor = SyncActor.__new__(SyncActor)
    actor.context = Context(nursery)  # type: ignore[assignment]
    actor.index = index
    actor.settings = SyncSettings(index=index)
    actor.reindex_pending, actor.reindex_removed = {}, set()
    actor.reindex_queued_at, actor.last_received_at = math.inf, -math.inf
    actor.reindex_wakeup = trio.Event()
    return actor, index


def _shown(count: int, *, created: bool = True, prefix: str = "knw_") -> list[Materialised]:
    return [Materialised(f"{prefix}{number:05d}", removed=False, created=created) for number in range(count)]


async def test_a_trickle_is_indexed_at_once_created_without_and_overwritten_with_a_forced_reindex(
        autojump_clock, nursery):
    actor, index = _actor(nursery)
    actor.last_received_at = trio.current_time()
    actor._reindex([*_shown(2), Materialised("knw_x", removed=False, created=False)])
    await trio.sleep(0.01)
    assert index.calls == [(0.0, ("knw_00000", "knw_00001"), False), (0.0, ("knw_x",), True)]
    assert await actor.index_settled()


async def test_an_item_created_then_overwritten_before_indexing_gets_the_forced_reindex(autojump_clock, nursery):
    actor, index = _actor(nursery)
    actor.reindex_pending["knw_a"] = False  # queued, not drained yet (no task started)
    actor._reindex([Materialised("knw_a", removed=False, created=False)])
    await trio.sleep(0.01)
    assert index.calls == [(0.0, ("knw_a",), True)]


async def test_just_below_the_bulk_size_nothing_waits(autojump_clock, nursery):
    actor, index = _actor(nursery)
    actor.last_received_at = trio.current_time()
    actor._reindex(_shown(reindex_bulk_items_min - 1))
    await trio.sleep(0.01)
    assert [call[0] for call in index.calls] == [0.0]


async def test_a_bulk_catch_up_waits_for_a_pause_in_received_batches(autojump_clock, nursery):
    actor, index = _actor(nursery)
    actor.last_received_at = trio.current_time()
    actor._reindex(_shown(reindex_bulk_items_min))
    await trio.sleep(0.01)
    assert index.calls == []
    await trio.sleep(reindex_quiet_seconds)
    assert [(call[0], len(call[1])) for call in index.calls] == [(reindex_quiet_seconds, reindex_bulk_items_min)]


async def test_a_bulk_catch_up_waits_at_most_the_delay_and_removals_never_wait(autojump_clock, nursery):
    actor, index = _actor(nursery)
    actor._reindex(_shown(reindex_bulk_items_min))
    for _ in range(int(reindex_delay_seconds_max / 0.25) + 4):  # batches keep arriving every 0.25 s
        actor.last_received_at = trio.current_time()
        if trio.current_time() == 1.0:
            actor._reindex([Materialised("knw_gone", removed=True)])
        await trio.sleep(0.25)
    times = [call[0] for call in index.calls]
    assert index.calls[0] == (1.0, ("knw_gone",), False)
    assert times[1] == reindex_delay_seconds_max and len(index.calls[1][1]) == reindex_bulk_items_min


async def test_materialise_many_says_which_items_are_new(tmp_path):
    async with trio.open_nursery() as nursery:
        surface = new_knowledge_surface({}, os_release_text="")
        engine = await Engine.open(real_env(str(tmp_path)), nursery=nursery, migrations=list(surface.migrations))
        first, digest = _remote("knw_n", 120, "evd_n")
        shown = await engine.write(lambda connection: materialise_many(connection, [(first, digest)], 2.0))
        assert [(item.knowledge_id, item.created) for item in shown] == [("knw_n", True)]
        later = Operation(**{**first.__dict__, "counter": 2, "lamport": 2, "clock": {"dev_remote": 2},
                             "payload": {**first.payload, "body": {"amount": 130}}})
        shown = await engine.write(lambda connection: materialise_many(
            connection, [(later, digest_and_document(later)[0])], 3.0))
        assert [(item.knowledge_id, item.created) for item in shown] == [("knw_n", False)]
        nursery.cancel_scope.cancel()
