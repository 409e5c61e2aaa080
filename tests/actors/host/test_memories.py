"""The host memory store on a real engine: rows and index in step, one index per engine,
the extra work committed in the same transaction, and catch-up after a crash between the
commit and the index add."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.host import (
    MemoryIndexes,
    NewMemory,
    catch_up_index,
    delete_memories,
    forget_memories,
    host_migrations,
    insert_memories,
    load_memories,
    memory_tenant,
    store_memories,
)
from troupe.auth import auth_migrations
from troupe.retrieval import RecallFilter
from troupe.runtime import real_env
from troupe.storage import Engine

moment = datetime.datetime(2026, 10, 10, 20, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=8)))


def memory(content: str, entry_id: str = "a", **fields) -> NewMemory:
    values = dict(content=content, kind="fact", stance="neutral", lifecycle="stable", belief=0.8,
                  people=["小林"], sources=[(entry_id, 1)], occurred_at=moment, entry_id=entry_id)
    values.update(fields)
    return NewMemory(**values)


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    return await Engine.open(env, nursery=nursery, migrations=[*auth_migrations, *host_migrations])


async def recall_keys(index, query: str, **filters) -> list[str]:
    result = await index.recall(query, recall_filter=RecallFilter(memory_tenant, **filters), limit=10)
    return [hit.key for hit in result.hits]


async def test_stored_memories_are_durable_and_recallable(engine):
    indexes = MemoryIndexes()
    index = await indexes.index_for(engine)
    assert await indexes.index_for(engine) is index
    marked = []
    ids = await store_memories(
        engine, index, [memory("小林喜欢看星星"), memory("小林在学木工", sources=[("a", 1), ("b", 7)])],
        created_at=100.0, in_transaction=lambda connection, ids: marked.append(list(ids)),
    )
    assert marked == [ids] and ids == sorted(ids)
    records = await engine.read(lambda connection: load_memories(connection, ids))
    second = records[ids[1]]
    assert second.sources == (("a", 1), ("b", 7)) and second.people == ("小林",)
    assert (second.kind, second.stance, second.lifecycle, second.belief) == ("fact", "neutral", "stable", 0.8)
    assert second.occurred_at == moment.isoformat()
    assert await recall_keys(index, "星星") == [str(ids[0])]
    assert await recall_keys(index, "木工") == [str(ids[1])]


async def test_in_transaction_failure_rolls_the_memories_back(engine):
    index = await MemoryIndexes().index_for(engine)

    def refuse(connection, ids):
        raise RuntimeError("batch state changed")

    with pytest.raises(RuntimeError):
        await store_memories(engine, index, [memory("不应留下")], created_at=1.0, in_transaction=refuse)
    assert await engine.read(lambda connection: list(connection.execute("SELECT * FROM host_memories"))) == []
    assert await recall_keys(index, "留下") == []


async def test_catch_up_indexes_what_a_crash_left_out(engine):
    # Rows committed but never added to the index (a crash between the two steps).
    ids = await engine.write(lambda connection: insert_memories(connection, [memory("猫咪在窗边")], 5.0))
    index = await MemoryIndexes().index_for(engine)  # opening catches up
    assert await recall_keys(index, "猫咪") == [str(ids[0])]
    assert await catch_up_index(engine, index) == 0  # nothing is indexed twice


async def test_forget_and_delete(engine):
    index = await MemoryIndexes().index_for(engine)
    ids = await store_memories(engine, index, [memory("喜欢寿司"), memory("讨厌寿司")], created_at=1.0)
    await forget_memories(engine, index, [ids[0]])
    assert await recall_keys(index, "寿司") == [str(ids[1])]
    assert set(await recall_keys(index, "寿司", include_forgotten=True)) == {str(i) for i in ids}
    await delete_memories(engine, index, [ids[1]], deleted_at=2.0)
    assert await recall_keys(index, "寿司") == []
    records = await engine.read(lambda connection: load_memories(connection, ids))
    assert records[ids[1]].deleted and records[ids[0]].forgotten
