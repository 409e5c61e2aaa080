"""Writes over real HTTP: ``/memory/write`` validation and receipts, sensitivity, ``/evidence``,
``/memory/update`` versions and scopes, ``/agent/lifecycle``, ``/memory/flow/promote`` and
``/agent/idempotency/recover`` with every error code they can answer."""

from __future__ import annotations

import pytest

from troupe.actors.knowledge import (
    FailingSensitivityDetector,
    ScopeSettings,
    receipt_fail,
    receipt_take,
)
from troupe.http.knowledge import LifecycleIn, MemoryWriteIn

from ._knowledge_harness import (
    assert_error,
    bill,
    conversation,
    lifecycle,
    start_knowledge_server,
    wait_until,
)


async def test_a_conversation_turn_is_written_once_and_replayed_with_its_first_response(client):
    first = await client.post("/memory/write", json=conversation())
    assert first.status_code == 200, first.text
    body = first.json()
    assert set(body) == {"evidence_id", "status", "quality_score", "sensitivity", "latency_ms"}
    assert body["status"] == "accepted" and body["sensitivity"] == 0 and body["evidence_id"].startswith("evd_")
    again = await client.post("/memory/write", json=conversation())
    assert again.json() == body
    evidence = (await client.get(f"/evidence/{body['evidence_id']}")).json()
    assert evidence["raw"] == {"user": "请保持回答简洁", "assistant": "好的，我会记住。"}
    assert evidence["provenance"] == {"session_id": "session-01", "run_id": "run-01", "turn_id": "turn-03",
                                      "occurred_at": 1788393600}
    assert evidence["scope"] == "user:alice" and evidence["source_type"] == "CONVERSATION"
    changed = conversation(user="请详细回答")
    assert_error(await client.post("/memory/write", json=changed), 409, "IDEMPOTENCY_CONFLICT")
    assert_error(await client.get("/evidence/evd_nosuch"), 404, "NOT_FOUND")


@pytest.mark.parametrize(("change", "fragment"), [
    (lambda body: body["raw"].update(user=""), "raw.user"),
    (lambda body: body["raw"].pop("assistant"), "raw.assistant"),
    (lambda body: body["raw"].update(session_id="s"), "only user and assistant"),
    (lambda body: body["provenance"].pop("run_id"), "run_id"),
    (lambda body: body["provenance"].pop("occurred_at"), "occurred_at"),
    (lambda body: body.pop("idempotency_key"), "idempotency_key"),
    (lambda body: body.update(idempotency_key="has space"), "idempotency_key"),
    (lambda body: body.update(idempotency_key="k" * 129), "idempotency_key"),
    (lambda body: body.update(scope="team:x"), "scope"),
    (lambda body: body["provenance"].update(occurred_at="1788393600"), "occurred_at"),
])
async def test_conversation_rules_are_400(client, change, fragment):
    body = conversation()
    change(body)
    error = assert_error(await client.post("/memory/write", json=body), 400, "INVALID_REQUEST")
    assert fragment in error["message"]


async def test_key_format_is_accepted_at_128_characters(client):
    body = conversation(key="a.b_c:d-" + "k" * 120)
    assert len(body["idempotency_key"]) == 128
    assert (await client.post("/memory/write", json=body)).status_code == 200


async def test_tool_results_with_provenance_need_the_agent_fields_and_a_boolean_approved(client):
    legacy = {"source_type": "TOOL_RESULT", "raw": {"stdout": "ok"}, "scope": "user:alice"}
    assert (await client.post("/memory/write", json=legacy)).status_code == 200
    agent = {**legacy, "idempotency_key": "run-01:call-7", "provenance": {
        "session_id": "session-01", "run_id": "run-01", "turn_id": "turn-05", "occurred_at": 1788393600,
        "tool_call_id": "call-7", "tool_name": "shell", "approved": True}}
    assert (await client.post("/memory/write", json=agent)).status_code == 200
    for name in ("tool_call_id", "tool_name", "approved"):
        broken = {**agent, "provenance": {k: v for k, v in agent["provenance"].items() if k != name}}
        assert name in assert_error(await client.post("/memory/write", json=broken), 400, "INVALID_REQUEST")["message"]
    not_boolean = {**agent, "provenance": {**agent["provenance"], "approved": "yes"}}
    assert_error(await client.post("/memory/write", json=not_boolean), 400, "INVALID_REQUEST")
    keyless = {k: v for k, v in agent.items() if k != "idempotency_key"}
    assert_error(await client.post("/memory/write", json=keyless), 400, "INVALID_REQUEST")


