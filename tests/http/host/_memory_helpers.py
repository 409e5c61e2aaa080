"""Shared by the prepare, search and feedback tests: memories stored the way the learning
worker stores them (through ``store_memories`` and the process's shared index)."""

from __future__ import annotations

import datetime
from typing import Any

from troupe.actors.host import NewMemory, delete_memories, host_memory_indexes, store_memories

utc = datetime.UTC


def when(day: int, hour: int = 12) -> datetime.datetime:
    return datetime.datetime(2026, 10, day, hour, 0, tzinfo=utc)


async def remember(host: Any, content: str, *, entry_id: str = "astrbot:group-a", **fields: Any) -> int:
    values: dict[str, Any] = dict(
        content=content, kind="fact", stance="neutral", lifecycle="stable", belief=0.9, people=[],
        sources=[(entry_id, fields.pop("message_id", 1))], occurred_at=when(10), entry_id=entry_id,
    )
    values.update(fields)
    index = await host_memory_indexes.index_for(host.engine, host.env.embedder)
    (memory_id,) = await store_memories(host.engine, index, [NewMemory(**values)], created_at=host.env.clock.wall())
    return memory_id


async def delete(host: Any, memory_id: int) -> None:
    index = await host_memory_indexes.index_for(host.engine, host.env.embedder)
    await delete_memories(host.engine, index, [memory_id], deleted_at=host.env.clock.wall())


def fields_of(response: Any) -> list[str]:
    return [problem["field"] for problem in response.json()["error"]["fields"]]
