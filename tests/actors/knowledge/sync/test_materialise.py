"""Materialising a batch of remote winners (``materialise_many``): a first materialisation
that meets another ACTIVE item of the same subject records its conflicts with source ``sync``
on whichever item the stable order calls new, the remote one included (it is inserted before
its conflicts are recorded: simulator seed 3 crashed the inbound actor on this), and shared
evidence is inserted once."""

from __future__ import annotations

import trio

from troupe.actors.knowledge._store import EvidenceDraft, create_knowledge, insert_evidence
from troupe.actors.knowledge.sync import (
    Operation,
    digest_and_document,
    kind_upsert,
    materialise_many,
)
from troupe.http.knowledge import new_knowledge_surface
from troupe.runtime import real_env
from troupe.storage import Engine


def _remote(knowledge_id: str, amount: int, evidence_id: str) -> tuple[Operation, str]:
    evidence = {"id": evidence_id, "source_type": "MANUAL_CONFIG", "raw": {"title": "电费账单"}, "context": None,
                "provenance": None, "quality_score": 0.5, "origin": "write", "knowledge_id": None,
                "created_at": 1.0}
    operation = Operation("dev_remote", 1, knowledge_id, "shared:home", 1, kind_upsert, {"dev_remote": 1},
                          {"title": "电费账单", "body": {"vendor": "国家电网", "amount": amount}, "status": "ACTIVE",
                           "version": 1, "entities": [], "relations": [], "origin_evidence_id": evidence_id,
                           "created_at": 1.0, "evidence": [evidence]}, 1.0)
    return operation, digest_and_document(operation)[0]


async def test_remote_items_meeting_a_local_subject_record_sync_conflicts(tmp_path):
    async with trio.open_nursery() as nursery:
        surface = new_knowledge_surface({}, os_release_text="")
        engine = await Engine.open(real_env(str(tmp_path)), nursery=nursery, migrations=list(surface.migrations))

        def local(connection):
            insert_evidence(connection, EvidenceDraft(scope="shared:home", source_type="MANUAL_CONFIG",
                                                      raw={"title": "电费账单"}), evidence_id="evd_local", now=1.0)
            create_knowledge(connection, knowledge_id="knw_m", evidence_id="evd_local", title="电费账单",
                             body={"vendor": "国家电网", "amount": 100}, now=1.0)

        await engine.write(local)
        winners = [_remote("knw_z", 120, "evd_shared"), _remote("knw_a", 130, "evd_shared")]
        shown = await engine.write(lambda connection: materialise_many(connection, winners, 2.0))
        assert [item.knowledge_id for item in shown] == ["knw_z", "knw_a"]
        rows = await engine.read(lambda connection: connection.execute(
            "SELECT knowledge_id, source FROM knowledge_conflicts ORDER BY knowledge_id").fetchall())
        # knw_z meets knw_m and is the newer (greater id): recorded on knw_z itself; knw_a then
        # meets knw_z (the subject's most recent ACTIVE item), the newer again
        assert rows == [("knw_z", "sync"), ("knw_z", "sync")]
        evidence = await engine.read(lambda connection: connection.execute(
            "SELECT COUNT(*) FROM knowledge_evidence WHERE id = 'evd_shared'").fetchone()[0])
        assert evidence == 1
        nursery.cancel_scope.cancel()
