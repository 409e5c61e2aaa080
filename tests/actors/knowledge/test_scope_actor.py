"""The scope actor through a real ActorSystem and Engine: write → receipt → replay returns the
first response; same key with another payload → 409; a sensitive shared write is refused with
nothing stored; a failing detector → 503 with no receipt; structuring runs after the reply and
announces ``memory_ready``; exactly one evidence per key across an actor crash after the
commit, and across a failed write (FAILED → recover → one retry → fail closed); the
simulator's ``sensitivity_check_fails`` fault point fails a write closed; what the store would
refuse as too large is the caller's 400 before any receipt; each scope reads its own
structuring queue through its index."""

from __future__ import annotations

import dataclasses

import pytest
import trio

from troupe.actors.knowledge import (
    KnowledgeRefused,
    LifecycleRecorded,
    MemoryReady,
    MemoryWritten,
    Provenance,
    RecordLifecycle,
    RecoverIdempotency,
    RetryAuthorized,
    WriteMemory,
    _scope_actor,
    evidence_raw_bytes_max,
    lifecycle_data_bytes_max,
    stored_json_bytes,
    structuring_due,
    structuring_next_at,
)
from troupe.actors.knowledge._events_hub import Subscribe, events_hub_kind
from troupe.actors.knowledge._schema import knowledge_migrations
from troupe.actors.knowledge._scope_actor import ScopeSettings, scope_actor_kind
from troupe.actors.knowledge._sensitivity import FailingSensitivityDetector
from troupe.runtime import (
    ActorCrashed,
    ActorSystem,
    NoFaultPoints,
    domain_fault_point_names,
    fault_point_names,
    real_env,
)
from troupe.storage import Engine

scope = "user:alice"


def turn(number: int = 3, user: str = "请保持回答简洁", key: str | None = None, where: str = scope) -> WriteMemory:
    return WriteMemory(
        source_type="CONVERSATION", raw={"user": user, "assistant": "好的，我会记住。"}, scope=where,
        idempotency_key=key if key is not None else f"session-01:turn-{number:02d}",
        provenance=Provenance(session_id="session-01", run_id="run-01", turn_id=f"turn-{number:02d}",
                              occurred_at=1788393600))


class ScriptedStructurer:
    """Records the evidence it structured; announces one ``memory_ready`` per evidence."""

    def __init__(self):
        self.structured: list[str] = []
        self.gate: trio.Event | None = None

    async def structure(self, context, evidence_id):
        if self.gate is not None:
            await self.gate.wait()
        self.structured.append(evidence_id)
        return (MemoryReady(evidence_id=evidence_id, knowledge_id="knw_" + evidence_id, title="t", scope=context.key),)


class CrashAfterTurn(NoFaultPoints):
    """Fails the next turn after the actor's code returned (its writes are committed)."""

    def __init__(self):
        self.armed = False

    def fires(self, point):
        if point == "turn_raises_after" and self.armed:
            self.armed = False
            return True
        return False


@pytest.fixture
def structurer():
    return ScriptedStructurer()


@pytest.fixture
def faults():
    return CrashAfterTurn()


@pytest.fixture
async def system(nursery, tmp_path, structurer, faults):
    env = dataclasses.replace(real_env(str(tmp_path)), fault_points=faults)
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations])
    system = ActorSystem(env, [scope_actor_kind(ScopeSettings(structurer=structurer)), events_hub_kind()],
                         storage=engine)
    await nursery.start(system.run)
    return system


async def count(system, table, where="1"):
    return await system.storage.read(
        lambda connection: connection.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}").fetchone()[0])


async def structured(system):
    for _ in range(200):
        if await count(system, "knowledge_structuring") == 0:
            return
        await trio.sleep(0.01)
    raise AssertionError("structuring never drained")


async def test_a_replay_returns_the_first_response_and_writes_nothing(system):
    actor = system.ref("knowledge_scope", scope)
    first = await actor.ask(turn())
    assert isinstance(first, MemoryWritten) and first.status == "accepted" and first.sensitivity == 0
    assert first.evidence_id.startswith("evd_")
    assert await actor.ask(turn()) == first
    assert await count(system, "knowledge_evidence") == 1
    # Another payload under the same key is refused; the same key in another namespace is not.
    other = await actor.ask(turn(user="换一句话"))
    assert isinstance(other, KnowledgeRefused) and (other.code, other.status) == ("IDEMPOTENCY_CONFLICT", 409)
    assert await count(system, "knowledge_evidence") == 1


