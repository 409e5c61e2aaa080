"""``/query_memory`` over a real engine: every routing row of the contract's table, the
result fields, tiers, tenant isolation, keeping the index in step with the store (archive,
reflection lifecycle, restart reconciliation without duplicates), 503 and the degraded
``hybrid_recall_failed`` answer."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.character import character_migrations
from troupe.actors.character._protocol import MemoryResults, MemoryUnavailable
from troupe.actors.character._recall import (
    CharacterRecallIndexes,
    query_characters_max,
    query_memory,
    query_memory_problem,
    recall_failed_error_code,
    recall_tenant,
    time_characters_max,
)
from troupe.actors.character._store import (
    NewFact,
    NewReflection,
    add_facts,
    add_reflection,
    archive_facts,
    transition_reflection,
)
from troupe.actors.host._memories import retrieval_migration
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor


def utc(*parts: int) -> float:
    return datetime.datetime(*parts, tzinfo=datetime.UTC).timestamp()


class StepClock:
    """A monotonic clock that advances 2 ms per reading (elapsed_ms is then exact)."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        self.now += 0.002
        return self.now


@pytest.fixture
async def engine(nursery, tmp_path):
    env = Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
              storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())
    return await Engine.open(env, nursery=nursery,
                             migrations=[*character_migrations, retrieval_migration])


async def seed(engine, name: str = "小天") -> None:
    def write(connection):
        add_facts(connection, name, [
            NewFact("fact_sushi", "主人喜欢吃寿司", event_start_at=utc(2026, 5, 1, 12)),
            NewFact("fact_shanghai", "主人下周要去上海出差", event_start_at=utc(2026, 5, 3, 9)),
            NewFact("fact_cat", "主人养了一只橘猫", event_start_at=utc(2026, 4, 1, 8)),
        ], utc(2026, 5, 4, 10))
        add_facts(connection, name, [
            NewFact("fact_old", "主人以前喜欢吃拉面", event_start_at=utc(2025, 1, 1, 8)),
        ], utc(2026, 5, 4, 10))
        archive_facts(connection, name, ["fact_old"], utc(2026, 5, 4, 11))
        add_reflection(connection, name, NewReflection(
            "reflection_food", "主人很喜欢日本料理，比如寿司", source_fact_ids=("fact_sushi",),
            event_start_at=utc(2026, 5, 1, 12)), utc(2026, 5, 4, 12))

    await engine.write(write)


async def ask(recall, query=None, time=None):
    return await query_memory(recall, query, time, clock=StepClock())


