"""Checkpoints on a real engine: snapshot, list, restore in place, delete, the per-session
cap, export → import giving byte-identical history, damaged exports refused with nothing
written, a damaged stored blob as ``StoreCorrupted``, and fork at lastSeq 1."""

from __future__ import annotations

import hashlib

import cbor2
import pytest

from troupe.actors.sessions import (
    SessionRefused,
    SessionRow,
    StoreCorrupted,
    StoredEvent,
    checkpoint_import_bytes_max,
    checkpoint_kind_auto,
    checkpoint_name_characters_max,
    checkpoints_per_session_max,
    commit_turn,
    create_checkpoint,
    decode_export,
    delete_checkpoint,
    export_checkpoint,
    fork_from_checkpoint,
    import_checkpoint,
    insert_session,
    list_checkpoints,
    load_checkpoint,
    load_session,
    read_history,
    restore_checkpoint,
    sessions_migrations,
)
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor, cbor_decode, cbor_encode

created_ms = 1_760_000_000_000
messages = [
    {"role": "user", "content": [{"t": "text", "text": "画一只猫"}]},
    {"zeta": 1, "role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ImageGen"}]},
    {"role": "tool", "toolCallId": "c1", "result": "ok", "artifact": {"kind": "image", "mime": "image/png"}},
    {"role": "assistant", "content": [{"type": "text", "text": "好了 🐱"}]},
]


@pytest.fixture
async def engine(nursery, tmp_path):
    env = Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
              storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())
    engine = await Engine.open(env, nursery=nursery, migrations=list(sessions_migrations))
    await engine.write(lambda c: new_session(c, "s_1", messages[:2], last_seq=7))
    return engine


def new_session(connection, session_id, history, last_seq):
    insert_session(connection, SessionRow(session_id=session_id, end_user_id="u_1",
                                          created_at_ms=created_ms, last_activity_at_ms=created_ms))
    commit_turn(connection, session_id, events=(), messages=history, last_seq=last_seq, sealed=True,
                status="idle", usage=None, last_activity_at_ms=created_ms)


def raw_history(connection, session_id):
    return [text for (text,) in connection.execute(
        "SELECT message_json FROM agent_session_messages WHERE session_id = ? ORDER BY position",
        (session_id,))]


def checkpoint_count(connection, session_id="s_1"):
    return len(list_checkpoints(connection, session_id))


async def test_create_list_restore_delete(engine):
    first = await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_1",
                                                           created_at_ms=created_ms + 1, name="起点"))
    assert first.encode() == {"checkpointId": "cp_1", "sessionId": "s_1", "createdAt": created_ms + 1,
                              "messageCount": 2, "lastSeq": 7, "kind": "manual", "name": "起点"}
    await engine.write(lambda c: commit_turn(c, "s_1", events=(), messages=messages[2:], last_seq=9,
                                             sealed=True, status="idle", usage=None,
                                             last_activity_at_ms=created_ms))
    second = await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_2",
                                                            created_at_ms=created_ms + 2,
                                                            kind=checkpoint_kind_auto))
    assert "name" not in second.encode() and second.message_count == 4
    assert await engine.read(lambda c: list_checkpoints(c, "s_1")) == [first, second]
    assert await engine.read(lambda c: load_checkpoint(c, "s_1", "cp_2")) == second
    assert await engine.read(lambda c: load_checkpoint(c, "s_other", "cp_2")) is None

    restored = await engine.write(lambda c: restore_checkpoint(c, "s_1", "cp_1"))
    assert restored.encode() == {"status": "restored", "fromMessages": 4, "toMessages": 2, "checkpointId": "cp_1"}
    page = await engine.read(lambda c: read_history(c, "s_1"))
    assert (list(page.messages), page.last_seq) == (messages[:2], 9)  # seq never goes back
    assert await engine.write(lambda c: restore_checkpoint(c, "s_1", "cp_missing")) is None
    # A turn after the restore appends right after the restored history.
    await engine.write(lambda c: commit_turn(c, "s_1", events=(), messages=messages[3:], last_seq=10,
                                             sealed=True, status="idle", usage=None,
                                             last_activity_at_ms=created_ms))
    assert list((await engine.read(lambda c: read_history(c, "s_1"))).messages) == [*messages[:2], messages[3]]

    assert await engine.write(lambda c: delete_checkpoint(c, "s_1", "cp_1"))
    assert not await engine.write(lambda c: delete_checkpoint(c, "s_1", "cp_1"))
    assert [m.checkpoint_id for m in await engine.read(lambda c: list_checkpoints(c, "s_1"))] == ["cp_2"]
    with pytest.raises(LookupError):
        await engine.write(lambda c: create_checkpoint(c, "s_missing", checkpoint_id="x", created_at_ms=0))
    with pytest.raises(ValueError):
        await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="x", created_at_ms=0,
                                                       name="n" * (checkpoint_name_characters_max + 1)))


