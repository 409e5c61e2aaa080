"""The outbox on a real engine: registration with the caller's writes, claims in order,
completion exactly once, bounded retries, crash recovery that re-claims under a new claim,
cancellation, dedupe, cursors, and every bound at and just over its limit."""

from __future__ import annotations

import pytest

from troupe.actors.character import (
    OutboxTask,
    _outbox,
    active_task_count,
    active_tasks,
    append_recent,
    cancel_tasks,
    character_migrations,
    claim_lease_seconds,
    claim_next,
    complete_task,
    cursor_get,
    cursor_put,
    fail_task,
    get_task,
    outbox_attempts_max,
    read_recent,
    recover_claims,
    register_task,
    release_claim,
    retry_backoff_seconds,
    task_claim,
)
from troupe.actors.character._protocol import HistoryMessage
from troupe.storage import Engine, StorageError

from .store_helpers import base_time, character_engine_env, open_character_engine


@pytest.fixture
async def engine(nursery, tmp_path):
    return await open_character_engine(nursery, tmp_path)


async def register(engine, task_id, name="小天", kind="post_turn_signal", **options):
    options.setdefault("generation", 1)
    options.setdefault("now", base_time)
    return await engine.write(lambda c: register_task(
        c, name, task_id=task_id, kind=kind, payload={"turn": task_id}, **options))


async def claim(engine, name="小天", now=base_time, kinds=None) -> OutboxTask | None:
    return await engine.write(lambda c: claim_next(c, name, now, kinds))


async def test_a_task_registered_with_the_turn_commits_or_vanishes_with_it(engine):
    def turn(connection):
        append_recent(connection, "小天", [HistoryMessage("user", "你好")], base_time)
        register_task(connection, "小天", task_id="task_1", kind="post_turn_signal",
                      payload={"count": 1}, generation=3, now=base_time)

    await engine.write(turn)
    task = await engine.read(lambda c: get_task(c, "task_1"))
    assert (task.state, task.attempts, task.generation, task.payload) == ("pending", 0, 3, {"count": 1})

    def failing_turn(connection):
        turn_two = [HistoryMessage("user", "再见")]
        append_recent(connection, "小天", turn_two, base_time)
        register_task(connection, "小天", task_id="task_2", kind="post_turn_signal",
                      payload={}, generation=3, now=base_time)
        raise RuntimeError("crash inside the turn")

    with pytest.raises(RuntimeError):
        await engine.write(failing_turn)
    assert await engine.read(lambda c: get_task(c, "task_2")) is None
    assert len(await engine.read(lambda c: read_recent(c, "小天"))) == 1


async def test_claims_follow_registration_order_and_skip_other_characters(engine):
    await register(engine, "task_1")
    await register(engine, "task_x", name="other")
    await register(engine, "task_2", kind="history_review")
    first = await claim(engine)
    assert (first.task_id, first.state, first.attempts) == ("task_1", "running", 1)
    assert first.claim == task_claim("task_1", 1)
    assert (await claim(engine, kinds=["post_turn_signal"])) is None
    second = await claim(engine)
    assert second.task_id == "task_2"
    assert await claim(engine) is None
    assert (await claim(engine, name="other")).task_id == "task_x"


async def test_completion_is_accepted_exactly_once(engine):
    await register(engine, "task_1")
    task = await claim(engine)
    assert await engine.write(lambda c: complete_task(c, "task_1", task.claim, base_time + 1))
    assert not await engine.write(lambda c: complete_task(c, "task_1", task.claim, base_time + 2))
    assert await engine.write(lambda c: fail_task(c, "task_1", task.claim, base_time, "x")) is None
    done = await engine.read(lambda c: get_task(c, "task_1"))
    assert (done.state, done.finished_at, done.claim) == ("done", base_time + 1, None)
    assert await claim(engine, now=base_time + 10 * claim_lease_seconds) is None


async def test_effects_written_with_a_refused_completion_can_be_dropped_in_the_same_job(engine):
    await register(engine, "task_1")
    task = await claim(engine)

    def finish(connection):
        if complete_task(connection, "task_1", task.claim, base_time):
            append_recent(connection, "小天", [HistoryMessage("assistant", "effect")], base_time)

    await engine.write(finish)
    await engine.write(finish)
    assert len(await engine.read(lambda c: read_recent(c, "小天"))) == 1


async def test_crash_recovery_reclaims_under_a_new_claim_and_refuses_the_old_one(engine):
    await register(engine, "task_1")
    lost = await claim(engine)
    # The actor restarts: its previous incarnation's claims are lost.
    assert await engine.write(lambda c: recover_claims(c, "小天", base_time + 1)) == 1
    recovered = await engine.read(lambda c: get_task(c, "task_1"))
    assert (recovered.state, recovered.claim) == ("pending", None)
    again = await claim(engine, now=base_time + 1)
    assert again.claim == task_claim("task_1", 2) != lost.claim
    assert not await engine.write(lambda c: complete_task(c, "task_1", lost.claim, base_time + 2))
    assert await engine.write(lambda c: complete_task(c, "task_1", again.claim, base_time + 2))
    assert await engine.write(lambda c: recover_claims(c, "小天", base_time + 3)) == 0


