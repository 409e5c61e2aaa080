"""GET /api/v1/events and /events/status over real HTTP (hypercorn): the three frame kinds,
ids shared across connections, replay versus resync at each window boundary, the checks
before the stream (every 400, 429 with Retry-After 5, 503), idle and maximum ends on the
test's clock, revocation mid-stream, shutdown with open streams, client close freeing slots.
Durations are injected short through ``EventSettings``."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.host import notification_item
from troupe.actors.host._goal_schema import NotificationRow, notification_columns
from troupe.auth import TokenScope
from troupe.http import ShutdownSignal
from troupe.http.host import EventSettings, event_limit_retry_after_seconds

from ._events_helpers import (
    cancel_goal_notifications,
    goal_for,
    notifications_path,
    open_events,
    publish_dedup_notice,
    publish_one,
    publish_reminders,
    status_path,
    wait_for,
)
from ._host_harness import start_host_server
from .test_checks import assert_error

fast = EventSettings(poll_seconds=0.05, heartbeat_seconds=60, connections_per_token_max=2, connections_max=3,
                     send_seconds_max=0.5, final_send_seconds_max=0.2, notification_window_ids=5,
                     cursors_max=50)


@pytest.fixture
async def host(nursery, tmp_path):
    # The clock is not frozen: streams schedule their polls on it (tests move it forward).
    return await start_host_server(nursery, str(tmp_path / "data"), rate_burst=100_000, event_settings=fast)


async def connections(client) -> int:
    return (await client.get(status_path)).json()["connections"]


def seq_of(frame) -> int:
    return int(frame.id.rsplit(":", 1)[1])


async def row(host, identifier) -> NotificationRow:
    rows = await host.rows(f"SELECT {notification_columns} FROM host_notifications WHERE id = ?", identifier)
    return NotificationRow(*rows[0])


async def test_heartbeat_first_then_reminders_read_only(host):
    import datetime
    secret = await host.token("all")
    async with host.client(secret) as client, open_events(client) as (response, frames):
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert response.headers["cache-control"] == "no-store" and response.headers["x-accel-buffering"] == "no"
        first = await frames.next()
        instance_id = (await client.get(status_path)).json()["instance_id"]
        assert first.event == "heartbeat" and first.id.startswith(instance_id + ":") and len(instance_id) == 32
        sent = datetime.datetime.fromisoformat(first.data["time"])
        assert list(first.data) == ["time"] and sent.utcoffset() == datetime.timedelta(0)
        assert abs(sent.timestamp() - host.clock.wall()) <= 2
        await publish_dedup_notice(host, 1)  # never streamed
        cancelled = await publish_one(host, 2)
        await cancel_goal_notifications(host, 2)  # excluded
        identifier = await publish_one(host, 3, content="带\n换行")
        reminder = await frames.until("reminder")
        expected = notification_item(await row(host, identifier), datetime.UTC)
        assert reminder.data == expected and reminder.data["status"] == "pending" and reminder.data["taken_at"] is None
        assert seq_of(reminder) > seq_of(first)
        status = (await client.get(status_path)).json()
        assert status["connections"] == 1 and status["reminders_pushed"] == 1
    assert (await row(host, identifier)).status == "pending"  # the stream never marks taken
    assert (await row(host, cancelled)).status == "cancelled"


async def test_scope_comes_from_the_token_only(host):
    narrow = await host.token("narrow", TokenScope.of_entries(["astrbot:a"]))
    async with host.client(narrow) as client, open_events(client) as (_, frames):
        await frames.next()
        await publish_reminders(host, [goal_for(1, entry_id="other:x"), goal_for(2, entry_id="astrbot:a"),
                                       goal_for(3, entry_id=None)])
        assert (await frames.until("reminder")).data["goal_id"] == 2
        assert (await frames.until("reminder")).data["goal_id"] == 3
        await publish_one(host, 4, entry_id="astrbot:a")
        assert (await frames.until("reminder")).data["goal_id"] == 4  # goal 1 was never sent


async def test_ids_increase_across_connections_and_status_lists_every_limit(host):
    one, two = await host.token("one"), await host.token("two")
    async with host.client(one) as first_client, host.client(two) as second_client:
        async with open_events(first_client) as (_, first), open_events(second_client) as (_, second):
            seqs = [seq_of(await first.next()), seq_of(await second.next())]
            await publish_one(host, 1)
            seqs += [seq_of(await first.until("reminder")), seq_of(await second.until("reminder"))]
            assert len(set(seqs)) == 4 and seqs[0] < seqs[1] and max(seqs[:2]) < min(seqs[2:])
            status = (await first_client.get(status_path)).json()
    assert status == {
        "instance_id": status["instance_id"], "connections": 2, "reminders_pushed": 2,
        "per_token_limit": 2, "global_limit": 3, "poll_seconds": 0.05, "heartbeat_seconds": 60,
        "idle_seconds": 300.0, "max_seconds": 3600.0, "replay_seconds": 900.0, "cursor_limit": 50,
        "notification_window": 5, "send_seconds": 0.5, "final_send_seconds": 0.2,
    }


async def test_checks_before_the_stream(host):
    secret = await host.token("all")
    async with host.client(secret) as client:
        async with open_events(client) as (_, frames):
            good = (await frames.next()).id
        bad_requests = [
            ({"params": {"entry_id": "astrbot:a"}}, ["query.entry_id"]),
            ({"params": {"token": secret}}, ["query.token"]),
            ({"params": [("last_event_id", good), ("last_event_id", good)]}, ["query.last_event_id"]),
            ({"headers": {"Last-Event-ID": "42"}}, ["header.last-event-id"]),
            ({"params": {"last_event_id": "zz:1"}}, ["query.last_event_id"]),
            ({"headers": {"Last-Event-ID": good}, "params": {"last_event_id": good[:-1] + "9"}},
             ["header.last-event-id", "query.last_event_id"]),
        ]
        for options, fields in bad_requests:
            response = await client.get("/api/v1/events", **options)
            error = assert_error(response, 400, "invalid_request")
            assert [problem["field"] for problem in error["fields"]] == fields
        repeated = await client.get("/api/v1/events", headers=[("Last-Event-ID", good), ("Last-Event-ID", good)])
        assert_error(repeated, 400, "invalid_request")
        assert (await client.head("/api/v1/events")).status_code == 200
        assert_error(await client.post("/api/v1/events"), 400, "method_not_allowed")
        assert await connections(client) == 0
    async with host.client("wrong") as stranger:
        assert_error(await stranger.get("/api/v1/events"), 401, "unauthorized")
        assert_error(await stranger.get(status_path), 401, "unauthorized")
    async with host.client() as anonymous:
        response = await anonymous.get("/api/v1/events", params={"access_token": secret})
        assert_error(response, 401, "unauthorized")  # a token in the URL is never read
    host.ready[0] = False
    async with host.client(secret) as client:
        assert_error(await client.get("/api/v1/events"), 503, "unavailable")


async def test_both_cursor_forms_resume_with_replay(host):
    secret = await host.token("all")
    async with host.client(secret) as client:
        async with open_events(client) as (_, frames):
            await frames.next()
            await publish_one(host, 1)
            resume = (await frames.until("reminder")).id
        later = [await publish_one(host, goal_id) for goal_id in (2, 3)]
        for options in ({"headers": {"Last-Event-ID": resume}}, {"params": {"last_event_id": resume}},
                        {"headers": {"Last-Event-ID": resume}, "params": {"last_event_id": resume}}):
            async with open_events(client, **options) as (_, frames):
                heartbeat = await frames.next()
                assert heartbeat.event == "heartbeat"  # a usable cursor: no resync
                assert [(await frames.until("reminder")).data["id"] for _ in later] == later


async def test_first_subscription_resyncs_when_history_is_older_than_the_window(host):
    secret = await host.token("all")
    window = fast.notification_window_ids
    ids = await publish_reminders(host, [goal_for(goal_id) for goal_id in range(1, window + 1)])
    async with host.client(secret) as client:
        async with open_events(client) as (_, frames):
            assert (await frames.next()).event == "heartbeat"  # exactly the window: nothing older
            assert [(await frames.until("reminder")).data["id"] for _ in ids] == ids
        more = await publish_reminders(host, [goal_for(window + 1)])
        async with open_events(client) as (_, frames):
            resync = await frames.next()
            assert resync.event == "resync"
            assert resync.data == {"reason": "window_exceeded", "pull_url": notifications_path}
            assert (await frames.next()).event == "heartbeat"
            assert [(await frames.until("reminder")).data["id"] for _ in range(window)] == (ids + more)[1:]


async def test_cursor_at_the_window_edge_replays_and_one_below_resyncs(host):
    secret = await host.token("all")
    window = fast.notification_window_ids
    async with host.client(secret) as client:
        async with open_events(client) as (_, frames):
            cursor = (await frames.next()).id  # watermark 0
        ids = await publish_reminders(host, [goal_for(goal_id) for goal_id in range(1, window + 1)])
        async with open_events(client, headers={"Last-Event-ID": cursor}) as (_, frames):
            assert (await frames.next()).event == "heartbeat"  # watermark 0 == max - window: replay
            assert [(await frames.until("reminder")).data["id"] for _ in ids] == ids
        await publish_reminders(host, [goal_for(window + 1)])
        async with open_events(client, headers={"Last-Event-ID": cursor}) as (_, frames):
            resync = await frames.next()
            assert resync.data["reason"] == "window_exceeded"


async def test_unknown_expired_evicted_and_foreign_cursors_resync(host):
    secret, other = await host.token("all"), await host.token("other")
    async with host.client(secret) as client, host.client(other) as other_client:
        async with open_events(client) as (_, frames):
            cursor = (await frames.next()).id
        foreign_instance = "0" * 32 + ":1"
        unknown = cursor.rsplit(":", 1)[0] + ":999999"
        for stale in (foreign_instance, unknown):
            async with open_events(client, headers={"Last-Event-ID": stale}) as (_, frames):
                assert (await frames.next()).data == {"reason": "cursor_unavailable", "pull_url": notifications_path}
        async with open_events(other_client, headers={"Last-Event-ID": cursor}) as (_, frames):
            assert (await frames.next()).data["reason"] == "cursor_unavailable"  # another token's
        async with open_events(client) as (_, frames):
            young = (await frames.next()).id
        host.clock.advance(fast.replay_seconds - 1)  # the exact boundary: test_event_hub.py
        async with open_events(client, headers={"Last-Event-ID": young}) as (_, frames):
            assert (await frames.next()).event == "heartbeat"  # younger than replay_seconds: kept
        host.clock.advance(2)
        async with open_events(client, headers={"Last-Event-ID": young}) as (_, frames):
            assert (await frames.next()).data["reason"] == "cursor_unavailable"
        async with open_events(client) as (_, frames):
            oldest = (await frames.next()).id
        hub = host.app.state.events
        for _ in range(fast.cursors_max - 1):
            hub.next_event_id(0, 0)
        async with open_events(client, headers={"Last-Event-ID": oldest}) as (_, frames):
            assert (await frames.next()).event == "heartbeat"  # the cap is reached, not passed
        hub.next_event_id(0, 0)
        hub.next_event_id(0, 0)
        async with open_events(client, headers={"Last-Event-ID": oldest}) as (_, frames):
            assert (await frames.next()).data["reason"] == "cursor_unavailable"  # evicted


async def test_connection_limits_answer_429_and_slots_are_freed(host):
    one, two = await host.token("one"), await host.token("two")
    async with host.client(one) as client, host.client(two) as other:
        async with open_events(client) as (_, a), open_events(client) as (_, b):
            await a.next()
            await b.next()
            refused = await client.get("/api/v1/events")
            error = assert_error(refused, 429, "event_token_limit")
            assert error["retry_after_seconds"] == event_limit_retry_after_seconds == 5
            async with open_events(other) as (_, c):
                await c.next()
                assert_error(await other.get("/api/v1/events"), 429, "event_global_limit")
            await wait_for(lambda: _equals(connections(client), 2))
        await wait_for(lambda: _equals(connections(client), 0))
        async with open_events(client) as (response, frames):
            assert response.status_code == 200 and (await frames.next()).event == "heartbeat"


async def _equals(awaitable, expected) -> bool:
    return await awaitable == expected


async def test_idle_end_ignores_heartbeats_and_a_reminder_resets_it(nursery, tmp_path):
    settings = EventSettings(poll_seconds=0.05, heartbeat_seconds=0.05, idle_seconds=300, connection_seconds_max=3600)
    host = await start_host_server(nursery, str(tmp_path / "data"), rate_burst=100_000, event_settings=settings)
    secret = await host.token("all")
    async with host.client(secret) as client, open_events(client) as (_, frames):
        await frames.next()
        host.clock.advance(200)
        await publish_one(host, 1)
        await frames.until("reminder")
        host.clock.advance(299)
        for _ in range(3):
            assert (await frames.next()).event == "heartbeat"  # still open: 299 s since the reminder
        host.clock.advance(1)
        rest = await frames.rest()
        assert all(frame.event == "heartbeat" for frame in rest)
        await wait_for(lambda: _equals(connections(client), 0))


async def test_maximum_duration_ends_even_a_busy_stream(host):
    secret = await host.token("all")
    async with host.client(secret) as client, open_events(client) as (_, frames):
        await frames.next()
        step = fast.idle_seconds - 10  # a reminder in every step keeps it from idling
        moved, goal_id = 0.0, 0
        while moved + step < fast.connection_seconds_max:
            host.clock.advance(step)
            moved += step
            goal_id += 1
            await publish_one(host, goal_id)
            await frames.until("reminder")
        host.clock.advance(fast.connection_seconds_max - moved - 1)
        await publish_one(host, goal_id + 1)
        await frames.until("reminder")  # one second before the maximum: still open
        host.clock.advance(1)
        assert {frame.event for frame in await frames.rest()} <= {"heartbeat"}


async def test_revocation_ends_the_stream_at_the_next_poll_and_renewals_get_401(host):
    secret = await host.token("doomed")
    async with host.client(secret) as client:
        async with open_events(client) as (_, frames):
            cursor = (await frames.next()).id
            await host.revoke("doomed")
            assert await frames.rest() == []
        response = await client.get("/api/v1/events", headers={"Last-Event-ID": cursor})
        assert_error(response, 401, "unauthorized")


async def test_hub_shutdown_ends_every_stream_and_refuses_new_ones(host):
    one, two = await host.token("one"), await host.token("two")
    async with host.client(one) as client, host.client(two) as other:
        async with open_events(client) as (_, a), open_events(other) as (_, b):
            await a.next()
            await b.next()
            with trio.fail_after(2):
                host.app.state.events.shutdown()
                assert await a.rest() == [] and await b.rest() == []
        assert_error(await client.get("/api/v1/events"), 503, "unavailable")
        assert await connections(client) == 0


async def test_the_server_signal_ends_streams_first(nursery, tmp_path):
    signal = ShutdownSignal()
    host = await start_host_server(nursery, str(tmp_path / "data"), event_settings=fast, shutdown=signal)
    secret = await host.token("all")
    async with host.client(secret) as client, open_events(client) as (_, frames):
        await frames.next()
        with trio.fail_after(2):
            signal.set()
            assert await frames.rest() == []


async def test_a_client_that_closes_frees_its_slot_at_once(host):
    secret = await host.token("all")
    async with host.client(secret) as client:
        for _ in range(3):  # more than the per-token limit, one after another
            async with open_events(client) as (_, frames):
                await frames.next()
        await wait_for(lambda: _equals(connections(client), 0))