async def test_sensitive_content_for_a_shared_scope_is_refused_with_nothing_stored(system):
    shared = system.ref("knowledge_scope", "shared:home")
    refused = await shared.ask(turn(user="我的密码是 hunter22", where="shared:home"))
    assert refused == KnowledgeRefused("SENSITIVE_SHARED_SCOPE", refused.message, 422)
    assert await count(system, "knowledge_evidence") == 0
    assert await count(system, "knowledge_receipts") == 0
    # The same content in the user's own scope is kept, with its sensitivity.
    kept = await system.ref("knowledge_scope", scope).ask(turn(user="我的密码是 hunter22"))
    assert isinstance(kept, MemoryWritten) and kept.sensitivity > 0


async def test_a_failing_detector_answers_503_without_taking_the_receipt(nursery, tmp_path, structurer):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations])
    settings = ScopeSettings(sensitivity=FailingSensitivityDetector(), structurer=structurer)
    system = ActorSystem(env, [scope_actor_kind(settings), events_hub_kind()], storage=engine)
    await nursery.start(system.run)
    refused = await system.ref("knowledge_scope", scope).ask(turn())
    assert (refused.code, refused.status) == ("SENSITIVITY_CHECK_FAILED", 503)
    assert await count(system, "knowledge_receipts") == 0
    assert await count(system, "knowledge_evidence") == 0


async def test_structuring_runs_after_the_reply_and_announces_memory_ready(system, structurer):
    hub = system.ref("knowledge_events", "main")
    subscription = await hub.ask(Subscribe())
    assert (await subscription.next_message())["event"] == "connected"
    structurer.gate = trio.Event()
    written = await system.ref("knowledge_scope", scope).ask(turn())
    # Acknowledged and durable before any structuring ran.
    assert structurer.structured == []
    assert await count(system, "knowledge_evidence") == 1
    assert await count(system, "reminders", "kind = 'knowledge_scope' AND name = 'structuring'") == 1
    structurer.gate.set()
    ready = await subscription.next_message()
    assert ready == {"event": "memory_ready", "data": {"evidence_id": written.evidence_id,
                                                       "knowledge_id": "knw_" + written.evidence_id,
                                                       "title": "t", "scope": scope}}
    await structured(system)
    assert structurer.structured == [written.evidence_id]


async def test_the_structuring_reminder_is_a_crash_net_due_after_the_write(system, structurer):
    """The write starts its structuring at once; its durable reminder is due
    ``structuring_reminder_delay_seconds`` later (a reminder due at once fired into the running
    task, one more turn and one more job per write), and the task's end cancels it."""
    from troupe.actors.knowledge import structuring_reminder_delay_seconds

    structurer.gate = trio.Event()
    before = system.env.clock.wall()
    await system.ref("knowledge_scope", scope).ask(turn())
    after = system.env.clock.wall()
    (due,) = await system.storage.read(lambda connection: connection.execute(
        "SELECT due_wall FROM reminders WHERE kind = 'knowledge_scope' AND name = 'structuring'").fetchone())
    assert before + structuring_reminder_delay_seconds <= due <= after + structuring_reminder_delay_seconds
    structurer.gate.set()
    await structured(system)
    for _ in range(200):
        if await count(system, "reminders", "kind = 'knowledge_scope'") == 0:
            break
        await trio.sleep(0.01)
    assert await count(system, "reminders", "kind = 'knowledge_scope'") == 0
    assert system.reminders.fired == 0


async def test_one_evidence_per_key_across_a_crash_after_the_commit(system, faults):
    actor = system.ref("knowledge_scope", scope)
    faults.armed = True
    with pytest.raises(ActorCrashed):
        await actor.ask(turn())
    # The client never saw the answer; its retry gets the first response, nothing new.
    replay = await actor.ask(turn())
    assert isinstance(replay, MemoryWritten)
    assert await count(system, "knowledge_evidence") == 1
    assert await count(system, "knowledge_receipts", "state = 'COMPLETED'") == 1


