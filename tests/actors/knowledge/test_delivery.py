"""Insights (last 24 h, quality order, sensitive excluded, suppressed by a pending MANUAL
conflict, limit 1–10) and the digest (strict dates, local day bounds, counts only)."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.knowledge._delivery import (
    DigestCounts,
    digest,
    digest_empty_summary,
    digest_summary,
    insight_summary,
    insight_summary_body_characters,
    insights,
    insights_limit_problem,
    local_day_bounds,
    local_today,
    local_zone,
    parse_digest_date,
)
from troupe.actors.knowledge._protocol import insights_limit_max, insights_window_seconds

from .recall_helpers import open_bench

scope = "user:local"


async def test_insights_are_recent_clean_and_quality_ordered(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    old = await bench.remember({"title": "旧笔记", "body": "a"}, scope=scope, quality_score=0.99)
    bench.clock.now += insights_window_seconds + 1
    low = await bench.remember({"title": "低", "body": "b"}, scope=scope, quality_score=0.5)
    high = await bench.remember({"title": "高", "body": "c"}, scope=scope, quality_score=0.9)
    await bench.remember({"title": "密", "body": "d"}, scope=scope, quality_score=1.0, sensitivity=1)
    await bench.remember({"title": "他人", "body": "e"}, scope="user:bob", quality_score=1.0)
    found = await insights(bench.engine, bench.env, limit=insights_limit_max)
    assert [i.knowledge_id for i in found] == [high.knowledge_id, low.knowledge_id]
    assert found[0].encode() == {"title": "高", "summary": "高：c", "knowledge_id": high.knowledge_id,
                                 "score": 0.9, "kind": "recent"}
    assert old.knowledge_id not in [i.knowledge_id for i in found]
    assert len(await insights(bench.engine, bench.env, limit=1)) == 1


async def test_a_pending_manual_conflict_suppresses_everything(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    await bench.remember({"title": "备份", "body": {"enabled": True}}, scope=scope)
    assert len(await insights(bench.engine, bench.env)) == 1
    await bench.remember({"title": "备份", "body": {"enabled": True}}, scope="user:bob")
    await bench.remember({"title": "备份", "body": {"enabled": False}}, scope="user:bob")
    assert await insights(bench.engine, bench.env) == []


def test_insight_summary_is_title_and_the_start_of_the_body():
    body = "字" * (insight_summary_body_characters + 5)
    assert insight_summary("标题", body) == "标题：" + "字" * insight_summary_body_characters + "…"
    assert insight_summary("标题", "短") == "标题：短"


def test_limit_bounds():
    assert insights_limit_problem(1) is None and insights_limit_problem(10) is None
    assert insights_limit_problem(0) and insights_limit_problem(11)
    assert insights_limit_problem("3") and insights_limit_problem(True)


@pytest.mark.parametrize("text", ["2026-13-01", "2026-02-30", "2026-1-1", "today", "2026-01-01x",
                                  " 2026-01-01", "２０２６-01-01"])
def test_digest_dates_are_strict(text):
    assert parse_digest_date(text) is None


def test_digest_date_and_local_bounds():
    assert parse_digest_date("2026-02-28") == datetime.date(2026, 2, 28)
    zone = local_zone(8 * 3600)
    start, end = local_day_bounds(datetime.date(2026, 8, 29), zone)
    assert end - start == 86_400
    assert start == datetime.datetime(2026, 8, 28, 16, tzinfo=datetime.UTC).timestamp()
    just_before_midnight = datetime.datetime(2026, 8, 29, 15, 59, 59, tzinfo=datetime.UTC).timestamp()
    assert local_today(just_before_midnight, zone) == datetime.date(2026, 8, 29)
    assert local_today(just_before_midnight + 1, zone) == datetime.date(2026, 8, 30)


def test_digest_summary_uses_counts_only():
    assert digest_summary(DigestCounts()) == digest_empty_summary
    counts = DigestCounts({"directory": 8, "clipboard": 3, "behavior": 1, "unknown": 5}, quarantined=1)
    assert digest_summary(counts) == "当日新增 12 条记忆（目录 8、剪贴板 3、行为 1），另有 1 条敏感内容已隔离"
    assert digest(datetime.date(2026, 8, 29), counts).encode()["date"] == "2026-08-29"
    assert digest_summary(DigestCounts(quarantined=2)) == "当日无新记忆，另有 2 条敏感内容已隔离"
