"""Leased recall (``_recall.RecallLease`` / ``RecallLeases``): a character's ``/query_memory``
runs outside the actor's turn.  The bounds per character and per process (at and just over
them), the waiter bound and the wait limit, what a release does to leases that wait, read or
hang, and, through the actor on a real engine, that a leased answer equals the in-turn one,
that the mailbox moves while a lease reads, and that a lease outlives an actor crash."""

from __future__ import annotations

import gc

import pytest
import trio

from troupe.actors.character import (
    CacheHistory,
    CharacterReleased,
    CharacterStatus,
    MemoryResults,
    MemoryUnavailable,
    QueryMemory,
    RecallLease,
    RecallLeases,
    ReleaseCharacter,
    ReloadCharacter,
    character_leased_queries_max,
    lease_drain_seconds_max,
    process_leased_queries_max,
)
from troupe.actors.character._recall import (
    CharacterRecallIndexes,
    lease_exit_seconds_max,
    lease_wait_seconds_max,
)
from troupe.retrieval import RecallResult
from troupe.runtime import ActorCrashed

from .test_character_actor import settled_outbox
from .test_character_wiring import engine, start, user_lines  # noqa: F401  (the engine fixture)

name = "小天"


class Clock:
    def monotonic(self) -> float:
        return trio.current_time()


class GatedRecall:
    """A recall handle whose reads wait for ``gate`` (``None``: answer at once)."""

    def __init__(self, name: str = name, gate: trio.Event | None = None) -> None:
        self.name = name
        self.closed = False
        self.gate = gate
        self.reads = 0
        self.reading = 0
        self.reading_max = 0

    async def recall(self, query, time, *, limit, sync_stale=True):
        assert not sync_stale, "a leased recall never syncs"
        self.reads += 1
        self.reading += 1
        self.reading_max = max(self.reading_max, self.reading)
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await trio.sleep(0)
        finally:
            self.reading -= 1
        return RecallResult([], "hybrid", candidates_total=7)


async def run_leases(leases: RecallLeases, recalls, answers: list, nursery) -> None:
    for recall in recalls:
        lease = leases.lease(recall)

        async def run(lease=lease) -> None:
            answers.append(await lease.query("寿司", None, clock=Clock()))

        nursery.start_soon(run)


def test_the_limits_relate():
    assert 1 <= character_leased_queries_max <= process_leased_queries_max
    assert lease_drain_seconds_max + lease_exit_seconds_max < lease_wait_seconds_max + 30


async def test_a_character_reads_at_most_its_slots_at_once_and_the_rest_wait(autojump_clock):
    leases = RecallLeases(character_max=2, process_max=4)
    gate = trio.Event()
    recall = GatedRecall(gate=gate)
    answers: list = []
    async with trio.open_nursery() as nursery:
        await run_leases(leases, [recall] * 3, answers, nursery)
        await trio.sleep(1)
        assert (recall.reading, leases.statistics().waiting) == (2, 1)  # at the bound, one over waits
        gate.set()
    assert [answer.candidates_total for answer in answers] == [7, 7, 7]
    assert recall.reading_max == 2 and leases.statistics().reading_max == 2
    assert leases.statistics().reading == 0 and not leases.leases_of(name)


async def test_the_process_bound_spans_characters(autojump_clock):
    leases = RecallLeases(character_max=1, process_max=2)
    gate = trio.Event()
    recalls = [GatedRecall(f"c{number}", gate) for number in range(3)]
    answers: list = []
    async with trio.open_nursery() as nursery:
        await run_leases(leases, recalls, answers, nursery)
        await trio.sleep(1)
        assert sum(recall.reading for recall in recalls) == 2
        assert leases.statistics().waiting == 1
        gate.set()
    assert len(answers) == 3 and all(isinstance(answer, MemoryResults) for answer in answers)


