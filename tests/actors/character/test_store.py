"""The character store on a real engine: names, recent history and its compression swap,
raw time rows and the last conversation time, facts and their archive, reflections and their
lifecycle, persona entries and corrections, surfacing, documents, the change feed the recall
index follows, and every bound at and just over its limit."""

from __future__ import annotations

import pytest

from troupe.actors.character import (
    HistoryMessage,
    NewFact,
    NewPersonaEntry,
    NewReflection,
    _store,
    add_facts,
    add_persona_entry,
    add_reflection,
    append_recent,
    append_time_indexed,
    archive_facts,
    archive_persona_entry,
    character_exists,
    character_name_characters_max,
    character_name_problem,
    content_text,
    fact_count,
    fold_recent_prefix,
    funnel_counts,
    get_correction,
    get_reflection,
    iterate_memories,
    last_conversation_at,
    list_characters,
    list_facts,
    list_persona_entries,
    list_reflections,
    memory_changes,
    memory_version,
    message_content_characters_max,
    messages_per_append_max,
    read_document,
    read_recent,
    read_recent_meta,
    read_recent_positioned,
    read_time_indexed,
    recent_history_messages_max,
    record_correction,
    record_surfaced,
    replace_recent,
    reset_confirmed_at,
    rewrite_persona_entry,
    set_correction_state,
    surfaced_ids_per_call_max,
    surfaced_times,
    time_indexed_between,
    transition_reflection,
    write_document,
)
from troupe.storage import StorageError

from .store_helpers import base_time, open_character_engine

refused = (ValueError, StorageError)


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_character_engine(nursery, tmp_path)


def user(text: str) -> HistoryMessage:
    return HistoryMessage("user", text)


# -- names ---------------------------------------------------------------------------------


def test_character_names_at_their_boundaries():
    assert character_name_problem("小天") is None
    assert character_name_problem("Lan Lan") is None
    assert character_name_problem("a" * character_name_characters_max) is None
    assert character_name_problem("a" * (character_name_characters_max + 1)) is not None
    for bad in ("", " 小天", "小天 ", "a/b", "a\\b", "..", "a..b", "a\nb", "a\x00b", "a\x7fb",
                "a\u2028b"):
        assert character_name_problem(bad) is not None, bad
    assert character_name_problem("a.b") is None
    assert character_name_problem("猫\u200d💻") is None  # an emoji sequence's joiner


# -- recent history ------------------------------------------------------------------------


async def test_recent_history_appends_and_keeps_the_newest(engine):
    assert await engine.write(lambda c: append_recent(c, "小天", [], base_time)) == 0
    messages = [user(f"m{index}") for index in range(recent_history_messages_max)]
    await engine.write(lambda c: append_recent(c, "小天", messages, base_time))
    recent = await engine.read(lambda c: read_recent(c, "小天"))
    assert len(recent) == recent_history_messages_max
    assert recent[0].content == "m0"
    await engine.write(lambda c: append_recent(
        c, "小天", [HistoryMessage("assistant", ({"type": "text", "text": "hi"},))], base_time + 1))
    recent = await engine.read(lambda c: read_recent(c, "小天"))
    assert len(recent) == recent_history_messages_max
    assert recent[0].content == "m1"
    assert (recent[-1].role, recent[-1].content, recent[-1].at) == (
        "assistant", [{"type": "text", "text": "hi"}], base_time + 1)
    last_two = await engine.read(lambda c: read_recent(c, "小天", 2))
    assert [message.content for message in last_two][0] == f"m{recent_history_messages_max - 1}"
    assert await engine.read(lambda c: read_recent(c, "nobody")) == []