async def test_the_cap_evicts_the_oldest_auto_checkpoint_first(engine):
    def fill(connection):
        create_checkpoint(connection, "s_1", checkpoint_id="cp_manual", created_at_ms=0)
        for index in range(checkpoints_per_session_max - 1):
            create_checkpoint(connection, "s_1", checkpoint_id=f"cp_auto_{index}", created_at_ms=index,
                              kind=checkpoint_kind_auto)
    await engine.write(fill)
    assert await engine.read(checkpoint_count) == checkpoints_per_session_max
    await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_new", created_at_ms=99))
    ids = [m.checkpoint_id for m in await engine.read(lambda c: list_checkpoints(c, "s_1"))]
    assert len(ids) == checkpoints_per_session_max
    assert "cp_auto_0" not in ids and ids[0] == "cp_manual" and ids[-1] == "cp_new"


async def test_export_then_import_gives_byte_identical_history(engine):
    await engine.write(lambda c: commit_turn(c, "s_1", events=(), messages=messages[2:], last_seq=9,
                                             sealed=True, status="idle", usage=None,
                                             last_activity_at_ms=created_ms))
    before = await engine.read(lambda c: raw_history(c, "s_1"))
    await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_1", created_at_ms=5, name="n"))
    data = await engine.read(lambda c: export_checkpoint(c, "s_1", "cp_1"))
    assert data == await engine.read(lambda c: export_checkpoint(c, "s_1", "cp_1"))  # deterministic
    assert await engine.read(lambda c: export_checkpoint(c, "s_1", "cp_missing")) is None
    outer = cbor_decode(data)
    assert outer["version"] == 1 and outer["sha256"] == hashlib.sha256(outer["payload"]).hexdigest()

    await engine.write(lambda c: commit_turn(c, "s_1", events=(), messages=[{"role": "user", "content": "later"}],
                                             last_seq=10, sealed=True, status="idle", usage=None,
                                             last_activity_at_ms=created_ms))
    imported = await engine.write(lambda c: import_checkpoint(c, "s_1", data, checkpoint_id="cp_2",
                                                              created_at_ms=6))
    assert imported.encode() == {"checkpointId": "cp_2", "sessionId": "s_1", "createdAt": 6,
                                 "messageCount": 4, "lastSeq": 9, "kind": "manual", "name": "n"}
    await engine.write(lambda c: restore_checkpoint(c, "s_1", "cp_2"))
    assert await engine.read(lambda c: raw_history(c, "s_1")) == before
    assert '"zeta":1,"role":"assistant"' in before[1]  # the client's key order survives
    with pytest.raises(LookupError):
        await engine.write(lambda c: import_checkpoint(c, "s_missing", data, checkpoint_id="x", created_at_ms=0))


def reencode(data: bytes, change) -> bytes:
    outer = cbor_decode(data)
    inner = cbor_decode(outer["payload"])
    change(outer, inner)
    outer["payload"] = cbor_encode(inner)
    outer["sha256"] = hashlib.sha256(outer["payload"]).hexdigest()
    return cbor_encode(outer)


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1:]


