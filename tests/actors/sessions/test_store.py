"""The session store on a real engine: rows, listing, turn commits, the bounded event log,
history paging at its boundaries, epochs, the usage snapshot, and damage that must surface as
``StoreCorrupted`` rather than as a shorter history."""

from __future__ import annotations

import json

import apsw
import pytest

from troupe.actors.sessions import (
    ClientToolDeclaration,
    CreateOptions,
    PlatformPromptOptions,
    SessionRow,
    StoreCorrupted,
    StoredEvent,
    UsageSnapshot,
    begin_epoch,
    commit_turn,
    epoch_start,
    event_kind_control,
    history_page_messages_max,
    insert_session,
    list_sessions,
    load_session,
    mark_status,
    read_events,
    read_history,
    record_usage,
    seal_epoch,
    session_log_events_max,
    session_title_characters_max,
    sessions_list_limit_max,
    sessions_migrations,
    set_cwd,
    set_title,
    usage_is_stale,
)
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor, StorageCorrupt

created_ms = 1_760_000_000_000


@pytest.fixture
async def engine(nursery, tmp_path):
    env = Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
              storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())
    return await Engine.open(env, nursery=nursery, migrations=list(sessions_migrations))


def row(session_id: str = "s_1", end_user_id: str = "u_1", activity: int = created_ms, **fields) -> SessionRow:
    return SessionRow(session_id=session_id, end_user_id=end_user_id, created_at_ms=created_ms,
                      last_activity_at_ms=activity, **fields)


def event(seq: int, type_: str = "msg.text.delta", session_id: str = "s_1") -> StoredEvent:
    return StoredEvent.of({"type": type_, "sessionId": session_id, "turnId": "t", "seq": seq,
                           "ts": created_ms + seq, "v": 1, "source": "kernel", "text": "你好"})


def user(text: str) -> dict:
    return {"role": "user", "content": [{"t": "text", "text": text}]}


async def commit(engine, session_id="s_1", *, seqs=(), messages=(), last_seq=None, sealed=True,
                 status="idle", usage=None, at=created_ms + 1):
    events = [event(seq, session_id=session_id) for seq in seqs]
    top = last_seq if last_seq is not None else (max(seqs) if seqs else 0)
    return await engine.write(lambda c: commit_turn(
        c, session_id, events=events, messages=messages, last_seq=top, sealed=sealed,
        status=status, usage=usage, last_activity_at_ms=at))


async def test_a_row_round_trips_with_its_options(engine):
    options = CreateOptions(
        model="local", tools=("TodoWrite", "AskUser"),
        client_tools=(ClientToolDeclaration(name="pick", description="选一张图",
                                            parameters={"type": "object", "b": 1, "a": 2},
                                            read_only=True, effects=("ui",), timeout_ms=1000),),
        thinking_budget=2048, max_turns=3, cwd="/srv/work",
        platform=PlatformPromptOptions(system=(), system_append=("补充",), strategy="prepend"),
    )
    stored = row(title="旅行", options=options)
    await engine.write(lambda c: insert_session(c, stored))
    assert await engine.read(lambda c: load_session(c, "s_1")) == stored
    assert await engine.read(lambda c: load_session(c, "s_missing")) is None
    meta = stored.meta(live=False).encode()
    assert meta == {"sessionId": "s_1", "endUserId": "u_1", "status": "idle", "live": False,
                    "lastSeq": 0, "createdAt": created_ms, "lastActivityAt": created_ms, "title": "旅行"}


