"""Rounds at scale and at rest: two devices forcing a round on each other at once finish at
once (the peers' requests go to the inbound actor, never behind a busy turn), an idle
anti-entropy round costs a few hundred bytes per peer (vectors, no operations), and a page of
operations is cut at ``push_operations_max`` and ``push_body_bytes_max``."""

from __future__ import annotations

import time

import apsw
import httpx
import trio

from tests.http.knowledge._knowledge_harness import wait_until
from troupe.actors.knowledge.sync import (
    RunSyncRound,
    SyncRoundDone,
    operations_body,
    operations_missing_documents,
    sync_key,
    sync_kind_name,
)
from troupe.actors.knowledge.sync._schema import sync_covered_sql

from ._sync_harness import converged, item_ids, pair, start_device, write_shared

idle_round_bytes_per_peer_max = 1_000
"""An idle anti-entropy exchange with one peer: two small vectors and a signed envelope."""


async def _round(server, anti_entropy: bool = True) -> SyncRoundDone:
    return await server.system.ref(sync_kind_name, sync_key).ask(RunSyncRound(anti_entropy=anti_entropy), timeout=30)


async def test_two_devices_forcing_rounds_on_each_other_at_once_finish_quickly(nursery, tmp_path):
    slow = {"gossip_interval_seconds": 30.0, "anti_entropy_interval_seconds": 60.0}
    a = await start_device(nursery, str(tmp_path / "a"), "A", **slow)
    b = await start_device(nursery, str(tmp_path / "b"), "B", **slow)
    async with a.client() as ca, b.client() as cb:
        await pair(cb, ca)
        await write_shared(ca, "电费账单", 210.0)
        await write_shared(cb, "水费账单", 80.0)
        await wait_until(lambda: _outbox_empty(a))
        await wait_until(lambda: _outbox_empty(b))
        started = time.perf_counter()
        results: dict[str, SyncRoundDone] = {}
        async with trio.open_nursery() as both:
            for name, server in (("a", a), ("b", b)):
                both.start_soon(lambda name=name, server=server: _keep(results, name, _round(server)))
        elapsed = time.perf_counter() - started
        assert elapsed < 5.0, elapsed  # the peer timeout is 10 s: nobody waited for it
        assert results["a"].peers_reached == 1 and results["b"].peers_reached == 1
        await converged([a, b], count=2, seconds=10)


async def _keep(results, name, awaitable):
    results[name] = await awaitable


async def _outbox_empty(server) -> bool:
    captured = await server.engine.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM knowledge_items WHERE scope LIKE 'shared:%'").fetchone()[0])
    return captured >= 1


async def test_an_idle_anti_entropy_round_exchanges_vectors_only(nursery, tmp_path):
    a = await start_device(nursery, str(tmp_path / "a"), "A", anti_entropy_interval_seconds=60.0)
    b = await start_device(nursery, str(tmp_path / "b"), "B", anti_entropy_interval_seconds=60.0)
    c = await start_device(nursery, str(tmp_path / "c"), "C", anti_entropy_interval_seconds=60.0)
    async with a.client() as ca, b.client() as cb, c.client() as cc:
        await pair(cb, ca)
        await pair(cc, ca)
        await pair(cc, cb)
        for client, title in ((ca, "电费"), (cb, "水费"), (cc, "燃气费")):
            for index in range(5):
                await write_shared(client, f"{title}账单{index}", 10.0 + index)
        await converged([a, b, c], count=15, seconds=20)
        for server in (a, b, c):
            await _round(server)  # every vector each device keeps of its peers is current
        counted = {"out": 0, "in": 0, "requests": 0}

        async def request_hook(request: httpx.Request) -> None:
            counted["requests"] += 1
            counted["out"] += len(request.content or b"") + sum(len(k) + len(v) for k, v in request.headers.raw)

        async def response_hook(response: httpx.Response) -> None:
            await response.aread()
            counted["in"] += len(response.content or b"")

        a.env.http = httpx.AsyncClient(timeout=10, event_hooks={"request": [request_hook],
                                                                "response": [response_hook]})
        done = await _round(a)
        assert done.peers_reached == 2 and done.pushed == 0 and done.pulled == 0
        assert counted["requests"] == 2, counted  # one exchange per peer
        assert counted["out"] + counted["in"] <= 2 * idle_round_bytes_per_peer_max, counted
        assert len(await item_ids(a)) == 15


_log_sql = """
    CREATE TABLE sync_ops (seq INTEGER PRIMARY KEY AUTOINCREMENT, op_id TEXT NOT NULL UNIQUE,
        origin TEXT NOT NULL, counter INTEGER NOT NULL, knowledge_id TEXT NOT NULL, digest TEXT NOT NULL,
        document TEXT NOT NULL, received_at REAL NOT NULL);
    CREATE TABLE sync_origins (origin TEXT PRIMARY KEY, contiguous INTEGER NOT NULL) WITHOUT ROWID;
"""


def _log(documents: int, size: int) -> apsw.Connection:
    connection = apsw.Connection(":memory:")
    connection.execute(_log_sql)
    connection.execute(sync_covered_sql)

    for counter in range(1, documents + 1):
        document = '{"counter":%d,"pad":"%s"}' % (counter, "x" * size)
        connection.execute("INSERT INTO sync_ops (op_id, origin, counter, knowledge_id, digest, document, "
                           "received_at) VALUES (?, 'dev_a', ?, 'knw_1', '', ?, 0)",
                           (f"dev_a:{counter}", counter, document))
    connection.execute("INSERT INTO sync_origins VALUES ('dev_a', ?)", (documents,))
    return connection


def test_a_page_is_cut_at_its_operation_and_byte_limits():
    connection = _log(10, 100)
    found, more = operations_missing_documents(connection, {}, operations_max=10, bytes_max=10**6)
    assert len(found) == 10 and not more  # exactly at the operation limit
    found, more = operations_missing_documents(connection, {}, operations_max=9, bytes_max=10**6)
    assert len(found) == 9 and more  # one over it
    one = len(found[0])  # every document has this size; a page is documents joined by commas
    found, more = operations_missing_documents(connection, {}, operations_max=10, bytes_max=3 * one + 2)
    assert len(found) == 3 and more
    found, more = operations_missing_documents(connection, {}, operations_max=10, bytes_max=3 * one + 1)
    assert len(found) == 2 and more
    found, more = operations_missing_documents(connection, {}, operations_max=10, bytes_max=1)
    assert len(found) == 1 and more  # a page always carries one operation
    found, more = operations_missing_documents(connection, {"dev_a": 8}, operations_max=10, bytes_max=10**6)
    assert [document[:14] for document in found] == [b'{"counter":9,"', b'{"counter":10,'] and not more
    body = operations_body(found, version_vector={"dev_a": 10})
    assert body.startswith(b'{"version_vector":{"dev_a":10},"operations":[{"counter":9')
