"""Idempotency receipts on a real engine: the first response replayed byte for byte across a
restart, the conflict / in-progress / failed refusals, separate namespaces, recovery with its
404 / 409 rules and exactly one authorised retry, the audit fields kept, uncertain commits
resolving to one evidence per key, and a canonical hash that never trusts a client's."""

from __future__ import annotations

import dataclasses

import pytest

from troupe.actors.knowledge import (
    ContextDraft,
    EvidenceDraft,
    _receipts,
    canonical_request_json,
    code_idempotency_completed,
    code_idempotency_conflict,
    code_idempotency_failed,
    code_idempotency_in_progress,
    code_idempotency_not_found,
    idempotency_key_characters_max,
    idempotency_key_problem,
    operation_lifecycle,
    operation_memory_update,
    operation_memory_write,
    receipt_check,
    receipt_fail,
    receipt_get,
    receipt_key_text,
    receipt_namespace_lifecycle,
    receipt_namespace_update,
    receipt_namespace_write,
    receipt_recover,
    receipt_state_completed,
    receipt_state_failed,
    receipt_state_in_progress,
    receipt_state_retry_authorized,
    receipt_take,
    receipts_fail_in_progress,
    record_lifecycle,
    recovery_reason_characters_max,
    recovery_reason_characters_min,
    recovery_reason_problem,
    recovery_response,
    request_hash,
    response_json_text,
    write_evidence,
)
from troupe.storage import StorageCrashed

from .store_helpers import base_time, open_knowledge_engine

scope = "user:alice"
key = "session-01:turn-03"


def conversation(user: str = "请保持回答简洁") -> dict:
    return {"source_type": "CONVERSATION",
            "raw": {"user": user, "assistant": "好的，我会记住。"},
            "scope": scope, "context": None, "idempotency_key": key,
            "provenance": {"session_id": "session-01", "run_id": "run-01",
                           "turn_id": "turn-03", "occurred_at": 1788393600}}


def draft_of(request: dict) -> EvidenceDraft:
    return EvidenceDraft(scope=request["scope"], source_type=request["source_type"],
                         raw=request["raw"], provenance=request["provenance"],
                         quality_score=0.8, idempotency_key=request["idempotency_key"])


def hash_of(request: dict) -> str:
    return request_hash(operation_memory_write, request)


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_knowledge_engine(nursery, tmp_path)


async def write(engine, request: dict, evidence_id: str, *, now: float = base_time,
                latency_ms: int = 7):
    return await engine.write(lambda c: write_evidence(
        c, draft_of(request), evidence_id=evidence_id, now=now, latency_ms=latency_ms,
        request_hash=hash_of(request)))


async def evidence_count(engine) -> int:
    return await engine.read(
        lambda c: c.execute("SELECT COUNT(*) FROM knowledge_evidence").fetchone()[0])


# -- validation and hashing ----------------------------------------------------------------


def test_idempotency_keys_at_their_boundaries():
    assert idempotency_key_problem("a") is None
    assert idempotency_key_problem("A-z_0.9:x") is None
    assert idempotency_key_problem("k" * idempotency_key_characters_max) is None
    assert idempotency_key_problem("k" * (idempotency_key_characters_max + 1)) is not None
    assert idempotency_key_problem("") is not None
    assert idempotency_key_problem(None) is not None
    for bad in ("with space", "slash/", "中文", "a\n", "semi;colon"):
        assert idempotency_key_problem(bad) is not None, bad


def test_recovery_reasons_are_measured_after_trimming():
    assert recovery_reason_problem("a" * recovery_reason_characters_min) is None
    assert recovery_reason_problem("  " + "a" * (recovery_reason_characters_min - 1) + "  ")
    assert recovery_reason_problem("a" * recovery_reason_characters_max) is None
    assert recovery_reason_problem("  " + "a" * recovery_reason_characters_max + "  ") is None
    assert recovery_reason_problem("a" * (recovery_reason_characters_max + 1)) is not None
    assert recovery_reason_problem(3) is not None


