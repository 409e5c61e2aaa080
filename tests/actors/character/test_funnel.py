"""The funnel log on a real engine: every key present, inclusive windows, batch amounts,
events that roll back with their transition, and the per-character bound."""

from __future__ import annotations

import pytest

from troupe.actors.character import (
    NewFact,
    _funnel,
    add_facts,
    funnel_counts,
    funnel_event_kinds,
    read_events,
    record_event,
)
from troupe.storage import StorageError

from .store_helpers import base_time, open_character_engine


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_character_engine(nursery, tmp_path)


def test_the_ten_counters_in_the_contract_order():
    assert funnel_event_kinds == (
        "facts_added", "reflections_synthesized", "reflections_confirmed",
        "reflections_promoted", "reflections_merged", "reflections_denied",
        "reflections_archived", "persona_entries_added", "persona_entries_rewritten",
        "persona_entries_archived",
    )


async def test_an_unknown_character_counts_zero_for_every_key(engine):
    counts = await engine.read(lambda c: funnel_counts(c, "nobody", 0.0, base_time))
    assert counts == dict.fromkeys(funnel_event_kinds, 0)
    assert list(counts) == list(funnel_event_kinds)


async def test_windows_are_inclusive_at_both_ends_and_per_character(engine):
    def write(connection):
        record_event(connection, "小天", "facts_added", base_time, amount=3)
        record_event(connection, "小天", "reflections_confirmed", base_time + 10, "reflection_1")
        record_event(connection, "小天", "reflections_confirmed", base_time + 20, "reflection_2")
        record_event(connection, "other", "facts_added", base_time + 10)

    await engine.write(write)

    async def counts(since, until, name="小天"):
        return await engine.read(lambda c: funnel_counts(c, name, since, until))

    everything = await counts(base_time, base_time + 20)
    assert everything["facts_added"] == 3
    assert everything["reflections_confirmed"] == 2
    assert sum(everything.values()) == 5
    assert (await counts(base_time + 0.001, base_time + 20))["facts_added"] == 0
    assert (await counts(base_time, base_time + 19.999))["reflections_confirmed"] == 1
    assert (await counts(base_time + 10, base_time + 10))["reflections_confirmed"] == 1
    assert (await counts(base_time + 30, base_time + 20))["reflections_confirmed"] == 0
    assert (await counts(base_time, base_time + 20, "other"))["facts_added"] == 1


async def test_a_store_transition_writes_its_event_in_the_same_job(engine):
    await engine.write(lambda c: add_facts(
        c, "小天", [NewFact("fact_1", "喜欢寿司"), NewFact("fact_2", "住在上海")], base_time))
    counts = await engine.read(lambda c: funnel_counts(c, "小天", base_time, base_time))
    assert counts["facts_added"] == 2
    events = await engine.read(lambda c: read_events(c, "小天"))
    assert [(event.kind, event.amount) for event in events] == [("facts_added", 2)]


async def test_a_failing_job_leaves_neither_transition_nor_event(engine):
    def failing(connection):
        add_facts(connection, "小天", [NewFact("fact_1", "喜欢寿司")], base_time)
        raise RuntimeError("the job fails after the transition")

    with pytest.raises(RuntimeError):
        await engine.write(failing)
    counts = await engine.read(lambda c: funnel_counts(c, "小天", 0, base_time * 2))
    assert counts["facts_added"] == 0


async def test_bad_events_are_our_own_bug(engine):
    for kwargs in ({"kind": "facts_removed"}, {"amount": 0},
                   {"amount": _funnel.funnel_amount_max + 1},
                   {"subject_id": "x" * (_funnel.funnel_subject_characters_max + 1)}):
        arguments = {"kind": "facts_added", **kwargs}
        with pytest.raises((ValueError, StorageError)):
            await engine.write(lambda c, arguments=arguments: record_event(
                c, "小天", arguments["kind"], base_time, arguments.get("subject_id", ""),
                arguments.get("amount", 1)))
    await engine.write(lambda c: record_event(
        c, "小天", "facts_added", base_time, "x" * _funnel.funnel_subject_characters_max,
        _funnel.funnel_amount_max))


async def test_the_log_keeps_the_newest_events_per_character(engine, monkeypatch):
    monkeypatch.setattr(_funnel, "funnel_events_per_character_max", 5)

    def write(connection):
        for index in range(5):
            record_event(connection, "小天", "facts_added", base_time + index)
        record_event(connection, "other", "facts_added", base_time)

    await engine.write(write)
    assert len(await engine.read(lambda c: read_events(c, "小天"))) == 5
    await engine.write(lambda c: record_event(c, "小天", "reflections_denied", base_time + 9))
    events = await engine.read(lambda c: read_events(c, "小天"))
    assert [event.at for event in events] == [base_time + offset for offset in (1, 2, 3, 4, 9)]
    assert len(await engine.read(lambda c: read_events(c, "other"))) == 1
