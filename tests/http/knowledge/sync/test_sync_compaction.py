"""Log compaction over real HTTP: an upsert that a later operation of the same item covers and
every peer holds leaves the log (a placeholder stays in ``sync_covered``); tombstones never
do; ``/sync/state``'s digest is the same before and after and on every device; a device
paired afterwards receives the placeholders and catches up completely."""

from __future__ import annotations

from troupe.actors.knowledge.sync import RunSyncRound, sync_key, sync_kind_name

from ._sync_harness import converged, pair, shared_state, start_device, write_shared


async def _round(server) -> None:
    await server.system.ref(sync_kind_name, sync_key).ask(RunSyncRound(anti_entropy=True), timeout=30)


async def _log(server, knowledge_id: str) -> tuple[int, int]:
    return await server.engine.read(lambda connection: (
        connection.execute("SELECT COUNT(*) FROM sync_ops WHERE knowledge_id = ?", (knowledge_id,)).fetchone()[0],
        connection.execute("SELECT COUNT(*) FROM sync_covered WHERE knowledge_id = ?", (knowledge_id,)).fetchone()[0]))


async def _digest(client, knowledge_id: str) -> str:
    return (await client.get(f"/sync/state/knowledge/{knowledge_id}")).json()["operation_digest"]


async def test_covered_upserts_leave_the_log_and_a_late_device_still_converges(nursery, tmp_path):
    slow = {"anti_entropy_interval_seconds": 60.0}
    a = await start_device(nursery, str(tmp_path / "a"), "A", **slow)
    b = await start_device(nursery, str(tmp_path / "b"), "B", **slow)
    async with a.client() as ca, b.client() as cb:
        await pair(cb, ca)
        await write_shared(ca, "电费账单", 100.0)
        await write_shared(ca, "猫粮订阅", 50.0)
        await converged([a, b], count=2)
        titles = {row[4]: row[1] for row in await shared_state(a) if row[0] == "item"}
        knowledge_id, other_id = titles["电费账单"], titles["猫粮订阅"]
        for amount, server in ((101, ca), (102, cb), (103, ca)):
            version = [row for row in await shared_state(a) if row[1] == knowledge_id][0][3]
            response = await server.post("/memory/update", json={
                "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
                "body": {"vendor": "国家电网", "amount": amount}, "idempotency_key": f"edit-{amount}"})
            assert response.status_code == 200, response.text
            await converged([a, b], count=2)
        before = await _digest(ca, knowledge_id)
        assert before == await _digest(cb, knowledge_id)
        assert (await _log(a, knowledge_id))[0] == 4

        forgot = await cb.post("/forget", json={"command": "忘记猫粮订阅", "confirm": True, "scope": "shared:home"})
        assert other_id in forgot.json()["forgotten_ids"], forgot.text
        await converged([a, b], count=1)
        for _ in range(2):  # vectors refreshed, then compacted, on both sides
            await _round(a)
            await _round(b)
        for server in (a, b):
            assert await _log(server, knowledge_id) == (1, 3)  # the winner stays, three covered moved
            assert await _log(server, other_id) == (1, 1)  # the tombstone stays, the upsert it covers moved
            assert await server.engine.read(lambda connection: connection.execute(
                "SELECT json_extract(document, '$.kind') FROM sync_ops WHERE knowledge_id = ?",
                (other_id,)).fetchone()[0]) == "tombstone"
        assert await _digest(ca, knowledge_id) == before == await _digest(cb, knowledge_id)

        c = await start_device(nursery, str(tmp_path / "c"), "C", **slow)
        async with c.client() as cc:
            await pair(cc, ca)
            state = await converged([a, b, c], count=1)
            assert ("forgotten", other_id) in state
            assert await _digest(cc, knowledge_id) == before
            assert await _log(c, knowledge_id) == (1, 3)  # C received the placeholders, never the payloads
            for _ in range(2):
                await _round(c)
            assert (await cc.get("/sync/status")).json()["pending_outgoing_ops"] == 0
            vectors = [await server.engine.read(lambda connection: connection.execute(
                "SELECT origin, contiguous FROM sync_origins ORDER BY origin").fetchall()) for server in (a, b, c)]
            assert vectors[0] == vectors[1] == vectors[2]