async def test_a_hung_claim_is_reclaimable_after_its_lease_only(engine):
    await register(engine, "task_1")
    hung = await claim(engine)
    assert await claim(engine, now=base_time + claim_lease_seconds - 0.001) is None
    again = await claim(engine, now=base_time + claim_lease_seconds)
    assert again.attempts == 2
    assert not await engine.write(lambda c: complete_task(c, "task_1", hung.claim, base_time))
    assert await engine.write(lambda c: complete_task(c, "task_1", again.claim, base_time))


async def test_failures_retry_with_backoff_until_the_attempts_are_used(engine):
    await register(engine, "task_1", attempts_max=2)
    first = await claim(engine)
    state = await engine.write(lambda c: fail_task(c, "task_1", first.claim, base_time, "boom"))
    assert state == "pending"
    assert await claim(engine, now=base_time + retry_backoff_seconds - 0.001) is None
    second = await claim(engine, now=base_time + retry_backoff_seconds)
    assert second.attempts == 2
    state = await engine.write(lambda c: fail_task(c, "task_1", second.claim, base_time + 9,
                                                  "e" * 5000))
    assert state == "failed"
    failed = await engine.read(lambda c: get_task(c, "task_1"))
    assert failed.state == "failed"
    assert len(failed.last_error) == _outbox.outbox_error_characters_max
    assert await claim(engine, now=base_time + 10_000) is None


async def test_recovery_of_a_task_on_its_last_attempt_fails_it(engine):
    await register(engine, "task_1", attempts_max=1)
    await claim(engine)
    assert await engine.write(lambda c: recover_claims(c, "小天", base_time)) == 1
    assert (await engine.read(lambda c: get_task(c, "task_1"))).state == "failed"


async def test_cancellation_refuses_the_running_worker(engine):
    await register(engine, "task_1", generation=1)
    await register(engine, "task_2", kind="correction", generation=2)
    await register(engine, "task_3", kind="correction", generation=2)
    running = await claim(engine)
    assert await engine.write(lambda c: cancel_tasks(
        c, "小天", base_time, kinds=["correction"], states=["running"])) == 0
    assert await engine.write(lambda c: cancel_tasks(c, "小天", base_time, generation_below=2)) == 1
    assert not await engine.write(lambda c: complete_task(c, "task_1", running.claim, base_time))
    assert [task.task_id for task in await engine.read(lambda c: active_tasks(c, "小天"))] == [
        "task_2", "task_3"]
    assert await engine.write(lambda c: cancel_tasks(c, "小天", base_time)) == 2
    assert await engine.read(lambda c: active_task_count(c, "小天")) == 0


async def test_a_dedupe_key_coalesces_while_the_task_is_active(engine):
    first = await register(engine, "task_1", kind="history_review", dedupe_key="review")
    same = await register(engine, "task_2", kind="history_review", dedupe_key="review")
    assert same.task_id == first.task_id == "task_1"
    running = await claim(engine)
    assert (await register(engine, "task_3", kind="history_review", dedupe_key="review")).task_id == "task_1"
    await engine.write(lambda c: complete_task(c, "task_1", running.claim, base_time))
    assert (await register(engine, "task_4", kind="history_review", dedupe_key="review")).task_id == "task_4"


async def test_active_tasks_are_bounded_per_character(engine, monkeypatch):
    monkeypatch.setattr(_outbox, "outbox_active_tasks_per_character_max", 3)
    for index in range(3):
        assert await register(engine, f"task_{index}") is not None
    assert await register(engine, "task_over") is None
    assert await register(engine, "task_other", name="other") is not None
    task = await claim(engine)
    await engine.write(lambda c: complete_task(c, task.task_id, task.claim, base_time))
    assert await register(engine, "task_after") is not None


async def test_finished_rows_are_pruned_oldest_first(engine, monkeypatch):
    monkeypatch.setattr(_outbox, "outbox_finished_tasks_per_character_max", 2)
    for index in range(3):
        await register(engine, f"task_{index}")
        task = await claim(engine)
        await engine.write(lambda c, task=task: complete_task(c, task.task_id, task.claim, base_time))
    assert await engine.read(lambda c: get_task(c, "task_0")) is None
    assert (await engine.read(lambda c: get_task(c, "task_2"))).state == "done"
    assert (await engine.read(lambda c: get_task(c, "task_1"))).state == "done"


async def test_registration_bounds_are_enforced(engine):
    for options in ({"kind": "dance"}, {"attempts_max": 0},
                    {"attempts_max": outbox_attempts_max + 1}):
        with pytest.raises((ValueError, StorageError)):
            await register(engine, "task_bad", **options)
    assert await register(engine, "task_max", attempts_max=outbox_attempts_max) is not None
    limit = _outbox.outbox_payload_bytes_max
    # {"blob":"..."} is 11 bytes around the text.
    fits = {"blob": "x" * (limit - 11)}
    assert await engine.write(lambda c: register_task(
        c, "小天", task_id="task_fits", kind="promotion", payload=fits, generation=1,
        now=base_time)) is not None
    over = {"blob": "x" * (limit - 10)}
    with pytest.raises((ValueError, StorageError)):
        await engine.write(lambda c: register_task(
            c, "小天", task_id="task_over", kind="promotion", payload=over, generation=1,
            now=base_time))


