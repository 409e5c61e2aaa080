"""``paused`` applies at once, also to an exchange already under way: once ``PUT /sync/settings
{"paused": true}`` is answered, no operation leaves the device, neither by a round of its own
in progress nor in the answer to a peer's request that was being handled.  (Before, the pause
was checked once per round and once per request, so an edit made just after the pause could
still reach the peer: the flake of ``test_offline_edits_on_both_sides_converge_to_one_winner``
under load.)  Both tests pause and edit exactly at the risky moment through a hook, then check
the peer never got the edit, and that it arrives after the resume."""

from __future__ import annotations

from typing import Any

import trio

from tests.http.knowledge._knowledge_harness import wait_until
from troupe.actors.knowledge.sync import (
    RunSyncRound,
    SyncActor,
    SyncRoundDone,
    sync_key,
    sync_kind_name,
)

from ._sync_harness import converged, item_ids, pair, shared_state, start_device, write_shared

quiet = {"gossip_interval_seconds": 30.0, "anti_entropy_interval_seconds": 60.0}
"""The loops stay idle after their first round: only the rounds a test forces run."""


async def _round(server: Any) -> SyncRoundDone:
    return await server.system.ref(sync_kind_name, sync_key).ask(RunSyncRound(anti_entropy=True), timeout=30)


async def _paired_with_one_item(nursery: Any, tmp_path: Any, **a_options: Any) -> tuple[Any, Any, str, int]:
    a = await start_device(nursery, str(tmp_path / "a"), "A", **(a_options or quiet))
    b = await start_device(nursery, str(tmp_path / "b"), "B", **quiet)
    async with a.client() as ca, b.client() as cb:
        await pair(cb, ca)
        await write_shared(ca, "网费账单", 100.0)

        async def delivered() -> list[str]:  # the item is made by structuring, a moment later
            await _round(a)
            return await item_ids(b)

        await wait_until(delivered)
        await converged([a, b], count=1, seconds=10)
    (knowledge_id,) = await item_ids(a)
    return a, b, knowledge_id, (await shared_state(a))[0][3]


async def _pause_and_edit(client: Any, knowledge_id: str, version: int) -> None:
    """Pause, edit, and have the edit captured into an operation (``/sync/state`` captures)."""
    assert (await client.put("/sync/settings", json={"paused": True})).json() == {"enabled": True, "paused": True}
    response = await client.post("/memory/update", json={
        "knowledge_id": knowledge_id, "expected_version": version, "scope": "shared:home",
        "body": {"vendor": "电信", "amount": 120}, "idempotency_key": "edit-after-pause"})
    assert response.status_code == 200, response.text
    assert (await client.get(f"/sync/state/knowledge/{knowledge_id}")).status_code == 200


class _PauseOnFirstDigest:
    """A's outbound client: the first anti-entropy request of the armed round first pauses A
    and edits (as the user would, while the round is in flight), then goes out."""

    def __init__(self, inner: Any, client: Any, knowledge_id: str, version: int) -> None:
        self.inner, self.client, self.knowledge_id, self.version = inner, client, knowledge_id, version
        self.armed, self.requests_after_pause = True, 0

    async def post(self, url: str, **options: Any) -> Any:
        if not self.armed:
            self.requests_after_pause += 1
        elif url.endswith("/sync/peer/digest"):
            self.armed = False
            await _pause_and_edit(self.client, self.knowledge_id, self.version)
        return await self.inner.post(url, **options)


async def test_a_round_in_progress_sends_nothing_once_the_pause_is_answered(nursery, tmp_path):
    # A's own loop runs the round (a forced round is a turn of the actor the pause must reach)
    a, b, knowledge_id, version = await _paired_with_one_item(
        nursery, tmp_path, gossip_interval_seconds=0.05, anti_entropy_interval_seconds=0.2)
    before = await shared_state(b)
    async with a.client() as ca:
        hook = _PauseOnFirstDigest(a.env.http, ca, knowledge_id, version)
        a.env.http = hook
        await wait_until(lambda: _fired(hook))
        await trio.sleep(0.5)  # rounds go on (paused) and anti-entropy falls due again
        # the page that would have carried the edit never left; B still shows the old version
        assert hook.requests_after_pause == 0
        assert await shared_state(b) == before
        assert (await ca.put("/sync/settings", json={"paused": False})).json()["paused"] is False
        state = await converged([a, b], count=1, seconds=10)
        assert state[0][5] == {"vendor": "电信", "amount": 120}


async def _fired(hook: _PauseOnFirstDigest) -> bool:
    return not hook.armed


async def test_a_peer_request_being_handled_when_the_pause_is_answered_carries_nothing(
        nursery, tmp_path, monkeypatch):
    a, b, knowledge_id, version = await _paired_with_one_item(nursery, tmp_path)
    before = await shared_state(b)
    taken = SyncActor._take_records
    armed = [True]

    async def take_records(actor: SyncActor, documents: Any) -> None:
        # Called by A's inbound actor for B's anti-entropy request after the request passed
        # the pause check: pause A and edit there, then let the request go on.
        if armed[0] and actor.inbound and actor.context.env is a.env:
            armed[0] = False
            async with a.client() as ca:
                await _pause_and_edit(ca, knowledge_id, version)
        await taken(actor, documents)

    monkeypatch.setattr(SyncActor, "_take_records", take_records)
    done = await _round(b)
    assert not armed[0]
    assert done.pulled == 0 and done.peers_reached == 0  # A answered 503: paused
    assert await shared_state(b) == before
    async with a.client() as ca:
        await ca.put("/sync/settings", json={"paused": False})
    await _round(b)
    state = await converged([a, b], count=1, seconds=10)
    assert state[0][5] == {"vendor": "电信", "amount": 120}


async def test_a_resume_starts_exchanging_at_once_not_an_interval_later(nursery, tmp_path):
    # Both loops pause 30 s between rounds (``quiet``): an edit made while paused reaches the
    # peer within seconds of the resume only because the resume wakes the loop (no forced round).
    a, b, knowledge_id, version = await _paired_with_one_item(nursery, tmp_path)
    async with a.client() as ca:
        await _pause_and_edit(ca, knowledge_id, version)
        await trio.sleep(0.2)
        assert (await shared_state(b))[0][5] != {"vendor": "电信", "amount": 120}
        answer = await ca.put("/sync/settings", json={"paused": False})
        assert answer.json() == {"enabled": True, "paused": False}
    state = await converged([a, b], count=1, seconds=5)
    assert state[0][5] == {"vendor": "电信", "amount": 120}
