"""``MemoryIndex`` writes through a real thread executor: graph inserts and embedding run on
worker threads while recalls search the same graph from other worker threads."""

import datetime
import string

import trio

from troupe.models._hashed_embedder import HashedEmbedder
from troupe.retrieval import (
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    _store,
    connection_setup,
    retrieval_migrations,
)
from troupe.runtime._real_env import ThreadExecutor
from troupe.storage import Engine

from .conftest import make_env, open_test_engine

base = datetime.datetime(2026, 5, 1, 9)
writers = 4
batches_per_writer = 10
items_per_batch = 4


def word(number: int) -> str:
    """A unique all-letter token per number (the tokenizer keeps it as one word)."""
    letters = ""
    for _ in range(4):
        number, digit = divmod(number, 26)
        letters += string.ascii_lowercase[digit]
    return "zq" + letters


def memory(number: int) -> MemoryItem:
    return MemoryItem(
        key=f"m{number}",
        text=f"{word(number)} talked about {word(number * 7 + 3)} and the harbour",
        tenant="t",
        created_at=base + datetime.timedelta(minutes=number),
        context="" if number % 3 else f"earlier: {word(number + 5000)}",
    )


async def vector_summary(engine, index):
    return await engine.read(
        lambda connection: _store.vector_summary(connection, index.vector_fingerprint)
    )


async def test_concurrent_adds_and_recalls_on_threads_stay_consistent(tmp_path):
    executor = ThreadExecutor()
    env = make_env(tmp_path / "data")
    env.executor = executor
    engine = await Engine.open(
        env, migrations=retrieval_migrations(), connection_setup=connection_setup
    )
    vector_path = str(tmp_path / "vectors.usearch")
    added: list[int] = []
    failures: list[str] = []
    writing_done = trio.Event()
    try:
        index = await MemoryIndex.open(
            engine, embedder=HashedEmbedder(), vector_path=vector_path, executor=executor
        )

        async def check_recallable(number: int) -> None:
            item = memory(number)
            result = await index.recall(item.text, recall_filter=RecallFilter("t"), limit=5)
            top = result.hits[0] if result.hits else None
            if top is None or top.key != item.key or not {"text", "vector"} <= set(top.ranks):
                failures.append(f"{item.key}: {top}")

        async def writer(first: int) -> None:
            for batch in range(batches_per_writer):
                numbers = [first + batch * items_per_batch + j for j in range(items_per_batch)]
                await index.add([memory(number) for number in numbers])
                for number in numbers:  # recallable, by text and by vector, once add returns
                    await check_recallable(number)
                added.extend(numbers)

        async def reader() -> None:
            checked = 0
            while not writing_done.is_set() or checked < 20:
                if added:
                    await check_recallable(added[(checked * 7919) % len(added)])
                    checked += 1
                await trio.sleep(0)

        async with trio.open_nursery() as readers:
            for _ in range(2):
                readers.start_soon(reader)
            async with trio.open_nursery() as writing:
                for number in range(writers):
                    writing.start_soon(writer, number * batches_per_writer * items_per_batch)
            writing_done.set()

        assert failures == []
        assert len(added) == writers * batches_per_writer * items_per_batch
        count, highest = await vector_summary(engine, index)
        assert count == len(added)
        assert len(index._vectors) == count
        assert index._vectors.high_water_sequence == highest
        index.save_vectors()
        reopened = await MemoryIndex.open(
            engine, embedder=HashedEmbedder(), vector_path=vector_path, executor=executor
        )
        assert not reopened.vector_index_rebuilt
    finally:
        await engine.aclose()


class ReorderingExecutor:
    """Inline, except that the first graph insert waits until the second has finished."""

    def __init__(self) -> None:
        self.inserts = 0
        self.first_waiting = trio.Event()
        self.second_done = trio.Event()

    async def run_sync(self, function, *args):
        if getattr(function, "__name__", "") == "upsert":
            self.inserts += 1
            if self.inserts == 1:
                self.first_waiting.set()
                await self.second_done.wait()
                return function(*args)
            result = function(*args)
            self.second_done.set()
            return result
        return function(*args)


async def test_high_water_mark_waits_for_an_earlier_insert_still_in_flight(tmp_path):
    engine = await open_test_engine(tmp_path / "data")
    try:
        executor = ReorderingExecutor()
        index = await MemoryIndex.open(engine, embedder=HashedEmbedder(), executor=executor)
        graph = index._vectors
        marks = []

        async def first() -> None:
            await index.add([memory(1)])

        async def second() -> None:
            # Only once the first insert is committed (sequence 1) and held before the graph:
            # starting earlier would let the writer thread commit the two in either order.
            await executor.first_waiting.wait()
            await index.add([memory(2)])
            marks.append(graph.high_water_sequence)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
        _, highest = await vector_summary(engine, index)
        # When the second insert (sequence 2) returned, the first (sequence 1) was not in the
        # graph yet: the mark stayed below it, so a save then would be caught up on restart.
        assert highest == 2 and marks == [0]
        assert graph.high_water_sequence == highest and len(graph) == 2
    finally:
        await engine.aclose()