async def test_damaged_or_foreign_exports_are_refused_and_nothing_is_written(engine):
    await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_1", created_at_ms=5))
    await engine.write(lambda c: new_session(c, "s_2", messages[:1], last_seq=1))
    data = await engine.read(lambda c: export_checkpoint(c, "s_1", "cp_1"))
    outer = cbor_decode(data)
    bad_digest = cbor_encode({**outer, "payload": flip(outer["payload"], len(outer["payload"]) - 3)})

    def set_(key, value):
        return lambda outer, inner: inner.__setitem__(key, value)

    cases = {
        "flipped byte": (flip(data, len(data) - 5), "validation_failed"),
        "digest": (bad_digest, "validation_failed"),
        "truncated": (data[:-1], "validation_failed"),
        "trailing bytes": (data + b"\x00", "validation_failed"),
        "empty": (b"", "validation_failed"),
        "not cbor": (b"\xff\xfe", "validation_failed"),
        "version": (cbor_encode({**outer, "version": 2}), "validation_failed"),
        "format": (cbor_encode({**outer, "format": "other"}), "validation_failed"),
        "extra key": (cbor_encode({**outer, "more": 1}), "validation_failed"),
        "count": (reencode(data, lambda o, i: i["checkpoint"].__setitem__("messageCount", 3)), "validation_failed"),
        "message": (reencode(data, set_("messages", ["{\"no\":\"role\"}", messages[1]["role"]])), "validation_failed"),
        "text": (reencode(data, set_("messages", [b"bytes", "{}"])), "validation_failed"),
        "meta": (reencode(data, lambda o, i: i["checkpoint"].__setitem__("kind", "other")), "validation_failed"),
        "shape": (reencode(data, set_("extra", 1)), "validation_failed"),
        "other session": (data, "session_mismatch"),
        "over the cap": (b"\x00" * (checkpoint_import_bytes_max + 1), "payload_too_large"),
        "at the cap": (b"\x00" * checkpoint_import_bytes_max, "validation_failed"),
    }
    for label, (blob, code) in cases.items():
        target = "s_2" if label == "other session" else "s_1"
        refused = await engine.write(lambda c, blob=blob, target=target: import_checkpoint(
            c, target, blob, checkpoint_id="cp_x", created_at_ms=9))
        assert isinstance(refused, SessionRefused) and refused.code == code, label
    assert await engine.read(checkpoint_count) == 1
    assert await engine.read(lambda c: checkpoint_count(c, "s_2")) == 0
    assert isinstance(decode_export(cbor2.dumps([1, 2])), SessionRefused)


async def test_a_damaged_stored_checkpoint_is_store_corrupted(engine):
    await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_1", created_at_ms=5))
    await engine.write(lambda c: c.execute(
        "UPDATE agent_session_checkpoints SET history = substr(history, 1, length(history) - 1)"))
    for operation in (lambda c: restore_checkpoint(c, "s_1", "cp_1"),
                      lambda c: export_checkpoint(c, "s_1", "cp_1")):
        with pytest.raises(StoreCorrupted):
            await engine.write(operation)
    # The digest matches but the blob is not a history (damage written by other code).
    blob = cbor_encode(["not json"])
    await engine.write(lambda c: c.execute(
        "UPDATE agent_session_checkpoints SET history = ?, history_sha256 = ?",
        (blob, hashlib.sha256(blob).hexdigest())))
    with pytest.raises(StoreCorrupted):
        await engine.write(lambda c: restore_checkpoint(c, "s_1", "cp_1"))
    await engine.write(lambda c: c.execute("UPDATE agent_session_checkpoints SET kind = 'odd'"))
    with pytest.raises(StoreCorrupted):
        await engine.read(lambda c: list_checkpoints(c, "s_1"))
    # The live history was never touched.
    assert list((await engine.read(lambda c: read_history(c, "s_1"))).messages) == messages[:2]


async def test_fork_copies_the_checkpoint_into_a_new_session_at_last_seq_1(engine):
    await engine.write(lambda c: create_checkpoint(c, "s_1", checkpoint_id="cp_1", created_at_ms=5))
    template = SessionRow(session_id="s_fork", end_user_id="u_1", created_at_ms=created_ms + 50,
                          last_activity_at_ms=created_ms + 50, status="running", last_seq=99)
    created = StoredEvent.of({"type": "session.created", "sessionId": "s_fork", "seq": 1, "ts": 0,
                              "v": 1, "source": "kernel"})
    forked = await engine.write(lambda c: fork_from_checkpoint(c, "s_1", "cp_1", template, events=(created,)))
    assert (forked.last_seq, forked.seq_sealed, forked.message_count, forked.forked_from, forked.status) == (
        1, True, 2, "s_1", "idle")
    assert await engine.read(lambda c: load_session(c, "s_fork")) == forked
    assert await engine.read(lambda c: raw_history(c, "s_fork")) == await engine.read(lambda c: raw_history(c, "s_1"))
    assert await engine.write(lambda c: fork_from_checkpoint(c, "s_1", "cp_missing", template)) is None
    assert await engine.read(lambda c: load_session(c, "s_fork")) == forked