async def test_message_bounds_are_enforced_before_anything_is_written(engine):
    limit = message_content_characters_max
    await engine.write(lambda c: append_recent(c, "小天", [user("x" * limit)], base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: append_recent(
            c, "小天", [user("ok"), user("x" * (limit + 1))], base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: append_recent(c, "小天", [HistoryMessage("tool", "x")], base_time))
    many = [user("m")] * messages_per_append_max
    await engine.write(lambda c: append_time_indexed(c, "小天", many, base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: append_time_indexed(c, "小天", many + [user("m")], base_time))
    assert len(await engine.read(lambda c: read_recent(c, "小天"))) == 1


async def test_a_compression_swaps_the_window_and_its_metadata_at_once(engine):
    await engine.write(lambda c: append_recent(c, "小天", [user("a"), user("b"), user("c")], base_time))
    assert await engine.read(lambda c: read_recent_meta(c, "小天")) == {}
    summary = HistoryMessage("system", "先前的对话摘要")
    await engine.write(lambda c: replace_recent(
        c, "小天", [summary, user("c")], {"compressed_at": base_time + 5, "dropped": 2},
        base_time + 5))
    recent = await engine.read(lambda c: read_recent(c, "小天"))
    assert [message.content for message in recent] == ["先前的对话摘要", "c"]
    assert await engine.read(lambda c: read_recent_meta(c, "小天")) == {
        "compressed_at": base_time + 5, "dropped": 2}
    await engine.write(lambda c: append_recent(c, "小天", [user("d")], base_time + 6))
    assert [m.content for m in await engine.read(lambda c: read_recent(c, "小天"))] == [
        "先前的对话摘要", "c", "d"]
    too_many = [user("m")] * (recent_history_messages_max + 1)
    with pytest.raises(refused):
        await engine.write(lambda c: replace_recent(c, "小天", too_many, {}, base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: replace_recent(
            c, "小天", [], {"blob": "x" * _store.recent_meta_bytes_max}, base_time))


async def test_folding_a_prefix_keeps_what_was_appended_after_the_read(engine):
    await engine.write(lambda c: append_recent(c, "小天", [user("a"), user("b"), user("c")], base_time))
    positioned = await engine.read(lambda c: read_recent_positioned(c, "小天"))
    assert [message.content for _, message in positioned] == ["a", "b", "c"]
    assert [position for position, _ in positioned] == sorted(position for position, _ in positioned)
    # A turn appends while the compression of a, b runs: only a, b are folded.
    await engine.write(lambda c: append_recent(c, "小天", [user("d")], base_time + 1))
    through = positioned[1][0]
    left = await engine.write(lambda c: fold_recent_prefix(c, "小天", through, {"summary": "a b"}, base_time + 2))
    assert left == 2
    assert [m.content for m in await engine.read(lambda c: read_recent(c, "小天"))] == ["c", "d"]
    assert await engine.read(lambda c: read_recent_meta(c, "小天")) == {"summary": "a b"}
    # Positions keep growing after a fold, so a later fold never takes a newer message.
    await engine.write(lambda c: append_recent(c, "小天", [user("e")], base_time + 3))
    positions = [position for position, _ in await engine.read(lambda c: read_recent_positioned(c, "小天"))]
    assert positions == sorted(positions) and positions[0] > through
    # The metadata bound holds at and just over its limit (the JSON text's bytes).
    fits = {"s": "x" * (_store.recent_meta_bytes_max - len('{"s":""}'))}
    await engine.write(lambda c: fold_recent_prefix(c, "小天", -1, fits, base_time + 4))
    with pytest.raises(refused):
        await engine.write(lambda c: fold_recent_prefix(
            c, "小天", -1, {"s": "x" * (_store.recent_meta_bytes_max - len('{"s":""}') + 1)}, base_time + 4))
    assert len(await engine.read(lambda c: read_recent(c, "小天"))) == 3


# -- raw rows ------------------------------------------------------------------------------


async def test_raw_rows_and_the_last_conversation_time(engine):
    assert await engine.read(lambda c: last_conversation_at(c, "小天")) is None
    parts = HistoryMessage("user", ({"type": "text", "text": "看"}, {"type": "image_url"}, "图"))
    seqs = await engine.write(lambda c: append_time_indexed(c, "小天", [user("早"), parts], base_time))
    assert len(seqs) == 2 and seqs[0] < seqs[1]
    await engine.write(lambda c: append_time_indexed(c, "小天", [user("晚")], base_time + 100))
    # A clock step back never moves the last conversation time backwards.
    await engine.write(lambda c: append_time_indexed(c, "小天", [user("回")], base_time + 50))
    assert await engine.read(lambda c: last_conversation_at(c, "小天")) == base_time + 100
    rows = await engine.read(lambda c: read_time_indexed(c, "小天"))
    assert [row.content_text for row in rows] == ["早", "看\n图", "晚", "回"]
    assert rows[1].content[1] == {"type": "image_url"}
    after = await engine.read(lambda c: read_time_indexed(c, "小天", seqs[1]))
    assert [row.content_text for row in after] == ["晚", "回"]
    window = await engine.read(lambda c: time_indexed_between(c, "小天", base_time + 1, base_time + 100))
    assert [row.content_text for row in window] == ["回", "晚"]
    assert await engine.write(lambda c: append_time_indexed(c, "小天", [], base_time)) == []


async def test_raw_rows_keep_the_newest_per_character(engine, monkeypatch):
    monkeypatch.setattr(_store, "time_indexed_rows_per_character_max", 3)
    await engine.write(lambda c: append_time_indexed(c, "小天", [user("1"), user("2"), user("3")], base_time))
    await engine.write(lambda c: append_time_indexed(c, "other", [user("o")], base_time))
    assert len(await engine.read(lambda c: read_time_indexed(c, "小天"))) == 3
    await engine.write(lambda c: append_time_indexed(c, "小天", [user("4"), user("5")], base_time))
    assert [row.content_text for row in await engine.read(lambda c: read_time_indexed(c, "小天"))] == [
        "3", "4", "5"]
    assert len(await engine.read(lambda c: read_time_indexed(c, "other"))) == 1


def test_content_text_of_parts():
    assert content_text("纯文本") == "纯文本"
    assert content_text([{"type": "text", "text": "a"}, {"type": "image"}, "b"]) == "a\nb"


# -- facts and the change feed ---------------------------------------------------------------


async def test_facts_archive_and_the_change_feed(engine):
    facts = [NewFact("fact_1", "喜欢寿司", event_start_at=base_time - 86400),
             NewFact("fact_2", "住在上海", entity="master")]
    added = await engine.write(lambda c: add_facts(c, "小天", facts, base_time))
    assert [fact.status for fact in added] == ["active", "active"]
    assert await engine.read(lambda c: fact_count(c, "小天")) == 2
    version = await engine.read(lambda c: memory_version(c, "小天"))
    changes = await engine.read(lambda c: memory_changes(c, "小天", 0))
    assert [(record.id, record.tier) for record in changes.upserts] == [
        ("fact_1", "fact"), ("fact_2", "fact")]
    assert changes.through_seq == version and changes.complete
    assert await engine.write(lambda c: archive_facts(c, "小天", ["fact_1", "nope"], base_time + 1)) == 1
    assert await engine.write(lambda c: archive_facts(c, "小天", ["fact_1"], base_time + 1)) == 0
    changes = await engine.read(lambda c: memory_changes(c, "小天", version))
    assert [(record.id, record.tier) for record in changes.upserts] == [("fact_1", "fact_archive")]
    assert await engine.read(lambda c: fact_count(c, "小天", "archived")) == 1
    archive = await engine.read(lambda c: list_facts(c, "小天", "archived"))
    assert archive[0].archived_at == base_time + 1
    walk = await engine.read(lambda c: iterate_memories(c, "小天", "fact"))
    assert [record.id for record in walk] == ["fact_2"]
    counts = await engine.read(lambda c: funnel_counts(c, "小天", base_time, base_time))
    assert counts["facts_added"] == 2


async def test_facts_beyond_the_bound_archive_the_oldest_then_delete_with_tombstones(engine, monkeypatch):
    monkeypatch.setattr(_store, "facts_per_character_max", 2)
    monkeypatch.setattr(_store, "facts_archived_per_character_max", 1)
    await engine.write(lambda c: add_facts(c, "小天", [NewFact("fact_1", "一"), NewFact("fact_2", "二")], base_time))
    assert await engine.read(lambda c: fact_count(c, "小天")) == 2
    await engine.write(lambda c: add_facts(c, "小天", [NewFact("fact_3", "三")], base_time + 1))
    assert [fact.id for fact in await engine.read(lambda c: list_facts(c, "小天"))] == ["fact_3", "fact_2"]
    assert [fact.id for fact in await engine.read(lambda c: list_facts(c, "小天", "archived"))] == ["fact_1"]
    before = await engine.read(lambda c: memory_version(c, "小天"))
    await engine.write(lambda c: add_facts(c, "小天", [NewFact("fact_4", "四")], base_time + 2))
    assert await engine.read(lambda c: fact_count(c, "小天", "archived")) == 1
    changes = await engine.read(lambda c: memory_changes(c, "小天", before))
    assert changes.removals == ["fact_1"]
    assert {record.id for record in changes.upserts} == {"fact_4", "fact_2"}


async def test_fact_text_and_batch_bounds(engine, monkeypatch):
    limit = _store.memory_text_characters_max
    await engine.write(lambda c: add_facts(c, "小天", [NewFact("fact_1", "x" * limit)], base_time))
    for bad in (NewFact("fact_2", "x" * (limit + 1)), NewFact("fact_3", ""),
                NewFact("fact_4", "ok", entity="e" * (_store.entity_characters_max + 1))):
        with pytest.raises(refused):
            await engine.write(lambda c, bad=bad: add_facts(c, "小天", [bad], base_time))
    monkeypatch.setattr(_store, "facts_per_add_max", 2)
    with pytest.raises(refused):
        await engine.write(lambda c: add_facts(
            c, "小天", [NewFact(f"fact_b{index}", "x") for index in range(3)], base_time))
    await engine.write(lambda c: add_facts(
        c, "小天", [NewFact(f"fact_b{index}", "x") for index in range(2)], base_time))


async def test_pruned_tombstones_make_the_feed_incomplete(engine, monkeypatch):
    monkeypatch.setattr(_store, "memory_tombstones_per_character_max", 1)
    monkeypatch.setattr(_store, "facts_archived_per_character_max", 0)
    await engine.write(lambda c: add_facts(c, "小天", [NewFact("fact_1", "一"), NewFact("fact_2", "二")], base_time))
    start = await engine.read(lambda c: memory_version(c, "小天"))
    await engine.write(lambda c: archive_facts(c, "小天", ["fact_1"], base_time))
    assert (await engine.read(lambda c: memory_changes(c, "小天", start))).complete
    await engine.write(lambda c: archive_facts(c, "小天", ["fact_2"], base_time))
    changes = await engine.read(lambda c: memory_changes(c, "小天", start))
    assert not changes.complete
    latest = await engine.read(lambda c: memory_changes(c, "小天", start + 1))
    assert latest.complete and latest.removals == ["fact_2"]


async def test_the_change_feed_pages_by_sequence(engine, monkeypatch):
    monkeypatch.setattr(_store, "memory_change_seqs_per_page", 2)
    for index in range(3):
        await engine.write(lambda c, index=index: add_facts(
            c, "小天", [NewFact(f"fact_{index}", "x")], base_time))
    first = await engine.read(lambda c: memory_changes(c, "小天", 0))
    assert [record.id for record in first.upserts] == ["fact_0", "fact_1"]
    second = await engine.read(lambda c: memory_changes(c, "小天", first.through_seq))
    assert [record.id for record in second.upserts] == ["fact_2"]
    assert second.through_seq == await engine.read(lambda c: memory_version(c, "小天"))


# -- reflections ---------------------------------------------------------------------------


async def test_the_reflection_lifecycle_and_its_funnel_events(engine):
    reflection = await engine.write(lambda c: add_reflection(
        c, "小天", NewReflection("reflection_1", "主人最近很忙", source_fact_ids=("fact_1",)), base_time))
    assert (reflection.status, reflection.source_fact_ids) == ("pending", ("fact_1",))
    confirmed = await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_1", "confirmed", base_time + 1))
    assert (confirmed.status, confirmed.confirmed_at) == ("confirmed", base_time + 1)
    assert await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_1", "pending", base_time + 2)) == "a reflection never returns to pending"
    assert isinstance(await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_1", "confirmed", base_time + 2)), str)
    assert await engine.write(lambda c: transition_reflection(
        c, "小天", "missing", "confirmed", base_time)) == "unknown reflection"
    promoted = await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_1", "promoted", base_time + 3))
    assert promoted.promoted_at == base_time + 3
    await engine.write(lambda c: transition_reflection(c, "小天", "reflection_1", "archived", base_time + 4))
    assert isinstance(await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_1", "denied", base_time + 5)), str)
    await engine.write(lambda c: add_reflection(c, "小天", NewReflection("reflection_2", "b"), base_time))
    await engine.write(lambda c: transition_reflection(
        c, "小天", "reflection_2", "merged", base_time, merged_into="reflection_3"))
    await engine.write(lambda c: add_reflection(c, "小天", NewReflection("reflection_4", "c"), base_time))
    await engine.write(lambda c: transition_reflection(c, "小天", "reflection_4", "denied", base_time))
    counts = await engine.read(lambda c: funnel_counts(c, "小天", base_time, base_time + 10))
    assert counts == {
        "facts_added": 0, "reflections_synthesized": 3, "reflections_confirmed": 1,
        "reflections_promoted": 1, "reflections_merged": 1, "reflections_denied": 1,
        "reflections_archived": 1, "persona_entries_added": 0,
        "persona_entries_rewritten": 0, "persona_entries_archived": 0,
    }
    merged = await engine.read(lambda c: get_reflection(c, "小天", "reflection_2"))
    assert merged.merged_into == "reflection_3"
    changes = await engine.read(lambda c: memory_changes(c, "小天", 0))
    assert changes.upserts == []
    assert set(changes.removals) == {"reflection_1", "reflection_2", "reflection_4"}


async def test_live_reflections_beyond_the_bound_archive_the_oldest(engine, monkeypatch):
    monkeypatch.setattr(_store, "reflections_per_character_max", 2)
    monkeypatch.setattr(_store, "reflections_archived_per_character_max", 1)
    for index in range(2):
        await engine.write(lambda c, index=index: add_reflection(
            c, "小天", NewReflection(f"reflection_{index}", "x"), base_time + index))
    assert len(await engine.read(lambda c: list_reflections(c, "小天"))) == 2
    await engine.write(lambda c: add_reflection(c, "小天", NewReflection("reflection_2", "x"), base_time + 2))
    live = await engine.read(lambda c: list_reflections(c, "小天"))
    assert [reflection.id for reflection in live] == ["reflection_1", "reflection_2"]
    await engine.write(lambda c: add_reflection(c, "小天", NewReflection("reflection_3", "x"), base_time + 3))
    archived = await engine.read(lambda c: list_reflections(c, "小天", ["archived"]))
    assert [reflection.id for reflection in archived] == ["reflection_1"]
    walk = await engine.read(lambda c: iterate_memories(c, "小天", "reflection"))
    assert [record.id for record in walk] == ["reflection_2", "reflection_3"]


async def test_reset_confirmed_at_counts_the_rows_it_changed(engine):
    for index in range(3):
        await engine.write(lambda c, index=index: add_reflection(
            c, "小天", NewReflection(f"reflection_{index}", "x"), base_time))
    for index in range(2):
        await engine.write(lambda c, index=index: transition_reflection(
            c, "小天", f"reflection_{index}", "confirmed", base_time))
    await engine.write(lambda c: add_reflection(c, "other", NewReflection("reflection_o", "x"), base_time))
    await engine.write(lambda c: transition_reflection(c, "other", "reflection_o", "confirmed", base_time))
    assert await engine.write(lambda c: reset_confirmed_at(c, base_time + 60, "小天")) == 2
    assert await engine.write(lambda c: reset_confirmed_at(c, base_time + 60)) == 1
    assert await engine.write(lambda c: reset_confirmed_at(c, base_time + 60)) == 0
    reflection = await engine.read(lambda c: get_reflection(c, "小天", "reflection_0"))
    assert reflection.confirmed_at == base_time + 60


# -- surfacing -----------------------------------------------------------------------------


async def test_record_surfaced_refreshes_cooldowns(engine, monkeypatch):
    assert await engine.write(lambda c: record_surfaced(c, "小天", [], base_time)) == 0
    assert not await engine.read(lambda c: character_exists(c, "小天"))
    await engine.write(lambda c: record_surfaced(c, "小天", ["reflection_1", "reflection_1"], base_time))
    await engine.write(lambda c: record_surfaced(c, "小天", ["reflection_1", "reflection_2"], base_time + 5))
    assert await engine.read(lambda c: surfaced_times(c, "小天")) == {
        "reflection_1": base_time + 5, "reflection_2": base_time + 5}
    ids = [f"reflection_{index}" for index in range(surfaced_ids_per_call_max)]
    await engine.write(lambda c: record_surfaced(c, "小天", ids, base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: record_surfaced(c, "小天", ids + ["reflection_x"], base_time))
    monkeypatch.setattr(_store, "surfaced_records_per_character_max", 2)
    await engine.write(lambda c: record_surfaced(c, "other", ["a", "b"], base_time))
    await engine.write(lambda c: record_surfaced(c, "other", ["c"], base_time + 1))
    assert set(await engine.read(lambda c: surfaced_times(c, "other"))) == {"b", "c"}


# -- persona -------------------------------------------------------------------------------


async def test_persona_entries_add_rewrite_archive_with_events(engine, monkeypatch):
    entry = await engine.write(lambda c: add_persona_entry(
        c, "小天", NewPersonaEntry("persona_1", "喜欢猫", section="likes"), base_time))
    assert (entry.revision, entry.status) == (1, "active")
    rewritten = await engine.write(lambda c: rewrite_persona_entry(c, "小天", "persona_1", "很喜欢猫", base_time + 1))
    assert (rewritten.text, rewritten.revision) == ("很喜欢猫", 2)
    assert await engine.write(lambda c: archive_persona_entry(c, "小天", "persona_1", base_time + 2))
    assert not await engine.write(lambda c: archive_persona_entry(c, "小天", "persona_1", base_time + 2))
    assert await engine.write(lambda c: rewrite_persona_entry(c, "小天", "persona_1", "x", base_time)) is None
    assert await engine.read(lambda c: list_persona_entries(c, "小天")) == []
    assert len(await engine.read(lambda c: list_persona_entries(c, "小天", "archived"))) == 1
    counts = await engine.read(lambda c: funnel_counts(c, "小天", base_time, base_time + 2))
    assert (counts["persona_entries_added"], counts["persona_entries_rewritten"],
            counts["persona_entries_archived"]) == (1, 1, 1)
    monkeypatch.setattr(_store, "persona_entries_per_character_max", 2)
    monkeypatch.setattr(_store, "persona_entries_archived_per_character_max", 1)
    for index in (2, 3):
        assert await engine.write(lambda c, index=index: add_persona_entry(
            c, "小天", NewPersonaEntry(f"persona_{index}", "x"), base_time)) is not None
    assert await engine.write(lambda c: add_persona_entry(
        c, "小天", NewPersonaEntry("persona_4", "x"), base_time)) is None
    await engine.write(lambda c: archive_persona_entry(c, "小天", "persona_2", base_time + 9))
    archived = await engine.read(lambda c: list_persona_entries(c, "小天", "archived"))
    assert [entry.id for entry in archived] == ["persona_2"]


async def test_corrections_finish_once(engine, monkeypatch):
    await engine.write(lambda c: record_correction(c, "小天", "correction_1", None, "新条目", "task_1", base_time))
    assert await engine.write(lambda c: set_correction_state(c, "correction_1", "cancelled", base_time))
    assert not await engine.write(lambda c: set_correction_state(c, "correction_1", "applied", base_time))
    assert (await engine.read(lambda c: get_correction(c, "correction_1"))).state == "cancelled"
    monkeypatch.setattr(_store, "persona_corrections_per_character_max", 1)
    await engine.write(lambda c: record_correction(c, "小天", "correction_2", None, "x", None, base_time + 1))
    assert await engine.read(lambda c: get_correction(c, "correction_1")) is None


# -- documents and profiles ----------------------------------------------------------------


async def test_documents_round_trip_within_their_bound(engine):
    assert await engine.read(lambda c: read_document(c, "小天", "persona")) is None
    await engine.write(lambda c: write_document(c, "小天", "persona", {"名字": "小天", "v": 2}, base_time))
    assert await engine.read(lambda c: read_document(c, "小天", "persona")) == {"名字": "小天", "v": 2}
    assert await engine.read(lambda c: read_document(c, "小天", "settings")) is None
    limit = _store.document_bytes_max
    await engine.write(lambda c: write_document(c, "小天", "settings", {"b": "x" * (limit - 8)}, base_time))
    with pytest.raises(refused):
        await engine.write(lambda c: write_document(c, "小天", "settings", {"b": "x" * (limit - 7)}, base_time))
    assert await engine.read(lambda c: list_characters(c)) == ["小天"]
    assert await engine.read(lambda c: character_exists(c, "小天"))