async def test_sensitive_content_is_kept_for_a_user_and_refused_for_a_shared_scope(client, knowledge_server):
    secret = {"source_type": "MANUAL_CONFIG", "raw": {"note": "我的手机号是13812345678"}, "scope": "user:alice"}
    stored = await client.post("/memory/write", json=secret)
    assert stored.status_code == 200 and stored.json()["sensitivity"] > 0
    shared = {**secret, "scope": "shared:home", "idempotency_key": "shared-1"}
    assert_error(await client.post("/memory/write", json=shared), 422, "SENSITIVE_SHARED_SCOPE")
    rows = await knowledge_server.engine.read(lambda connection: connection.execute(
        "SELECT (SELECT COUNT(*) FROM knowledge_evidence WHERE scope = 'shared:home'), "
        "(SELECT COUNT(*) FROM knowledge_receipts WHERE key = 'shared-1')").fetchone())
    assert rows == (0, 0)


async def test_a_failing_detector_is_503_and_takes_no_receipt(nursery, tmp_path):
    server = await start_knowledge_server(nursery, str(tmp_path / "data"),
                                          scope_settings=ScopeSettings(sensitivity=FailingSensitivityDetector()))
    async with server.client() as client:
        assert_error(await client.post("/memory/write", json=conversation()), 503, "SENSITIVITY_CHECK_FAILED")
    count = await server.engine.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM knowledge_receipts").fetchone()[0])
    assert count == 0


async def _structured(client, knowledge_server, evidence_id: str) -> str:
    async def linked():
        row = await knowledge_server.engine.read(lambda connection: connection.execute(
            "SELECT knowledge_id FROM knowledge_links WHERE evidence_id = ?", (evidence_id,)).fetchone())
        return None if row is None else row[0]

    return await wait_until(linked)


async def test_update_checks_version_scope_and_keeps_its_own_receipts(client, knowledge_server):
    written = (await client.post("/memory/write", json=bill())).json()
    knowledge_id = await _structured(client, knowledge_server, written["evidence_id"])
    update = {"knowledge_id": knowledge_id, "expected_version": 1, "scope": "shared:home",
              "body": {"vendor": "国家电网", "amount": 230}, "idempotency_key": "update-session-01-turn-04"}
    assert_error(await client.post("/memory/update", json={**update, "scope": "shared:office"}), 404, "NOT_FOUND")
    assert_error(await client.post("/memory/update", json={**update, "knowledge_id": "knw_nosuch"}), 404, "NOT_FOUND")
    assert_error(await client.post("/memory/update", json={k: v for k, v in update.items() if k != "body"}),
                 400, "INVALID_REQUEST")
    done = await client.post("/memory/update", json=update)
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["knowledge_id"] == knowledge_id and body["version"] == 2 and body["status"] == "updated"
    assert body["evidence_id"] != written["evidence_id"]
    assert (await client.post("/memory/update", json=update)).json() == body  # replayed
    stale = {**update, "idempotency_key": "update-2", "body": {"amount": 250}}
    assert_error(await client.post("/memory/update", json=stale), 409, "VERSION_CONFLICT")
    agent = {**update, "expected_version": 2, "idempotency_key": "update-3", "provenance": {
        "session_id": "s", "run_id": "r", "turn_id": "t", "occurred_at": 1, "tool_call_id": "c",
        "tool_name": "pixiu_memory_update", "approved": False}}
    assert "approved" in assert_error(await client.post("/memory/update", json=agent), 400, "INVALID_REQUEST")["message"]
    secret = {**update, "expected_version": 2, "idempotency_key": "update-4", "body": {"password": "password: hunter2"}}
    assert_error(await client.post("/memory/update", json=secret), 422, "SENSITIVE_SHARED_SCOPE")


async def test_lifecycle_events_get_a_server_chosen_tier_and_are_idempotent(client):
    first = await client.post("/agent/lifecycle", json=lifecycle())
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["event"] == "PRE_COMPRESS" and body["tier"] == "MID_TERM" and body["status"] == "ACTIVE"
    assert body["context_id"].startswith("ctx_") and body["expires_at"] > 1788393600
    assert (await client.post("/agent/lifecycle", json=lifecycle())).json() == body
    changed = lifecycle(data={"summary": "另一个摘要"})
    assert_error(await client.post("/agent/lifecycle", json=changed), 409, "IDEMPOTENCY_CONFLICT")
    turn = (await client.post("/agent/lifecycle", json=lifecycle("TURN_END", key="t-1", tier="MID_TERM"))).json()
    assert turn["tier"] == "SHORT_TERM"
    # The same external key in the write namespace is independent.
    assert (await client.post("/memory/write", json=conversation(key="session-01:pre-compress:04"))).status_code == 200
    no_turn = lifecycle("TURN_START", key="t-2")
    no_turn.pop("turn_id")
    assert "turn_id" in assert_error(await client.post("/agent/lifecycle", json=no_turn), 400, "INVALID_REQUEST")["message"]
    assert_error(await client.post("/agent/lifecycle", json=lifecycle(key="t-3", data={})), 400, "INVALID_REQUEST")
    assert_error(await client.post("/agent/lifecycle", json=lifecycle(key="t-4", event="NAP")), 400, "INVALID_REQUEST")


