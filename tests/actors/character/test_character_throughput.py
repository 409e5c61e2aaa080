"""The character actor's cheap paths (issue 9's ``/cache`` throughput and cold start): turns
coalesce into one pending post-turn task (never into a running one), a backlog past one
task's row bound continues in a follow-up task, the runner completes a task and claims the
next in one write and reports what it saw so the task-ended turn reads nothing, the known
facts are read only when the model found a fact, and a recall index that is not open is
opened in the background while ``/query_memory`` answers 503 with a ``Retry-After``."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.character import (
    CacheHistory,
    HistoryMessage,
    MemoryResults,
    MemoryUnavailable,
    QueryMemory,
    RenewHistory,
    add_facts,
    character_surface_migrations,
    ensure_character,
    list_fact_texts,
    list_facts,
    recall_opening_retry_after_seconds,
)
from troupe.actors.character._character import post_turn_rows_per_task_max
from troupe.actors.character._outbox import active_tasks, claim_next, register_task
from troupe.actors.character._recall import CharacterRecallIndexes
from troupe.actors.character._reflection import LifecycleSettings, facts_per_extraction_max
from troupe.actors.character._store import NewFact
from troupe.models import LocalModel
from troupe.runtime import real_env
from troupe.storage import Engine

from .test_character_actor import settled_outbox
from .test_character_wiring import GatedMemory, name, start


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    env.model = LocalModel()
    engine = await Engine.open(env, nursery=nursery, migrations=list(character_surface_migrations))
    engine.test_env = env
    return engine


def turn(text: str) -> tuple[HistoryMessage, ...]:
    return (HistoryMessage("user", text), HistoryMessage("assistant", "嗯嗯"))


async def outbox_rows(engine, kind="post_turn_signal"):
    return await engine.read(lambda connection: connection.execute(
        "SELECT state, payload_json FROM character_outbox WHERE name = ? AND kind = ? ORDER BY seq",
        (name, kind)).fetchall())


def test_register_coalesces_only_into_a_pending_task_of_the_same_generation(tmp_path):
    import apsw

    from troupe.actors.character import character_migrations

    connection = apsw.Connection(str(tmp_path / "outbox.db"))
    for migration in character_migrations:
        connection.execute(migration.sql)

    def register(task_id, generation=0):
        return register_task(connection, name, task_id=task_id, kind="post_turn_signal", payload={},
                             generation=generation, now=1.0, coalesce_pending=True)

    assert register("task_1").task_id == "task_1"
    assert register("task_2").task_id == "task_1"  # pending: covers this registration too
    assert register("task_3", generation=1).task_id == "task_3"  # another generation stays apart
    claimed = claim_next(connection, name, 2.0, ["post_turn_signal"])
    assert claimed.task_id == "task_1" and claimed.claim == "task_1#1"
    assert register("task_4").task_id == "task_4"  # task_1 runs: it may have read already
    assert [task.task_id for task in active_tasks(connection, name)] == ["task_1", "task_3", "task_4"]


def test_claim_prefers_the_compression_in_one_scan(tmp_path):
    import apsw

    from troupe.actors.character import character_migrations

    connection = apsw.Connection(str(tmp_path / "outbox.db"))
    for migration in character_migrations:
        connection.execute(migration.sql)
    for task_id, kind in (("task_1", "post_turn_signal"), ("task_2", "recent_compression"),
                          ("task_3", "history_review")):
        register_task(connection, name, task_id=task_id, kind=kind, payload={}, generation=0, now=1.0)
    kinds = ["post_turn_signal", "recent_compression", "history_review"]
    order = []
    while (task := claim_next(connection, name, 2.0, kinds, preferred_kinds=["recent_compression"])):
        order.append((task.task_id, task.state, task.attempts))
    assert order == [("task_2", "running", 1), ("task_1", "running", 1), ("task_3", "running", 1)]


async def test_turns_during_the_batching_wait_become_one_task(nursery, engine):
    system, character = await start(nursery, engine, outbox_batch_seconds=0.3)
    for number in range(5):
        await character.ask(CacheHistory(messages=turn(f"我喜欢吃第{number}种寿司")))
    await settled_outbox(system)
    assert [state for state, _ in await outbox_rows(engine)] == ["done"]
    facts = await engine.read(lambda connection: list_facts(connection, name))
    assert len(facts) == 5  # one extraction read all five turns


async def test_a_turn_during_a_running_extraction_gets_its_own_task(nursery, engine):
    memory = GatedMemory("post_turn_signal")
    system, character = await start(nursery, engine, memory=memory, outbox_batch_seconds=0)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))
    await memory.started.wait()
    await character.ask(CacheHistory(messages=turn("我喜欢吃拉面")))
    await character.ask(CacheHistory(messages=turn("我喜欢吃天妇罗")))
    assert [state for state, _ in await outbox_rows(engine)] == ["running", "pending"]
    memory.gate.set()
    await settled_outbox(system)
    assert [state for state, _ in await outbox_rows(engine)] == ["done", "done"]
    texts = await engine.read(lambda connection: list_fact_texts(connection, name))
    assert sorted(texts) == sorted(["我喜欢吃寿司", "我喜欢吃拉面", "我喜欢吃天妇罗"])


async def test_after_a_task_the_next_turns_wait_for_the_next_batching_window(nursery, engine):
    # The runner does not claim, in the same run, the signal turns registered while its task
    # ran: the next runner waits the window again, and a turn meanwhile joins that task.
    memory = GatedMemory("post_turn_signal")
    system, character = await start(nursery, engine, memory=memory, outbox_batch_seconds=0.3)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))
    await memory.started.wait()
    await character.ask(CacheHistory(messages=turn("我喜欢吃拉面")))
    memory.gate.set()
    with trio.fail_after(5):
        while [state for state, _ in await outbox_rows(engine)] != ["done", "pending"]:
            await trio.sleep(0.01)
    await character.ask(CacheHistory(messages=turn("我喜欢吃天妇罗")))  # inside the new window
    assert [state for state, _ in await outbox_rows(engine)] == ["done", "pending"]
    await settled_outbox(system)
    assert [state for state, _ in await outbox_rows(engine)] == ["done", "done"]
    texts = await engine.read(lambda connection: list_fact_texts(connection, name))
    assert sorted(texts) == sorted(["我喜欢吃寿司", "我喜欢吃拉面", "我喜欢吃天妇罗"])


@pytest.mark.parametrize("batch_seconds", [0, 0.5])
async def test_a_backlog_past_one_task_continues_in_a_follow_up_task(nursery, engine, batch_seconds):
    from troupe.actors.character import append_time_indexed

    now = engine.test_env.clock.wall()
    backlog = [HistoryMessage("user", f"我喜欢第{number}号") for number in range(post_turn_rows_per_task_max + 9)]

    def load(connection):
        # Rows no task covers yet, as a coalesced backlog leaves them.
        ensure_character(connection, name, now)
        append_time_indexed(connection, name, backlog, now)

    await engine.write(load)
    system, character = await start(nursery, engine, outbox_batch_seconds=batch_seconds)
    await character.ask(CacheHistory(messages=(HistoryMessage("user", "我喜欢最后一号"),)))
    # With batching on, the continuations follow in the same run: no window between them.
    with trio.fail_after(1.5):
        await settled_outbox(system)
    rows = await outbox_rows(engine)
    # One extraction adds at most ``facts_per_extraction_max`` facts and its cursor stops
    # there; continuations take the rest, so no stated fact is dropped.
    tasks = -(-(len(backlog) + 1) // facts_per_extraction_max)
    assert [state for state, _ in rows] == ["done"] * tasks
    assert all('"route":"continuation"' in payload for _, payload in rows[1:])
    texts = await engine.read(lambda connection: list_fact_texts(connection, name, limit=10_000))
    assert len(texts) == len(backlog) + 1


async def test_the_task_ended_turn_reads_nothing_when_the_outbox_did_not_change(nursery, engine):
    system, character = await start(nursery, engine, outbox_batch_seconds=0)
    reads = 0
    original = engine.read

    async def counting(function):
        nonlocal reads
        reads += 1
        return await original(function)

    await character.ask(CacheHistory(messages=turn("今天天气不错")))
    await settled_outbox(system)
    await trio.sleep(0.05)  # the task-ended turn
    engine.read = counting
    try:
        await character.ask(CacheHistory(messages=turn("明天也许下雨")))
        for _ in range(200):
            rows = await original(lambda connection: connection.execute(
                "SELECT count(*) FROM character_outbox WHERE state = 'done'").fetchone()[0])
            if rows == 2:
                break
            await trio.sleep(0.01)
        await trio.sleep(0.05)
    finally:
        engine.read = original
    # The extraction's one read of the raw rows (no fact found: no read of the known facts),
    # and none by the task-ended turn.
    assert reads == 1


async def test_known_facts_are_read_only_when_a_fact_was_found(nursery, engine):
    system, character = await start(nursery, engine, outbox_batch_seconds=0)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))
    await settled_outbox(system)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))  # the same fact again
    await settled_outbox(system)
    assert await engine.read(lambda connection: list_fact_texts(connection, name)) == ["我喜欢吃寿司"]


async def test_a_renew_cuts_the_batching_wait_short(nursery, engine):
    system, character = await start(nursery, engine, outbox_batch_seconds=30.0)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))
    with trio.fail_after(10):
        await character.ask(RenewHistory(messages=turn("再见")))
        await settled_outbox(system)


class SlowIndexes(CharacterRecallIndexes):
    """Opening a character's recall waits for ``gate`` (a 100k-fact index build)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.opens = 0

    async def open_character(self, engine, name, *, embedder=None):
        self.opens += 1
        await self.gate.wait()
        return await super().open_character(engine, name, embedder=embedder)


