"""Three real servers on loopback: a full mesh paired by QR and PIN, concurrent edits of one
item on all three while one is partitioned (paused), then healing: every replica ends
byte-identical, the winner independent of arrival order, a forget undone nowhere, and
anti-entropy repairing what gossip missed (operations relayed through a third device)."""

from __future__ import annotations

import trio

from tests.http.knowledge._knowledge_harness import wait_until

from ._sync_harness import converged, item_ids, pair, shared_state, start_device, write_shared


async def _has(server, count):
    return len(await item_ids(server)) == count


async def test_three_devices_converge_after_a_partition(nursery, tmp_path):
    a = await start_device(nursery, str(tmp_path / "a"), "A")
    b = await start_device(nursery, str(tmp_path / "b"), "B")
    c = await start_device(nursery, str(tmp_path / "c"), "C")
    async with a.client() as ca, b.client() as cb, c.client() as cc:
        await pair(cb, ca)
        await pair(cc, ca, method="PIN", pin="111222")
        await pair(cc, cb)
        for client in (ca, cb, cc):
            status = (await client.get("/sync/status")).json()
            assert status["peers_total"] == 3, status
        await write_shared(ca, "宽带账单", 100.0)
        await converged([a, b, c], count=1)
        (knowledge_id,) = await item_ids(a)

        # C is partitioned: paused, it neither sends nor takes operations; A and B pause for
        # the edits too, so all three edit from the same version (gossip is fast enough to
        # deliver A's edit to B between two requests otherwise)
        for client in (ca, cb, cc):
            await client.put("/sync/settings", json={"paused": True})
        version = (await shared_state(a))[0][3]
        for client, amount, key in ((ca, 101, "a"), (cb, 102, "b"), (cc, 103, "c")):
            response = await client.post("/memory/update", json={
                "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
                "body": {"vendor": "联通", "amount": amount}, "idempotency_key": f"edit-{key}"})
            assert response.status_code == 200, response.text
        await write_shared(cc, "物业账单", 300.0)  # written offline on C
        for client in (ca, cb):
            await client.put("/sync/settings", json={"paused": False})
        await converged([a, b], count=1)
        await wait_until(lambda: _has(c, 2))

        await cc.put("/sync/settings", json={"paused": False})
        state = await converged([a, b, c], count=2)
        winners = [row for row in state if row[0] == "item" and row[1] == knowledge_id]
        assert winners[0][5]["amount"] in (101, 102, 103)
        digests = {(await client.get(f"/sync/state/knowledge/{knowledge_id}")).json()["operation_digest"]
                   for client in (ca, cb, cc)}
        assert len(digests) == 1
        state_doc = (await ca.get(f"/sync/state/knowledge/{knowledge_id}")).json()
        assert state_doc["clock_entries"] == 3 and state_doc["clock_total"] >= 3

        # a forget on one device while another edits concurrently: the tombstone wins everywhere
        await ca.put("/sync/settings", json={"paused": True})
        version = [row for row in await shared_state(b) if row[1] == knowledge_id][0][3]
        response = await ca.post("/memory/update", json={
            "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
            "body": {"vendor": "联通", "amount": 999}, "idempotency_key": "late-edit"})
        assert response.status_code == 200, response.text
        forgot = await cb.post("/forget", json={"command": "忘记宽带账单 联通", "confirm": True, "scope": "shared:home"})
        assert knowledge_id in forgot.json()["forgotten_ids"], forgot.text
        await trio.sleep(0.2)
        await ca.put("/sync/settings", json={"paused": False})
        state = await converged([a, b, c])
        assert ("forgotten", knowledge_id) in state
        assert knowledge_id not in await item_ids(a)
        status = (await ca.get("/sync/status")).json()
        assert status["last_anti_entropy_ts"] is not None and status["total_ops_synced"] > 0


async def test_anti_entropy_relays_operations_between_devices_that_missed_them(nursery, tmp_path):
    a = await start_device(nursery, str(tmp_path / "a"), "A")
    b = await start_device(nursery, str(tmp_path / "b"), "B")
    c = await start_device(nursery, str(tmp_path / "c"), "C")
    async with a.client() as ca, b.client() as cb, c.client() as cc:
        await pair(cb, ca)
        await pair(cc, ca)
        await pair(cc, cb)
        # B's listener goes away for C only: C's pushes to B fail; A relays C's operations
        # to B through anti-entropy.
        c_id = next(peer for peer in (await cc.get("/sync/peers")).json()["peers"] if peer["is_self"])["id"]
        b_peers = await b.engine.read(lambda connection: connection.execute(
            "SELECT device_id FROM sync_peers").fetchall())
        assert (c_id,) in b_peers
        await c.engine.write(lambda connection: connection.execute(
            "UPDATE sync_peers SET address = 'http://127.0.0.1:9' WHERE device_name = 'B'"))
        await write_shared(cc, "停车费", 50.0)
        await converged([a, b, c], count=1)


        async def b_offline_but_served():
            # B is unreachable from C (itself and A are online), yet B's anti-entropy request
            # to C told C it holds C's operation (relayed by A): nothing is pending for B.
            status = (await cc.get("/sync/status")).json()
            return status["peers_online"] == 2 and status["pending_outgoing_ops"] == 0

        await wait_until(b_offline_but_served)