async def test_status_title_and_cwd(engine):
    await engine.write(lambda c: insert_session(c, row()))
    assert await engine.write(lambda c: mark_status(c, "s_1", "running", last_activity_at_ms=created_ms + 5))
    assert not await engine.write(lambda c: mark_status(c, "s_missing", "ended"))
    with pytest.raises(ValueError):
        await engine.write(lambda c: mark_status(c, "s_1", "paused"))
    assert await engine.write(lambda c: set_title(c, "s_1", "t" * session_title_characters_max))
    with pytest.raises(ValueError):
        await engine.write(lambda c: set_title(c, "s_1", "t" * (session_title_characters_max + 1)))
    assert await engine.write(lambda c: set_cwd(c, "s_1", "/a")) is None
    assert await engine.write(lambda c: set_cwd(c, "s_1", "/b")) == "/a"
    loaded = await engine.read(lambda c: load_session(c, "s_1"))
    assert (loaded.status, loaded.last_activity_at_ms, loaded.options.cwd) == ("running", created_ms + 5, "/b")
    assert loaded.title == "t" * session_title_characters_max


async def test_listing_is_per_user_newest_activity_first_and_paged(engine):
    def insert_all(connection):
        for index in range(5):
            insert_session(connection, row(f"s_{index}", activity=created_ms + (index * 7) % 5))
        insert_session(connection, row("s_other", end_user_id="u_2", activity=created_ms + 99))
    await engine.write(insert_all)
    rows, total = await engine.read(lambda c: list_sessions(c, "u_1", 2, 0))
    assert total == 5 and [r.session_id for r in rows] == ["s_2", "s_4"]
    rows, total = await engine.read(lambda c: list_sessions(c, "u_1", sessions_list_limit_max, 3))
    assert [r.session_id for r in rows] == ["s_3", "s_0"]
    rows, total = await engine.read(lambda c: list_sessions(c, "u_1", 1, 5))
    assert (rows, total) == ([], 5)
    for limit in (0, sessions_list_limit_max + 1):
        with pytest.raises(ValueError):
            await engine.read(lambda c, limit=limit: list_sessions(c, "u_1", limit, 0))


async def test_history_pages_at_their_boundaries(engine):
    await engine.write(lambda c: insert_session(c, row()))
    await commit(engine, seqs=(1, 2), messages=[user(f"m{index}") for index in range(5)])

    async def page(offset, limit):
        return await engine.read(lambda c: read_history(c, "s_1", offset, limit))

    first = await page(0, 2)
    assert ([m["content"][0]["text"] for m in first.messages], first.total, first.next_offset) == (["m0", "m1"], 5, 2)
    assert first.last_seq == 2
    last = await page(4, 2)
    assert ([m["content"][0]["text"] for m in last.messages], last.next_offset) == (["m4"], None)
    exact = await page(3, 2)
    assert (len(exact.messages), exact.next_offset) == (2, None)
    assert (await page(5, 2)).messages == () and (await page(9, 1)).messages == ()
    assert len((await page(0, None)).messages) == 5
    assert len((await page(0, history_page_messages_max)).messages) == 5
    for limit in (0, history_page_messages_max + 1):
        with pytest.raises(ValueError):
            await page(0, limit)
    encoded = first.encode()
    assert encoded["sessionId"] == "s_1" and encoded["nextOffset"] == 2 and "nextOffset" not in last.encode()


async def test_a_turn_is_one_transaction(engine):
    await engine.write(lambda c: insert_session(c, row()))

    def crash_after_commit(connection):
        commit_turn(connection, "s_1", events=[event(1)], messages=[user("lost")], last_seq=1,
                    sealed=True, status="idle", usage=None, last_activity_at_ms=created_ms)
        raise RuntimeError("the process died before COMMIT")

    with pytest.raises(RuntimeError):
        await engine.write(crash_after_commit)
    loaded = await engine.read(lambda c: load_session(c, "s_1"))
    assert (loaded.last_seq, loaded.message_count) == (0, 0)
    assert (await engine.read(lambda c: read_events(c, "s_1"))).events == ()
    updated = await commit(engine, seqs=(1, 3), messages=[user("kept")], last_seq=4, status="idle")
    assert (updated.last_seq, updated.message_count, updated.seq_sealed) == (4, 1, True)
    for seqs in ((4,), (5, 5), (6, 5)):
        with pytest.raises(ValueError):
            await commit(engine, seqs=seqs, last_seq=9)
    with pytest.raises(ValueError):
        await commit(engine, seqs=(), last_seq=3)  # the watermark never goes back
    assert (await engine.read(lambda c: load_session(c, "s_1"))).last_seq == 4


