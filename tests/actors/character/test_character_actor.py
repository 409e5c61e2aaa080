"""The character actor through a real ActorSystem and Engine: cache → new_dialog; the settle
lock (a NewDialog sent during a renew waits and sees the settled state, while the mailbox
stays responsive); claims (release closes derived-task admission until reload, replayed and
revoked claims are refused, publication removes only older generations); outbox tasks
complete exactly once across an actor crash.

The memory slice is scripted here (``ScriptedMemory``: the real store for history, gates for
the background work) so these tests pin the actor's own behaviour."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.character import (
    CacheHistory,
    CancelCorrection,
    CharacterReleased,
    CharacterReloaded,
    CharacterStatus,
    ClaimRefused,
    ContextText,
    ConversationGap,
    CorrectionCancelled,
    HistoryCached,
    HistoryMessage,
    HistoryProcessed,
    HistorySettled,
    LastConversationGap,
    NewDialog,
    RecordSurfaced,
    ReleaseCharacter,
    ReloadCharacter,
    RenewHistory,
    ReplyDeferred,
    SettleHistory,
    SurfacedRecorded,
    ask_waiting,
)
from troupe.actors.character._character import (
    CharacterSettings,
    StoreMemory,
    character_actor_kind,
    derived_task_kinds,
)
from troupe.actors.character._outbox import active_tasks, register_task
from troupe.actors.character._schema import character_migrations
from troupe.actors.character._store import (
    append_recent,
    append_time_indexed,
    character_exists,
    last_conversation_at,
    read_recent,
    record_surfaced,
)
from troupe.runtime import ActorCrashed, ActorSystem, real_env
from troupe.storage import Engine, state_get, state_put

name = "小天"


def said(*texts: str) -> tuple[HistoryMessage, ...]:
    return tuple(HistoryMessage("user" if index % 2 == 0 else "assistant", text) for index, text in enumerate(texts))


class ScriptedMemory:
    """The real store for history; background work that waits on per-kind gates and records
    each applied effect in ``actor_state`` (so exactly-once is checked in storage)."""

    def __init__(self):
        self.gates: dict[str, trio.Event] = {}
        self.started: list[str] = []
        self.closed = 0
        self.changed = 0

    def gate(self, kind: str) -> trio.Event:
        self.gates[kind] = trio.Event()
        return self.gates[kind]

    def append_history(self, connection, name, messages, now, *, only_uncached):
        append_recent(connection, name, messages, now)
        append_time_indexed(connection, name, messages, now)
        return len(messages)

    def character_known(self, connection, name):
        return character_exists(connection, name)

    def last_conversation_at(self, connection, name):
        return last_conversation_at(connection, name)

    def record_surfaced(self, connection, name, reflection_ids, now):
        return record_surfaced(connection, name, reflection_ids, now)

    async def new_dialog_text(self, port):
        def read(connection):
            recent = [message.content for message in read_recent(connection, port.name)]
            return recent, state_get(connection, "settled", port.name)

        recent, settled = await port.storage.read(read)
        return f"settled={settled} recent={'|'.join(recent)}"

    async def recent_history_text(self, port):
        return "history"

    async def settings_text(self, port):
        return "settings"

    async def persona(self, port):
        return {"name": port.name}

    async def followup_topics(self, port):
        return []

    async def reflect(self, port):
        return None, None

    async def run_task(self, port, task):
        self.started.append(task.kind)
        gate = self.gates.get(task.kind)
        if gate is not None:
            await gate.wait()

        def effects(connection):
            applied = state_get(connection, "applied", task.task_id) or 0
            state_put(connection, "applied", task.task_id, applied + 1)
            if task.kind == "recent_compression" and task.payload.get("detailed"):
                settled = state_get(connection, "settled", port.name) or 0
                state_put(connection, "settled", port.name, settled + 1)

        return effects

    async def query_memory(self, port, query, time):
        return None

    def memory_changed(self, port):
        self.changed += 1

    def close_stores(self, port):
        self.closed += 1
        return True


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*character_migrations])
    engine.test_env = env
    return engine


@pytest.fixture
def memory():
    return ScriptedMemory()


@pytest.fixture
async def system(nursery, engine, memory):
    system = ActorSystem(engine.test_env, [character_actor_kind(CharacterSettings(memory=memory))], storage=engine)
    await nursery.start(system.run)
    return system


async def settled_outbox(system, character=name):
    """Wait until the character's outbox has no claimable task left."""
    for _ in range(200):
        tasks = await system.storage.read(lambda connection: active_tasks(connection, character))
        if not tasks:
            return
        await trio.sleep(0.01)
    raise AssertionError(f"outbox never drained: {tasks}")