async def test_a_failed_write_fails_closed_until_one_recovery(system, monkeypatch):
    actor = system.ref("knowledge_scope", scope)
    real_write = _scope_actor.write_evidence

    def broken(connection, draft, **options):
        real_write(connection, draft, **options)
        raise RuntimeError("the disk went away mid-job")

    monkeypatch.setattr(_scope_actor, "write_evidence", broken)
    with pytest.raises(ActorCrashed):
        await actor.ask(turn())
    monkeypatch.setattr(_scope_actor, "write_evidence", real_write)
    assert await count(system, "knowledge_evidence") == 0  # the job rolled back
    failed = await actor.ask(turn())
    assert (failed.code, failed.status) == ("IDEMPOTENCY_FAILED", 409)
    # Recovery with another payload is refused; with the original it authorises one retry.
    other = await actor.ask(RecoverIdempotency(original=turn(user="改过的"), reason="核验过了"))
    assert other.code == "IDEMPOTENCY_CONFLICT"
    authorised = await actor.ask(RecoverIdempotency(original=turn(), reason="  已核验首次执行未完成下游写入  "))
    assert isinstance(authorised, RetryAuthorized)
    assert (authorised.operation, authorised.idempotency_key, authorised.recovery_count) == (
        "MEMORY_WRITE", "session-01:turn-03", 1)
    again = await actor.ask(RecoverIdempotency(original=turn(), reason="再来一次"))
    assert again.code == "IDEMPOTENCY_CONFLICT"  # already authorised, not yet used
    written = await actor.ask(turn())
    assert isinstance(written, MemoryWritten)
    assert await actor.ask(turn()) == written
    assert await count(system, "knowledge_evidence") == 1
    done = await actor.ask(RecoverIdempotency(original=turn(), reason="不该允许"))
    assert (done.code, done.status) == ("IDEMPOTENCY_COMPLETED", 409)
    reason = await system.storage.read(lambda connection: connection.execute(
        "SELECT recovery_reason, recovery_count FROM knowledge_receipts").fetchone())
    assert reason == ("已核验首次执行未完成下游写入", 1)


async def test_recovering_an_unknown_receipt_is_404_and_a_keyless_one_400(system):
    actor = system.ref("knowledge_scope", scope)
    missing = await actor.ask(RecoverIdempotency(original=turn(), reason="abc"))
    assert (missing.code, missing.status) == ("IDEMPOTENCY_NOT_FOUND", 404)
    keyless = dataclasses.replace(turn(), idempotency_key=None)
    refused = await actor.ask(RecoverIdempotency(original=keyless, reason="abc"))
    assert (refused.code, refused.status) == ("IDEMPOTENCY_KEY_REQUIRED", 400)


async def test_an_in_progress_receipt_left_by_a_crash_turns_failed_on_activation(system):
    def leave_in_progress(connection):
        connection.execute(
            "INSERT INTO knowledge_receipts (namespace, key, scope, operation, request_hash, state, created_at, "
            "updated_at) VALUES ('write', 'k1', ?, 'MEMORY_WRITE', 'h', 'IN_PROGRESS', 0, 0)", (scope,))

    await system.storage.write(leave_in_progress)
    await system.ref("knowledge_scope", scope).ask(turn())
    assert await count(system, "knowledge_receipts", "key = 'k1' AND state = 'FAILED'") == 1


async def test_the_real_structuring_announces_memory_ready_with_the_new_knowledge(nursery, tmp_path):
    from troupe.retrieval import retrieval_migrations

    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations, *retrieval_migrations()])
    system = ActorSystem(env, [scope_actor_kind(), events_hub_kind()], storage=engine)
    await nursery.start(system.run)
    subscription = await system.ref("knowledge_events", "main").ask(Subscribe())
    await subscription.next_message()
    written = await system.ref("knowledge_scope", scope).ask(WriteMemory(
        source_type="OCR", scope=scope, raw={"title": "2026年4月家庭支出清单", "body": {"amount": 210}}))
    ready = await subscription.next_message()
    assert ready["event"] == "memory_ready" and ready["data"]["evidence_id"] == written.evidence_id
    assert ready["data"]["knowledge_id"].startswith("knw_") and ready["data"]["scope"] == scope
    await structured(system)
    assert await count(system, "knowledge_links", f"evidence_id = '{written.evidence_id}'") == 1


# -- the simulator's fault point, and what the store would refuse ------------------------------


class SensitivityOutage(NoFaultPoints):
    """The sensitivity detector is unavailable for the next ``remaining`` checks."""

    def __init__(self, remaining: int):
        self.remaining = remaining
        self.consulted: list[str] = []

    def fires(self, point):
        self.consulted.append(point)
        if point == _scope_actor.sensitivity_fault_point and self.remaining > 0:
            self.remaining -= 1
            return True
        return False


def test_the_sensitivity_fault_point_is_listed_apart_from_the_runtimes():
    assert _scope_actor.sensitivity_fault_point == "sensitivity_check_fails"
    assert "sensitivity_check_fails" in domain_fault_point_names
    assert not set(domain_fault_point_names) & set(fault_point_names)
    assert not any(NoFaultPoints().fires(point) for point in domain_fault_point_names)


