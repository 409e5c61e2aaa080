"""``TokenLookups``: concurrent requests share one read, yet every request is answered from a
read that began after it arrived (so a revocation holds from the next request on)."""

from __future__ import annotations

import apsw
import pytest
import trio
import trio.testing

from troupe.auth import TokenLookups, TokenScope, auth_migrations, token_create, token_revoke
from troupe.storage import StorageError


class GatedEngine:
    """An engine stand-in: each read waits until the test opens the gate, then runs on one
    in-memory connection holding the token table."""

    def __init__(self) -> None:
        self.connection = apsw.Connection(":memory:")
        for migration in auth_migrations:
            self.connection.execute(migration.sql)
        self.gate = trio.Event()
        self.started: list[int] = []
        self.failure: Exception | None = None

    async def read(self, function):
        self.started.append(len(self.started))
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return function(self.connection)

    def create(self, name: str, secret: str) -> None:
        token_create(self.connection, name=name, scope=TokenScope.all(), secret=secret, created_at=0.0)


async def test_waiting_requests_share_one_read_and_get_their_own_answers():
    engine = GatedEngine()
    engine.create("a", "troupe_a")
    engine.create("b", "troupe_b")
    lookups = TokenLookups(engine)
    answers: dict[str, object] = {}

    async def ask(secret: str) -> None:
        answers[secret] = await lookups.authenticate(secret)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "troupe_a")
        await trio.testing.wait_all_tasks_blocked()
        assert engine.started == [0]  # the first request leads a round of its own
        for secret in ("troupe_b", "troupe_unknown", "troupe_a"):
            nursery.start_soon(ask, secret)
        await trio.testing.wait_all_tasks_blocked()
        engine.gate.set()
    assert lookups.reads == 2
    assert answers["troupe_a"].name == "a" and answers["troupe_b"].name == "b"
    assert answers["troupe_unknown"] is None
    assert await lookups.authenticate(None) is None and await lookups.authenticate("x" * 201) is None
    assert lookups.reads == 2


async def test_a_revocation_before_a_request_arrives_is_seen_even_while_a_read_runs():
    engine = GatedEngine()
    engine.create("a", "troupe_a")
    lookups = TokenLookups(engine)
    answers: list[object] = []

    async def ask() -> None:
        answers.append(await lookups.authenticate("troupe_a"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        token_revoke(engine.connection, name="a", revoked_at=1.0)  # the CLI, mid-read
        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        engine.gate.set()
    # The first read's snapshot predates the revoke in real SQLite; this stand-in reads
    # live, so both see it; what matters is that the second request got a read of its own.
    assert lookups.reads == 2 and answers[1] is None


async def test_a_cancelled_leader_still_answers_its_round():
    engine = GatedEngine()
    engine.create("a", "troupe_a")
    lookups = TokenLookups(engine)
    follower: list[object] = []

    async def lead() -> None:
        await lookups.authenticate("troupe_a")
        await trio.sleep_forever()  # the client went away: the cancellation lands here at the latest

    async def follow() -> None:
        follower.append(await lookups.authenticate("troupe_a"))

    leader_scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_in, leader_scope, lead)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(follow)  # waits for the leader's round, then leads its own
        await trio.testing.wait_all_tasks_blocked()
        leader_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert engine.started == [0]  # the shielded read is still running
        engine.gate.set()
    assert [grant.name for grant in follower] == ["a"]
    assert lookups.reads == 2


async def _run_in(scope: trio.CancelScope, function) -> None:
    with scope:
        await function()


async def test_a_failed_read_fails_every_request_of_its_round():
    engine = GatedEngine()
    engine.failure = StorageError("disk gone")
    engine.gate.set()
    lookups = TokenLookups(engine)
    failures: list[BaseException] = []

    async def ask(secret: str) -> None:
        with pytest.raises(StorageError) as caught:
            await lookups.authenticate(secret)
        failures.append(caught.value)

    async with trio.open_nursery() as nursery:
        for secret in ("troupe_a", "troupe_b"):
            nursery.start_soon(ask, secret)
    assert len(failures) == 2 and failures[0] is not failures[1]