async def test_contexts_are_promoted_once_into_knowledge(client):
    context = (await client.post("/agent/lifecycle", json=lifecycle(
        data={"summary": "用户喜欢简洁的回答"}))).json()
    promote = {"source": "MID_TERM", "context_ids": [context["context_id"], "ctx_nosuch"], "scope": "user:alice"}
    first = await client.post("/memory/flow/promote", json=promote)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["promoted_count"] == 1 and len(body["knowledge_ids"]) == 1
    assert (await client.post("/memory/flow/promote", json=promote)).json()["knowledge_ids"] == body["knowledge_ids"]
    other_scope = {**promote, "scope": "user:bob"}
    assert (await client.post("/memory/flow/promote", json=other_scope)).json()["promoted_count"] == 0
    assert_error(await client.post("/memory/flow/promote", json={**promote, "context_ids": []}), 400, "INVALID_REQUEST")
    assert_error(await client.post("/memory/flow/promote", json={**promote, "source": "LONG_TERM"}),
                 400, "INVALID_REQUEST")


def _recovery(original, **extra):
    return {"operation": "MEMORY_WRITE", "original_request": original, "confirm_duplicate_risk": True,
            "reason": "  已核验首次执行未完成下游写入  ", **extra}


async def _fail_receipt(server, namespace: str, operation: str, request) -> None:
    from troupe.actors.knowledge import request_hash

    hashed = request_hash(operation, request.canonical())

    def job(connection):
        receipt_fail(connection, namespace, request.idempotency_key, scope=request.scope, operation=operation,
                     request_hash=hashed, error="injected by the test", now=1.0)

    await server.engine.write(job)


async def test_recovery_authorises_exactly_one_retry_of_a_failed_write(client, knowledge_server):
    original = conversation(turn=9)
    await _fail_receipt(knowledge_server, "write", "MEMORY_WRITE", MemoryWriteIn.model_validate(original).to_request())
    assert_error(await client.post("/memory/write", json=original), 409, "IDEMPOTENCY_FAILED")
    changed = {**original, "raw": {"user": "别的", "assistant": "好"}}
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(changed)), 409, "IDEMPOTENCY_CONFLICT")
    authorised = await client.post("/agent/idempotency/recover", json=_recovery(original))
    assert authorised.status_code == 200, authorised.text
    body = authorised.json()
    assert body["status"] == "RETRY_AUTHORIZED" and body["recovery_count"] == 1
    assert body["operation"] == "MEMORY_WRITE" and body["idempotency_key"] == "session-01:turn-09"
    retried = await client.post("/memory/write", json=original)
    assert retried.status_code == 200
    assert (await client.post("/memory/write", json=original)).json() == retried.json()
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(original)), 409, "IDEMPOTENCY_COMPLETED")
    count = await knowledge_server.engine.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM knowledge_evidence WHERE idempotency_key = 'session-01:turn-09'").fetchone()[0])
    assert count == 1
    reason = await knowledge_server.engine.read(lambda connection: connection.execute(
        "SELECT recovery_count, recovery_reason FROM knowledge_receipts WHERE key = 'session-01:turn-09'").fetchone())
    assert reason == (1, "已核验首次执行未完成下游写入")


async def test_recovery_refusals(client, knowledge_server):
    original = conversation(turn=11)
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(original)), 404, "IDEMPOTENCY_NOT_FOUND")
    keyless = {k: v for k, v in bill().items()}
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(keyless)), 400, "IDEMPOTENCY_KEY_REQUIRED")
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery({**original, "source_type": "EMAIL"})),
                 400, "INVALID_RECOVERY_REQUEST")
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(original, operation="LIFECYCLE")),
                 400, "INVALID_RECOVERY_REQUEST")
    assert_error(await client.post("/agent/idempotency/recover", json=_recovery(original, confirm_duplicate_risk=False)),
                 400, "INVALID_REQUEST")
    for reason in ("  ab  ", "x" * 257):
        assert_error(await client.post("/agent/idempotency/recover", json=_recovery(original, reason=reason)),
                     400, "INVALID_REQUEST")
    assert (await client.post("/agent/idempotency/recover", json=_recovery(original, reason="  abc  "))).status_code == 404
    assert (await client.post("/agent/idempotency/recover", json=_recovery(original, reason="x" * 256))).status_code == 404
    # A lifecycle receipt in progress (the actor is active, so it stays IN_PROGRESS).
    event = lifecycle(key="life-77")
    assert (await client.post("/agent/lifecycle", json=lifecycle(key="warm-up"))).status_code == 200
    request = LifecycleIn.model_validate(event).to_request()
    from troupe.actors.knowledge import request_hash

    hashed = request_hash("LIFECYCLE", request.canonical())
    await knowledge_server.engine.write(lambda connection: receipt_take(
        connection, "lifecycle", "life-77", scope="user:alice", operation="LIFECYCLE", request_hash=hashed, now=1.0))
    assert_error(await client.post("/agent/lifecycle", json=event), 409, "IDEMPOTENCY_IN_PROGRESS")
    assert_error(await client.post("/agent/idempotency/recover",
                                   json=_recovery(event, operation="LIFECYCLE")), 409, "IDEMPOTENCY_IN_PROGRESS")
