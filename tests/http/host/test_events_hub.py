"""The events hub's rules at their exact boundaries (no HTTP): cursor age at and just over
``replay_seconds``, the cursor cap at and just over ``cursors_max``, the window edge, the
connection limits; and a client that stops reading (or vanished) driven in-process through
the app's full ASGI stack, whose slot is freed after the send bounds."""

from __future__ import annotations

import trio

from troupe.http.host import (
    EventCursors,
    EventLimitReached,
    EventSettings,
    EventsHub,
    code_event_global_limit,
    code_event_token_limit,
    event_connection_seconds_max,
    event_connections_max,
    event_connections_per_token_max,
    event_cursors_max,
    event_final_send_seconds_max,
    event_heartbeat_seconds,
    event_idle_seconds,
    event_notification_window_ids,
    event_poll_seconds,
    event_replay_seconds,
    event_send_seconds_max,
    parse_event_id,
)

from ._host_harness import start_host_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_790_000_000.0 + self.now


class Random:
    def token_bytes(self, count: int) -> bytes:
        return bytes(range(count))


def hub(**settings) -> tuple[EventsHub, Clock]:
    clock = Clock()
    return EventsHub(engine=None, clock=clock, random=Random(), settings=EventSettings(**settings)), clock


def test_the_contract_defaults():
    assert (event_connections_per_token_max, event_connections_max) == (2, 32)
    assert (event_poll_seconds, event_heartbeat_seconds, event_idle_seconds) == (1.0, 15.0, 300.0)
    assert (event_connection_seconds_max, event_send_seconds_max, event_final_send_seconds_max) == (3600.0, 5.0, 1.0)
    assert (event_replay_seconds, event_cursors_max, event_notification_window_ids) == (900.0, 10_000, 1000)


def test_event_ids_and_their_parsing():
    events, _ = hub()
    first, second = events.next_event_id(1, 0), events.next_event_id(2, 0)
    assert first == f"{bytes(range(16)).hex()}:1" and second.endswith(":2")
    assert parse_event_id(first) == (bytes(range(16)).hex(), 1)
    for bad in ("", "1", "abc:1", "A" * 32 + ":1", "0" * 32 + ":", "0" * 32 + ":-1", "0" * 32 + ":1 ", "0" * 32 + ":" + "9" * 20):
        assert parse_event_id(bad) is None, bad


def test_cursor_age_at_and_just_over_replay_seconds():
    events, clock = hub(replay_seconds=900)
    cursor = events.next_event_id(7, 3)
    clock.now += 900
    assert events.start_of(cursor, 7, (1, 10)).resync_reason is None
    assert events.start_of(cursor, 7, (1, 10)).position == 3
    clock.now += 0.001
    start = events.start_of(cursor, 7, (1, 10))
    assert (start.resync_reason, start.position) == ("cursor_unavailable", 0)


def test_cursor_cap_at_and_just_over_cursors_max():
    events, _ = hub(cursors_max=3)
    oldest = events.next_event_id(1, 0)
    events.next_event_id(1, 0)
    events.next_event_id(1, 0)
    assert len(events.cursors) == 3 and events.start_of(oldest, 1, (None, None)).resync_reason is None
    events.next_event_id(1, 0)
    assert len(events.cursors) == 3 and events.start_of(oldest, 1, (None, None)).resync_reason == "cursor_unavailable"
    cursors = EventCursors(cursors_max=1, replay_seconds=1)
    assert len(cursors) == 0


def test_window_edge_and_first_subscriptions():
    events, _ = hub(notification_window_ids=1000)
    at_edge = events.next_event_id(1, 500)
    assert events.start_of(at_edge, 1, (1, 1500)).resync_reason is None
    start = events.start_of(at_edge, 1, (1, 1501))
    assert (start.resync_reason, start.position) == ("window_exceeded", 501)
    assert events.start_of(None, 1, (None, None)).resync_reason is None
    assert events.start_of(None, 1, (1, 1000)).resync_reason is None  # window start 0: nothing older
    assert events.start_of(None, 1, (1, 1001)).resync_reason == "window_exceeded"
    assert events.start_of(None, 1, (2, 1001)).resync_reason is None  # id 1 is gone: nothing older
    assert events.start_of(at_edge, 2, (1, 1500)).resync_reason == "cursor_unavailable"  # another token's


def test_connection_limits_at_and_just_over():
    events, _ = hub(connections_per_token_max=2, connections_max=3)
    events.admit(1)
    events.admit(1)
    try:
        events.admit(1)
        raise AssertionError("a third stream of one token")
    except EventLimitReached as limit:
        assert limit.code == code_event_token_limit
    events.admit(2)
    try:
        events.admit(3)
        raise AssertionError("a fourth stream in all")
    except EventLimitReached as limit:
        assert limit.code == code_event_global_limit
    events.release(1)
    events.admit(3)
    assert events.connections == 3 and events.connections_of(1) == 1


async def test_a_client_that_stops_reading_is_dropped_after_the_send_bounds(nursery, tmp_path):
    settings = EventSettings(poll_seconds=0.02, heartbeat_seconds=0.05, send_seconds_max=0.3, final_send_seconds_max=0.2)
    host = await start_host_server(nursery, str(tmp_path / "data"), event_settings=settings)
    secret = await host.token("all")
    scope = {"type": "http", "method": "GET", "path": "/api/v1/events", "raw_path": b"/api/v1/events",
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {secret}".encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    sent: list[dict] = []
    requested = False

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await trio.sleep_forever()  # never closes: a client that vanished

    async def send(message: dict) -> None:
        sent.append(message)
        if len(sent) >= 3:
            await trio.sleep_forever()  # the client stopped reading after its first frames

    events = host.app.state.events
    with trio.fail_after(3):
        began = trio.current_time()
        await host.app.asgi_app(scope, receive, send)
        took = trio.current_time() - began
    assert sent[0]["status"] == 200 and events.connections == 0
    # A heartbeat went out at once, the next send hung (0.3 s) and the final one too (0.2 s).
    assert settings.send_seconds_max <= took <= 2.0
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