async def test_query_only_is_hybrid_with_every_tier(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")
    answer = await ask(recall, "寿司")
    assert isinstance(answer, MemoryResults)
    ids = [hit.id for hit in answer.results]
    assert set(ids[:2]) == {"fact_sushi", "reflection_food"}
    by_id = {hit.id: hit for hit in answer.results}
    sushi = by_id["fact_sushi"]
    assert (sushi.tier, sushi.entity, sushi.text) == ("fact", "master", "主人喜欢吃寿司")
    assert sushi.score is not None and sushi.score > 0
    assert sushi.created_at == utc(2026, 5, 4, 10)
    assert sushi.event_start_at == utc(2026, 5, 1, 12) and sushi.event_end_at is None
    assert by_id["reflection_food"].tier == "reflection"
    assert answer.query == "寿司" and answer.time is None and answer.error_code is None
    assert answer.candidates_total >= 2
    assert answer.elapsed_ms > 0
    archive = await ask(recall, "拉面")
    assert [(hit.id, hit.tier) for hit in archive.results] == [("fact_old", "fact_archive")]


async def test_query_and_valid_time_filter_hard(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")
    inside = await ask(recall, "主人", "2026-05-01/2026-05-02")
    assert {hit.id for hit in inside.results} == {"fact_sushi", "reflection_food"}
    assert all(hit.score is not None for hit in inside.results)
    assert inside.time is None
    hour = await ask(recall, "上海", "2026-05-03T09:41:00")
    assert [hit.id for hit in hour.results] == ["fact_shanghai"]
    outside = await ask(recall, "寿司", "2026-05-03")
    assert outside.results == ()


async def test_time_only_orders_facts_and_reflections_by_distance(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")
    answer = await ask(recall, None, "2026-05-03")
    assert isinstance(answer, MemoryResults)
    ids = [hit.id for hit in answer.results]
    assert ids[0] == "fact_shanghai"  # inside the window
    assert set(ids[1:3]) == {"fact_sushi", "reflection_food"}  # two days before
    assert ids[3] == "fact_cat"
    assert "fact_old" not in ids  # the archive is not in the time-only route
    assert all(hit.score is None for hit in answer.results)
    assert answer.time == "2026-05-03" and answer.query is None
    blank_query = await ask(recall, "   ", "2026-05-03")
    assert [hit.id for hit in blank_query.results] == ids and blank_query.time == "2026-05-03"


async def test_neither_is_empty(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")
    for query, time in ((None, None), ("", ""), (None, "not a time")):
        answer = await ask(recall, query, time)
        assert isinstance(answer, MemoryResults)
        assert answer.results == () and answer.candidates_total == 0 and answer.error_code is None


async def test_invalid_time_with_query_is_plain_query_recall(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")
    plain = await ask(recall, "寿司")
    ignored = await ask(recall, "寿司", "2026-05-07/2026-05-01")
    assert [hit.id for hit in ignored.results] == [hit.id for hit in plain.results]
    assert [hit.score for hit in ignored.results] == [hit.score for hit in plain.results]
    assert ignored.time is None


async def test_tenants_are_isolated(engine) -> None:
    await seed(engine, "小天")

    def other(connection):
        add_facts(connection, "host", [NewFact("fact_other", "主人喜欢吃寿司和饺子")], utc(2026, 5, 4))

    await engine.write(other)
    indexes = CharacterRecallIndexes()
    mine = await indexes.open_character(engine, "小天")
    theirs = await indexes.open_character(engine, "host")
    assert recall_tenant("host") != "host"
    assert "fact_other" not in {hit.id for hit in (await ask(mine, "寿司")).results}
    assert [hit.id for hit in (await ask(theirs, "寿司")).results] == ["fact_other"]


async def test_index_follows_the_store(engine) -> None:
    await seed(engine)
    indexes = CharacterRecallIndexes()
    recall = await indexes.open_character(engine, "小天")
    assert recall.indexed_count == 5  # 3 facts, 1 archived fact, 1 reflection

    def change(connection):
        archive_facts(connection, "小天", ["fact_sushi"], utc(2026, 5, 5))
        transition_reflection(connection, "小天", "reflection_food", "denied", utc(2026, 5, 5))
        add_facts(connection, "小天", [NewFact("fact_new", "主人最近爱喝抹茶拿铁")], utc(2026, 5, 5))

    await engine.write(change)
    # Not marked: recall answers from the index as it was, without a read per query.
    assert {hit.id for hit in (await ask(recall, "寿司")).results} == {"fact_sushi", "reflection_food"}
    # The writer (the actor, after every write that can change memories) marks the handle;
    # the next recall syncs first, so acknowledged writes are visible.
    recall.mark_stale()
    tiers = {hit.id: hit.tier for hit in (await ask(recall, "寿司")).results}
    assert tiers == {"fact_sushi": "fact_archive"} and not recall.stale
    assert [hit.id for hit in (await ask(recall, "抹茶")).results] == ["fact_new"]
    assert recall.indexed_count == 5


async def test_restart_reconciles_without_duplicates(engine) -> None:
    await seed(engine)
    first = CharacterRecallIndexes()
    await first.open_character(engine, "小天")
    first.forget_engine(engine)

    # Written while no index followed (a crash between the store commit and the index add).
    def later(connection):
        add_facts(connection, "小天", [NewFact("fact_late", "主人喜欢寿司店的玉子烧")], utc(2026, 5, 6))
        transition_reflection(connection, "小天", "reflection_food", "archived", utc(2026, 5, 6))

    await engine.write(later)
    second = CharacterRecallIndexes()
    recall = await second.open_character(engine, "小天")
    answer = await ask(recall, "寿司")
    ids = [hit.id for hit in answer.results]
    assert sorted(ids) == ["fact_late", "fact_sushi"]
    assert len(ids) == len(set(ids))
    live = await engine.read(lambda connection: connection.execute(
        "SELECT COUNT(*) FROM retrieval_items WHERE tenant = ? AND deleted = 0",
        (recall_tenant("小天"),)).fetchone()[0])
    assert live == recall.indexed_count == 5


async def test_unavailable_before_open_and_after_release(engine) -> None:
    await seed(engine)
    assert isinstance(await ask(None, "寿司"), MemoryUnavailable)
    indexes = CharacterRecallIndexes()
    recall = await indexes.open_character(engine, "小天")
    assert indexes.opened(engine, "小天") is recall
    assert indexes.release(engine, "小天") is True
    assert indexes.release(engine, "小天") is False
    assert indexes.opened(engine, "小天") is None
    assert isinstance(await ask(recall, "寿司"), MemoryUnavailable)
    reopened = await indexes.open_character(engine, "小天")
    assert [hit.id for hit in (await ask(reopened, "橘猫")).results] == ["fact_cat"]


async def test_failure_degrades_without_exception_text(engine) -> None:
    await seed(engine)
    recall = await CharacterRecallIndexes().open_character(engine, "小天")

    async def broken(*args, **kwargs):
        raise RuntimeError("secret database path /var/lib/x")

    recall.index.recall = broken  # type: ignore[method-assign]
    answer = await ask(recall, "寿司")
    assert isinstance(answer, MemoryResults)
    assert answer.results == () and answer.error_code == recall_failed_error_code
    assert "secret" not in repr(answer)


def test_query_memory_problem_limits() -> None:
    assert query_memory_problem(None, None) is None
    assert query_memory_problem("a" * query_characters_max, None) is None
    assert query_memory_problem("a" * (query_characters_max + 1), None) is not None
    assert query_memory_problem(None, "2" * time_characters_max) is None
    assert query_memory_problem(None, "2" * (time_characters_max + 1)) is not None
    assert query_memory_problem(3, None) is not None
    assert query_memory_problem(None, ["2026"]) is not None


async def test_host_and_characters_share_one_index_and_one_migration(nursery, tmp_path) -> None:
    from troupe.actors.character import character_surface_migrations
    from troupe.actors.host import NewMemory, host_memory_indexes, host_migrations, store_memories
    from troupe.auth import auth_migrations
    from troupe.retrieval import RecallFilter, retrieval_migration, shared_memory_indexes

    # Both surfaces declare the very same retrieval migration object: merged by value, as the
    # server's ``surface_migrations`` does, it runs once.
    merged = list(dict.fromkeys([*auth_migrations, *host_migrations, *character_surface_migrations]))
    assert retrieval_migration in host_migrations and retrieval_migration in character_surface_migrations
    assert sum(migration.component == "retrieval" for migration in merged) == len(
        [m for m in character_surface_migrations if m.component == "retrieval"])
    env = Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
              storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())
    engine = await Engine.open(env, nursery=nursery, migrations=merged)
    await seed(engine)
    indexes = CharacterRecallIndexes()
    recall = await indexes.open_character(engine, "小天")
    host_index = await host_memory_indexes.index_for(engine)
    assert host_index is recall.index is await shared_memory_indexes.index_for(engine)
    moment = datetime.datetime(2026, 5, 1, tzinfo=datetime.UTC)
    await store_memories(engine, host_index, [NewMemory(
        content="小林也喜欢吃寿司", kind="fact", stance="neutral", lifecycle="stable", belief=0.9,
        people=["小林"], sources=[("a", 1)], occurred_at=moment, entry_id="a")], created_at=1.0)
    # One index, separate tenants: neither side recalls the other's items.
    assert "fact_sushi" in {hit.id for hit in (await ask(recall, "寿司")).results}
    assert all(not hit.text.startswith("小林") for hit in (await ask(recall, "寿司")).results)
    host_hits = await host_index.recall("寿司", recall_filter=RecallFilter("host"), limit=10)
    assert [hit.text for hit in host_hits.hits] == ["小林也喜欢吃寿司"]