def test_the_canonical_hash_ignores_spelling_and_nothing_else():
    request = conversation()
    reordered = dict(reversed(list(request.items())))
    assert canonical_request_json(request) == canonical_request_json(reordered)
    assert hash_of(request) == hash_of(reordered)
    assert hash_of({"amount": 210.0}) == hash_of({"amount": 210})
    assert hash_of({"amount": 210.5}) != hash_of({"amount": 210})
    assert hash_of(conversation("另一句话")) != hash_of(request)
    assert "\\u" not in canonical_request_json(request)  # UTF-8, not escapes
    # The operation is part of what is hashed: the same body under another endpoint differs.
    assert request_hash(operation_memory_update, request) != hash_of(request)
    # A hash a client slipped into the body is hashed as data, never used as the hash.
    forged = dict(request, request_hash=hash_of(request))
    assert hash_of(forged) not in (hash_of(request), forged["request_hash"])
    with pytest.raises(ValueError):
        canonical_request_json({"amount": float("nan")})
    with pytest.raises(ValueError):
        canonical_request_json({"when": object()})


def test_receipt_keys_are_spelled_per_namespace():
    assert receipt_key_text(receipt_namespace_write, "k") == "k"
    assert receipt_key_text(receipt_namespace_update, "k") == "update:k"
    assert receipt_key_text(receipt_namespace_lifecycle, "k") == "lifecycle:k"


def test_response_text_keeps_the_response_key_order():
    assert response_json_text({"b": 1, "a": "é"}) == '{"b":1,"a":"é"}'


# -- completion and replay -----------------------------------------------------------------


async def test_same_key_same_payload_replays_the_first_response_across_a_restart(
        nursery, tmp_path):
    engine = await open_knowledge_engine(nursery, tmp_path)
    first = await write(engine, conversation(), "evd_1", latency_ms=42)
    assert not first.replayed and first.evidence.id == "evd_1"
    assert first.response() == {"evidence_id": "evd_1", "status": "accepted",
                                "quality_score": 0.8, "sensitivity": 0, "latency_ms": 42}
    await engine.aclose()

    engine = await open_knowledge_engine(nursery, tmp_path)
    again = await write(engine, conversation(), "evd_2", now=base_time + 60, latency_ms=3)
    assert again.replayed and again.evidence is None
    assert again.response_json == first.response_json  # byte for byte, latency included
    assert await evidence_count(engine) == 1
    receipt = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope))
    assert receipt.state == receipt_state_completed and receipt.completed_at == base_time
    await engine.aclose()


async def test_a_fresh_write_stores_the_receipt_a_take_and_completion_would(engine):
    """``write_evidence`` writes a never-seen key's receipt once, COMPLETED
    (``receipt_insert_completed``): the same row ``receipt_take`` + ``receipt_complete`` leave."""
    fresh = await write(engine, conversation(), "evd_1", latency_ms=5)
    other = {**conversation("另一句"), "idempotency_key": "two-step"}

    def two_steps(connection):
        taken = receipt_take(connection, receipt_namespace_write, "two-step", scope=scope,
                             operation=operation_memory_write, request_hash=hash_of(other), now=base_time)
        assert taken.action == "proceed"
        return _receipts.receipt_complete(connection, receipt_namespace_write, "two-step",
                                          fresh.response(), base_time, scope=scope)

    text = await engine.write(two_steps)
    assert text == fresh.response_json
    one = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope))
    two = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, "two-step", scope=scope))
    assert dataclasses.replace(one, key="two-step", request_hash=two.request_hash) == two


async def test_same_key_different_payload_is_an_idempotency_conflict(engine):
    await write(engine, conversation(), "evd_1")
    outcome = await write(engine, conversation("改过的内容"), "evd_2")
    assert outcome.refusal.code == code_idempotency_conflict
    assert outcome.refusal.status == 409
    assert await evidence_count(engine) == 1


