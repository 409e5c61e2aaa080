"""Two real servers on loopback: pairing by QR and by PIN, replication both ways, offline edits
on both sides converging to one winner, forget across devices, revoke then refused."""

from __future__ import annotations

import trio

from tests.http.knowledge._knowledge_harness import assert_error, wait_until

from ._sync_harness import (
    converged,
    device_id,
    item_ids,
    pair,
    shared_state,
    start_device,
    write_shared,
)


async def _two(nursery, tmp_path):
    a = await start_device(nursery, str(tmp_path / "a"), "书房工作站")
    b = await start_device(nursery, str(tmp_path / "b"), "客厅一体机")
    return a, b


async def test_pair_by_qr_then_replicate_both_ways_and_forget_everywhere(nursery, tmp_path):
    a, b = await _two(nursery, tmp_path)
    async with a.client() as ca, b.client() as cb:
        paired = await pair(cb, ca)
        assert paired["status"] == "paired" and paired["device_name"] == "书房工作站"
        assert paired["domain"] == "shared:home" and paired["peer_id"] == await device_id(ca)
        peers = (await ca.get("/sync/peers")).json()["peers"]
        assert [peer["is_self"] for peer in peers] == [True, False]
        assert peers[1]["id"] == await device_id(cb) and peers[1]["name"] == "客厅一体机"

        await write_shared(ca, "电费账单", 210.0)
        await write_shared(cb, "水费账单", 80.0)
        await ca.post("/memory/write", json={"source_type": "MANUAL_CONFIG", "scope": "user:alice",
                                            "raw": {"title": "私人", "body": {"k": 1}}})
        state = await converged([a, b], count=2)
        assert {row[4] for row in state if row[0] == "item"} == {"电费账单", "水费账单"}
        # user:* never leaves the device
        assert await b.engine.read(lambda c: c.execute(
            "SELECT COUNT(*) FROM knowledge_items WHERE scope = 'user:alice'").fetchone()[0]) == 0
        # the remote item is real knowledge on B: it resolves to evidence and is recalled
        knowledge_id = next(row[1] for row in state if row[0] == "item" and row[4] == "电费账单")
        query = {"text": "电费账单 国家电网", "context_hint": {"scope": "shared:home"}}
        answer = (await cb.post("/memory/query", json=query)).json()
        assert answer["source_knowledge"] == knowledge_id and answer["source_evidence"], answer
        status = (await cb.get(f"/sync/state/knowledge/{knowledge_id}")).json()
        assert status["present"] and not status["tombstone"] and len(status["operation_digest"]) == 64
        assert status == (await ca.get(f"/sync/state/knowledge/{knowledge_id}")).json() | {
            "updated_at": status["updated_at"]}

        # forget on B removes it on A too, for good
        plan = {"command": "忘记电费账单", "confirm": True, "scope": "shared:home"}
        forgot = await cb.post("/forget", json=plan)
        assert forgot.status_code == 200 and forgot.json()["forgotten_ids"], forgot.text
        assert knowledge_id in forgot.json()["forgotten_ids"]
        state = await converged([a, b])
        assert ("forgotten", knowledge_id) in state
        gone = (await ca.get(f"/sync/state/knowledge/{knowledge_id}")).json()
        assert gone["present"] and gone["tombstone"]
        answer = (await ca.post("/memory/query", json=query)).json()
        assert answer["source_knowledge"] != knowledge_id


async def test_pin_pairing_checks_the_pin_and_tokens_are_single_use(nursery, tmp_path):
    a, b = await _two(nursery, tmp_path)
    async with a.client() as ca, b.client() as cb:
        assert_error(await ca.post("/sync/token", json={"method": "PIN"}), 400, "INVALID_REQUEST")
        for pin in ("12345", "1234567", "12345a", 123456, "１２３４５６"):
            assert_error(await ca.post("/sync/token", json={"method": "PIN", "pin": pin}), 400, "INVALID_REQUEST")
        assert_error(await ca.post("/sync/token", json={"method": "QR", "ttl_seconds": 9}), 400, "INVALID_REQUEST")
        assert_error(await ca.post("/sync/token", json={"method": "QR", "ttl_seconds": 3601}), 400,
                     "INVALID_REQUEST")
        assert (await ca.post("/sync/token", json={"method": "QR", "ttl_seconds": 3600})).status_code == 200
        token = (await ca.post("/sync/token", json={"method": "PIN", "pin": "654321", "ttl_seconds": 10})).json()
        assert token["method"] == "PIN" and token["ttl_seconds"] == 10
        wrong = await cb.post("/sync/pair", json={"method": "PIN", "token": token["token"], "pin": "000000"})
        assert_error(wrong, 422, "PAIRING_FAILED")
        again = await cb.post("/sync/pair", json={"method": "PIN", "token": token["token"], "pin": "654321"})
        assert_error(again, 422, "PAIRING_FAILED")  # a wrong PIN burnt the token
        assert_error(await cb.post("/sync/pair", json={"method": "QR", "token": "bm90IGEgdG9rZW4"}), 422,
                     "PAIRING_FAILED")
        own = (await cb.post("/sync/token", json={"method": "QR"})).json()
        assert_error(await cb.post("/sync/pair", json={"method": "QR", "token": own["token"]}), 422,
                     "PAIRING_FAILED")
        tampered = (await ca.post("/sync/token", json={"method": "QR"})).json()["token"]
        assert_error(await cb.post("/sync/pair", json={"method": "QR", "token": tampered[:-3] + "AAA"}), 422,
                     "PAIRING_FAILED")
        paired = await pair(cb, ca, method="PIN", pin="246810")
        assert paired["status"] == "paired"
        used = (await ca.post("/sync/token", json={"method": "QR"})).json()["token"]
        assert (await cb.post("/sync/pair", json={"method": "QR", "token": used})).status_code == 200
        assert_error(await cb.post("/sync/pair", json={"method": "QR", "token": used}), 422, "PAIRING_FAILED")