async def applied_counts(system):
    return await system.storage.read(lambda connection: {
        key: value for key, value in connection.execute("SELECT key, value FROM actor_state WHERE kind = 'applied'")
    })


async def test_cache_then_new_dialog_sees_it(system):
    character = system.ref("character", name)
    assert await character.ask(NewDialog()) == ContextText("")  # unknown character
    assert await character.ask(CacheHistory(messages=said("你好", "你好呀"))) == HistoryCached(2)
    assert await character.ask(CacheHistory(messages=())) == HistoryCached(0)
    text = await ask_waiting(character, NewDialog(), timeout_seconds=5)
    assert text == ContextText("settled=None recent=你好|你好呀")
    gap = await character.ask(LastConversationGap())
    assert isinstance(gap, ConversationGap) and 0 <= gap.gap_seconds < 5
    await settled_outbox(system)
    # The post-turn signal ran once in the background; the empty cache registered nothing.
    assert len(await applied_counts(system)) == 1


async def test_a_new_dialog_during_renew_waits_for_the_settled_state(system, memory):
    character = system.ref("character", name)
    gate = memory.gate("recent_compression")
    assert await character.ask(RenewHistory(messages=said("第一句"))) == HistoryProcessed()
    order = []

    async def read_context():
        order.append(("new_dialog", await ask_waiting(character, NewDialog(), timeout_seconds=5)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_context)
        await trio.sleep(0.05)
        # A plain ask is deferred, and the mailbox still answers other requests meanwhile.
        assert await character.ask(NewDialog()) == ReplyDeferred()
        assert await character.ask(CacheHistory(messages=said("插话"))) == HistoryCached(1)
        assert order == []
        state = await character.ask(CharacterStatus())
        assert state.settling
        order.append(("compression", "released"))
        gate.set()
    assert order == [
        ("compression", "released"),
        ("new_dialog", ContextText("settled=1 recent=第一句|插话")),
    ]
    assert not (await character.ask(CharacterStatus())).settling


async def test_settle_with_an_empty_history_still_takes_the_lock(system, memory):
    character = system.ref("character", name)
    await character.ask(CacheHistory(messages=said("a")))
    gate = memory.gate("recent_compression")
    assert await character.ask(SettleHistory(messages=())) == HistorySettled()
    assert (await character.ask(CharacterStatus())).settling
    gate.set()
    text = await ask_waiting(character, NewDialog(), timeout_seconds=5)
    assert text.text.startswith("settled=1")


async def test_release_closes_admission_until_reload(system, memory):
    character = system.ref("character", name)
    gate = memory.gate("post_turn_signal")
    await character.ask(CacheHistory(messages=said("a")))
    for _ in range(100):
        if memory.started:
            break
        await trio.sleep(0.01)
    assert memory.started == ["post_turn_signal"]
    released = await ask_waiting(
        character, ReleaseCharacter(claim_token="t1", claim_generation=0, hold_admission=True), timeout_seconds=5
    )
    assert released == CharacterReleased(name, 1, "t1")
    # Retrying the same live token is the same success (nothing more to cancel).
    again = await ask_waiting(character, ReleaseCharacter(claim_token="t1", claim_generation=0), timeout_seconds=5)
    assert again == CharacterReleased(name, 0, "t1")
    state = await character.ask(CharacterStatus())
    assert not state.admission_open and not state.stores_open
    # Held: foreground writes are refused (never half-applied), nothing derived runs.
    refused = await character.ask(CacheHistory(messages=said("b")))
    assert refused.message.startswith("the character is released")
    gate.set()
    assert await character.ask(ReloadCharacter(release_tokens=("t1",))) == CharacterReloaded(name, 1, 0, True)
    assert await character.ask(CacheHistory(messages=said("c"))) == HistoryCached(1)
    await settled_outbox(system)
    # The cancelled task never applied; the new one applied once.
    assert len(await applied_counts(system)) == 1


async def test_a_non_held_release_keeps_tasks_pending_until_reload(system, memory):
    character = system.ref("character", name)
    await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0))
    assert await character.ask(CacheHistory(messages=said("a"))) == HistoryCached(1)
    await trio.sleep(0.05)
    assert memory.started == []
    pending = await system.storage.read(lambda connection: active_tasks(connection, name))
    assert [task.kind for task in pending] == ["post_turn_signal"]
    await character.ask(ReloadCharacter(release_tokens=("t1",)))
    await settled_outbox(system)
    assert memory.started == ["post_turn_signal"]