async def test_keys_are_per_scope_so_another_scope_never_sees_them(engine):
    """The same key in another scope is another request (no 409 that would leak what the
    first scope holds); each scope replays its own first response."""
    first = await write(engine, conversation(), "evd_1")
    other = dict(conversation("另一个作用域的内容"), scope="user:bob")
    second = await write(engine, other, "evd_2")
    assert second.refusal is None and not second.replayed and second.evidence.id == "evd_2"
    again = await write(engine, other, "evd_3")
    assert again.replayed and again.response_json == second.response_json
    assert (await write(engine, conversation(), "evd_4")).response_json == first.response_json
    assert await evidence_count(engine) == 2
    receipts = await engine.read(lambda c: [
        receipt_get(c, receipt_namespace_write, key, scope=name).scope for name in (scope, "user:bob")])
    assert receipts == [scope, "user:bob"]
    assert await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope="user:carol")) is None


async def test_the_per_scope_migration_keeps_every_receipt(nursery, tmp_path):
    """Migration 3 re-keys the receipts table; rows written under migration 2 survive it."""
    from troupe.actors.knowledge import knowledge_migrations
    from troupe.storage import Engine

    from .store_helpers import knowledge_engine_env

    env = knowledge_engine_env(tmp_path)
    old = await Engine.open(env, nursery=nursery, migrations=list(knowledge_migrations[:2]))
    await old.write(lambda c: c.execute(
        "INSERT INTO knowledge_receipts (namespace, key, scope, operation, request_hash, state, "
        "response_json, created_at, updated_at, recovery_count) VALUES "
        "('write', ?, ?, 'MEMORY_WRITE', 'h', 'COMPLETED', '{}', 1, 2, 1)", (key, scope)))
    await old.aclose()
    engine = await Engine.open(env, nursery=nursery, migrations=list(knowledge_migrations))
    receipt = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope))
    assert (receipt.state, receipt.response_json, receipt.recovery_count, receipt.updated_at) == (
        receipt_state_completed, "{}", 1, 2.0)
    await engine.aclose()


async def test_writes_without_a_key_take_no_receipt(engine):
    request = dict(conversation(), idempotency_key=None, source_type="OCR")
    first = await engine.write(lambda c: write_evidence(
        c, draft_of(request), evidence_id="evd_1", now=base_time, latency_ms=1))
    second = await engine.write(lambda c: write_evidence(
        c, draft_of(request), evidence_id="evd_2", now=base_time, latency_ms=1))
    assert (first.evidence.id, second.evidence.id) == ("evd_1", "evd_2")
    assert await engine.read(
        lambda c: c.execute("SELECT COUNT(*) FROM knowledge_receipts").fetchone()[0]) == 0


async def test_namespaces_keep_write_update_and_lifecycle_apart(engine):
    await write(engine, conversation(), "evd_1")
    # The same external key on a lifecycle event is a different receipt, not a conflict.
    lifecycle = ContextDraft(scope=scope, event="TURN_END", session_id="session-01",
                             turn_id="turn-03", occurred_at=base_time, data={"summary": "x"},
                             idempotency_key=key)
    lifecycle_hash = request_hash(operation_lifecycle, {"event": "TURN_END", "key": key})
    recorded = await engine.write(lambda c: record_lifecycle(
        c, lifecycle, context_id="ctx_1", now=base_time, request_hash=lifecycle_hash))
    assert recorded.context.id == "ctx_1" and not recorded.replayed
    again = await engine.write(lambda c: record_lifecycle(
        c, lifecycle, context_id="ctx_2", now=base_time + 1, request_hash=lifecycle_hash))
    assert again.replayed and again.response_json == recorded.response_json
    assert recorded.response() == {"event": "TURN_END", "context_id": "ctx_1",
                                   "tier": "SHORT_TERM", "status": "ACTIVE",
                                   "expires_at": int(base_time) + 86_400}
    states = await engine.read(lambda c: [
        (receipt_get(c, namespace, key, scope=scope) or None) and receipt_get(c, namespace, key, scope=scope).state
        for namespace in (receipt_namespace_write, receipt_namespace_update,
                          receipt_namespace_lifecycle)])
    assert states == [receipt_state_completed, None, receipt_state_completed]


# -- in progress, failure, recovery --------------------------------------------------------


async def take(engine, request: dict, *, now: float = base_time):
    return await engine.write(lambda c: receipt_take(
        c, receipt_namespace_write, key, scope=scope, operation=operation_memory_write,
        request_hash=hash_of(request), now=now))


