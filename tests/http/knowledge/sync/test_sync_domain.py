"""The shared domain over real HTTP with three servers on loopback paired as a chain (A–B and
B–C, never A–C): pairing with one member joins the domain, so A's and C's edits reach each
other relayed by B's anti-entropy, and a revocation signed by A for C (a member A never paired
with) replicates to B, which stops taking C's requests: C's later edits reach nobody."""

from __future__ import annotations

import trio

from tests.http.knowledge._knowledge_harness import assert_error, wait_until
from troupe.actors.knowledge.sync import RunSyncRound, sync_key, sync_kind_name

from ._sync_harness import converged, device_id, item_ids, pair, start_device, write_shared


async def test_a_chain_of_pairings_is_one_domain_and_a_revocation_reaches_every_member(nursery, tmp_path):
    a = await start_device(nursery, str(tmp_path / "a"), "A")
    b = await start_device(nursery, str(tmp_path / "b"), "B")
    c = await start_device(nursery, str(tmp_path / "c"), "C")
    async with a.client() as ca, b.client() as cb, c.client() as cc:
        await pair(cb, ca)
        await pair(cc, cb, method="PIN", pin="246810")
        a_id, c_id = await device_id(ca), await device_id(cc)
        assert c_id not in [peer["id"] for peer in (await ca.get("/sync/peers")).json()["peers"]]

        await write_shared(ca, "宽带账单", 100.0)
        await write_shared(cc, "物业账单", 300.0)
        await converged([a, b, c], count=2)

        # A revokes C, a member it knows only through B's signed record
        assert_error(await ca.post("/sync/peers/dev_nosuch/revoke"), 404, "PEER_NOT_FOUND")
        revoked = (await ca.post(f"/sync/peers/{c_id}/revoke")).json()
        assert revoked == {"status": "revoked", "peer_id": c_id, "domain": "shared:home"}
        assert_error(await ca.post(f"/sync/peers/{c_id}/revoke"), 404, "PEER_NOT_FOUND")

        async def b_dropped_c() -> bool:
            return c_id not in [peer["id"] for peer in (await cb.get("/sync/peers")).json()["peers"]]

        await wait_until(b_dropped_c)
        assert a_id in [peer["id"] for peer in (await cb.get("/sync/peers")).json()["peers"]]

        await write_shared(cc, "停车费", 50.0)
        for _ in range(3):
            round_done = await c.system.ref(sync_kind_name, sync_key).ask(RunSyncRound(anti_entropy=True), timeout=30)
            assert round_done.peers_reached == 0  # B refuses C now
            await trio.sleep(0.1)
        assert len(await item_ids(c)) == 3
        assert len(await item_ids(a)) == 2 and len(await item_ids(b)) == 2
