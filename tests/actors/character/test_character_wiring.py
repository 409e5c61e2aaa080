"""The character actor with the real memory (``StoreMemory``, ``LocalModel``) on a real engine:
the reflection lifecycle end to end (cache → facts → reflection → confirmed → promoted into
the persona) with its funnel counters; ``/reflect``; the history review's denials and
persona corrections and ``/cancel_correction``; the periodic loop's durable reminder; recall
closed from ``/release_character`` until the reload; exactly once across an actor crash."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.character import (
    CacheHistory,
    CancelCorrection,
    CharacterReleased,
    CharacterSettings,
    CharacterStatus,
    CorrectionCancelled,
    Funnel,
    HistoryCached,
    HistoryMessage,
    HistoryProcessed,
    MemoryLoopQueued,
    MemoryResults,
    MemoryUnavailable,
    ProcessHistory,
    QueryMemory,
    Reflect,
    ReleaseCharacter,
    ReloadCharacter,
    RunMemoryLoop,
    StoreMemory,
    character_actor_kind,
    character_surface_migrations,
    memory_loop_reminder_name,
)
from troupe.actors.character._recall import CharacterRecallIndexes
from troupe.actors.character._reflection import LifecycleSettings
from troupe.actors.character._store import (
    NewPersonaEntry,
    NewReflection,
    add_persona_entry,
    add_reflection,
    get_persona_entry,
    list_corrections,
    list_facts,
    list_persona_entries,
    list_reflections,
    reflection_statuses,
)
from troupe.models import LocalModel
from troupe.runtime import ActorCrashed, ActorSystem, real_env
from troupe.storage import Engine, reminders_for

from .test_character_actor import settled_outbox

name = "小天"
preferences = ("我喜欢吃寿司", "我最喜欢的食物是拉面", "我爱吃生鱼片")


def user_lines(*texts: str) -> tuple[HistoryMessage, ...]:
    return tuple(HistoryMessage("user", text) for text in texts)


def quick_memory(**options) -> StoreMemory:
    """The real memory; confirmed reflections are promoted at the next pass."""
    return StoreMemory(recall_indexes=CharacterRecallIndexes(),
                       lifecycle=LifecycleSettings(promote_after_seconds=0.001), **options)


class GatedMemory(StoreMemory):
    """The real memory whose tasks of one kind wait for ``gate``."""

    def __init__(self, kind: str) -> None:
        super().__init__(recall_indexes=CharacterRecallIndexes(),
                         lifecycle=LifecycleSettings(promote_after_seconds=0.001))
        self.kind = kind
        self.gate = trio.Event()
        self.started = trio.Event()

    async def run_task(self, port, task):
        if task.kind == self.kind:
            self.started.set()
            await self.gate.wait()
        return await super().run_task(port, task)


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    env.model = LocalModel()
    engine = await Engine.open(env, nursery=nursery, migrations=list(character_surface_migrations))
    engine.test_env = env
    return engine


async def start(nursery, engine, memory=None, **settings):
    memory = memory or quick_memory()
    system = ActorSystem(engine.test_env, [character_actor_kind(CharacterSettings(memory=memory, **settings))],
                         storage=engine)
    await nursery.start(system.run)
    return system, system.ref("character", name)


async def counts(character) -> dict[str, int]:
    reply = await character.ask(Funnel(since=0.0, until=4_000_000_000.0))
    return {kind: count for kind, count in reply.counts.items() if count}


async def read(engine, function):
    return await engine.read(lambda connection: function(connection))


async def test_the_reflection_lifecycle_end_to_end(nursery, engine):
    system, character = await start(nursery, engine)
    assert await character.ask(CacheHistory(messages=user_lines(*preferences))) == HistoryCached(3)
    await settled_outbox(system)
    facts = await read(engine, lambda connection: list_facts(connection, name))
    assert sorted(fact.text for fact in facts) == sorted(preferences)

    # The loop synthesises a reflection; nothing supports it yet, so it stays pending.
    assert await character.ask(RunMemoryLoop()) == MemoryLoopQueued(2)
    await settled_outbox(system)
    (reflection,) = await read(engine, lambda connection: list_reflections(connection, name))
    assert reflection.status == "pending" and set(reflection.source_fact_ids) == {fact.id for fact in facts}

    # A newer fact that says the same thing confirms it; the next pass promotes it.
    await character.ask(CacheHistory(messages=user_lines("我喜欢吃寿司和天妇罗")))
    await settled_outbox(system)
    await character.ask(RunMemoryLoop())
    await settled_outbox(system)
    (confirmed,) = await read(engine, lambda connection: list_reflections(connection, name))
    assert confirmed.status == "confirmed"
    await character.ask(RunMemoryLoop())
    await settled_outbox(system)
    (promoted,) = await read(engine, lambda connection: list_reflections(connection, name, reflection_statuses))
    assert promoted.status == "promoted"
    (entry,) = await read(engine, lambda connection: list_persona_entries(connection, name))
    assert (entry.text, entry.section, entry.source) == (reflection.text, "master", "reflection")
    assert await counts(character) == {
        "facts_added": 4, "reflections_synthesized": 1, "reflections_confirmed": 1,
        "reflections_promoted": 1, "persona_entries_added": 1,
    }
    # Recall followed every step (the actor marks the handle after each write).
    found = await character.ask(QueryMemory(query="天妇罗"))
    assert [hit.tier for hit in found.results] == ["fact"]


async def test_reflect_answers_the_synthesis_and_queues_promotion(nursery, engine):
    system, character = await start(nursery, engine)
    await character.ask(CacheHistory(messages=user_lines(*preferences)))
    await settled_outbox(system)
    answer = await character.ask(Reflect())
    encoded = answer.encode()
    assert encoded["auto_transitions"] == 0 and encoded["reflection"]["status"] == "pending"
    assert len(encoded["reflection"]["source_fact_ids"]) == 3
    await settled_outbox(system)
    # Its facts are used: nothing new to synthesise.
    assert (await character.ask(Reflect())).encode() == {"reflection": None, "auto_transitions": 0}
    assert (await counts(character))["reflections_synthesized"] == 1
    # The reflection is recallable at once.
    results = await character.ask(QueryMemory(query="寿司"))
    assert "reflection" in {hit.tier for hit in results.results}


async def test_the_history_review_denies_and_corrects(nursery, engine):
    system, character = await start(nursery, engine)

    def seed(connection):
        add_persona_entry(connection, name, NewPersonaEntry("persona_sushi", "主人喜欢吃寿司", section="master"), 1.0)
        add_reflection(connection, name, NewReflection("reflection_fish", "主人很喜欢吃生鱼片"), 1.0)

    await engine.write(seed)
    lines = user_lines("不对，我才不喜欢吃生鱼片", "其实我现在不喜欢吃寿司了")
    assert await character.ask(ProcessHistory(messages=lines)) == HistoryProcessed()
    await settled_outbox(system)
    (denied,) = await read(engine, lambda connection: list_reflections(connection, name, ("denied",)))
    assert denied.id == "reflection_fish"
    entry = await read(engine, lambda connection: get_persona_entry(connection, name, "persona_sushi"))
    assert (entry.text, entry.revision) == ("其实我现在不喜欢吃寿司了", 2)
    (correction,) = await read(engine, lambda connection: list_corrections(connection, name))
    assert correction.state == "applied"
    funnel = await counts(character)
    assert funnel["reflections_denied"] == 1 and funnel["persona_entries_rewritten"] == 1
    # The review's cursor moved with its work: a second review reads nothing again.
    await character.ask(ProcessHistory(messages=()))
    await settled_outbox(system)
    assert (await counts(character)) == funnel


async def test_cancel_correction_stops_the_pending_proposal(nursery, engine):
    memory = GatedMemory("correction")
    system, character = await start(nursery, engine, memory)
    await engine.write(lambda connection: add_persona_entry(
        connection, name, NewPersonaEntry("persona_sushi", "主人喜欢吃寿司", section="master"), 1.0))
    await character.ask(ProcessHistory(messages=user_lines("其实我现在不喜欢吃寿司了")))
    with trio.fail_after(5):
        await memory.started.wait()
    assert await character.ask(CancelCorrection()) == CorrectionCancelled("cancelled")
    memory.gate.set()
    await settled_outbox(system)
    entry = await read(engine, lambda connection: get_persona_entry(connection, name, "persona_sushi"))
    assert (entry.text, entry.revision) == ("主人喜欢吃寿司", 1)
    (correction,) = await read(engine, lambda connection: list_corrections(connection, name))
    assert correction.state == "cancelled"
    assert await character.ask(CancelCorrection()) == CorrectionCancelled("no_task")


async def test_the_loop_reminder_arms_itself_and_runs(nursery, engine):
    system, character = await start(nursery, engine, memory_loop_interval_seconds=0.2)
    await character.ask(CacheHistory(messages=user_lines(*preferences)))
    reminders = await read(engine, lambda connection: reminders_for(connection, "character", name))
    assert [reminder.name for reminder in reminders] == [memory_loop_reminder_name]
    with trio.fail_after(5):
        while not await read(engine, lambda connection: list_reflections(connection, name)):
            await trio.sleep(0.05)
    # It re-armed itself (the character talked recently).
    with trio.fail_after(5):
        while not await read(engine, lambda connection: reminders_for(connection, "character", name)):
            await trio.sleep(0.05)


async def test_release_closes_recall_until_the_reload(nursery, engine):
    system, character = await start(nursery, engine)
    await character.ask(CacheHistory(messages=user_lines("我喜欢吃寿司")))
    await settled_outbox(system)
    assert [hit.text for hit in (await character.ask(QueryMemory(query="寿司"))).results] == ["我喜欢吃寿司"]
    released = await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0))
    assert isinstance(released, CharacterReleased)
    assert isinstance(await character.ask(QueryMemory(query="寿司")), MemoryUnavailable)
    assert not (await character.ask(CharacterStatus())).stores_open
    # Writes still land (the release holds no admission) but do not reopen recall.
    assert await character.ask(CacheHistory(messages=user_lines("我爱吃拉面"))) == HistoryCached(1)
    assert isinstance(await character.ask(QueryMemory(query="寿司")), MemoryUnavailable)
    # Durable: a new incarnation is still released.
    await system.drain()
    assert isinstance(await character.ask(QueryMemory(query="寿司")), MemoryUnavailable)
    await character.ask(ReloadCharacter(release_tokens=("t1",)))
    assert (await character.ask(CharacterStatus())).stores_open
    await settled_outbox(system)
    results = await character.ask(QueryMemory(query="寿司 拉面"))
    assert isinstance(results, MemoryResults)
    assert {hit.text for hit in results.results} == {"我喜欢吃寿司", "我爱吃拉面"}


async def test_synthesis_applies_exactly_once_across_a_crash(nursery, engine):
    memory = GatedMemory("reflection_synthesis")
    system, character = await start(nursery, engine, memory)
    await character.ask(CacheHistory(messages=user_lines(*preferences)))
    await settled_outbox(system)
    await character.ask(RunMemoryLoop())
    with trio.fail_after(5):
        await memory.started.wait()
    with pytest.raises(ActorCrashed):
        await character.ask("not a request")  # a bug in a turn crashes the actor
    memory.gate.set()
    await character.ask(CharacterStatus())  # a fresh incarnation recovers the dead runner's claim
    await settled_outbox(system)
    reflections = await read(engine, lambda connection: list_reflections(connection, name, reflection_statuses))
    assert len(reflections) == 1
    assert (await counts(character))["reflections_synthesized"] == 1
