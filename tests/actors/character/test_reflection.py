"""Fact extraction, reflection synthesis, the lifecycle, denial, corrections and history
compression with the offline ``LocalModel`` (and a scripted conversing model for the tiers),
then a whole lifecycle committed through the real store."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from troupe.actors.character._reflection import (
    DialogueLine,
    LifecycleSettings,
    ReflectionModels,
    apply_correction,
    compress_history,
    compression_threshold_messages,
    detect_denials,
    extract_dialogue_facts,
    facts_per_extraction_max,
    plan_lifecycle,
    propose_correction,
    recent_history_kept_messages,
    reflection_facts_max,
    reflection_facts_min,
    reflection_models_from_environment,
    reflection_summary,
    synthesise_reflection,
    unreflected_facts,
)
from troupe.models import Completion, LocalModel, ModelConfigurationError, OpenAIChatModel

day = 24 * 3600.0


class Ids:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count:04d}"


@dataclass
class Fact:
    id: str
    text: str
    entity: str = "master"
    created_at: float = 0.0
    event_start_at: float | None = None


@dataclass
class Reflection:
    id: str
    text: str
    status: str = "pending"
    entity: str = "master"
    created_at: float = 0.0
    updated_at: float = 0.0
    confirmed_at: float | None = None
    source_fact_ids: tuple[str, ...] = ()


@dataclass
class Entry:
    id: str
    section: str
    text: str
    status: str = "active"
    revision: int = 1


local = ReflectionModels.single()


async def test_extraction_with_the_local_model() -> None:
    lines = [
        DialogueLine("user", "我喜欢吃寿司。今天天气不错。", 10.0),
        DialogueLine("assistant", "我也喜欢看星星。", 11.0),
        DialogueLine("system", "我喜欢系统提示。", 12.0),
        DialogueLine("user", "你喜欢什么？", 13.0),
        DialogueLine("user", "我打算下周去上海。", 14.0),
    ]
    extraction = await extract_dialogue_facts(local, lines, character_name="小天",
                                              known_fact_texts=[], new_id=Ids())
    assert [(fact.text, fact.entity, fact.event_start_at) for fact in extraction.facts] == [
        ("我喜欢吃寿司。", "master", 10.0),
        ("我也喜欢看星星。", "小天", 11.0),
        ("我打算下周去上海。", "master", 14.0),
    ]
    assert [fact.id for fact in extraction.facts] == ["fact_0001", "fact_0002", "fact_0003"]
    again = await extract_dialogue_facts(local, lines, character_name="小天",
                                         known_fact_texts=["我喜欢吃寿司", "我也喜欢看星星！"], new_id=Ids())
    assert [fact.text for fact in again.facts] == ["我打算下周去上海。"]
    assert again.duplicates_skipped == 2


async def test_extraction_is_bounded() -> None:
    lines = [DialogueLine("user", f"我喜欢第{index}种水果。", float(index)) for index in range(facts_per_extraction_max + 5)]
    extraction = await extract_dialogue_facts(local, lines, character_name="小天", known_fact_texts=[], new_id=Ids())
    assert len(extraction.facts) == facts_per_extraction_max


class Scripted:
    """A conversing model answering from a queue (what an OpenAI-compatible tier would)."""

    name = "scripted"
    capabilities = frozenset({"converse", "json_object"})

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.requests = []

    async def complete(self, request):
        self.requests.append(request)
        return Completion(text=self.answers.pop(0))


async def test_extraction_through_a_conversing_summary_tier() -> None:
    model = Scripted(json.dumps({"facts": [{"line": 0, "text": "主人喜欢猫"}, {"line": 9, "text": "x", "entity": "某个很长的名字" * 20},
                                           {"text": 3}]}))
    models = ReflectionModels(summary=model, correction=LocalModel(), emotion=LocalModel())
    extraction = await extract_dialogue_facts(models, [DialogueLine("user", "猫真可爱", 5.0)],
                                              character_name="小天", known_fact_texts=[], new_id=Ids())
    assert [(fact.text, fact.entity, fact.event_start_at) for fact in extraction.facts] == [
        ("主人喜欢猫", "master", 5.0), ("x", "master", 5.0)]
    assert model.requests[0].response_format == "json"


async def test_synthesis_needs_enough_facts_of_one_entity() -> None:
    facts = [Fact(f"fact_{index}", f"主人喜欢吃寿司和生鱼片{index}", created_at=float(index),
                  event_start_at=float(100 + index)) for index in range(reflection_facts_min - 1)]
    assert await synthesise_reflection(local, facts, new_id=Ids()) is None
    facts.append(Fact("fact_x", "主人喜欢日本料理", created_at=50.0, event_start_at=300.0))
    reflection = await synthesise_reflection(local, facts, new_id=Ids())
    assert reflection is not None
    assert reflection.id == "reflection_0001" and reflection.entity == "master"
    assert reflection.source_fact_ids == ("fact_0", "fact_1", "fact_x")
    assert reflection.event_start_at == 100.0 and reflection.event_end_at == 300.0
    assert "寿司" in reflection.text
    assert reflection_summary(reflection)["status"] == "pending"
    many = [Fact(f"fact_{index:02d}", f"主人喜欢{index}号菜", created_at=float(index)) for index in range(reflection_facts_max + 3)]
    assert len((await synthesise_reflection(local, many, new_id=Ids())).source_fact_ids) == reflection_facts_max
    assert unreflected_facts(facts, [Reflection("r", "t", source_fact_ids=("fact_0",))]) == facts[1:]


async def test_lifecycle_confirm_promote_merge_archive() -> None:
    settings = LifecycleSettings(pending_expiry_seconds=10 * day, promote_after_seconds=3 * day,
                                 denied_archive_after_seconds=day)
    reflections = [
        Reflection("r_supported", "主人很喜欢吃寿司", created_at=0.0, source_fact_ids=("f_old",)),
        Reflection("r_waiting", "主人喜欢下雨天", created_at=0.0),
        Reflection("r_expired", "主人害怕打雷", created_at=-11 * day),
        Reflection("r_ready", "主人喜欢橘猫", status="confirmed", confirmed_at=-4 * day),
        Reflection("r_young", "主人喜欢爬山", status="confirmed", confirmed_at=-day),
        Reflection("r_merge", "主人每天早上喝咖啡", status="confirmed", confirmed_at=-5 * day),
        Reflection("r_denied", "主人讨厌香菜", status="denied", updated_at=-2 * day),
    ]
    facts = [Fact("f_old", "主人喜欢吃寿司", created_at=-1.0), Fact("f_new", "主人又去吃了寿司", created_at=5.0)]
    entries = [Entry("persona_coffee", "master", "主人早上喝咖啡", revision=2)]
    plan = await plan_lifecycle(local, reflections, facts, entries, now=0.5 * day, new_id=Ids(), settings=settings)
    moves = {t.reflection_id: t.to_status for t in plan.transitions}
    assert moves == {"r_supported": "confirmed", "r_expired": "archived", "r_ready": "promoted",
                     "r_merge": "merged", "r_denied": "archived"}
    merged = next(t for t in plan.transitions if t.reflection_id == "r_merge")
    assert merged.merged_into == "persona_coffee"
    writes = {(w.action, w.entry_id): w for w in plan.persona_writes}
    added = writes[("add", "persona_0001")]
    assert (added.section, added.text, added.revision) == ("master", "主人喜欢橘猫", 1)
    rewrite = writes[("rewrite", "persona_coffee")]
    assert rewrite.revision == 3 and rewrite.text == "主人早上喝咖啡；主人每天早上喝咖啡"
    assert plan.funnel_counts() == {"reflections_confirmed": 1, "reflections_archived": 2,
                                    "reflections_promoted": 1, "reflections_merged": 1,
                                    "persona_entries_added": 1, "persona_entries_rewritten": 1}
    assert (await plan_lifecycle(local, [], [], [], now=0.0, new_id=Ids())).is_empty


async def test_denial_targets_the_reflection_the_remark_is_about() -> None:
    reflections = [Reflection("r_sushi", "主人喜欢吃寿司"), Reflection("r_cat", "主人养了橘猫", status="confirmed"),
                   Reflection("r_gone", "主人喜欢寿司", status="archived")]
    lines = [DialogueLine("user", "不对，我不喜欢吃寿司", 1.0), DialogueLine("assistant", "不对，寿司", 2.0),
             DialogueLine("user", "我喜欢吃寿司", 3.0)]
    denials = await detect_denials(local, lines, reflections, now=9.0)
    assert [(d.reflection_id, d.from_status, d.to_status, d.at) for d in denials] == [
        ("r_sushi", "pending", "denied", 9.0)]
    assert await detect_denials(local, [DialogueLine("user", "不对，今天下雨", 1.0)], reflections, now=9.0) == ()
    emotion = Scripted(json.dumps({"target": "r_cat"}))
    models = ReflectionModels(summary=LocalModel(), correction=LocalModel(), emotion=emotion)
    chosen = await detect_denials(models, [DialogueLine("user", "别再提了", 1.0)], reflections, now=9.0)
    assert [d.reflection_id for d in chosen] == ["r_cat"]


async def test_corrections_local_and_conversing() -> None:
    entries = [Entry("p_sushi", "master", "主人喜欢吃寿司", revision=4), Entry("p_cat", "master", "主人养猫")]
    proposal = await propose_correction(local, entries, "其实我现在不喜欢吃寿司了")
    assert proposal is not None and proposal.entry_id == "p_sushi"
    assert proposal.proposed_text == "其实我现在不喜欢吃寿司了"
    write = apply_correction(entries[0], proposal, now=7.0)
    assert (write.action, write.revision, write.source, write.at) == ("rewrite", 5, "correction", 7.0)
    assert await propose_correction(local, entries, "今天天气很好") is None
    assert await propose_correction(local, entries, "我喜欢吃寿司") is None  # not a correction
    correction = Scripted("主人已经不喜欢吃寿司了")
    models = ReflectionModels(summary=LocalModel(), correction=correction, emotion=LocalModel())
    rewritten = await propose_correction(models, entries, "其实我现在不喜欢吃寿司了")
    assert rewritten.proposed_text == "主人已经不喜欢吃寿司了"


async def test_history_compression_thresholds() -> None:
    lines = [DialogueLine("user" if index % 2 == 0 else "assistant", f"第{index}句话，我们聊了天气。", float(index))
             for index in range(compression_threshold_messages)]
    assert await compress_history(local, lines, previous_summary="", detailed=False) is None
    more = [*lines, DialogueLine("user", "再来一句。", 99.0)]
    compressed = await compress_history(local, more, previous_summary="以前聊过猫。", detailed=False)
    assert compressed is not None
    assert len(compressed.kept) == recent_history_kept_messages
    assert compressed.compressed_count == len(more) - recent_history_kept_messages
    assert compressed.summary
    assert compressed.metadata(now=5.0)["summary"] == compressed.summary
    short = lines[:25]
    assert await compress_history(local, short, previous_summary="", detailed=False) is None
    assert (await compress_history(local, short, previous_summary="", detailed=True)).compressed_count == 5


def test_tier_models_from_the_environment() -> None:
    default = LocalModel()
    models = reflection_models_from_environment({}, default=default)
    assert models.summary is models.correction is models.emotion is default
    configured = reflection_models_from_environment(
        {"CHARACTER_MODEL_CORRECTION_BASE_URL": "http://127.0.0.1:9/v1",
         "CHARACTER_MODEL_CORRECTION_NAME": "fix-model"}, default=default)
    assert isinstance(configured.correction, OpenAIChatModel)
    assert configured.summary is default and configured.emotion is default
    with pytest.raises(ModelConfigurationError):
        reflection_models_from_environment({"CHARACTER_MODEL_EMOTION_BASE_URL": "http://x/v1"})
    assert isinstance(reflection_models_from_environment({}).summary, LocalModel)


async def test_whole_lifecycle_through_the_store(nursery, tmp_path) -> None:
    """Each step's writes, committed with the store's functions, move the funnel counters."""
    from tests.actors.character.store_helpers import open_character_engine
    from troupe.actors.character._funnel import funnel_counts
    from troupe.actors.character._store import (
        NewFact,
        NewPersonaEntry,
        add_facts,
        add_persona_entry,
        add_reflection,
        list_facts,
        list_persona_entries,
        list_reflections,
        rewrite_persona_entry,
        transition_reflection,
    )

    engine = await open_character_engine(nursery, tmp_path)
    ids = Ids()
    name = "小天"
    lines = [DialogueLine("user", text, 1.0) for text in ("我喜欢吃寿司。", "我喜欢吃生鱼片。", "我喜欢吃寿司卷。")]
    extraction = await extract_dialogue_facts(local, lines, character_name=name, known_fact_texts=[], new_id=ids)
    await engine.write(lambda connection: add_facts(connection, name, extraction.facts, 10.0))
    facts = await engine.read(lambda connection: list_facts(connection, name))
    reflection = await synthesise_reflection(local, facts, new_id=ids)
    assert reflection is not None
    await engine.write(lambda connection: add_reflection(connection, name, reflection, 20.0))
    await engine.write(lambda connection: add_facts(connection, name, [
        NewFact(id="fact_late", text="我还是最喜欢吃寿司")], 30.0))

    async def run_lifecycle(now: float) -> None:
        state = await engine.read(lambda connection: (
            list_reflections(connection, name, ("pending", "confirmed", "denied")),
            list_facts(connection, name), list_persona_entries(connection, name)))
        plan = await plan_lifecycle(local, *state, now=now, new_id=ids)

        def commit(connection) -> None:
            for transition in plan.transitions:
                assert not isinstance(transition_reflection(
                    connection, name, transition.reflection_id, transition.to_status, transition.at,
                    merged_into=transition.merged_into), str)
            for write in plan.persona_writes:
                if write.action == "add":
                    add_persona_entry(connection, name, NewPersonaEntry(write.entry_id, write.text, write.section,
                                                                        write.source), write.at)
                else:
                    rewrite_persona_entry(connection, name, write.entry_id, write.text, write.at)

        await engine.write(commit)

    await run_lifecycle(40.0)  # supported by fact_late → confirmed
    await run_lifecycle(40.0 + 4 * day)  # confirmed long enough → promoted
    counts = await engine.read(lambda connection: funnel_counts(connection, name, 0.0, 10 * day))
    assert counts["facts_added"] == 4
    assert counts["reflections_synthesized"] == 1
    assert counts["reflections_confirmed"] == 1
    assert counts["reflections_promoted"] == 1
    assert counts["persona_entries_added"] == 1
    entries = await engine.read(lambda connection: list_persona_entries(connection, name))
    assert [entry.text for entry in entries] == [reflection.text]
