"""The scope actor wired to the real structuring and the real knowledge index: an update
records its field conflicts (NEW_WINS, announced as ``conflict_detected``), is indexed at its
new version before the reply, has its entities rebuilt and announces ``memory_ready``; an
archive takes the item out of recall; a promotion refreshes the index; the index port is
called after each of those commits, and a failing refresh does not fail the committed
request."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from troupe.actors.knowledge import (
    ArchiveKnowledge,
    KnowledgeArchived,
    KnowledgeRefused,
    KnowledgeUpdated,
    MemoryWritten,
    PromoteContexts,
    RecallIndexRefresher,
    RecordLifecycle,
    ScopeSettings,
    UpdateKnowledge,
    WriteMemory,
    agent_context,
    events_hub_kind,
    knowledge_indexes,
    knowledge_migrations,
    knowledge_title_characters_max,
    scope_actor_kind,
)
from troupe.actors.knowledge._events_hub import Subscribe
from troupe.models import HashedEmbedder
from troupe.retrieval import retrieval_migrations
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

scope = "user:alice"
title = "2026年4月家庭支出清单"


class RecordingIndex(RecallIndexRefresher):
    """The real refresher, recording what it was asked to refresh (or failing on demand)."""

    def __init__(self):
        self.refreshed: list[list[str]] = []
        self.failing = False

    async def refresh(self, context, knowledge_ids):
        self.refreshed.append(list(knowledge_ids))
        if self.failing:
            raise RuntimeError("the index is unavailable")
        await super().refresh(context, knowledge_ids)


@pytest.fixture
def index_port():
    return RecordingIndex()


@pytest.fixture
async def system(nursery, tmp_path, index_port):
    env = dataclasses.replace(real_env(str(tmp_path)), embedder=HashedEmbedder(64))
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations, *retrieval_migrations()])
    system = ActorSystem(env, [scope_actor_kind(ScopeSettings(index=index_port)), events_hub_kind()],
                         storage=engine)
    await nursery.start(system.run)
    return system


async def drained(system):
    for _ in range(400):
        left = await system.storage.read(lambda connection: connection.execute(
            "SELECT COUNT(*) FROM knowledge_structuring").fetchone()[0])
        if left == 0:
            return
        await trio.sleep(0.01)
    raise AssertionError("structuring never drained")


async def remembered(system, body: dict) -> str:
    """Writes one item and waits for its ``memory_ready`` (announced once it is indexed)."""
    subscription = await system.ref("knowledge_events", "main").ask(Subscribe())
    written = await system.ref("knowledge_scope", scope).ask(WriteMemory(
        source_type="OCR", scope=scope, raw={"title": title, "body": body}))
    assert isinstance(written, MemoryWritten)
    while True:
        message = await subscription.next_message()
        if message["event"] == "memory_ready" and message["data"]["evidence_id"] == written.evidence_id:
            return message["data"]["knowledge_id"]


async def context_for(system, query: str):
    index = await knowledge_indexes.open(system.storage, system.env.embedder)
    return await agent_context(system.storage, index, system.env, query=query, scope=scope, session_id="s",
                               turn_id="t", top_k=5, max_chars=4000)


def update(knowledge_id: str, version: int, body: dict, key: str | None = "edit-1", **fields) -> UpdateKnowledge:
    return UpdateKnowledge(knowledge_id=knowledge_id, expected_version=version, scope=scope, body=body,
                           idempotency_key=key, **fields)


async def test_an_update_records_conflicts_reindexes_and_announces(system, index_port):
    knowledge_id = await remembered(system, {"amount": 156, "vendor": "国家电网"})
    subscription = await system.ref("knowledge_events", "main").ask(Subscribe())
    assert (await subscription.next_message())["event"] == "connected"
    index_port.refreshed.clear()
    updated = await system.ref("knowledge_scope", scope).ask(
        update(knowledge_id, 1, {"amount": 186, "vendor": "南方电网", "note": "新增"}))
    assert isinstance(updated, KnowledgeUpdated) and updated.version == 2
    # Indexed at its new version before the reply.
    assert index_port.refreshed == [[knowledge_id]]
    indexed = knowledge_indexes.opened(system.storage)
    assert indexed is not None and indexed._keys[knowledge_id].split("\x1f")[1] == "2"
    rows = await system.storage.read(lambda connection: connection.execute(
        "SELECT field, old_value_json, new_value_json, resolution, pending FROM knowledge_conflicts "
        "WHERE knowledge_id = ? ORDER BY field", (knowledge_id,)).fetchall())
    assert rows == [("body.amount", "156", "186", "NEW_WINS", 0),
                    ("body.vendor", '"国家电网"', '"南方电网"', "NEW_WINS", 0)]
    first, second = await subscription.next_message(), await subscription.next_message()
    assert [first["event"], second["event"]] == ["conflict_detected", "conflict_detected"]
    assert first["data"]["field"] == "body.amount" and first["data"]["severity"] == "medium"
    assert (first["data"]["old_value"], first["data"]["new_value"]) == (156, 186)
    ready = await subscription.next_message()
    assert ready["event"] == "memory_ready" and ready["data"]["knowledge_id"] == knowledge_id
    await drained(system)
    entities = await system.storage.read(lambda connection: [row[0] for row in connection.execute(
        "SELECT name FROM knowledge_entities WHERE knowledge_id = ? ORDER BY name", (knowledge_id,))])
    assert "南方电网" in entities and "国家电网" not in entities
    found = await context_for(system, "南方电网")
    assert [(item.knowledge_id, item.version) for item in found.items] == [(knowledge_id, 2)]
    # A replay answers the first response and records nothing more.
    replay = await system.ref("knowledge_scope", scope).ask(
        update(knowledge_id, 1, {"amount": 186, "vendor": "南方电网", "note": "新增"}))
    assert replay == updated
    count = await system.storage.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM knowledge_conflicts").fetchone()[0])
    assert count == 2


async def test_a_failing_index_refresh_does_not_fail_the_committed_update(system, index_port):
    knowledge_id = await remembered(system, {"amount": 156})
    subscription = await system.ref("knowledge_events", "main").ask(Subscribe())
    index_port.failing = True
    updated = await system.ref("knowledge_scope", scope).ask(update(knowledge_id, 1, {"amount": 200}))
    assert isinstance(updated, KnowledgeUpdated) and updated.version == 2
    index_port.failing = False
    # The rebuild's own refresh (announced by memory_ready, after it) repairs the index.
    events = [(await subscription.next_message())["event"] for _ in range(3)]
    assert events == ["connected", "conflict_detected", "memory_ready"]
    found = await context_for(system, title)
    assert [(item.knowledge_id, item.version) for item in found.items] == [(knowledge_id, 2)]


async def test_update_titles_at_and_over_their_limit(system):
    knowledge_id = await remembered(system, {"amount": 1})
    actor = system.ref("knowledge_scope", scope)
    over = await actor.ask(update(knowledge_id, 1, {"amount": 2}, title="题" * (knowledge_title_characters_max + 1)))
    assert isinstance(over, KnowledgeRefused) and (over.code, over.status) == ("INVALID_REQUEST", 400)
    at_limit = await actor.ask(update(knowledge_id, 1, {"amount": 2}, title="题" * knowledge_title_characters_max))
    assert isinstance(at_limit, KnowledgeUpdated)


async def test_an_archive_takes_the_item_out_of_recall(system, index_port):
    knowledge_id = await remembered(system, {"amount": 156})
    assert [item.knowledge_id for item in (await context_for(system, title)).items] == [knowledge_id]
    index_port.refreshed.clear()
    actor = system.ref("knowledge_scope", scope)
    archived = await actor.ask(ArchiveKnowledge(knowledge_id=knowledge_id, scope=scope))
    assert archived == KnowledgeArchived(knowledge_id=knowledge_id, version=1)
    assert index_port.refreshed == [[knowledge_id]]
    assert (await context_for(system, title)).items == ()
    assert await actor.ask(ArchiveKnowledge(knowledge_id=knowledge_id, scope=scope)) == archived
    other = await system.ref("knowledge_scope", "user:bob").ask(ArchiveKnowledge(knowledge_id=knowledge_id,
                                                                                 scope="user:bob"))
    assert (other.code, other.status) == ("NOT_FOUND", 404)
    not_active = await actor.ask(update(knowledge_id, 1, {"amount": 2}))
    assert (not_active.code, not_active.status) == ("KNOWLEDGE_NOT_ACTIVE", 409)


async def test_a_promotion_refreshes_the_index(system, index_port):
    actor = system.ref("knowledge_scope", scope)
    recorded = await actor.ask(RecordLifecycle(event="SESSION_END", scope=scope, session_id="session-01",
                                               idempotency_key="end-1", occurred_at=1788393600,
                                               data={"summary": "用户喜欢简洁的回答"}))
    promoted = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope, context_ids=(recorded.context_id,)))
    assert promoted.promoted_count == 1
    assert index_port.refreshed == [list(promoted.knowledge_ids)]
    found = await context_for(system, "简洁的回答")
    assert [item.knowledge_id for item in found.items] == list(promoted.knowledge_ids)
