"""``/preference/extract``: local rules (Chinese and English, negations), the model port with
validation and fallback, versions kept per (scope, key), sensitive evidence not read, unknown
evidence refused."""

from __future__ import annotations

import json

from troupe.actors.knowledge._preferences import (
    extract_preferences,
    local_preferences,
    preference_problem,
)
from troupe.actors.knowledge._protocol import KnowledgeRefused
from troupe.actors.knowledge._store import list_preferences, preference_history
from troupe.models import Completion, ModelUnavailable

from .recall_helpers import open_bench


def test_local_rules():
    assert local_preferences("请保持回答简洁") == [
        ("OUTPUT_STYLE", "output_style.compact", {"enabled": True})]
    assert local_preferences("不要太简洁") == [
        ("OUTPUT_STYLE", "output_style.compact", {"enabled": False})]
    assert local_preferences("执行前先确认一下。不要保存我的密码") == [
        ("OP_HABIT", "op_habit.confirm_before_action", {"enabled": True}),
        ("SECURITY_POLICY", "security_policy.no_secrets", {"enabled": True})]
    assert local_preferences("Keep answers concise, please.") == [
        ("OUTPUT_STYLE", "output_style.compact", {"enabled": True})]
    assert local_preferences("今天天气不错") == []


def test_model_proposals_are_validated():
    good = {"category": "OP_HABIT", "key": "op_habit.dark_mode", "value": {"on": True}, "confidence": 0.9}
    assert preference_problem(good) is None
    assert preference_problem({**good, "category": "FOOD"})
    assert preference_problem({**good, "key": "Not A Key"})
    assert preference_problem({**good, "value": "yes"})
    assert preference_problem({**good, "confidence": 1.5})
    assert preference_problem({**good, "key": "a." + "b" * 126}) is None  # 128 characters
    assert preference_problem({**good, "key": "a." + "b" * 127})  # 129


async def test_extract_stores_versions(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    first = await bench.evidence({"user": "回答不要太简洁", "assistant": "好的"}, source_type="CONVERSATION")
    result = await extract_preferences(bench.engine, bench.env, [first])
    (preference,) = result.extracted_preferences
    assert (preference.category, preference.key, preference.value) == (
        "OUTPUT_STYLE", "output_style.compact", {"enabled": False})
    second = await bench.evidence({"user": "请保持回答简洁", "assistant": "好的"}, source_type="CONVERSATION")
    bench.clock.now += 60
    again = await extract_preferences(bench.engine, bench.env, [second])
    assert again.extracted_preferences[0].id == preference.id
    history = await bench.engine.read(lambda c: preference_history(c, preference.id))
    assert [(v.version, v.value) for v in history] == [(1, {"enabled": False}), (2, {"enabled": True})]
    stored = await bench.engine.read(lambda c: list_preferences(c, "user:alice"))
    assert [(p.key, p.version) for p in stored] == [("output_style.compact", 2)]
    # The same value again adds no version.
    third = await bench.evidence({"user": "简洁一点", "assistant": "好"}, source_type="CONVERSATION")
    await extract_preferences(bench.engine, bench.env, [third])
    history = await bench.engine.read(lambda c: preference_history(c, preference.id))
    assert len(history) == 2


async def test_unknown_evidence_is_refused_and_sensitive_evidence_not_read(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path)
    refused = await extract_preferences(bench.engine, bench.env, ["evd_missing"])
    assert isinstance(refused, KnowledgeRefused) and refused.status == 404
    secret = await bench.evidence({"title": "简洁", "body": "请简洁，密码是 hunter2"}, sensitivity=3)
    result = await extract_preferences(bench.engine, bench.env, [secret])
    assert result.extracted_preferences == ()


class Proposing:
    name = "scripted"
    capabilities = frozenset({"converse"})

    def __init__(self, outcome):
        self.outcome = outcome

    async def complete(self, request):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return Completion(text=self.outcome)


async def test_the_model_port_proposes_and_invalid_proposals_are_dropped(nursery, tmp_path):
    answer = json.dumps({"preferences": [
        {"category": "OUTPUT_STYLE", "key": "output_style.emoji", "value": {"enabled": False},
         "confidence": 0.8},
        {"category": "FOOD", "key": "food.tea", "value": {"likes": True}}]})
    bench = await open_bench(nursery, tmp_path, model=Proposing(answer))
    evidence = await bench.evidence({"title": "风格", "body": "别用表情"})
    result = await extract_preferences(bench.engine, bench.env, [evidence])
    assert [p.key for p in result.extracted_preferences] == ["output_style.emoji"]


async def test_a_failing_model_falls_back_to_the_rules(nursery, tmp_path):
    bench = await open_bench(nursery, tmp_path, model=Proposing(ModelUnavailable("down")))
    evidence = await bench.evidence({"title": "风格", "body": "请保持回答简洁"})
    result = await extract_preferences(bench.engine, bench.env, [evidence])
    assert [p.key for p in result.extracted_preferences] == ["output_style.compact"]