async def fail(engine, request: dict, *, now: float = base_time, error: str = "boom"):
    return await engine.write(lambda c: receipt_fail(
        c, receipt_namespace_write, key, scope=scope, operation=operation_memory_write,
        request_hash=hash_of(request), error=error, now=now))


async def recover(engine, request: dict, *, operation: str = operation_memory_write,
                  reason: str = "已核验首次执行未完成下游写入", now: float = base_time + 100):
    return await engine.write(lambda c: receipt_recover(
        c, operation, key, scope=scope, request_hash=hash_of(request), reason=reason, now=now))


async def test_a_request_still_in_progress_is_refused_and_fails_after_a_restart(
        nursery, tmp_path):
    engine = await open_knowledge_engine(nursery, tmp_path)
    assert (await take(engine, conversation())).action == "proceed"
    outcome = await write(engine, conversation(), "evd_1")
    assert outcome.refusal.code == code_idempotency_in_progress
    assert (await recover(engine, conversation())).code == code_idempotency_in_progress
    engine.crash()

    engine = await open_knowledge_engine(nursery, tmp_path)
    # The scope's actor activates: what was in progress is now of unknown outcome: FAILED.
    assert await engine.write(lambda c: receipts_fail_in_progress(
        c, scope=scope, error="interrupted by a restart", now=base_time + 5)) == 1
    assert await engine.write(lambda c: receipts_fail_in_progress(
        c, scope="user:bob", error="x", now=base_time + 5)) == 0
    outcome = await write(engine, conversation(), "evd_1")
    assert outcome.refusal.code == code_idempotency_failed
    assert outcome.refusal.status == 409
    assert await evidence_count(engine) == 0
    await engine.aclose()


async def test_recovery_authorises_exactly_one_retry_consumed_by_the_identical_request(
        nursery, tmp_path):
    engine = await open_knowledge_engine(nursery, tmp_path)
    await fail(engine, conversation())
    # Another payload may not recover this key, and nothing changes when it tries.
    refused = await recover(engine, conversation("别的请求"))
    assert (refused.code, refused.status) == (code_idempotency_conflict, 409)
    authorised = await recover(engine, conversation(), reason="  已核验首次执行未完成  ")
    receipt = authorised.receipt
    assert receipt.state == receipt_state_retry_authorized
    assert (receipt.recovery_count, receipt.recovery_reason, receipt.recovered_at) == (
        1, "已核验首次执行未完成", base_time + 100)
    assert recovery_response(receipt) == {
        "operation": "MEMORY_WRITE", "idempotency_key": key, "status": "RETRY_AUTHORIZED",
        "recovery_count": 1, "authorized_at": int(base_time + 100)}
    # Authorising again before the retry ran is refused.
    assert (await recover(engine, conversation())).code == code_idempotency_conflict
    # A different payload under the key does not consume the authorisation.
    other = await write(engine, conversation("别的"), "evd_x")
    assert other.refusal.code == code_idempotency_conflict
    await engine.aclose()

    engine = await open_knowledge_engine(nursery, tmp_path)  # the authorisation is durable
    retried = await write(engine, conversation(), "evd_1", now=base_time + 200)
    assert retried.recovered and retried.evidence.id == "evd_1"
    after = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope))
    assert after.state == receipt_state_completed
    assert (after.recovery_count, after.recovery_reason, after.recovered_at,
            after.retry_consumed_at) == (1, "已核验首次执行未完成", base_time + 100,
                                         base_time + 200)
    # Completed now: replays, and recovery is refused as completed.
    replay = await write(engine, conversation(), "evd_2")
    assert replay.replayed and replay.response_json == retried.response_json
    completed = await recover(engine, conversation())
    assert (completed.code, completed.status) == (code_idempotency_completed, 409)
    assert await evidence_count(engine) == 1
    await engine.aclose()