async def test_the_event_log_keeps_the_newest_events(engine):
    await engine.write(lambda c: insert_session(c, row()))
    await commit(engine, seqs=range(1, session_log_events_max + 1))
    log = await engine.read(lambda c: read_events(c, "s_1"))
    assert (len(log.events), log.oldest_seq, log.events_dropped) == (session_log_events_max, 1, 0)
    control = StoredEvent.of({"type": "server.tool.request", "sessionId": "s_1",
                              "seq": session_log_events_max + 1, "v": 1, "source": "server"},
                             event_kind_control)
    await engine.write(lambda c: commit_turn(
        c, "s_1", events=[control], messages=(), last_seq=session_log_events_max + 1, sealed=True,
        status="idle", usage=None, last_activity_at_ms=created_ms))
    log = await engine.read(lambda c: read_events(c, "s_1", after_seq=session_log_events_max - 1))
    assert [e.seq for e in log.events] == [session_log_events_max, session_log_events_max + 1]
    assert (log.oldest_seq, log.events_dropped, log.last_seq) == (2, 1, session_log_events_max + 1)
    assert log.events[-1] == control and json.loads(log.events[0].data)["text"] == "你好"
    assert '"text":"你好"' in log.events[0].data  # compact, not ASCII-escaped


async def test_epochs_start_per_the_contract(engine):
    sealed = row(last_seq=41, seq_sealed=True)
    assert epoch_start(sealed, now_ms=created_ms + 10_000) == 42
    unsealed = row(last_seq=41, seq_sealed=False)
    assert epoch_start(unsealed, now_ms=created_ms + 10_000) == 10_000
    assert epoch_start(unsealed, now_ms=created_ms + 20) == 42  # the watermark wins
    assert epoch_start(unsealed, now_ms=created_ms + 42) == 42
    assert epoch_start(unsealed, now_ms=created_ms + 43) == 43

    await engine.write(lambda c: insert_session(c, row()))
    await commit(engine, seqs=(1, 2), sealed=True)
    loaded = await engine.read(lambda c: load_session(c, "s_1"))
    start = epoch_start(loaded, now_ms=created_ms + 5_000)
    assert start == 3
    assert await engine.write(lambda c: begin_epoch(c, "s_1", start))
    loaded = await engine.read(lambda c: load_session(c, "s_1"))
    assert (loaded.epoch_start_seq, loaded.seq_sealed, loaded.last_seq) == (3, False, 2)
    # A crash now (unsealed) makes the next epoch start past anything this epoch streamed.
    assert epoch_start(loaded, now_ms=created_ms + 5_000) == 5_000
    with pytest.raises(ValueError):
        await engine.write(lambda c: begin_epoch(c, "s_1", 2))
    assert not await engine.write(lambda c: begin_epoch(c, "s_missing", 1))
    assert await engine.write(lambda c: seal_epoch(c, "s_1"))
    assert (await engine.read(lambda c: load_session(c, "s_1"))).seq_sealed


async def test_a_usage_snapshot_that_lags_the_history_is_reported(engine):
    await engine.write(lambda c: insert_session(c, row()))
    assert usage_is_stale(await engine.read(lambda c: load_session(c, "s_1"))) is None
    usage = UsageSnapshot(input_tokens=10, output_tokens=5, as_of_message_count=2)
    updated = await commit(engine, seqs=(1,), messages=[user("a"), {"role": "assistant", "content": []}], usage=usage)
    assert usage_is_stale(updated) is None and updated.usage == usage
    # The next turn commits, then the process dies before its usage snapshot.
    updated = await commit(engine, seqs=(2,), messages=[user("b"), user("c"), user("d")])
    assert usage_is_stale(updated) == 3
    await engine.write(lambda c: record_usage(c, "s_1", UsageSnapshot(20, 9, 0, 0, 5)))
    assert usage_is_stale(await engine.read(lambda c: load_session(c, "s_1"))) is None


