"""Lifecycle events and promotion through the scope actor: the server chooses the tier and
``expires_at``; TURN events need ``turn_id`` and ``data`` must be non-empty; a replay returns
the first context; the lifecycle namespace is separate from the write namespace; promotion
turns ACTIVE contexts of the right tier and scope into knowledge once (the real structuring)."""

from __future__ import annotations

import pytest

from troupe.actors.knowledge import (
    ContextsPromoted,
    KnowledgeRefused,
    LifecycleRecorded,
    PromoteContexts,
    RecordLifecycle,
    WriteMemory,
    mid_term_context_seconds,
    short_term_context_seconds,
)
from troupe.actors.knowledge._events_hub import events_hub_kind
from troupe.actors.knowledge._lifecycle import context_tier, lifecycle_problem
from troupe.actors.knowledge._schema import knowledge_migrations
from troupe.actors.knowledge._scope_actor import scope_actor_kind
from troupe.retrieval import retrieval_migrations
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

scope = "user:alice"


def event(name: str = "PRE_COMPRESS", key: str = "session-01:pre-compress:04", turn_id: str | None = "turn-04",
          data: dict | None = None, where: str = scope) -> RecordLifecycle:
    return RecordLifecycle(event=name, scope=where, session_id="session-01", run_id="run-01", turn_id=turn_id,
                           occurred_at=1788393600, idempotency_key=key,
                           data={"summary": "压缩前的受控摘要"} if data is None else data)


@pytest.fixture
async def system(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations, *retrieval_migrations()])
    system = ActorSystem(env, [scope_actor_kind(), events_hub_kind()], storage=engine)
    await nursery.start(system.run)
    return system


def test_the_server_chooses_the_tier():
    assert [context_tier(name) for name in ("TURN_START", "TURN_END", "PRE_COMPRESS", "SESSION_SWITCH",
                                            "SESSION_END", "DELEGATION")] == ["SHORT_TERM"] * 2 + ["MID_TERM"] * 4
    assert lifecycle_problem(event("TURN_START", turn_id=None)) == "TURN_START needs turn_id"
    assert lifecycle_problem(event("SESSION_END", turn_id=None)) is None
    assert lifecycle_problem(event(data={})) == "data must be a non-empty object"
    assert lifecycle_problem(event("OTHER")).startswith("event must be one of")


async def test_a_lifecycle_event_is_recorded_once_with_its_expiry(system):
    actor = system.ref("knowledge_scope", scope)
    before = system.env.clock.wall()
    recorded = await actor.ask(event())
    assert isinstance(recorded, LifecycleRecorded)
    assert (recorded.event, recorded.tier, recorded.status) == ("PRE_COMPRESS", "MID_TERM", "ACTIVE")
    assert recorded.context_id.startswith("ctx_")
    assert int(before) + mid_term_context_seconds <= recorded.expires_at <= int(before) + mid_term_context_seconds + 2
    assert await actor.ask(event()) == recorded
    changed = await actor.ask(event(data={"summary": "另一个摘要"}))
    assert (changed.code, changed.status) == ("IDEMPOTENCY_CONFLICT", 409)
    short = await actor.ask(event("TURN_END", key="session-01:turn-04"))
    assert short.tier == "SHORT_TERM" and short.expires_at <= int(before) + short_term_context_seconds + 2
    # The write namespace is separate: the same external key writes a memory too.
    written = await actor.ask(WriteMemory(source_type="MANUAL_CONFIG", raw={"title": "x"}, scope=scope,
                                          idempotency_key="session-01:turn-04"))
    assert written.status == "accepted"
    invalid = await actor.ask(event("TURN_START", key="k2", turn_id=None))
    assert (invalid.code, invalid.status) == ("INVALID_REQUEST", 400)


async def test_promotion_makes_knowledge_once_and_skips_what_it_may_not_touch(system):
    actor = system.ref("knowledge_scope", scope)
    mid = await actor.ask(event(data={"summary": "用户喜欢简洁的回答"}))
    short = await actor.ask(event("TURN_START", key="t1"))
    other_scope = await system.ref("knowledge_scope", "user:bob").ask(event(key="b1", where="user:bob"))
    promoted = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope,
                                               context_ids=(mid.context_id, short.context_id,
                                                            other_scope.context_id, "ctx_missing")))
    assert isinstance(promoted, ContextsPromoted)
    assert promoted.promoted_count == 1 and len(promoted.knowledge_ids) == 1
    knowledge_id = promoted.knowledge_ids[0]
    assert knowledge_id.startswith("knw_")
    again = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope, context_ids=(mid.context_id,)))
    assert again.knowledge_ids == (knowledge_id,)
    rows = await system.storage.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM knowledge_evidence WHERE origin = 'promotion'").fetchone()[0])
    assert rows == 1
    status = await system.storage.read(lambda connection: connection.execute(
        "SELECT status, promoted_knowledge_id FROM knowledge_contexts WHERE id = ?", (mid.context_id,)).fetchone())
    assert status == ("PROMOTED", knowledge_id)
    empty = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope, context_ids=()))
    assert isinstance(empty, KnowledgeRefused) and empty.status == 400


async def test_promote_context_ids_are_capped(system):
    from troupe.actors.knowledge import promote_context_ids_max

    actor = system.ref("knowledge_scope", scope)
    at_limit = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope,
                                               context_ids=tuple(f"ctx_{n}" for n in range(promote_context_ids_max))))
    assert isinstance(at_limit, ContextsPromoted) and at_limit.promoted_count == 0
    over = await actor.ask(PromoteContexts(source="MID_TERM", scope=scope,
                                           context_ids=tuple(f"ctx_{n}" for n in range(promote_context_ids_max + 1))))
    assert isinstance(over, KnowledgeRefused) and over.code == "INVALID_REQUEST"