async def test_a_failed_retry_fails_closed_until_recovered_again(engine):
    await fail(engine, conversation())
    await recover(engine, conversation())

    def failing_retry(connection):
        outcome = write_evidence(connection, draft_of(conversation()), evidence_id="evd_1",
                                 now=base_time + 200, latency_ms=1,
                                 request_hash=hash_of(conversation()))
        assert outcome.recovered
        raise RuntimeError("the downstream write failed")

    with pytest.raises(RuntimeError):
        await engine.write(failing_retry)
    # The job rolled back, so the authorisation looks unused; recording the failure uses it.
    failed = await fail(engine, conversation(), now=base_time + 201, error="downstream")
    assert failed.state == receipt_state_failed and failed.retry_consumed_at == base_time + 201
    assert (await write(engine, conversation(), "evd_1")).refusal.code == code_idempotency_failed
    second = await recover(engine, conversation(), reason="第二次核验", now=base_time + 300)
    assert (second.receipt.recovery_count, second.receipt.recovery_reason) == (2, "第二次核验")
    assert (await write(engine, conversation(), "evd_1")).evidence.id == "evd_1"
    assert await evidence_count(engine) == 1


async def test_recovery_of_an_unknown_key_is_not_found_and_namespaces_matter(engine):
    refused = await recover(engine, conversation())
    assert (refused.code, refused.status) == (code_idempotency_not_found, 404)
    await fail(engine, conversation())
    other = await engine.write(lambda c: receipt_recover(
        c, operation_memory_update, key, scope=scope, request_hash=hash_of(conversation()),
        reason="核验过了", now=base_time))
    assert other.code == code_idempotency_not_found
    assert await engine.read(lambda c: receipt_get(c, receipt_namespace_update, key, scope=scope)) is None


async def test_failure_never_touches_a_completed_receipt_or_another_payload(engine):
    first = await write(engine, conversation(), "evd_1")
    assert await fail(engine, conversation()) is None
    assert await fail(engine, conversation("别的")) is None
    receipt = await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope))
    assert receipt.state == receipt_state_completed
    assert receipt.response_json == first.response_json


async def test_failure_errors_are_bounded(engine):
    failed = await fail(engine, conversation(), error="x" * 5000)
    assert len(failed.error) == _receipts.receipt_error_characters_max


async def test_check_is_read_only(engine):
    decision = await engine.read(lambda c: receipt_check(
        c, receipt_namespace_write, key, hash_of(conversation()), scope=scope))
    assert decision.action == "proceed" and decision.receipt is None
    assert await engine.read(lambda c: receipt_get(c, receipt_namespace_write, key, scope=scope)) is None


# -- uncertain commits ---------------------------------------------------------------------


async def test_an_uncertain_commit_resolves_to_exactly_one_evidence_per_key(nursery, tmp_path):
    # The process dies inside the batch that writes the evidence: the client never heard.
    engine = await open_knowledge_engine(nursery, tmp_path)

    def dying_write(connection):
        outcome = write_evidence(connection, draft_of(conversation()), evidence_id="evd_1",
                                 now=base_time, latency_ms=1,
                                 request_hash=hash_of(conversation()))
        engine.crash()
        return outcome

    with pytest.raises(StorageCrashed):
        await engine.write(dying_write)
    engine = await open_knowledge_engine(nursery, tmp_path)
    retried = await write(engine, conversation(), "evd_2", now=base_time + 1)
    assert retried.refusal is None
    assert await evidence_count(engine) == 1
    again = await write(engine, conversation(), "evd_3", now=base_time + 2)
    assert again.replayed and again.response_json == retried.response_json
    assert await evidence_count(engine) == 1

    # Committed, then the process died before the answer went out: the retry replays.
    engine.crash()
    engine = await open_knowledge_engine(nursery, tmp_path)
    assert (await write(engine, conversation(), "evd_4")).replayed
    assert await evidence_count(engine) == 1
    await engine.aclose()


def test_recovery_operations_address_their_namespaces():
    assert _receipts.operation_namespaces == {
        operation_memory_write: receipt_namespace_write,
        operation_memory_update: receipt_namespace_update,
        operation_lifecycle: receipt_namespace_lifecycle}
    assert receipt_state_in_progress in _receipts.receipt_states