async def test_replayed_and_revoked_claims_are_refused(system):
    character = system.ref("character", name)
    await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0))
    await character.ask(ReloadCharacter(release_tokens=("t1",)))
    replay = await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0))
    assert isinstance(replay, ClaimRefused) and replay.encode()["status"] == "cancelled"
    # A token the caller withdrew before its release arrived is refused too.
    await character.ask(ReloadCharacter(release_tokens=("late",)))
    assert isinstance(await character.ask(ReleaseCharacter(claim_token="late", claim_generation=0)), ClaimRefused)
    # Publish generation 2: a claim that captured generation 1 is stale (revoked).
    await character.ask(ReloadCharacter(publish_generation=2))
    stale = await character.ask(ReleaseCharacter(claim_token="t2", claim_generation=1))
    assert isinstance(stale, ClaimRefused)
    # The refusals are durable: a new incarnation still refuses.
    await system.drain()
    assert isinstance(await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=2)), ClaimRefused)


async def test_publication_removes_only_older_generations(system):
    character = system.ref("character", name)
    await character.ask(ReleaseCharacter(claim_token="old", claim_generation=0))
    await character.ask(ReleaseCharacter(claim_token="new", claim_generation=1))
    reloaded = await character.ask(ReloadCharacter(publish_generation=1))
    assert reloaded == CharacterReloaded(name, 0, 1, False)
    state = await character.ask(CharacterStatus())
    assert state.claims == (("new", 1),) and not state.admission_open
    # The removed claim is revoked; the concurrent claim on the published one is kept.
    assert isinstance(await character.ask(ReleaseCharacter(claim_token="old", claim_generation=1)), ClaimRefused)
    await system.drain()
    state = await character.ask(CharacterStatus())
    assert state.claims == (("new", 1),) and state.generation == 1
    await character.ask(ReloadCharacter(release_tokens=("new",)))
    assert (await character.ask(CharacterStatus())).admission_open


async def test_outbox_tasks_complete_exactly_once_across_a_crash(system, memory):
    character = system.ref("character", name)
    gate = memory.gate("post_turn_signal")
    await character.ask(CacheHistory(messages=said("a")))
    for _ in range(100):
        if memory.started:
            break
        await trio.sleep(0.01)
    # The first task runs (claimed), so the second turn's signal cannot coalesce into it.
    await character.ask(CacheHistory(messages=said("b")))
    with pytest.raises(ActorCrashed):
        await character.ask("not a request")  # a bug in a turn crashes the actor
    gate.set()
    # The next message activates a fresh instance: it recovers the dead runner's claim.
    await character.ask(CharacterStatus())
    await settled_outbox(system)
    counts = await applied_counts(system)
    assert len(counts) == 2
    assert all(state == 1 for state in await system.storage.read(lambda connection: [
        state_get(connection, "applied", key) for key in counts
    ]))


