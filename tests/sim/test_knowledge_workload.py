"""The knowledge workload: registered, exercises the real PIXIU app, and its checkers see the
surface's own bugs (planted here by monkeypatching, never in the surface code)."""

from __future__ import annotations

from troupe.actors.knowledge import _agent_context, _forget, _sensitivity, _store
from troupe.sim import SimulationConfig, run_simulation, workload_names

quiet = frozenset()
"""No faults: the planted-bug runs must fail because of the bug alone."""


def _knowledge_run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("knowledge",), **options))


def _texts(result) -> list[str]:
    assert all(violation.checker == "knowledge" for violation in result.violations)
    return [violation.text for violation in result.violations]


def test_registered():
    assert "knowledge" in workload_names()


def test_clean_without_faults_and_exercises_the_surface():
    result = _knowledge_run(1, 50, faults=quiet)
    assert [str(violation) for violation in result.violations] == []
    counts = result.event_counts
    assert counts["http_ok"] > 50
    assert counts["knowledge_structured"] > 15


def test_catches_a_second_memory_for_one_key(monkeypatch):
    # The write path checks a key with ``receipt_check`` (a never-seen key's receipt is
    # written once, completed) and other paths take it with ``receipt_take``: both forget.
    def forgetting(original):
        def forgetful(connection, namespace, key, *arguments, **options):
            # PLANTED BUG: a completed receipt is dropped, so a resent write runs afresh.
            decision = original(connection, namespace, key, *arguments, **options)
            if decision.action == "replay":
                connection.execute("DELETE FROM knowledge_receipts WHERE namespace = ? AND key = ?",
                                   (namespace, key))
                return original(connection, namespace, key, *arguments, **options)
            return decision
        return forgetful

    monkeypatch.setattr(_store, "receipt_take", forgetting(_store.receipt_take))
    monkeypatch.setattr(_store, "receipt_check", forgetting(_store.receipt_check))
    texts = _texts(_knowledge_run(1, 40, faults=quiet))
    assert any("acknowledged with two evidence ids" in text for text in texts), texts
    assert any("evidence rows" in text for text in texts), texts


def test_catches_a_forget_that_keeps_the_memory(monkeypatch):
    def pretend(connection, knowledge_ids, now):
        # PLANTED BUG: the forget answers what it would remove and removes nothing.
        plan = _store.forget_plan(connection, knowledge_ids)
        return _store.ForgetResult(tuple(item.id for item in plan.knowledge), plan.evidence_ids, plan.relation_count)

    monkeypatch.setattr(_forget, "forget_apply", pretend)
    texts = _texts(_knowledge_run(5, 70, faults=quiet))
    assert any("forgotten before the read was sent" in text or "after it was forgotten" in text for text in texts), texts
    assert any("forgotten, is in the store again" in text for text in texts), texts


def test_catches_sensitive_content_in_an_agent_context(monkeypatch):
    # PLANTED BUG: the detector finds nothing.
    monkeypatch.setattr(_sensitivity.LocalSensitivityDetector, "detect",
                        lambda self, value: _sensitivity.not_sensitive)
    texts = _texts(_knowledge_run(5, 70, faults=quiet))
    assert any("shows sensitive content" in text for text in texts), texts
    assert any("accepted into shared:" in text for text in texts), texts


def test_catches_a_context_that_crosses_scopes(monkeypatch):
    # PLANTED BUG: the newest items are taken from every scope and the scope filter is gone.
    monkeypatch.setattr(_agent_context, "_newest_ids", lambda connection, scope, limit: [
        row[0] for row in connection.execute(
            "SELECT id FROM knowledge_items WHERE status = 'ACTIVE' ORDER BY updated_at DESC, id LIMIT ?", (limit,))])
    monkeypatch.setattr(_agent_context, "admissible",
                        lambda view, scope: view is not None and view.active and bool(view.evidence)
                        and not view.sensitive)
    texts = _texts(_knowledge_run(1, 40, faults=quiet))
    assert any("returned" in text and "of scope" in text for text in texts), texts


async def test_gate_answers_a_storage_error_reading_the_schema_with_503():
    # Found by the workload (seeds 65, 181): an injected read error in the gate's schema
    # check escaped the app as a bare 500 with an empty body.
    import trio

    from troupe.http.knowledge._gate import KnowledgeGate
    from troupe.sim._asgi import AsgiDriver
    from troupe.storage import StorageIOError

    async def never(scope, receive, send):
        raise AssertionError("the gate must answer first")

    async def unreadable() -> bool:
        raise StorageIOError("injected I/O error on read")

    gate = KnowledgeGate(never, new_request_id=lambda: "req_1", schema_ready=unreadable)
    response = await AsgiDriver(gate).request("POST", "/memory/write", body=b"{}",
                                              headers=[("content-type", "application/json")])
    assert response.status == 503 and response.header("retry-after")
    assert response.json() == {"error": "OVERLOADED", "message": "storage is unavailable; retry shortly",
                               "request_id": "req_1"}
    await trio.lowlevel.checkpoint()
