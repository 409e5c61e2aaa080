"""Discovery and fences: the manifest passes the SDK's own discovery check, the per-session
closure (stable while the session lives, narrower once it ended), the family discovery, the
Idempotency-Key replay window and the ``checkpoint`` flag of compaction and restore."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import trio

from troupe.http.sessions.api import closure_document, manifest_document, operation_states
from troupe.http.sessions.api._app_api import current_closure, served_operations
from troupe.http.sessions.api._discovery import closure_operation_names, ended_writes_kept
from troupe.http.sessions.api._replay import ReplayWindow, request_fingerprint

pytest.importorskip("tansr_sdk")

from tansr_sdk.api import AuthToken, CallOptions, Client  # noqa: E402
from tansr_sdk.api.operations import manifest as frozen_manifest  # noqa: E402
from tansr_sdk.api.schema import validate_wire  # noqa: E402
from tansr_sdk.errors import Error  # noqa: E402
from tansr_sdk.lifecycle import now_ms  # noqa: E402
from tansr_sdk.session import (  # noqa: E402
    CompactOptions,
    CreateOptions,
    SessionClient,
    TurnTracker,
    WriteOptions,
)

served = served_operations()


def test_served_manifest_passes_the_sdks_schema_and_matches_the_frozen_catalogue():
    document = manifest_document(served)
    validate_wire("unified-v1", "Manifest", document)
    frozen = {operation["name"]: operation for operation in frozen_manifest()["operations"]}
    for operation in document["operations"]:
        expected = {key: value for key, value in frozen[operation["name"]].items()
                    if key not in ("fenced", "requestIdPath", "notes", "legacyOffloadPath")}
        assert {key: operation[key] for key in expected} == expected, operation["name"]


def test_the_frozen_catalogue_fails_its_own_schema_only_by_two_keys():
    """What part A saw: tansr-sdk 0.1.0's catalogue carries ``fenced`` and ``requestIdPath`` on
    every operation, which ``ManifestOperation`` (additionalProperties: false) forbids; without
    those two keys it passes, so a server can pass the check."""
    catalogue = frozen_manifest()
    with pytest.raises(Error):
        validate_wire("unified-v1", "Manifest", catalogue)
    stripped = [{key: value for key, value in operation.items() if key not in ("fenced", "requestIdPath")}
                for operation in catalogue["operations"]]
    validate_wire("unified-v1", "Manifest", {**catalogue, "operations": stripped})


def test_closure_id_is_deterministic_and_names_every_operation():
    states = operation_states(served=served)
    first, second = closure_document(states), closure_document(dict(states))
    assert first["closureId"] == second["closureId"] and len(first["closureId"]) == 64
    assert set(first["operations"]) == set(closure_operation_names)
    validate_wire("unified-v1", "CapabilityClosure", first)


def test_closure_depends_on_configuration_and_on_the_session_having_ended_only():
    deployment = SimpleNamespace(cwd_policy=None, voice=object())
    live = {status: current_closure(deployment, served, status) for status in ("idle", "running", None)}
    assert len({closure["closureId"] for closure in live.values()}) == 1
    ended = current_closure(deployment, served, "ended")
    assert ended["closureId"] != live["idle"]["closureId"]
    assert ended["operations"]["session.message.send"] == "disabled"
    assert all(ended["operations"][name] == live["idle"]["operations"][name] for name in ended_writes_kept)
    assert ended["operations"]["session.history.read"] == "enabled"
    assert live["idle"]["operations"]["session.cwd.set"] == "disabled"
    voiceless = current_closure(SimpleNamespace(cwd_policy=None, voice=None), served, "idle")
    assert voiceless["operations"]["session.audio.speak"] == "disabled"


def test_replay_window_decisions_and_bound():
    now = [0.0]
    window = ReplayWindow(lambda: now[0], receipts_max=2, receipt_seconds=10)
    one = request_fingerprint("POST", "/api/sessions/s/messages", b"", b"{}")
    assert one != request_fingerprint("POST", "/api/sessions/s/messages", b"", b"{ }")
    decision, receipt = window.begin("u", "k1", one)
    assert decision == "run"
    assert window.begin("u", "k1", one)[0] == "wait"
    assert window.begin("u", "k1", "other")[0] == "reused"
    assert window.begin("v", "k1", "other")[0] == "run"  # keys are per principal
    assert window.begin("u", "k2", one)[0] == "full"  # two in flight, none evictable: the bound
    assert window.finish("u", "k1", receipt, 202, [], b'{"accepted":true}')
    assert window.begin("u", "k1", one)[0] == "replay"
    decision, second = window.begin("u", "k2", one)
    assert decision == "run"  # the answered one was evicted to make room
    assert not window.finish("u", "k2", second, 503, [], b"")  # a same-request error is not kept
    assert window.begin("u", "k2", one)[0] == "run"  # so the retry runs the write
    assert len(window) == 2
    now[0] = 5.0
    decision, third = window.begin("w", "k3", one)
    assert decision == "full"
    assert window.finish("u", "k2", window._receipts[("u", "k2")], 200, [], b"{}")
    now[0] = 5.0 + 10.0
    assert window.begin("u", "k2", one)[0] == "run"  # its retention passed: forgotten


async def test_replay_waiter_wakes_when_the_first_arrival_finishes():
    window = ReplayWindow(trio.current_time)
    decision, receipt = window.begin("u", "k", "f")
    seen = []

    async def duplicate():
        while True:
            again, found = window.begin("u", "k", "f")
            if again != "wait":
                seen.append(again)
                return
            await found.done.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(duplicate)
        await trio.sleep(0)
        window.finish("u", "k", receipt, 500, [], b"")  # not final: forgotten, the duplicate runs
    assert seen == ["run"]


# --- through the SDK, against the fixture program --------------------------------------------


@pytest.fixture
def client(fixture_process):
    info = fixture_process.info
    made = Client(info["baseURL"], lambda cancel: AuthToken(info["token"], "fixture-owner"))
    yield made
    assert made.close(10)


def turn(session, prompt: str) -> None:
    floor = session.meta().last_seq
    with session.events(str(floor), deadline_ms=now_ms() + 25_000) as stream:
        tracker = TurnTracker(floor)
        session.send(prompt)
        for event in stream:
            if tracker.observe(event) is not None:
                break
    deadline = time.monotonic() + 10
    while session.meta().status != "idle" and time.monotonic() < deadline:
        time.sleep(0.01)


def test_discovery_through_the_sdk(client, fixture_process):
    assert client.call("discovery.manifest").body["runtime"]["installed"]["session"] == "sdk1"
    assert client.call("discovery.capabilities").body["manifestRevision"] == 7
    families = client.call("session.capabilities", CallOptions(query={"protocol": "sdk2-ext-v1"}))
    assert families.body["contracts"] == [{"contract": "sdk1", "availability": "legacy-complete"}]
    info = fixture_process.info
    offload = Client(info["baseURL"], lambda cancel: AuthToken(info["token"], "o"), family="sdk2-offload-v1")
    try:
        with pytest.raises(Error) as caught:
            SessionClient(offload).create(CreateOptions(request_id="py-unavailable-family"))
        assert caught.value.http_status == 404 and caught.value.detail["reason"] == "not_installed"
    finally:
        assert offload.close(10)


def test_closure_is_stable_for_a_live_session_and_changes_when_it_ends(client):
    session = SessionClient(client).create()
    first = session.capabilities().closure_id
    turn(session, "PY-ONE")
    checkpoint = session.checkpoint("c")
    turn(session, "PY-TWO")
    session.restore(checkpoint.checkpoint_id, False)
    assert session.capabilities().closure_id == first
    session.close()
    ended = session.capabilities()
    assert ended.closure_id != first and ended.operations["session.message.send"] == "disabled"
    stale = pytest.raises(Error, client.call, "session.interrupt", CallOptions(
        parameters={"id": session.id}, body={}, capability_closure=first))
    assert stale.value.http_status == 412 and stale.value.detail["domainCode"] == "closure_stale"
    assert stale.value.detail["closureId"] == ended.closure_id
    with pytest.raises(Error) as local:
        session.send("after the end")  # the SDK reads the closure and does not write
    assert local.value.http_status == 0


def test_idempotency_key_replays_the_first_answer(client):
    session = SessionClient(client).create()
    closure = session.capabilities().closure_id
    options = CallOptions(parameters={"id": session.id}, body={"label": "once"}, request_key="py-key-1",
                          capability_closure=closure)
    first = client.call("session.checkpoint.create", options)
    again = client.call("session.checkpoint.create", options)
    assert first.status == again.status == 201 and first.body == again.body
    assert again.headers.get("idempotent-replayed") == "true"
    assert [entry.checkpoint_id for entry in session.checkpoints()] == [first.body["checkpointId"]]
    reused = pytest.raises(Error, client.call, "session.checkpoint.create", CallOptions(
        parameters={"id": session.id}, body={"label": "other"}, request_key="py-key-1", capability_closure=closure))
    assert reused.value.http_status == 409 and reused.value.detail["reason"] == "idempotency_key_reused"
    assert reused.value.request_id == "py-key-1"
    keyed = session.checkpoint("keyed", WriteOptions(request_key="py-key-2"))
    assert keyed.checkpoint_id != first.body["checkpointId"]
    session.close()


def test_checkpoint_flag_of_compaction_and_restore(client):
    session = SessionClient(client).create()
    assert session.compact(CompactOptions(checkpoint=True))["status"] == "rejected"
    assert session.checkpoints() == []  # nothing compacted: no safety checkpoint left behind
    for index in range(4):
        turn(session, f"PY-COMPACT-{index}")
    before = session.history(limit=0)["total"]
    compacted = session.compact(CompactOptions(checkpoint=True))
    assert compacted["status"] == "compacted"
    safety = {entry.checkpoint_id: entry for entry in session.checkpoints()}[compacted["safetyCheckpointId"]]
    assert safety.message_count == before
    restored = session.restore(safety.checkpoint_id)  # the SDK's default: checkpoint=True
    assert restored["toMessages"] == before and restored["safetyCheckpointId"] in {
        entry.checkpoint_id for entry in session.checkpoints()}
    plain = session.restore(safety.checkpoint_id, False)
    assert "safetyCheckpointId" not in plain and len(session.checkpoints()) == 2
    bad = pytest.raises(Error, client.call, "session.compact", CallOptions(
        parameters={"id": session.id}, body={"checkpoint": "yes"},
        capability_closure=session.capabilities().closure_id))
    assert bad.value.http_status == 400
    session.close()


def test_keyed_requests_over_raw_http(fixture_process, client):
    import httpx

    from troupe.http.sessions._routes import default_body_bytes_max

    session = SessionClient(client).create()
    info = fixture_process.info
    headers = {"Authorization": "Bearer " + info["token"], "tansr-session-family": "sdk1",
               "idempotency-key": "raw-1"}
    base = f"{info['baseURL']}/api/sessions/{session.id}"
    read = httpx.get(base, headers=headers)
    assert read.status_code == 400 and read.json()["detail"]["reason"] == "idempotency_key_not_applicable"
    assert read.json()["requestId"] == "raw-1"
    over = httpx.post(base + "/checkpoints", headers=headers, content=b" " * (default_body_bytes_max + 1))
    assert over.status_code == 413 and over.json()["detail"]["limitBytes"] == default_body_bytes_max
    at_cap = b'{"label":"x"}' + b" " * (default_body_bytes_max - 13)
    created = httpx.post(base + "/checkpoints", headers={**headers, "idempotency-key": "raw-2"}, content=at_cap)
    assert created.status_code == 201
    replayed = httpx.post(base + "/checkpoints", headers={**headers, "idempotency-key": "raw-2"}, content=at_cap)
    assert replayed.content == created.content and replayed.headers["idempotent-replayed"] == "true"
    for response in (read, over, created, replayed):
        assert response.headers["tansr-contract"] == "unified-v1"
        if response.status_code >= 400:
            validate_wire("unified-v1", "UnifiedError", response.json())
    session.close()
