"""The core tables' helpers: journal + snapshots, actor state, blobs, reminders."""

import datetime
import hashlib

import cbor2
import pytest

from troupe.storage import (
    CorruptRecord,
    blob_get,
    blob_put,
    cbor_decode,
    cbor_encode,
    journal_append,
    journal_load,
    journal_snapshot,
    open_engine,
    reminder_attempt,
    reminder_delete,
    reminder_get,
    reminder_set,
    reminders_due,
    reminders_for,
    state_delete,
    state_get,
    state_put,
)


async def test_journal_append_and_load(inline_env):
    async with open_engine(inline_env) as engine:
        assert await engine.write(lambda c: journal_append(c, "entry", "a", [{"n": 1}, {"n": 2}])) == 2
        assert await engine.write(lambda c: journal_append(c, "entry", "a", ["three"])) == 3
        assert await engine.write(lambda c: journal_append(c, "entry", "b", ["other"])) == 1
        assert await engine.write(lambda c: journal_append(c, "entry", "a", [])) == 3
        state = await engine.read(lambda c: journal_load(c, "entry", "a"))
    assert state.snapshot is None and state.snapshot_seq == 0
    assert state.records == [(1, {"n": 1}), (2, {"n": 2}), (3, "three")]
    assert state.last_seq == 3


async def test_snapshot_prunes_and_sequence_continues(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: journal_append(c, "session", "s", list(range(10))))
        await engine.write(lambda c: journal_snapshot(c, "session", "s", 7, {"sum": 28}))
        state = await engine.read(lambda c: journal_load(c, "session", "s"))
        assert (state.snapshot, state.snapshot_seq) == ({"sum": 28}, 7)
        assert state.records == [(8, 7), (9, 8), (10, 9)]
        stored = await engine.read(lambda c: c.execute(
            "SELECT count(*) FROM journal WHERE kind = 'session'").get)
        assert stored == 3
        # Snapshot at the end prunes everything; numbering must not restart at 1.
        await engine.write(lambda c: journal_snapshot(c, "session", "s", 10, {"sum": 45}))
        assert await engine.write(lambda c: journal_append(c, "session", "s", ["next"])) == 11
        state = await engine.read(lambda c: journal_load(c, "session", "s"))
        assert state.records == [(11, "next")] and state.snapshot_seq == 10


async def test_snapshot_without_prune_keeps_history(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: journal_append(c, "k", "x", [1, 2, 3]))
        await engine.write(lambda c: journal_snapshot(c, "k", "x", 2, "s", prune=False))
        assert await engine.read(lambda c: c.execute("SELECT count(*) FROM journal").get) == 3
        state = await engine.read(lambda c: journal_load(c, "k", "x"))
        assert state.records == [(3, 3)]


async def test_snapshot_past_the_journal_is_refused(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: journal_append(c, "k", "x", [1]))
        with pytest.raises(ValueError):
            await engine.write(lambda c: journal_snapshot(c, "k", "x", 5, "s"))


async def test_journal_rejects_trailing_bytes_and_garbage(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: c.execute(
            "INSERT INTO journal VALUES ('k', 'x', 1, ?)", (cbor2.dumps(1) + b"\x00",)))
        with pytest.raises(CorruptRecord):
            await engine.read(lambda c: journal_load(c, "k", "x"))
        await engine.write(lambda c: c.execute(
            "INSERT INTO journal VALUES ('k', 'y', 1, ?)", (b"\x82\x01",)))
        with pytest.raises(CorruptRecord):
            await engine.read(lambda c: journal_load(c, "k", "y"))


def test_cbor_is_canonical_strict_and_timezone_aware():
    assert cbor_encode({"b": 1, "a": 2}) == cbor_encode({"a": 2, "b": 1})
    big = {"text": "x" * 100_000, "items": list(range(1000))}
    assert cbor_decode(cbor_encode(big)) == big
    with pytest.raises(CorruptRecord):
        cbor_decode(cbor_encode(big) + b"\x01")
    aware = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert cbor_decode(cbor_encode(aware)) == aware
    naive = datetime.datetime(2024, 1, 2, 3, 4, 5)
    assert cbor_decode(cbor_encode(naive)) == aware