async def test_cancel_correction_and_record_surfaced(system, memory):
    character = system.ref("character", name)
    assert await character.ask(CancelCorrection()) == CorrectionCancelled("no_task")
    gate = memory.gate("correction")
    now = system.env.clock.wall()
    await system.storage.write(lambda connection: register_task(
        connection, name, task_id="task_c", kind="correction", payload={}, generation=0, now=now))
    await character.ask(CacheHistory(messages=said("kick the runner")))
    for _ in range(100):
        if "correction" in memory.started:
            break
        await trio.sleep(0.01)
    assert await character.ask(CancelCorrection()) == CorrectionCancelled("cancelled")
    gate.set()
    await settled_outbox(system)
    assert "task_c" not in await applied_counts(system)
    assert await character.ask(RecordSurfaced(reflection_ids=())) == SurfacedRecorded(0)
    assert (await character.ask(RecordSurfaced(reflection_ids=("reflection_1",)))).encode() == {"ok": True}
    # Persisting failures never fail the caller.
    too_many = tuple(f"reflection_{index}" for index in range(101))
    assert (await character.ask(RecordSurfaced(reflection_ids=too_many))).encode() == {"ok": True}


def test_derived_kinds_exclude_the_settle_compression():
    assert "recent_compression" not in derived_task_kinds
    assert "post_turn_signal" in derived_task_kinds


async def test_the_real_memory_renders_and_recalls(nursery, tmp_path):
    from troupe.actors.character import MemoryResults, QueryMemory
    from troupe.actors.character._recall import CharacterRecallIndexes
    from troupe.actors.host._memories import retrieval_migration

    env = real_env(str(tmp_path / "recall"))
    engine = await Engine.open(env, nursery=nursery, migrations=[*character_migrations, retrieval_migration])
    engine.test_env = env

    settings = CharacterSettings(memory=StoreMemory(recall_indexes=CharacterRecallIndexes()))
    system = ActorSystem(engine.test_env, [character_actor_kind(settings)], storage=engine)
    await nursery.start(system.run)
    character = system.ref("character", name)
    assert await character.ask(CacheHistory(messages=said("我喜欢吃寿司", "记住了"))) == HistoryCached(2)
    # /settle writes only what /cache has not written yet.
    assert await character.ask(SettleHistory(messages=said("我喜欢吃寿司", "记住了", "还有拉面"))) == HistorySettled()
    text = await ask_waiting(character, NewDialog(), timeout_seconds=5)
    assert text.text.count("主人：我喜欢吃寿司") == 1 and "主人：还有拉面" in text.text
    await settled_outbox(system)
    results = await character.ask(QueryMemory(query="寿司"))
    assert isinstance(results, MemoryResults) and results.error_code is None
    empty = await character.ask(QueryMemory())
    assert empty.results == () and empty.candidates_total == 0


def test_parse_input_history_bounds_and_shapes():
    import json

    from troupe.actors.character import (
        history_message_characters_max,
        input_history_messages_max,
        parse_input_history,
    )

    assert parse_input_history("[]") == []
    parts = parse_input_history(json.dumps([{"role": "user", "content": [{"type": "text", "text": "看"}]}]))
    assert parts[0].text == "看"
    at_limit = json.dumps([{"role": "user", "content": "x"}] * input_history_messages_max)
    assert len(parse_input_history(at_limit)) == input_history_messages_max
    over = json.dumps([{"role": "user", "content": "x"}] * (input_history_messages_max + 1))
    assert isinstance(parse_input_history(over), str)
    longest = json.dumps([{"role": "user", "content": "x" * history_message_characters_max}])
    assert len(parse_input_history(longest)) == 1
    too_long = json.dumps([{"role": "user", "content": "x" * (history_message_characters_max + 1)}])
    assert isinstance(parse_input_history(too_long), str)
    for bad in ("nope", '{"role": "user"}', '[{"role": "tool", "content": "x"}]', '[{"role": "user", "content": 1}]', 5):
        assert isinstance(parse_input_history(bad), str)
    # One bad message rejects everything (never half-applied).
    assert isinstance(parse_input_history('[{"role": "user", "content": "ok"}, 3]'), str)


async def test_claims_per_character_are_bounded(system):
    from troupe.actors.character import CharacterFailed, claim_tokens_per_character_max

    character = system.ref("character", name)
    for index in range(claim_tokens_per_character_max):
        reply = await character.ask(ReleaseCharacter(claim_token=f"t{index}", claim_generation=0))
        assert isinstance(reply, CharacterReleased)
    refused = await character.ask(ReleaseCharacter(claim_token="one-more", claim_generation=0))
    assert isinstance(refused, CharacterFailed)