async def test_offline_edits_on_both_sides_converge_to_one_winner(nursery, tmp_path):
    a, b = await _two(nursery, tmp_path)
    async with a.client() as ca, b.client() as cb:
        await pair(cb, ca)
        await write_shared(ca, "网费账单", 100.0)
        await converged([a, b], count=1)
        (knowledge_id,) = await item_ids(a)
        # partition: both pause, both edit the same version
        for client in (ca, cb):
            assert (await client.put("/sync/settings", json={"paused": True})).json() == {
                "enabled": True, "paused": True}
        version = (await shared_state(a))[0][3]
        for client, amount, key in ((ca, 120, "edit-a"), (cb, 130, "edit-b")):
            response = await client.post("/memory/update", json={
                "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
                "body": {"vendor": "电信", "amount": amount}, "idempotency_key": key})
            assert response.status_code == 200, response.text
        await trio.sleep(0.3)
        assert await shared_state(a) != await shared_state(b)
        status = (await ca.get("/sync/status")).json()
        assert status["paused"] is True and status["pending_outgoing_ops"] >= 1
        for client in (ca, cb):
            await client.put("/sync/settings", json={"paused": False})
        state = await converged([a, b], count=1)
        winner_body = state[0][5]
        assert winner_body in ({"vendor": "电信", "amount": 120}, {"vendor": "电信", "amount": 130})
        # the loser's device now refuses a stale update
        stale = await cb.post("/memory/update", json={
            "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
            "body": {"amount": 1}, "idempotency_key": "stale"})
        assert_error(stale, 409, "VERSION_CONFLICT")
        assert (await ca.get(f"/sync/state/knowledge/{knowledge_id}")).json()["operation_digest"] == (
            await cb.get(f"/sync/state/knowledge/{knowledge_id}")).json()["operation_digest"]


async def test_revoke_then_the_peers_operations_are_refused(nursery, tmp_path):
    a, b = await _two(nursery, tmp_path)
    async with a.client() as ca, b.client() as cb:
        await pair(cb, ca)
        b_id = await device_id(cb)
        assert_error(await ca.post("/sync/peers/dev_nosuch/revoke"), 404, "PEER_NOT_FOUND")
        revoked = (await ca.post(f"/sync/peers/{b_id}/revoke")).json()
        assert revoked == {"status": "revoked", "peer_id": b_id, "domain": "shared:home"}
        assert_error(await ca.post(f"/sync/peers/{b_id}/revoke"), 404, "PEER_NOT_FOUND")
        assert [peer["is_self"] for peer in (await ca.get("/sync/peers")).json()["peers"]] == [True]
        await write_shared(cb, "燃气账单", 60.0)
        await wait_until(lambda: item_ids(b))
        await trio.sleep(1.0)  # B keeps trying: A answers 403
        assert await item_ids(a) == []
        unsigned = await ca.post("/sync/peer/ops", json={"operations": []})
        assert unsigned.status_code == 403 and unsigned.json()["error"] == "PEER_REFUSED"


async def test_pair_requests_settings_and_state_validation(nursery, tmp_path):
    a, _ = await _two(nursery, tmp_path)
    async with a.client() as ca:
        own = await device_id(ca)
        for target in (own, "nope", "dev_", "dev_" + "x" * 61, 7):
            assert_error(await ca.post("/sync/pair/request", json={"target_device_id": target}), 400,
                         "INVALID_REQUEST")
        requested = (await ca.post("/sync/pair/request", json={"target_device_id": "dev_0123abcd"})).json()
        assert len(requested["pin"]) == 6 and requested["pin"].isdigit()
        assert requested["request_id"].startswith("req_") and requested["target_device_id"] == "dev_0123abcd"
        confirm = {"request_id": requested["request_id"], "accept": True}
        assert (await ca.post("/sync/pair/confirm", json=confirm)).json() == {"status": "accepted"}
        assert_error(await ca.post("/sync/pair/confirm", json={"request_id": "req_nosuch", "accept": True}), 404,
                     "REQUEST_NOT_FOUND")
        assert_error(await ca.post("/sync/pair/confirm", json={**confirm, "accept": "yes"}), 400, "INVALID_REQUEST")
        second = (await ca.post("/sync/pair/request", json={"target_device_id": "dev_0123abcd"})).json()
        assert (await ca.post("/sync/pair/confirm", json={"request_id": second["request_id"],
                                                          "accept": False})).json() == {"status": "rejected"}
        for bad in ("nope", "evd_1", "knw_" + "x" * 125):
            assert_error(await ca.get(f"/sync/state/knowledge/{bad}"), 400, "INVALID_REQUEST")
        assert (await ca.get("/sync/state/knowledge/knw_unknown")).json() == {
            "present": False, "tombstone": False, "clock_entries": 0, "clock_total": 0,
            "operation_digest": None, "updated_at": None}
        assert_error(await ca.put("/sync/settings", json={"enabled": "false"}), 400, "INVALID_REQUEST")
        assert (await ca.put("/sync/settings", json={"enabled": False})).json() == {"enabled": False, "paused": False}
        status = (await ca.get("/sync/status")).json()
        assert status["enabled"] is False and status["domain"] == "shared:home"
        assert_error(await ca.post("/sync/token", json={"method": "QR"}), 422, "PAIRING_FAILED")
        assert (await ca.put("/sync/settings", json={})).json() == {"enabled": False, "paused": False}
        assert (await ca.put("/sync/settings", json={"enabled": True})).json() == {"enabled": True, "paused": False}
