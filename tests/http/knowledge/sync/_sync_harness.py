"""Several knowledge servers on loopback (each a real hypercorn on 127.0.0.1:0 with its own
data directory, engine and actor system) with the sync actor's loop on short intervals and a
real outbound ``httpx`` client as ``env.http``; helpers to pair them and to compare their
replicated state."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from tests.http.knowledge._knowledge_harness import KnowledgeServer, bill, start_knowledge_server
from troupe.actors.knowledge.sync import SyncSettings, item_sync_state

fast_sync = SyncSettings(gossip_interval_seconds=0.05, anti_entropy_interval_seconds=0.5,
                         retry_seconds_min=0.1, retry_seconds_max=0.5)


async def start_device(nursery: trio.Nursery, data_dir: str, name: str, **options: Any) -> KnowledgeServer:
    settings = SyncSettings(**{**fast_sync.__dict__, "device_name": name, **options})
    server = await start_knowledge_server(nursery, data_dir, sync_settings=settings)
    server.env.http = httpx.AsyncClient(timeout=10)
    return server


async def pair(joiner: httpx.AsyncClient, issuer: httpx.AsyncClient, *, method: str = "QR",
               pin: str = "123456") -> dict[str, Any]:
    request = {"method": method, "ttl_seconds": 300} | ({"pin": pin} if method == "PIN" else {})
    token = (await issuer.post("/sync/token", json=request)).json()
    response = await joiner.post("/sync/pair", json={"method": method, "token": token["token"]}
                                 | ({"pin": pin} if method == "PIN" else {}))
    assert response.status_code == 200, response.text
    return response.json()


async def device_id(client: httpx.AsyncClient) -> str:
    peers = (await client.get("/sync/peers")).json()["peers"]
    return next(peer["id"] for peer in peers if peer["is_self"])


async def write_shared(client: httpx.AsyncClient, title: str, amount: float) -> str:
    document = bill(amount=amount)
    document["raw"] = {**document["raw"], "title": title}
    response = await client.post("/memory/write", json=document)
    assert response.status_code == 200, response.text
    return response.json()["evidence_id"]


async def shared_state(server: KnowledgeServer) -> list[tuple[Any, ...]]:
    """The replicated state of a device: every shared item (id, status, version, title, body)
    and every forgotten shared id."""

    def read(connection: Any) -> list[tuple[Any, ...]]:
        items = [("item", *row[:4], json.loads(row[4])) for row in connection.execute(
            "SELECT id, status, version, title, body_json FROM knowledge_items "
            "WHERE scope LIKE 'shared:%' ORDER BY id")]
        gone = [("forgotten", row[0]) for row in connection.execute(
            "SELECT id FROM knowledge_forgotten WHERE kind = 'knowledge' AND scope LIKE 'shared:%' ORDER BY id")]
        return items + gone

    return await server.engine.read(read)


async def operation_digests(server: KnowledgeServer) -> list[tuple[str, str | None]]:
    """Per item of the operation log, the digest ``/sync/state`` answers (over the operations
    no other held one covers): equal on two devices exactly when they hold the same edits."""

    def read(connection: Any) -> list[tuple[str, str | None]]:
        ids = [row[0] for row in connection.execute("SELECT DISTINCT knowledge_id FROM sync_ops ORDER BY 1")]
        return [(knowledge_id, item_sync_state(connection, knowledge_id).operation_digest) for knowledge_id in ids]

    return await server.engine.read(read)


async def converged(servers: list[KnowledgeServer], *, seconds: float = 20.0, count: int | None = None) -> list:
    """Wait until every device shows the same shared state AND holds the same operations of
    every item.  The state alone is not enough: when A's edit wins, B shows it as soon as it
    arrives, while B's losing edit may still be on its way to A (a push refused while A was
    paused is retried after a backoff), so the operation digests differ for a while yet."""
    states: list = []
    digests: list = []
    with trio.move_on_after(seconds):
        while True:
            states = [await shared_state(server) for server in servers]
            digests = [await operation_digests(server) for server in servers]
            items = [row for row in states[0] if row[0] == "item"]
            if all(state == states[0] for state in states) and all(held == digests[0] for held in digests) \
                    and (count is None or len(items) == count):
                return states[0]
            await trio.sleep(0.05)
    raise AssertionError(f"no convergence in {seconds} s: {states} {digests}")


async def item_ids(server: KnowledgeServer) -> list[str]:
    return await server.engine.read(lambda connection: [row[0] for row in connection.execute(
        "SELECT id FROM knowledge_items WHERE scope LIKE 'shared:%' ORDER BY id")])
