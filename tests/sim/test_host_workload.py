"""The host workload: clean under faults, deterministic across processes, and able to see the
host surface's own bugs (planted here by monkeypatching, never in the surface code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from troupe.actors.host import _entry
from troupe.auth import TokenScope
from troupe.http.host import _routes_learning
from troupe.sim import SimulationConfig, run_simulation, workload_names
from troupe.sim._asgi import AsgiResponse
from troupe.sim._host_workload import envelope_problem, host_entry_names, host_tokens


def _host_run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("host",), **options))


def test_registered():
    assert "host" in workload_names()
    # Each token's scope reaches some entries and not others (except the one with scope all).
    for token in host_tokens[1:]:
        assert any(token.scope.allows(entry) for entry in host_entry_names)
        assert not all(token.scope.allows(entry) for entry in host_entry_names)


def test_clean_under_faults_and_exercises_the_surface():
    result = _host_run(3, 400, swarm=False)
    assert [str(violation) for violation in result.violations] == []
    counts = result.event_counts
    assert result.process_crashes > 0 and sum(result.runtime_faults.values()) > 0
    assert counts["messages_accepted"] > 20 and counts["batch_finished"] > 0 and counts["media_saved"] > 0
    assert counts["http_ok"] > 300


def test_same_seed_same_trace_in_two_processes():
    here = _host_run(5, 200)
    # Another process with another string-hash seed than this one.
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    completed = subprocess.run(
        [sys.executable, "-m", "troupe", "sim", "run", "--seed", "5", "--steps", "200", "--workload", "host"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    there = json.loads(completed.stdout.strip().splitlines()[-1])
    assert there["trace_sha256"] == here.trace_sha256
    assert there["event_counts"]["http_ok"] > 100


def test_catches_a_dedupe_that_overwrites(monkeypatch):
    original = _entry.accept_messages

    def overwriting(connection, entry_id, command, *arguments, **options):
        # PLANTED BUG: a repeated dedupe key overwrites the stored content.
        for message in command.messages:
            connection.execute("UPDATE host_messages SET content = ? WHERE entry_id = ? AND dedupe_key = ?",
                               (message.content, entry_id, message.dedupe_key))
        return original(connection, entry_id, command, *arguments, **options)

    monkeypatch.setattr(_entry, "accept_messages", overwriting)
    result = _host_run(2, 300, faults=frozenset())
    texts = [violation.text for violation in result.violations]
    assert any("was overwritten" in text for text in texts), texts
    assert all(violation.checker == "host" for violation in result.violations)


def test_catches_a_status_that_ignores_the_scope(monkeypatch):
    original = _routes_learning.status_document

    def leaking(connection, scope, now, **options):
        return original(connection, TokenScope.all(), now, **options)  # PLANTED BUG

    monkeypatch.setattr(_routes_learning, "status_document", leaking)
    result = _host_run(2, 300, faults=frozenset())
    texts = [violation.text for violation in result.violations]
    assert any("outside its scope" in text and "status" in text for text in texts), texts


def _response(status: int, document, headers=()) -> AsgiResponse:
    return AsgiResponse(status, (("content-type", "application/json"), *headers), json.dumps(document).encode())


def _error(code: str, retry_after=None, retry_at=None, fields=()):
    return {"error": {"code": code, "message": "m", "fields": list(fields),
                      "retry_after_seconds": retry_after, "retry_at": retry_at}}


@pytest.mark.parametrize(("status", "document", "headers", "problem"), [
    (400, _error("invalid_request", fields=[{"field": "body.x", "message": "m"}]), (), None),
    (503, _error("unavailable", 2, "2026-01-01T00:00:00+00:00"), (("retry-after", "2"),), None),
    (503, _error("unavailable", 2, "2026-01-01T00:00:00+00:00"), (), "Retry-After"),
    (429, _error("rate_limited", 3, "2026-01-01T00:00:00+00:00"), (("retry-after", "2"),), "disagree"),
    (404, _error("entry_forbidden"), (), "undocumented code"),
    (400, _error("invalid_request", 1, "x"), (), "retry fields"),
    (400, {"error": {"code": "invalid_request", "message": "m"}}, (), "unified"),
    (400, _error("invalid_request", fields=["body.x"]), (), "fields"),
])
def test_envelope_problems(status, document, headers, problem):
    response = _response(status, document, headers)
    found = envelope_problem(response, response.json())
    assert (found is None) if problem is None else (problem in found), found