@pytest.mark.parametrize("damage, read", [
    ("UPDATE agent_session_messages SET message_json = '{\"role\":' WHERE position = 1", "history"),
    ("UPDATE agent_session_messages SET message_json = '[1]' WHERE position = 2", "history"),
    ("UPDATE agent_session_messages SET message_json = x'00ff' WHERE position = 0", "history"),
    ("DELETE FROM agent_session_messages WHERE position = 1", "history"),
    ("DELETE FROM agent_session_messages WHERE position = 2", "history"),
    ("UPDATE agent_sessions SET message_count = 4", "history"),
    ("UPDATE agent_sessions SET message_count = 2", "history"),
    ("UPDATE agent_sessions SET options_json = 'not json'", "row"),
    ("UPDATE agent_sessions SET options_json = '{}'", "row"),
    ("UPDATE agent_sessions SET usage_json = '{\"inputTokens\":-1}'", "row"),
    ("UPDATE agent_sessions SET status = 'weird'", "row"),
    ("UPDATE agent_sessions SET last_seq = 'x'", "row"),
    ("UPDATE agent_session_events SET data = '{\"seq\":' WHERE seq = 1", "events"),
    ("UPDATE agent_session_events SET data = '{\"seq\":7}' WHERE seq = 1", "events"),
    ("UPDATE agent_session_events SET kind = 'other' WHERE seq = 1", "events"),
])
async def test_damage_is_store_corrupted_never_a_short_history(engine, damage, read):
    await engine.write(lambda c: insert_session(c, row()))
    await commit(engine, seqs=(1, 2), messages=[user("a"), user("b"), user("c")],
                 usage=UsageSnapshot(as_of_message_count=3))
    await engine.write(lambda c: c.execute(damage))
    readers = {
        "history": lambda c: read_history(c, "s_1", 0, None),
        "row": lambda c: load_session(c, "s_1"),
        "events": lambda c: read_events(c, "s_1"),
    }
    with pytest.raises(StoreCorrupted) as caught:
        await engine.read(readers[read])
    assert caught.value.session_id == "s_1"


async def test_history_writes_refuse_non_messages(engine):
    await engine.write(lambda c: insert_session(c, row()))
    for bad in ({"content": "no role"}, {"role": "user", "x": object()}):
        with pytest.raises(ValueError):
            await commit(engine, seqs=(1,), messages=[bad])
    with pytest.raises(apsw.ConstraintError):
        await engine.write(lambda c: insert_session(c, row()))


def test_the_store_slice_is_re_exported():
    import troupe.actors.sessions as sessions
    from troupe.actors.sessions import _checkpoints, _schema, _store

    for module in (_store, _checkpoints, _schema):
        for name in module.__all__:
            assert name in sessions.__all__ and getattr(sessions, name) is getattr(module, name), name
    assert issubclass(StoreCorrupted, StorageCorrupt)  # generic storage handlers see it too


def test_a_stored_event_frames_to_the_same_bytes_as_the_live_one():
    from troupe.actors.sessions import event_frame

    live = {"type": "msg.text.delta", "sessionId": "s_1", "turnId": "t", "seq": 3, "ts": 1.5e12,
            "v": 1, "source": "kernel", "text": "猫 \"quoted\"\n", "n": 0.1}
    control = {"type": "server.tool.request", "sessionId": "s_1", "seq": 4, "v": 1, "source": "server"}
    for original, kind in ((live, "kernel"), (control, event_kind_control)):
        stored = StoredEvent.of(original, kind)
        assert event_frame(stored.event()) == event_frame(original)
