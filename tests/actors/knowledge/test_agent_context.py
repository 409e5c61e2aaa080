"""``/agent/context``: hard scope and sensitivity filters, items that resolve to real evidence,
the character budget at and just over its limits, honest ``truncated``, freshness labels that
never change what is returned, conflict status, request validation at the limits."""

from __future__ import annotations

import json

import pytest

from troupe.actors.knowledge._agent_context import (
    agent_context,
    agent_context_problem,
    item_line,
    max_chars_max,
    max_chars_min,
    render_context,
    top_k_max,
    top_k_min,
)
from troupe.actors.knowledge._query import EvidenceLink, KnowledgeView

from .recall_helpers import open_bench


async def build(bench, query, scope="user:alice", **options):
    return await agent_context(bench.engine, bench.index, bench.env, query=query, scope=scope,
                               session_id="session-01", turn_id="turn-04", **options)


async def test_context_lists_traceable_items(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    turn = await bench.remember({"user": "请保持回答简洁", "assistant": "好的，我会记住。"},
                                source_type="CONVERSATION")
    result = await build(bench, "请按我的习惯整理结果，回答简洁")
    assert [item.knowledge_id for item in result.items] == [turn.knowledge_id]
    item = result.items[0]
    assert item.evidence_ids == (turn.evidence_id,) and item.version == 1
    assert item.scope == "user:alice" and item.conflict_status == "none"
    assert item.freshness == "fresh" and 0 < item.confidence <= 1
    assert f"[knowledge={turn.knowledge_id}; evidence={turn.evidence_id}]" in result.context
    assert not result.truncated
    body = result.encode()
    assert (body["session_id"], body["turn_id"]) == ("session-01", "turn-04")


async def test_scope_and_sensitivity_are_hard_filters(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "简洁回答", "body": "回答要简洁"}, scope="user:bob")
    await bench.remember({"title": "简洁回答 密码", "body": "密码是 hunter2"}, sensitivity=3)
    result = await build(bench, "简洁回答")
    assert result.items == () and result.context == ""
    # The same item as a clean one is returned: the filters, not the query, removed them.
    clean = await bench.remember({"title": "简洁回答", "body": "回答要简洁"})
    result = await build(bench, "简洁回答")
    assert [item.knowledge_id for item in result.items] == [clean.knowledge_id]


async def test_items_without_real_evidence_are_dropped(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    item = await bench.remember({"title": "周末计划", "body": "周六爬山"})
    await bench.engine.write(lambda c: c.execute("DELETE FROM knowledge_evidence"))
    assert (await build(bench, "周末计划")).items == ()
    assert item.knowledge_id


async def test_freshness_labels_never_filter(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "周末计划", "body": "周六爬山"})
    bench.clock.now += 100
    fresh = await build(bench, "周末计划", freshness_seconds=100)
    stale = await build(bench, "周末计划", freshness_seconds=99)
    assert [i.freshness for i in fresh.items] == ["fresh"]
    assert [i.freshness for i in stale.items] == ["stale"]
    assert [i.knowledge_id for i in fresh.items] == [i.knowledge_id for i in stale.items]


async def test_conflict_status_and_version(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "自动备份", "body": {"enabled": True, "hour": 2}})
    second = await bench.remember({"title": "自动备份", "body": {"enabled": False, "hour": 2}})
    result = await build(bench, "自动备份")
    assert [(i.version, i.conflict_status) for i in result.items] == [(2, "manual")]
    assert result.items[0].knowledge_id == second.knowledge_id


def view(index: int, body_characters: int) -> KnowledgeView:
    return KnowledgeView(
        knowledge_id=f"knw_{index}", scope="user:alice", status="ACTIVE", version=1,
        title=f"t{index}", body="x" * body_characters, created_at=0.0, updated_at=0.0,
        evidence=(EvidenceLink(f"evd_{index}", 0, 0.9, 0.0),), conflicts=(),
    )


def test_budget_at_and_just_over_the_limit():
    views = [view(1, 40), view(2, 40)]
    exact = len(item_line(views[0])) + 1 + len(item_line(views[1]))
    context, included, truncated = render_context(views, exact)
    assert len(context) == exact and len(included) == 2 and not truncated
    context, included, truncated = render_context(views, exact - 1)
    assert len(context) == exact - 1 and truncated and len(included) == 2
    assert context.endswith("[knowledge=knw_2; evidence=evd_2]") and "…" in context


def test_a_line_too_short_to_cut_is_left_out():
    views = [view(1, 10), view(2, 500)]
    first = len(item_line(views[0]))
    context, included, truncated = render_context(views, first + 20)
    assert context == item_line(views[0]) and [v.knowledge_id for v in included] == ["knw_1"]
    assert truncated


@pytest.mark.parametrize("max_chars", [max_chars_min, 100, 1000, max_chars_max])
async def test_context_never_exceeds_max_chars(nursery, tmp_path, max_chars):
    bench = await open_bench(nursery, tmp_path)
    for index in range(6):
        await bench.remember({"title": f"项目笔记 {index}", "body": "项目进度" * 200})
    result = await build(bench, "项目笔记", top_k=top_k_max, max_chars=max_chars)
    assert len(result.context) <= max_chars
    assert result.truncated == (max_chars < 6 * 850)
    lines = result.context.split("\n") if result.context else []
    assert len(lines) == len(result.items)
    for line, item in zip(lines, result.items, strict=True):
        assert f"knowledge={item.knowledge_id};" in line


async def test_top_k_bounds_the_items(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    for index in range(4):
        await bench.remember({"title": f"笔记 {index}", "body": "笔记内容"})
    assert len((await build(bench, "笔记", top_k=top_k_min)).items) == 1
    assert len((await build(bench, "笔记", top_k=3)).items) == 3


async def test_an_empty_query_lists_the_newest_items(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "旧", "body": "a"})
    bench.clock.now += 1
    newer = await bench.remember({"title": "新", "body": "b"})
    result = await build(bench, "", top_k=1)
    assert [i.knowledge_id for i in result.items] == [newer.knowledge_id]


def valid(**changes):
    request = dict(query="q", scope="user:alice", session_id="s", turn_id="t", top_k=5,
                   max_chars=4000, freshness_seconds=2592000)
    request.update(changes)
    return agent_context_problem(**request)


def test_request_limits():
    assert valid() is None
    assert valid(top_k=top_k_min) is None and valid(top_k=top_k_max) is None
    assert valid(top_k=top_k_min - 1) and valid(top_k=top_k_max + 1) and valid(top_k=True)
    assert valid(max_chars=max_chars_min) is None and valid(max_chars=max_chars_max) is None
    assert valid(max_chars=max_chars_min - 1) and valid(max_chars=max_chars_max + 1)
    assert valid(session_id="") and valid(turn_id=None) and valid(scope="alice")
    assert valid(freshness_seconds=-1)
    assert json.dumps(valid(top_k=0))