async def test_over_the_waiter_bound_a_query_answers_503_at_once(autojump_clock):
    leases = RecallLeases(character_max=1, process_max=1, waiters_max=1)
    gate = trio.Event()
    recall = GatedRecall(gate=gate)
    answers: list = []
    async with trio.open_nursery() as nursery:
        await run_leases(leases, [recall] * 3, answers, nursery)
        await trio.sleep(0.5)
        assert len(answers) == 1 and isinstance(answers[0], MemoryUnavailable)  # the third: busy
        assert answers[0].retry_after_seconds and leases.statistics().busy == 1
        gate.set()
    assert sum(isinstance(answer, MemoryResults) for answer in answers) == 2


async def test_a_query_that_finds_no_slot_in_time_answers_503(autojump_clock):
    leases = RecallLeases(character_max=1, process_max=1, wait_seconds_max=3.0)
    gate = trio.Event()
    recall = GatedRecall(gate=gate)
    answers: list = []
    async with trio.open_nursery() as nursery:
        await run_leases(leases, [recall] * 2, answers, nursery)
        await trio.sleep(2.9)
        assert not answers  # still waiting at the limit
        await trio.sleep(0.2)
        assert len(answers) == 1 and isinstance(answers[0], MemoryUnavailable)
        gate.set()
    assert isinstance(answers[1], MemoryResults) and recall.reads == 1


async def test_drain_waits_for_a_reading_lease_within_its_limit(autojump_clock):
    leases = RecallLeases()
    gate = trio.Event()
    recall = GatedRecall(gate=gate)
    answers: list = []
    async with trio.open_nursery() as nursery:
        await run_leases(leases, [recall], answers, nursery)
        await trio.sleep(0.1)

        async def open_gate() -> None:
            await trio.sleep(lease_drain_seconds_max / 2)
            gate.set()

        nursery.start_soon(open_gate)
        started = trio.current_time()
        assert await leases.drain(name) == 0
        assert trio.current_time() - started == pytest.approx(lease_drain_seconds_max / 2)
        assert answers and isinstance(answers[0], MemoryResults)  # answered before drain returned


async def test_drain_revokes_a_hanging_lease_and_it_never_answers_results(autojump_clock):
    leases = RecallLeases()
    recall = GatedRecall(gate=trio.Event())  # never opens
    events: list = []
    answers: list = []

    async with trio.open_nursery() as nursery:
        lease = leases.lease(recall, trace=lambda event, **fields: events.append((event, fields)))

        async def run() -> None:
            answers.append(await lease.query("寿司", None, clock=Clock()))

        nursery.start_soon(run)
        await trio.sleep(0.1)
        started = trio.current_time()
        assert await leases.drain(name) == 1
        assert trio.current_time() - started == pytest.approx(lease_drain_seconds_max)
        # Drain returned only after the revoked read left: nothing reads the handle now.
        assert recall.reading == 0 and lease.ended.is_set()
        assert events == [("character_lease_read", {"lease": lease.number}),
                          ("character_lease_end", {"lease": lease.number, "outcome": "revoked"})]
    assert isinstance(answers[0], MemoryUnavailable) and leases.statistics().revoked == 1


async def test_drain_revokes_a_lease_not_yet_reading_at_once(autojump_clock):
    leases = RecallLeases()
    recall = GatedRecall()
    lease = leases.lease(recall)
    started = trio.current_time()
    assert await leases.drain(name) == 1
    assert trio.current_time() == started
    assert isinstance(await lease.query("寿司", None, clock=Clock()), MemoryUnavailable)
    assert recall.reads == 0


async def test_a_lease_dropped_unstarted_is_forgotten():
    leases = RecallLeases()
    leases.lease(GatedRecall())
    gc.collect()
    assert leases.leases_of(name) == []


async def test_a_closed_handle_is_never_read():
    leases = RecallLeases()
    recall = GatedRecall()
    recall.closed = True
    assert isinstance(await leases.lease(recall).query("寿司", None, clock=Clock()), MemoryUnavailable)
    assert recall.reads == 0


