"""Receipts across a real crash: ``troupe serve`` as a subprocess, killed with SIGKILL after
acknowledged writes, started again on the same data directory.  A replayed write answers the
first response and creates nothing; a changed payload is still 409; the lifecycle and update
namespaces survive too; the evidence acknowledged before the kill is structured after it."""

from __future__ import annotations

import signal

import httpx
import trio

from tests.test_serve import start_serve

from ._knowledge_harness import assert_error, bill, conversation, lifecycle, wait_until

only_knowledge = ("--listen", "admin=off", "--listen", "host=off", "--listen", "sessions=off",
                  "--listen", "character=off", "--listen", "knowledge=127.0.0.1:0")


async def _kill(running) -> None:
    running.process.send_signal(signal.SIGKILL)
    with trio.fail_after(30):
        await running.process.wait()


async def test_receipts_survive_sigkill_and_restart(tmp_path):
    data_dir = str(tmp_path / "data")
    first = await start_serve(tmp_path, "--data-dir", data_dir, *only_knowledge)
    assert first.lines[0].startswith("listening knowledge http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=first.urls["knowledge"], timeout=30) as client:
        written = await client.post("/memory/write", json=conversation())
        assert written.status_code == 200, written.text
        shared = (await client.post("/memory/write", json={**bill(), "idempotency_key": "bill-1"})).json()
        context = (await client.post("/agent/lifecycle", json=lifecycle())).json()
    await _kill(first)

    again = await start_serve(tmp_path, "--data-dir", data_dir, *only_knowledge)
    try:
        async with httpx.AsyncClient(base_url=again.urls["knowledge"], timeout=30) as client:
            assert (await client.get("/health")).json()["status"] == "ready"
            replay = await client.post("/memory/write", json=conversation())
            assert replay.status_code == 200 and replay.json() == written.json()
            assert (await client.post("/memory/write", json={**bill(), "idempotency_key": "bill-1"})).json() == shared
            assert (await client.post("/agent/lifecycle", json=lifecycle())).json() == context
            assert_error(await client.post("/memory/write", json=conversation(user="改过的")), 409, "IDEMPOTENCY_CONFLICT")
            evidence = await client.get(f"/evidence/{written.json()['evidence_id']}")
            assert evidence.status_code == 200 and evidence.json()["provenance"]["turn_id"] == "turn-03"

            async def structured():
                answer = await client.post("/agent/context", json={
                    "query": "国家电网 水电燃气", "scope": "shared:home", "session_id": "s", "turn_id": "t"})
                return answer.json()["items"]

            items = await wait_until(structured, seconds=30, step=0.2)
            assert items[0]["evidence_ids"] == [shared["evidence_id"]]
    finally:
        again.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await again.process.wait() == 0
