"""The entry actor on a real engine: atomic batches, dedupe across restarts, creation
settings kept, and refused media rolling a batch back."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.host import (
    AcceptMessages,
    MediaRefused,
    MessagesAccepted,
    NewMessage,
    entry_actor_kind,
    host_migrations,
    named_paces,
)
from troupe.auth import TokenGrant, TokenScope, auth_migrations
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

grant = TokenGrant(1, "connector", TokenScope.all())


def new(key: str, **fields) -> NewMessage:
    return NewMessage(dedupe_key=key, sender="s", content=f"c-{key}", occurred_at="2026-10-10T20:00:00+08:00",
                      occurred_at_seconds=1.0, **fields)


class SomeMedia:
    def refused_positions(self, connection, grant, entry_id, media_ids):
        return [position for position, media_id in enumerate(media_ids) if media_id != "ok"]


@pytest.fixture
async def system(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*auth_migrations, *host_migrations])
    system = ActorSystem(env, [entry_actor_kind(media=SomeMedia())], storage=engine)
    await nursery.start(system.run)
    return system


async def test_batches_dedupe_and_survive_passivation(system):
    entry = system.ref("entry", "e")
    first = await entry.ask(AcceptMessages((new("a", pace=named_paces["quick"], entry_name="E"), new("b")), grant))
    assert first == MessagesAccepted((1, 2), 2)
    await system.drain()  # every actor passivates; the next ask activates from storage
    again = await entry.ask(AcceptMessages((new("b"), new("c", pace=named_paces["relaxed"])), grant))
    assert again == MessagesAccepted((2, 3), 3)
    contents = await system.storage.read(lambda c: list(c.execute("SELECT content FROM host_messages ORDER BY id")))
    assert contents == [("c-a",), ("c-b",), ("c-c",)]
    paces = await system.storage.read(lambda c: list(c.execute("SELECT name, pace_name FROM host_entries")))
    assert paces == [("E", "quick")]


async def test_a_refused_media_reference_stores_nothing(system):
    entry = system.ref("entry", "m")
    refused = await entry.ask(AcceptMessages((new("a", media_ids=("ok",)), new("b", media_ids=("ok", "gone"))), grant))
    assert refused == MediaRefused(((1, 1, "gone"),))
    count = await system.storage.read(lambda c: c.execute("SELECT count(*) FROM host_messages").fetchone()[0])
    assert count == 0
    accepted = await entry.ask(AcceptMessages((new("a", media_ids=("ok",)),), grant))
    assert accepted.message_ids == (1,)
    media = await system.storage.read(lambda c: list(c.execute("SELECT * FROM host_message_media")))
    assert media == [(1, 0, "ok")]
    with trio.fail_after(5):
        assert (await entry.ask(AcceptMessages((new("a", media_ids=("gone",)),), grant))).message_ids == (1,)