# -- through the actor, on a real engine ---------------------------------------------------------


async def test_a_leased_query_answers_what_the_turn_answers(nursery, engine):  # noqa: F811
    system, character = await start(nursery, engine)
    await character.ask(CacheHistory(messages=user_lines("我喜欢吃寿司", "我爱吃拉面")))
    await settled_outbox(system)
    in_turn = await character.ask(QueryMemory(query="寿司"))
    lease = await character.ask(QueryMemory(query="寿司", leased=True))
    assert isinstance(lease, RecallLease)
    leased = await lease.query("寿司", None, clock=engine.test_env.clock)
    assert isinstance(leased, MemoryResults) and isinstance(in_turn, MemoryResults)
    assert leased.results == in_turn.results and leased.candidates_total == in_turn.candidates_total


async def test_the_mailbox_moves_while_a_lease_reads_and_release_waits_for_it(nursery, engine):  # noqa: F811
    system, character = await start(nursery, engine)
    await character.ask(CacheHistory(messages=user_lines("我喜欢吃寿司")))
    await settled_outbox(system)
    lease = await character.ask(QueryMemory(query="寿司", leased=True))
    gate, reading = trio.Event(), trio.Event()
    read = lease.recall.recall

    async def gated(*args, **options):
        reading.set()
        await gate.wait()
        return await read(*args, **options)

    lease.recall.recall = gated
    answers: list = []

    async def run() -> None:
        answers.append(await lease.query("寿司", None, clock=engine.test_env.clock))

    nursery.start_soon(run)
    await reading.wait()
    assert (await character.ask(CharacterStatus())).stores_open  # the turn is not blocked
    second = await character.ask(QueryMemory(query="寿司", leased=True))
    assert isinstance(second, RecallLease)  # a second query is admitted meanwhile

    async def release() -> None:
        answers.append(await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0)))

    nursery.start_soon(release)
    await trio.sleep(0.05)
    assert answers == []  # the release waits for the reading lease
    gate.set()
    with trio.fail_after(5):
        while len(answers) < 2:
            await trio.sleep(0.01)
    assert isinstance(answers[0], MemoryResults) and isinstance(answers[1], CharacterReleased)
    # The lease admitted before the release and not started is revoked.
    assert isinstance(await second.query("寿司", None, clock=engine.test_env.clock), MemoryUnavailable)
    assert isinstance(await character.ask(QueryMemory(query="寿司", leased=True)), MemoryUnavailable)
    await character.ask(ReloadCharacter(release_tokens=("t1",)))
    again = await character.ask(QueryMemory(query="寿司", leased=True))
    assert isinstance(await again.query("寿司", None, clock=engine.test_env.clock), MemoryResults)


async def test_a_lease_outlives_an_actor_crash_and_the_next_release_revokes_it(nursery, engine):  # noqa: F811
    drain_seconds = 0.3
    engine.attachments[CharacterRecallIndexes.leases_key] = RecallLeases(drain_seconds_max=drain_seconds)
    system, character = await start(nursery, engine)
    await character.ask(CacheHistory(messages=user_lines("我喜欢吃寿司")))
    await settled_outbox(system)
    lease = await character.ask(QueryMemory(query="寿司", leased=True))
    reading = trio.Event()

    async def hangs(*args, **options):
        reading.set()
        await trio.sleep_forever()

    lease.recall.recall = hangs
    answers: list = []

    async def run() -> None:
        answers.append(await lease.query("寿司", None, clock=engine.test_env.clock))

    nursery.start_soon(run)
    await reading.wait()
    with pytest.raises(ActorCrashed):
        await character.ask("not a request")
    started = trio.current_time()
    released = await character.ask(ReleaseCharacter(claim_token="t1", claim_generation=0))
    assert isinstance(released, CharacterReleased)
    assert trio.current_time() - started >= drain_seconds
    assert lease.revoked and lease.ended.is_set()
    await trio.sleep(0)
    assert isinstance(answers[0], MemoryUnavailable)