async def test_recall_opens_in_the_background_and_answers_503_meanwhile(nursery, engine):
    from troupe.actors.character import StoreMemory

    indexes = SlowIndexes()
    memory = StoreMemory(recall_indexes=indexes, lifecycle=LifecycleSettings())
    now = engine.test_env.clock.wall()

    def load(connection):
        ensure_character(connection, name, now)
        add_facts(connection, name, [NewFact(id=f"fact_{number}", text=f"主人喜欢第{number}种寿司",
                                             entity="master") for number in range(50)], now)

    await engine.write(load)
    system, character = await start(nursery, engine, memory=memory, recall_open_wait_seconds=0.05)
    with trio.fail_after(5):  # never a long turn: the mailbox stays responsive
        first = await character.ask(QueryMemory(query="寿司"))
        again = await character.ask(QueryMemory(query="寿司"))
    assert first == again == MemoryUnavailable("the memory stores are being opened",
                                               retry_after_seconds=recall_opening_retry_after_seconds)
    assert indexes.opens == 1  # one opening task, not one per query
    indexes.gate.set()
    for _ in range(200):
        reply = await character.ask(QueryMemory(query="寿司"))
        if isinstance(reply, MemoryResults):
            break
        await trio.sleep(0.01)
    assert isinstance(reply, MemoryResults) and len(reply.results) == 10


async def test_a_small_character_answers_its_first_query_itself(nursery, engine):
    system, character = await start(nursery, engine, outbox_batch_seconds=0)
    await character.ask(CacheHistory(messages=turn("我喜欢吃寿司")))
    await settled_outbox(system)
    reply = await character.ask(QueryMemory(query="寿司"))
    assert isinstance(reply, MemoryResults) and [hit.text for hit in reply.results] == ["我喜欢吃寿司"]