async def test_the_sensitivity_fault_point_fails_the_write_closed(nursery, tmp_path, structurer):
    faults = SensitivityOutage(remaining=1)
    env = dataclasses.replace(real_env(str(tmp_path)), fault_points=faults)
    engine = await Engine.open(env, nursery=nursery, migrations=[*knowledge_migrations])
    system = ActorSystem(env, [scope_actor_kind(ScopeSettings(structurer=structurer)), events_hub_kind()],
                         storage=engine)
    await nursery.start(system.run)
    actor = system.ref("knowledge_scope", scope)
    refused = await actor.ask(turn())
    assert refused == KnowledgeRefused("SENSITIVITY_CHECK_FAILED", refused.message, 503)
    assert "sensitivity_check_fails" in faults.consulted
    assert await count(system, "knowledge_receipts") == 0
    assert await count(system, "knowledge_evidence") == 0
    # No receipt was taken: the client's retry of the same request simply runs.
    assert isinstance(await actor.ask(turn()), MemoryWritten)
    assert await count(system, "knowledge_evidence") == 1


async def test_raw_at_and_over_the_stored_limit(system, monkeypatch):
    # The guard is the store's own limit; a smaller one keeps the test fast (a megabyte of
    # text costs seconds of sensitivity scanning).
    assert _scope_actor.evidence_raw_bytes_max == evidence_raw_bytes_max
    limit = 4_096
    monkeypatch.setattr(_scope_actor, "evidence_raw_bytes_max", limit)
    monkeypatch.setattr(_scope_actor, "evidence_side_bytes_max", limit)
    actor = system.ref("knowledge_scope", scope)
    empty = stored_json_bytes({"text": ""})
    at_limit = WriteMemory(source_type="MANUAL_CONFIG", scope=scope, raw={"text": "x" * (limit - empty)},
                           idempotency_key="big-1")
    assert stored_json_bytes(at_limit.raw) == limit
    assert isinstance(await actor.ask(at_limit), MemoryWritten)
    over = dataclasses.replace(at_limit, raw={"text": "x" * (limit - empty + 1)}, idempotency_key="big-2")
    refused = await actor.ask(over)
    assert (refused.code, refused.status) == ("INVALID_REQUEST", 400)
    assert await count(system, "knowledge_receipts", "key = 'big-2'") == 0
    context = dataclasses.replace(at_limit, raw={"text": "y"}, idempotency_key="big-3",
                                  context={"c": "z" * limit})
    assert (await actor.ask(context)).code == "INVALID_REQUEST"
    assert await count(system, "knowledge_evidence") == 1


async def test_lifecycle_data_at_and_over_the_stored_limit(system):
    actor = system.ref("knowledge_scope", scope)
    empty = stored_json_bytes({"summary": ""})

    def event(key: str, size: int) -> RecordLifecycle:
        return RecordLifecycle(event="SESSION_END", scope=scope, session_id="session-01", idempotency_key=key,
                               occurred_at=1788393600, data={"summary": "s" * (size - empty)})

    assert isinstance(await actor.ask(event("l1", lifecycle_data_bytes_max)), LifecycleRecorded)
    refused = await actor.ask(event("l2", lifecycle_data_bytes_max + 1))
    assert (refused.code, refused.status) == ("INVALID_REQUEST", 400)
    assert await count(system, "knowledge_receipts", "key = 'l2'") == 0


async def test_structuring_reads_only_its_own_scopes_queue(system, structurer):
    structurer.gate = trio.Event()
    mine = await system.ref("knowledge_scope", scope).ask(turn())
    theirs = await system.ref("knowledge_scope", "user:bob").ask(turn(key="bob:turn-03", where="user:bob"))
    now = system.env.clock.wall() + 1

    def due(connection):
        return ([task.evidence_id for task in structuring_due(connection, now, scope=scope)],
                [task.evidence_id for task in structuring_due(connection, now, scope="user:bob")],
                sorted(task.evidence_id for task in structuring_due(connection, now)),
                structuring_next_at(connection, "user:nobody"))

    assert await system.storage.read(due) == ([mine.evidence_id], [theirs.evidence_id],
                                              sorted([mine.evidence_id, theirs.evidence_id]), None)
    plan = await system.storage.read(lambda connection: connection.execute(
        "EXPLAIN QUERY PLAN SELECT evidence_id FROM knowledge_structuring WHERE scope = ? AND available_at <= ? "
        "ORDER BY available_at", (scope, now)).fetchall())
    assert any("knowledge_structuring_by_scope" in row[-1] for row in plan), plan
    structurer.gate.set()
    await structured(system)
