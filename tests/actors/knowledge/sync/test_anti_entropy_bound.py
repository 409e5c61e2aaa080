"""An anti-entropy exchange is bounded by what had arrived at its first page
(``operations_arrived``, the ``seq_max`` of ``operations_missing_documents``; ``as_of`` in the
answer, ``until_seq`` on the later pages): what arrives meanwhile is gossip's to deliver, while
compaction placeholders and operations held above a gap still travel.  The peer route checks
``until_seq`` (an integer from 0 to ``seq_unbounded``) before anything else runs."""

from __future__ import annotations

import json

import trio

from tests.http.knowledge._knowledge_harness import start_knowledge_server
from troupe.actors.knowledge.sync import (
    header_device,
    header_signature,
    header_signed_at,
    operations_arrived,
    operations_missing_documents,
    seq_unbounded,
)
from troupe.http.knowledge import new_knowledge_surface
from troupe.runtime import real_env
from troupe.storage import Engine


def _store(connection, origin: str, counter: int) -> None:
    document = json.dumps({"origin": origin, "counter": counter})
    connection.execute("INSERT INTO sync_ops (op_id, origin, counter, knowledge_id, digest, document, received_at) "
                       "VALUES (?, ?, ?, 'knw_a', ?, ?, 0)", (f"{origin}:{counter}", origin, counter,
                                                               f"{counter:064d}", document))


def _counters(documents: list[bytes]) -> list[int]:
    return [json.loads(document)["counter"] for document in documents]


async def test_what_arrives_after_the_first_page_is_left_to_gossip(tmp_path):
    async with trio.open_nursery() as nursery:
        surface = new_knowledge_surface({}, os_release_text="")
        engine = await Engine.open(real_env(str(tmp_path)), nursery=nursery, migrations=list(surface.migrations))

        def first(connection) -> int:
            for counter in (1, 2, 4):  # 3 is missing: 4 is held above a gap
                _store(connection, "dev_x", counter)
            connection.execute("INSERT INTO sync_origins (origin, contiguous) VALUES ('dev_x', 2)")
            connection.execute("INSERT INTO sync_covered (op_id, origin, counter, knowledge_id, digest) "
                               "VALUES ('dev_y:1', 'dev_y', 1, 'knw_b', ?)", ("0" * 64,))
            connection.execute("INSERT INTO sync_origins (origin, contiguous) VALUES ('dev_y', 1)")
            return operations_arrived(connection)

        arrived = await engine.write(first)
        assert arrived == 3

        def later(connection) -> None:
            _store(connection, "dev_x", 5)
            _store(connection, "dev_x", 3)
            connection.execute("UPDATE sync_origins SET contiguous = 5 WHERE origin = 'dev_x'")

        await engine.write(later)

        def missing(connection, seq_max):
            return operations_missing_documents(connection, {}, operations_max=100, bytes_max=1 << 20,
                                                seq_max=seq_max)

        bounded, more = await engine.read(lambda connection: missing(connection, arrived))
        assert _counters(bounded) == [1, 2, 4, 1] and not more  # the gap's 4 and dev_y's placeholder travel
        assert json.loads(bounded[-1])["covered"] is True
        unbounded, _ = await engine.read(lambda connection: missing(connection, None))
        assert _counters(unbounded) == [1, 2, 3, 4, 5, 1]
        nothing, _ = await engine.read(lambda connection: missing(connection, 0))
        assert _counters(nothing) == [1]  # only the placeholder
        nursery.cancel_scope.cancel()


async def test_the_peer_route_checks_until_seq_at_its_bounds(nursery, tmp_path):
    server = await start_knowledge_server(nursery, str(tmp_path))
    headers = {header_device: "dev_stranger", header_signed_at: "1", header_signature: "c2ln"}
    async with server.client() as client:
        async def exchange(until_seq):
            body = {"version_vector": {}, "members_digest": "", "until_seq": until_seq}
            return await client.post("/sync/peer/digest", json=body, headers=headers)

        for bad in (-1, seq_unbounded + 1, True, "3", 1.5):
            answer = await exchange(bad)
            assert answer.status_code == 400 and answer.json()["error"] == "INVALID_REQUEST", answer.text
        for good in (0, seq_unbounded, None):
            answer = await exchange(good)
            assert answer.status_code == 403, answer.text  # past the check: the unknown device is refused
