"""Structuring evidence into knowledge: the local extractor, the model port's enrichment and
fallback, one item per evidence however often it runs, subject merges with conflicts, update
rebuilds, forgotten evidence, and the index following the store."""

from __future__ import annotations

import json

from troupe.actors.knowledge._protocol import ConflictDetected, MemoryReady
from troupe.actors.knowledge._query import KnowledgeIndexes
from troupe.actors.knowledge._store import (
    KnowledgeUpdateDraft,
    entities_per_knowledge_max,
    update_knowledge,
)
from troupe.actors.knowledge._structuring import (
    extract_structure,
    structure_evidence,
    structure_with_model,
    title_characters_max,
)
from troupe.models import Completion, ModelUnavailable

from .recall_helpers import open_bench

bill = {
    "title": "2026年4月家庭支出清单",
    "body": {"items": [
        {"category": "水电燃气", "vendor": "国家电网", "amount": 210.0, "tags": ["电费"]},
        {"category": "水电燃气", "vendor": "市自来水公司", "amount": 68.5},
        {"category": "水电燃气", "vendor": "燃气公司", "amount": 156},
    ]},
    "entities": ["国家电网", "市自来水公司"],
    "relations": [{"from": "国家电网", "to": "水电燃气", "type": "BELONG_TO"}],
}


def test_extract_structure_keeps_declared_structure_and_finds_names():
    structure = extract_structure("OCR", bill)
    assert structure.title == "2026年4月家庭支出清单"
    assert structure.body == bill["body"]
    assert structure.entities[:2] == ("国家电网", "市自来水公司")
    assert "水电燃气" in structure.entities and "电费" in structure.entities
    assert [relation.encode() for relation in structure.relations] == bill["relations"]
    assert "国家电网" in structure.text and structure.text.startswith("2026年4月家庭支出清单")


def test_extract_structure_of_a_conversation_turn():
    structure = extract_structure(
        "CONVERSATION", {"user": "请保持回答简洁。谢谢", "assistant": "好的，我会记住。"}
    )
    assert structure.title == "请保持回答简洁"
    assert structure.body == {"user": "请保持回答简洁。谢谢", "assistant": "好的，我会记住。"}
    assert structure.entities == ()  # prose leaves are not names


def test_extract_structure_bounds_entities_and_titles():
    many = {"title": "x" * (title_characters_max + 50), "entities": [f"e{i}" for i in range(200)]}
    structure = extract_structure("MANUAL_CONFIG", many)
    assert len(structure.title) == title_characters_max
    assert len(structure.entities) == entities_per_knowledge_max


class JsonModel:
    name = "scripted"
    capabilities = frozenset({"converse"})

    def __init__(self, answer: str | Exception) -> None:
        self.answer = answer

    async def complete(self, request):
        if isinstance(self.answer, Exception):
            raise self.answer
        return Completion(text=self.answer)


async def test_model_enrichment_keeps_only_names_in_the_text():
    answer = json.dumps({"entities": ["燃气公司", "火星"], "relations": [
        {"from": "燃气公司", "to": "国家电网", "type": "PEER"},
        {"from": "火星", "to": "国家电网", "type": "INVENTED"}]})
    structure = await structure_with_model(JsonModel(answer), "OCR", bill)
    assert "燃气公司" in structure.entities and "火星" not in structure.entities
    assert [relation.type for relation in structure.relations] == ["BELONG_TO", "PEER"]


async def test_model_failure_falls_back_to_the_local_extractor():
    local = extract_structure("OCR", bill)
    assert await structure_with_model(JsonModel(ModelUnavailable("down")), "OCR", bill) == local
    assert await structure_with_model(JsonModel("not json"), "OCR", bill) == local


