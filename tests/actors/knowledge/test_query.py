"""``/memory/query``: hybrid + graph recall under hard scope filters, answers drawn only from
the cited sources, confidence, time ranges, the model port and its fallback."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.knowledge._query import (
    graph_query_terms_max,
    graph_terms,
    query_knowledge,
    query_top_k_max,
    time_range_window,
)
from troupe.models import Completion, ModelTimeout

from .recall_helpers import base_time, open_bench

bill = {"title": "2026年4月家庭支出清单",
        "body": {"items": [{"category": "水电燃气", "vendor": "国家电网", "amount": 210}]},
        "relations": [{"from": "国家电网", "to": "水电燃气", "type": "BELONG_TO"}]}


async def test_query_answers_from_the_cited_sources(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    first = await bench.remember(bill, scope="shared:home", source_type="OCR")
    await bench.remember({"title": "周末计划", "body": "周六去爬山"}, scope="shared:home")
    answer = await query_knowledge(bench.engine, bench.index, bench.env, "水电燃气花了多少钱",
                                   scope="shared:home")
    assert answer.source_knowledge == first.knowledge_id
    assert answer.source_evidence[0] == first.evidence_id
    assert "水电燃气" in answer.answer
    assert 0.0 < answer.confidence <= 1.0
    assert answer.encode()["latency_ms"] >= 0


async def test_scope_is_a_hard_filter(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember(bill, scope="shared:home", source_type="OCR")
    answer = await query_knowledge(bench.engine, bench.index, bench.env, "国家电网",
                                   scope="user:alice")
    assert answer.source_evidence == () and answer.source_knowledge is None
    assert answer.confidence == 0.0


async def test_the_relation_graph_finds_items_through_entities(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    item = await bench.remember(bill, scope="shared:home", source_type="OCR")
    candidates = await bench.index.recall("国家电网", scopes=frozenset({"shared:home"}), limit=5)
    assert candidates[0].knowledge_id == item.knowledge_id
    assert candidates[0].ranks.get("graph") == 1


def test_graph_terms_are_bounded():
    assert graph_terms("国家电网")[:2] == ["国家电网", "国家电"]
    assert len(graph_terms("".join(chr(0x4E00 + i) for i in range(500)))) == graph_query_terms_max


async def test_sensitive_items_can_be_left_out(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "银行卡", "body": "银行卡号"}, sensitivity=2)
    kept = await query_knowledge(bench.engine, bench.index, bench.env, "银行卡", scope="user:alice")
    assert kept.source_knowledge is not None
    left = await query_knowledge(bench.engine, bench.index, bench.env, "银行卡", scope="user:alice",
                                 include_sensitive=False)
    assert left.source_knowledge is None


class Answering:
    name = "scripted"
    capabilities = frozenset({"converse"})

    def __init__(self, outcome):
        self.outcome = outcome
        self.requests = []

    async def complete(self, request):
        self.requests.append(request)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return Completion(text=self.outcome)


async def test_a_conversing_model_answers_from_the_sources_only(nursery, tmp_path):
    model = Answering("共 210 元。")
    bench = await open_bench(nursery, tmp_path, model=model)
    await bench.remember(bill, scope="shared:home", source_type="OCR")
    answer = await query_knowledge(bench.engine, bench.index, bench.env, "电网花了多少",
                                   scope="shared:home")
    assert answer.answer == "共 210 元。"
    prompt = model.requests[-1].messages[1].content
    assert "[1] 2026年4月家庭支出清单" in prompt and "电网花了多少" in prompt


async def test_a_failing_model_falls_back_to_the_sources(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path, model=Answering(ModelTimeout("slow")))
    await bench.remember(bill, scope="shared:home", source_type="OCR")
    answer = await query_knowledge(bench.engine, bench.index, bench.env, "国家电网",
                                   scope="shared:home")
    assert "国家电网" in answer.answer


def test_time_ranges():
    now = datetime.datetime(2026, 9, 3, 12, tzinfo=datetime.UTC).timestamp()
    assert time_range_window("last_month", now) == "2026-08"
    assert time_range_window("this_month", now) == "2026-09"
    assert time_range_window("today", now) == "2026-09-03"
    assert time_range_window("last_week", now) == "2026-08-24/2026-08-30"
    assert time_range_window("2026-04", now) == "2026-04"
    assert time_range_window("someday", now) is None
    assert time_range_window(None, now) is None


async def test_time_range_filters_by_creation(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember(bill, scope="shared:home", source_type="OCR")
    window = datetime.datetime.fromtimestamp(base_time, datetime.UTC).strftime("%Y-%m")
    found = await query_knowledge(bench.engine, bench.index, bench.env, "国家电网",
                                  scope="shared:home", time_range=window)
    assert found.source_knowledge is not None
    missed = await query_knowledge(bench.engine, bench.index, bench.env, "国家电网",
                                   scope="shared:home", time_range="2020-01")
    assert missed.source_knowledge is None


@pytest.mark.parametrize("top_k", [0, query_top_k_max + 1])
async def test_top_k_outside_the_limits_is_our_bug(nursery, tmp_path, top_k):
    bench = await open_bench(nursery, tmp_path)
    with pytest.raises(AssertionError):
        await query_knowledge(bench.engine, bench.index, bench.env, "x", scope=None, top_k=top_k)
    answer = await query_knowledge(bench.engine, bench.index, bench.env, "x", scope=None,
                                   top_k=query_top_k_max)
    assert answer.source_knowledge is None


class _CountingConnection:
    """Counts the entity rows ``graph_list`` reads (its per-name lookups)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.entity_rows = 0

    def execute(self, sql: str, parameters=()):
        rows = list(self.connection.execute(sql, parameters))
        if "FROM knowledge_entities WHERE name = ?" in sql:
            self.entity_rows += len(rows)
        return iter(rows)


