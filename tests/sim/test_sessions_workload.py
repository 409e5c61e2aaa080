"""The sessions workload: clean under faults, deterministic across processes, and able to see
the sessions surface's own bugs (planted here by monkeypatching, never in the surface code)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys

from troupe.actors.sessions import _session
from troupe.sim import SimulationConfig, run_simulation, workload_names
from troupe.sim._sessions_workload import (
    webhook_path,
    webhook_secret_text,
    webhook_signature_problem,
)


def _sessions_run(seed: int, steps: int, **options) -> object:
    return run_simulation(SimulationConfig(seed=seed, steps=steps, workloads=("sessions",), **options))


def test_registered():
    assert "sessions" in workload_names()


def test_clean_under_faults_and_exercises_the_surface():
    result = _sessions_run(3, 300, swarm=False)
    assert [str(violation) for violation in result.violations] == []
    counts = result.event_counts
    assert result.process_crashes > 0 and sum(result.runtime_faults.values()) > 0
    assert counts["session_epoch"] > 20 and counts["sessions_stream_open"] > 20
    assert counts["session_webhook"] > 0 and counts["webhook_enqueued"] > 0
    assert counts["http_ok"] > 200


def test_same_seed_same_trace_in_two_processes():
    here = _sessions_run(5, 150)
    hash_seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    completed = subprocess.run(
        [sys.executable, "-m", "troupe", "sim", "run", "--seed", "5", "--steps", "150", "--workload", "sessions"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    there = json.loads(completed.stdout.strip().splitlines()[-1])
    assert there["trace_sha256"] == here.trace_sha256


def _sign(body: bytes, timestamp: str, nonce: str) -> str:
    key = webhook_secret_text.encode()
    canonical = "\n".join(("tansr-webhook-v2", "POST", webhook_path, timestamp, nonce,
                           hashlib.sha256(body).hexdigest())).encode()
    v2 = hmac.new(key, canonical, hashlib.sha256).hexdigest()
    v1 = hmac.new(key, body, hashlib.sha256).hexdigest()
    return f"v2={v2}, v1={v1}"


def test_the_signature_check_accepts_good_and_refuses_tampered_deliveries():
    body, timestamp, nonce = b'{"sessionId":"s_1","turnId":"t_1"}', "1790000000000", "n-1"
    header = _sign(body, timestamp, nonce)
    assert webhook_signature_problem(header, timestamp, nonce, body) is None
    assert webhook_signature_problem(header, timestamp, nonce, body + b" ") is not None
    assert webhook_signature_problem(header, timestamp, "n-2", body) is not None
    assert webhook_signature_problem(header.split(",")[0], timestamp, nonce, body) is not None


def test_catches_an_epoch_that_restarts_below_what_was_streamed(monkeypatch):
    # PLANTED BUG: after a crash, the next epoch starts right above the committed watermark,
    # below the seqs the crashed epoch streamed without committing.
    monkeypatch.setattr(_session, "unsealed_epoch_margin", 0)
    monkeypatch.setattr(_session, "epoch_start", lambda row, now_ms: row.last_seq + 1)
    result = _sessions_run(1, 300)
    assert any("sessions:" in str(violation) for violation in result.violations)