async def test_structuring_creates_one_item_and_announces_it(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    evidence_id = await bench.evidence(bill, scope="shared:home", source_type="OCR")
    result = await structure_evidence(bench.engine, bench.index, bench.env, evidence_id)
    assert result.created and result.version == 1 and result.scope == "shared:home"
    assert result.events == (MemoryReady(evidence_id=evidence_id, knowledge_id=result.knowledge_id,
                                         title="2026年4月家庭支出清单", scope="shared:home"),)
    again = await structure_evidence(bench.engine, bench.index, bench.env, evidence_id)
    assert again.already_structured and again.knowledge_id == result.knowledge_id
    assert again.events == ()
    assert await bench.rows("SELECT count(*) FROM knowledge_items") == [(1,)]
    assert await bench.rows("SELECT count(*) FROM knowledge_structuring") == [(0,)]
    assert await bench.rows("SELECT name FROM knowledge_entities WHERE name = '国家电网'") == [("国家电网",)]
    assert bench.index.indexed_count == 1


async def test_same_subject_merges_with_field_conflicts(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    first = await bench.remember(bill, scope="shared:home", source_type="OCR")
    changed = json.loads(json.dumps(bill))
    changed["body"]["items"][2]["amount"] = 186
    second = await bench.remember(changed, scope="shared:home", source_type="OCR")
    assert second.knowledge_id == first.knowledge_id and second.version == 2
    assert not second.created
    conflict = second.conflicts[0]
    assert (conflict.field, conflict.old_value, conflict.new_value, conflict.resolution) == (
        "body.items[2].amount", 156, 186, "NEW_WINS")
    assert isinstance(second.events[1], ConflictDetected)
    assert second.events[1].encode()["data"]["severity"] == "medium"
    (body,) = await bench.rows("SELECT body_json FROM knowledge_items")
    assert json.loads(body[0])["items"][2]["amount"] == 186
    links = await bench.rows("SELECT count(*) FROM knowledge_links")
    assert links == [(2,)]
    # Another scope with the same title is another subject.
    other = await bench.remember(changed, scope="shared:office", source_type="OCR")
    assert other.created and other.knowledge_id != first.knowledge_id


async def test_conversation_turns_never_merge(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    turn = {"user": "好的", "assistant": "收到"}
    first = await bench.remember(turn, source_type="CONVERSATION")
    second = await bench.remember(turn, source_type="CONVERSATION")
    assert first.knowledge_id != second.knowledge_id and second.created


async def test_forgotten_evidence_is_dropped_silently(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    evidence_id = await bench.evidence(bill)
    await bench.engine.write(lambda c: c.execute("DELETE FROM knowledge_evidence WHERE id = ?", (evidence_id,)))
    result = await structure_evidence(bench.engine, bench.index, bench.env, evidence_id)
    assert result.knowledge_id is None and result.events == ()
    assert await bench.rows("SELECT count(*) FROM knowledge_structuring") == [(0,)]
    assert await bench.rows("SELECT count(*) FROM knowledge_items") == [(0,)]


async def test_an_update_rebuilds_structure_and_index(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    first = await bench.remember(bill, scope="shared:home", source_type="OCR")
    draft = KnowledgeUpdateDraft(knowledge_id=first.knowledge_id, expected_version=1,
                                 scope="shared:home", body={"vendor": "南方电网", "amount": 230})
    evidence_id = bench.env.ids.new_id("evd_")
    outcome = await bench.engine.write(lambda c: update_knowledge(
        c, draft, evidence_id=evidence_id, now=bench.clock.wall(), latency_ms=1))
    assert outcome.knowledge.version == 2
    result = await structure_evidence(bench.engine, bench.index, bench.env, evidence_id)
    assert result.knowledge_id == first.knowledge_id and result.version == 2
    names = {row[0] for row in await bench.rows("SELECT name FROM knowledge_entities")}
    assert "南方电网" in names and "国家电网" not in names
    hits = await bench.index.recall("南方电网", scopes=frozenset({"shared:home"}), limit=5)
    assert [hit.knowledge_id for hit in hits] == [first.knowledge_id]
    indexed = await bench.rows("SELECT key, text, deleted FROM retrieval_items ORDER BY id")
    assert [(key.split("\x1f")[1], deleted) for key, _, deleted in indexed] == [("1", 1), ("2", 0)]
    assert "南方电网" in indexed[1][1] and "燃气公司" not in indexed[1][1]


async def test_reconciliation_repairs_a_crash_before_indexing(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    result = await bench.remember(bill, scope="shared:home", source_type="OCR")
    # A crash between the store commit and the index write: the index lost the item.
    await bench.index.index.delete([f"{result.knowledge_id}\x1f1\x1f0"])
    fresh = await KnowledgeIndexes().open(bench.engine, bench.env.embedder)
    # The new registry shares the process's MemoryIndex, re-adds the item once.
    hits = await fresh.recall("国家电网", scopes=frozenset({"shared:home"}), limit=5)
    assert [hit.knowledge_id for hit in hits] == [result.knowledge_id]


async def test_a_batch_is_structured_with_one_index_refresh_before_its_events(nursery, tmp_path, monkeypatch):
    """``RecallStructurer.structure_batch``: each evidence its own write, ONE index refresh for
    the batch, then the events (an announced item is already searchable)."""
    from types import SimpleNamespace

    from troupe.actors.knowledge import MemoryReady, RecallStructurer

    bench = await open_bench(nursery, tmp_path)
    notes = [{"title": f"项目{name}周报", "body": {"text": f"{name}负责的部分已经完成"}} for name in ("张伟", "王芳", "李娜")]
    evidence_ids = [await bench.evidence(note) for note in notes]
    calls: list[list[str]] = []
    refresh = type(bench.index).refresh

    async def counted(self, knowledge_ids, *, reindex: bool = False) -> int:
        calls.append(list(knowledge_ids))
        return await refresh(self, knowledge_ids, reindex=reindex)

    monkeypatch.setattr(type(bench.index), "refresh", counted)
    context = SimpleNamespace(storage=bench.engine, env=bench.env)
    outcomes = await RecallStructurer().structure_batch(context, [*evidence_ids, "evd_missing"])
    assert len(calls) == 1 and len(calls[0]) == 3
    assert outcomes[-1] == ()
    ready = [events[0] for events in outcomes[:-1]]
    assert all(isinstance(event, MemoryReady) for event in ready)
    assert [event.evidence_id for event in ready] == evidence_ids
    found = await bench.index.recall("王芳", scopes=frozenset({"user:alice"}), limit=5)
    assert ready[1].knowledge_id in [candidate.knowledge_id for candidate in found]
    assert await bench.rows("SELECT COUNT(*) FROM knowledge_structuring") == [(0,)]


async def test_a_batch_of_turns_takes_one_read_and_one_write_job(nursery, tmp_path, monkeypatch):
    """``structure_evidence_batch``: conversation turns share one read and one write job; other
    sources, forgotten and already structured evidence take the one-by-one path, in order."""
    from troupe.actors.knowledge import structure_evidence_batch

    bench = await open_bench(nursery, tmp_path)
    turns = [await bench.evidence({"user": f"第{number}次提到{name}", "assistant": "记住了"},
                                  source_type="CONVERSATION") for number, name in enumerate(("张伟", "王芳", "李娜"))]
    note = await bench.evidence(bill, source_type="OCR")
    done = await bench.evidence({"user": "早就结构化了", "assistant": "好"}, source_type="CONVERSATION")
    before = await structure_evidence(bench.engine, bench.index, bench.env, done)
    forgotten = await bench.evidence({"user": "会被忘记", "assistant": "好"}, source_type="CONVERSATION")
    await bench.engine.write(lambda c: c.execute("DELETE FROM knowledge_evidence WHERE id = ?", (forgotten,)))
    writes, reads = [], []
    engine_type = type(bench.engine)
    write, read = engine_type.write, engine_type.read

    async def counted_write(self, function):
        writes.append(function.__qualname__)
        return await write(self, function)

    async def counted_read(self, function):
        reads.append(function.__qualname__)
        return await read(self, function)

    monkeypatch.setattr(engine_type, "write", counted_write)
    monkeypatch.setattr(engine_type, "read", counted_read)
    ordered = [turns[0], note, turns[1], done, forgotten, turns[2]]
    results = await structure_evidence_batch(bench.engine, bench.index, bench.env, ordered)
    monkeypatch.undo()
    assert [result.evidence_id for result in results] == ordered
    assert all(result.created for result in (results[0], results[2], results[5]))
    assert results[1].created and results[1].title == "2026年4月家庭支出清单"
    assert results[3].already_structured and results[3].knowledge_id == before.knowledge_id
    assert results[4].knowledge_id is None and results[4].events == ()
    batched = [name for name in writes if name.startswith("structure_evidence_batch")]
    assert len(batched) == 1  # the three turns: one job
    assert reads[0].startswith("structure_evidence_batch")  # their situations: one read
    assert await bench.rows("SELECT count(*) FROM knowledge_structuring") == [(0,)]
    linked = await bench.rows("SELECT evidence_id, count(*) FROM knowledge_links GROUP BY evidence_id")
    assert all(count == 1 for _, count in linked) and len(linked) == 5
    hits = await bench.index.recall("王芳", scopes=frozenset({"user:alice"}), limit=5)
    assert results[2].knowledge_id in [hit.knowledge_id for hit in hits]
    # Run again: nothing new, nothing announced.
    again = await structure_evidence_batch(bench.engine, bench.index, bench.env, ordered)
    assert all(result.events == () for result in again)
    assert await bench.rows("SELECT count(*) FROM knowledge_items") == [(5,)]


async def test_a_turn_that_fails_in_a_batch_fails_alone(nursery, tmp_path, monkeypatch):
    from troupe.actors.knowledge import _structuring, structure_evidence_batch

    bench = await open_bench(nursery, tmp_path)
    turns = [await bench.evidence({"user": f"第{number}句", "assistant": "好"}, source_type="CONVERSATION")
             for number in range(3)]
    real = _structuring.create_knowledge

    def failing(connection, **options):
        if options["evidence_id"] == turns[1]:
            real(connection, **options)  # its rows are written, then rolled back with its savepoint
            raise ValueError("title is too long")
        return real(connection, **options)

    monkeypatch.setattr(_structuring, "create_knowledge", failing)
    results = await structure_evidence_batch(bench.engine, bench.index, bench.env, turns)
    assert isinstance(results[1], ValueError)
    assert results[0].created and results[2].created
    assert await bench.rows("SELECT origin_evidence_id FROM knowledge_items ORDER BY origin_evidence_id") == [
        (turns[0],), (turns[2],)]
    assert await bench.rows("SELECT evidence_id FROM knowledge_structuring") == [(turns[1],)]