@pytest.mark.parametrize("names", [1, 2, 16])
async def test_the_graph_list_reads_a_bounded_number_of_entity_rows(nursery, tmp_path, names):
    """However common the names a query matches, the graph list reads at most
    ``graph_candidate_rows_max`` entity rows (matched names and neighbours together)."""
    from troupe.actors.knowledge._query import (
        graph_candidate_rows_max,
        graph_list,
        graph_rows_per_entity_max,
    )

    from .store_helpers import open_knowledge_engine

    engine = await open_knowledge_engine(nursery, tmp_path)
    per_name = graph_candidate_rows_max + 1  # each name alone is over the total budget
    people = [f"Person{number:02d}" for number in range(names)]

    def load(connection) -> None:
        for number in range(per_name):
            knowledge_id = f"knw_{number:05d}"
            connection.execute(
                "INSERT INTO knowledge_items (id, scope, status, version, title, body_json, created_at, updated_at) "
                "VALUES (?, 'user:alice', 'ACTIVE', 1, ?, '{}', ?, ?)",
                (knowledge_id, knowledge_id, base_time, base_time + number))
            for person in people:
                connection.execute("INSERT INTO knowledge_entities (knowledge_id, name) VALUES (?, ?)",
                                   (knowledge_id, person))
        connection.execute("INSERT INTO knowledge_relations (knowledge_id, position, source, target, type) "
                           "VALUES ('knw_00000', 0, ?, 'Neighbour', 'KNOWS')", (people[0],))
        connection.execute("INSERT INTO knowledge_entities (knowledge_id, name) VALUES ('knw_00000', 'Neighbour')")

    await engine.write(load)

    def read(connection):
        counting = _CountingConnection(connection)
        ranked = graph_list(counting, " ".join(people), scopes=frozenset({"user:alice"}), clean_only=True,
                            window=None)
        return counting.entity_rows, ranked

    rows, ranked = await engine.read(read)
    assert rows <= graph_candidate_rows_max
    assert rows >= min(graph_candidate_rows_max, names * graph_rows_per_entity_max) - names
    assert ranked and ranked[0] == f"knw_{per_name - 1:05d}"  # the newest ids first


async def test_an_item_committed_but_not_yet_indexed_is_in_no_list(nursery, tmp_path):
    """Structuring commits an item's rows, then indexes it.  In between, the graph list (which
    reads the rows) used to return it while the text index did not: /memory/query cited an
    item a forget plan could not find.  Now every list sees it from its index entry on."""
    from troupe.actors.knowledge._structuring import structure_evidence

    class NotYet:
        async def refresh(self, knowledge_ids, *, reindex: bool = False) -> int:
            return 0

    bench = await open_bench(nursery, tmp_path)
    evidence_id = await bench.evidence(bill, scope="shared:home", source_type="OCR")
    item = await structure_evidence(bench.engine, NotYet(), bench.env, evidence_id)
    assert await bench.rows("SELECT id FROM knowledge_items") == [(item.knowledge_id,)]
    assert await bench.index.recall("国家电网", scopes=frozenset({"shared:home"}), limit=5) == []
    await bench.index.refresh([item.knowledge_id])
    candidates = await bench.index.recall("国家电网", scopes=frozenset({"shared:home"}), limit=5)
    assert candidates[0].knowledge_id == item.knowledge_id and candidates[0].ranks.get("graph") == 1