async def test_state_put_get_delete(inline_env):
    async with open_engine(inline_env) as engine:
        assert await engine.read(lambda c: state_get(c, "character", "小天")) is None
        await engine.write(lambda c: state_put(c, "character", "小天", {"mood": "calm"}))
        await engine.write(lambda c: state_put(c, "character", "小天", {"mood": "happy"}))
        assert await engine.read(lambda c: state_get(c, "character", "小天")) == {"mood": "happy"}
        assert await engine.write(lambda c: state_delete(c, "character", "小天")) is True
        assert await engine.write(lambda c: state_delete(c, "character", "小天")) is False
        assert await engine.read(lambda c: state_get(c, "character", "小天")) is None


async def test_blobs_dedupe_by_sha256(inline_env):
    data = b"image bytes" * 1000
    async with open_engine(inline_env) as engine:
        first = await engine.write(lambda c: blob_put(c, data))
        second = await engine.write(lambda c: blob_put(c, data))
        assert first == second == hashlib.sha256(data).hexdigest()
        assert await engine.read(lambda c: c.execute("SELECT count(*) FROM blobs").get) == 1
        assert await engine.read(lambda c: blob_get(c, first)) == data
        assert await engine.read(lambda c: blob_get(c, "0" * 64)) is None


async def test_reminders_order_is_total_and_deterministic(inline_env):
    async with open_engine(inline_env) as engine:
        def setup(connection):
            reminder_set(connection, "session", "b", "idle", 100.0, {"n": 1})
            reminder_set(connection, "session", "a", "idle", 100.0, {"n": 2})
            reminder_set(connection, "goal", "z", "remind", 100.0, None)
            reminder_set(connection, "session", "a", "expire", 100.0, "e")
            reminder_set(connection, "session", "a", "later", 300.0, "l")
            reminder_set(connection, "session", "c", "early", 50.0, "x")

        await engine.write(setup)
        due = await engine.read(lambda c: reminders_due(c, 200.0, 10))
        assert [(r.due_wall, r.kind, r.key, r.name) for r in due] == [
            (50.0, "session", "c", "early"),
            (100.0, "goal", "z", "remind"),
            (100.0, "session", "a", "expire"),
            (100.0, "session", "a", "idle"),
            (100.0, "session", "b", "idle"),
        ]
        assert [r.name for r in await engine.read(lambda c: reminders_due(c, 200.0, 2))] == [
            "early", "remind"]
        mine = await engine.read(lambda c: reminders_for(c, "session", "a"))
        assert [(r.name, r.payload) for r in mine] == [("expire", "e"), ("idle", {"n": 2}),
                                                       ("later", "l")]


async def test_reminder_attempts_upsert_and_delete(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: reminder_set(c, "w", "h", "retry", 10.0, "p"))
        assert await engine.write(lambda c: reminder_attempt(c, "w", "h", "retry")) == 1
        assert await engine.write(lambda c: reminder_attempt(c, "w", "h", "retry")) == 2
        [reminder] = await engine.read(lambda c: reminders_for(c, "w", "h"))
        assert reminder.attempts == 2
        await engine.write(lambda c: reminder_set(c, "w", "h", "retry", 20.0, "q"))
        [reminder] = await engine.read(lambda c: reminders_for(c, "w", "h"))
        assert (reminder.due_wall, reminder.payload, reminder.attempts) == (20.0, "q", 0)
        assert await engine.read(lambda c: reminder_get(c, "w", "h", "retry")) == reminder
        assert await engine.read(lambda c: reminder_get(c, "w", "h", "other")) is None
        assert await engine.write(lambda c: reminder_delete(c, "w", "h", "retry")) is True
        assert await engine.write(lambda c: reminder_attempt(c, "w", "h", "retry")) == 0
        assert await engine.read(lambda c: reminders_for(c, "w", "h")) == []
        with pytest.raises(ValueError):
            await engine.read(lambda c: reminders_due(c, 0.0, 0))


async def test_reminder_delete_with_due_wall_keeps_one_that_was_set_again(inline_env):
    async with open_engine(inline_env) as engine:
        await engine.write(lambda c: reminder_set(c, "k", "a", "r", 10.0, None))
        await engine.write(lambda c: reminder_set(c, "k", "a", "r", 20.0, None))  # set again
        assert await engine.write(lambda c: reminder_delete(c, "k", "a", "r", due_wall=10.0)) is False
        [reminder] = await engine.read(lambda c: reminders_for(c, "k", "a"))
        assert reminder.due_wall == 20.0
        assert await engine.write(lambda c: reminder_delete(c, "k", "a", "r", due_wall=20.0)) is True
        assert await engine.read(lambda c: reminders_for(c, "k", "a")) == []