async def test_cursors_start_at_zero_and_keep_their_position(engine):
    assert await engine.read(lambda c: cursor_get(c, "小天", "review")) == 0
    await engine.write(lambda c: cursor_put(c, "小天", "review", 42, base_time))
    await engine.write(lambda c: cursor_put(c, "other", "review", 7, base_time))
    assert await engine.read(lambda c: cursor_get(c, "小天", "review")) == 42
    loop = "l" * _outbox.cursor_loop_characters_max
    await engine.write(lambda c: cursor_put(c, "小天", loop, 1, base_time))
    with pytest.raises((ValueError, StorageError)):
        await engine.write(lambda c: cursor_put(c, "小天", loop + "l", 1, base_time))


async def test_a_released_claim_returns_the_attempt_but_stays_dead(engine):
    await register(engine, "task_1", attempts_max=1)
    first = await claim(engine)
    assert await engine.write(lambda c: release_claim(c, "task_1", first.claim, base_time))
    assert not await engine.write(lambda c: release_claim(c, "task_1", first.claim, base_time))
    again = await claim(engine)
    assert (again.attempts, again.claim) == (1, task_claim("task_1", 2))
    assert not await engine.write(lambda c: complete_task(c, "task_1", first.claim, base_time))
    assert await engine.write(lambda c: complete_task(c, "task_1", again.claim, base_time))


def test_the_package_exports_the_store_slice_sorted():
    import troupe.actors.character as character
    from troupe.actors.character import _funnel, _outbox, _schema, _store

    for module in (_funnel, _outbox, _schema, _store):
        assert module.__all__ == sorted(module.__all__)
        for name in module.__all__:
            assert name in character.__all__, name
            assert getattr(character, name) is getattr(module, name)


async def test_a_process_crash_loses_no_registered_task_and_no_claim_runs_twice(nursery, tmp_path):
    engine = await Engine.open(character_engine_env(tmp_path), nursery=nursery,
                               migrations=list(character_migrations))
    await register(engine, "task_1")
    await register(engine, "task_2")
    lost = await claim(engine)
    engine.crash()
    engine = await Engine.open(character_engine_env(tmp_path), nursery=nursery,
                               migrations=list(character_migrations))
    # The restarted actor recovers before it claims: the lost claim's task is pending again.
    assert await engine.write(lambda c: recover_claims(c, "小天", base_time + 1)) == 1
    assert [task.state for task in await engine.read(lambda c: active_tasks(c, "小天"))] == [
        "pending", "pending"]
    again = await claim(engine, now=base_time + 1)
    assert again.task_id == lost.task_id and again.claim != lost.claim
    assert not await engine.write(lambda c: complete_task(c, "task_1", lost.claim, base_time + 2))
    assert await engine.write(lambda c: complete_task(c, "task_1", again.claim, base_time + 2))
    await engine.aclose()


async def test_claims_follow_registration_order_across_pending_and_expired_running_tasks(engine):
    # The claim reads pending and lease-expired running tasks as two index scans merged by
    # seq: the older of the two must still come first, whichever state it is in.
    await register(engine, "task_old")
    hung = await claim(engine)
    assert hung.task_id == "task_old"
    await register(engine, "task_new", kind="history_review")
    later = base_time + claim_lease_seconds
    assert (await claim(engine, now=later)).task_id == "task_old"
    assert (await claim(engine, now=later)).task_id == "task_new"
    await register(engine, "task_a", kind="post_turn_signal")
    await register(engine, "task_b", kind="promotion")
    assert (await claim(engine, now=later, kinds=["promotion"])).task_id == "task_b"
    assert await claim(engine, now=later, kinds=["promotion"]) is None


async def test_pruning_at_the_cap_keeps_the_newest_finished_of_every_state(engine, monkeypatch):
    monkeypatch.setattr(_outbox, "outbox_finished_tasks_per_character_max", 2)
    await register(engine, "task_failed", attempts_max=1)
    failing = await claim(engine)
    await engine.write(lambda c: fail_task(c, "task_failed", failing.claim, base_time, "boom"))
    await register(engine, "task_cancelled")
    await engine.write(lambda c: cancel_tasks(c, "小天", base_time))
    await register(engine, "task_done")
    done = await claim(engine)
    await engine.write(lambda c: complete_task(c, done.task_id, done.claim, base_time))
    assert await engine.read(lambda c: get_task(c, "task_failed")) is None
    assert (await engine.read(lambda c: get_task(c, "task_cancelled"))).state == "cancelled"
    assert (await engine.read(lambda c: get_task(c, "task_done"))).state == "done"
