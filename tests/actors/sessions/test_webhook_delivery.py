"""Turn-end webhook delivery against a real HTTP target (hypercorn on 127.0.0.1, a free port):
retries with backoff, the per-attempt timeout, the breaker opening and closing, the durable
queue (full → the newest is dropped; a restart resends), draining, and once per turn.

Limits are shrunk through ``WebhookLimits`` so each test takes well under a second or two;
signatures are checked by the independent verifier of ``test_webhook_signing``."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import math

import httpx
import pytest
import trio

from tests.http._harness import start_hypercorn
from troupe.actors.sessions import (
    TurnEndNotice,
    WebhookDeliveries,
    WebhookFailure,
    WebhookLimits,
    WebhookSettings,
    new_pending_delivery,
    webhook_deliveries_in,
    webhook_enqueue,
    webhook_migrations,
    webhook_pending,
)
from troupe.actors.sessions import _webhook_delivery as delivery_module
from troupe.http import ShutdownSignal
from troupe.runtime import Tracer, read_trace, real_env
from troupe.storage import Engine, InlineExecutor, StorageIOError

SECRET = "delivery-secret"
fast = WebhookLimits(attempt_timeout_seconds=0.3, backoff_seconds=0.01, poll_seconds=0.05, breaker_open_seconds=0.3)


class Target:
    """A webhook receiver: answers from ``plan`` (status codes or ``"hang"``) in order, then
    ``then`` for ever; records every request with its arrival time."""

    def __init__(self, plan: list[int | str] | None = None, then: int | str = 204) -> None:
        self.plan = list(plan or [])
        self.then = then
        self.requests: list[dict] = []

    async def app(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        self.requests.append({"path": scope["path"], "query": scope["query_string"], "headers": headers,
                              "body": body, "at": trio.current_time(), "method": scope["method"]})
        action = self.plan.pop(0) if self.plan else self.then
        if action == "hang":
            await trio.sleep_forever()
        await send({"type": "http.response.start", "status": action, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


class World:
    def __init__(self, nursery: trio.Nursery, data_dir: str) -> None:
        self.nursery = nursery
        self.data_dir = data_dir
        self.env = real_env(data_dir)
        # A client with credentials of its own: none of them may reach the webhook target.
        self.env.http = httpx.AsyncClient(headers={"Authorization": "Bearer must-not-leak"},
                                          cookies={"session": "must-not-leak"})
        self.tracer = Tracer(keep_in_memory=True)
        self.failures: list[WebhookFailure] = []
        self.engine: Engine | None = None
        self.port = 0

    async def open_engine(self) -> Engine:
        self.engine = await Engine.open(self.env, nursery=self.nursery, migrations=webhook_migrations)
        return self.engine

    def settings(self, **environ: str) -> WebhookSettings:
        return WebhookSettings.from_environ({
            "TANSR_SERVE_NOTIFY_URL": f"http://127.0.0.1:{self.port}/hooks/turn-end?k=1",
            "TANSR_SERVE_NOTIFY_SECRET": SECRET, **environ,
        })

    def deliveries(self, limits: WebhookLimits = fast, **options) -> WebhookDeliveries:
        return WebhookDeliveries(self.settings(), env=self.env, storage=self.engine, tracer=self.tracer,
                                 limits=limits, on_failure=self.failures.append, **options)

    async def pending(self) -> list:
        return await self.engine.read(webhook_pending)

    def events(self, name: str) -> list[dict]:
        return [record[5] | {"key": record[4]} for record in read_trace(b"".join(self.tracer.records))
                if record[2] == name]


@pytest.fixture
async def world(nursery, tmp_path):
    world = World(nursery, str(tmp_path / "data"))
    await world.open_engine()
    yield world
    await world.env.http.aclose()


async def serve(world: World, target: Target) -> Target:
    world.port = await start_hypercorn(world.nursery, target.app)
    return target


def notice(turn: str, session: str = "s_1", status: str = "completed") -> TurnEndNotice:
    return TurnEndNotice(session_id=session, end_user_id="u_123", turn_id=turn, status=status, last_seq=7,
                         reason="end_turn" if status == "completed" else "client_gone")


async def until(predicate, seconds: float = 3.0) -> None:
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.01)


def verify(request: dict, secret: str = SECRET) -> None:
    """The receiver's check, from the contract: v2 over prefix/method/path/ts/nonce/sha256."""
    headers = request["headers"]
    signatures = dict(part.strip().split("=", 1) for part in headers["x-tansr-signature"].split(","))
    canonical = "\n".join(["tansr-webhook-v2", request["method"], request["path"], headers["x-tansr-timestamp"],
                           headers["x-tansr-nonce"], hashlib.sha256(request["body"]).hexdigest()])
    assert hmac.compare_digest(signatures["v2"], hmac.new(secret.encode(), canonical.encode(), hashlib.sha256).hexdigest())
    assert hmac.compare_digest(signatures["v1"], hmac.new(secret.encode(), request["body"], hashlib.sha256).hexdigest())


# -- the contract's numbers -----------------------------------------------------------------


def test_default_limits_are_the_contracts():
    limits = WebhookLimits()
    assert (limits.inflight_max, limits.queue_max, limits.retries_max) == (32, 1024, 3)
    assert (limits.attempt_timeout_seconds, limits.backoff_seconds) == (5.0, 0.5)
    assert (limits.breaker_failures_max, limits.breaker_open_seconds) == (5, 30.0)
    assert limits.pending_max == 32 + 1024
    waits = [limits.backoff_seconds * 2 ** retry for retry in range(limits.retries_max)]
    assert waits == [0.5, 1.0, 2.0]


# -- retries ----------------------------------------------------------------------------------


async def test_fails_twice_then_succeeds_with_the_same_signed_bytes(world):
    target = await serve(world, Target([500, 503]))
    deliveries = world.deliveries(WebhookLimits(backoff_seconds=0.05, poll_seconds=0.05))
    await world.nursery.start(deliveries.run)
    assert await deliveries.enqueue_turn_end(notice("t1")) == "accepted"
    await until(lambda: deliveries.statistics().delivered == 1)
    assert len(target.requests) == 3
    first = target.requests[0]
    assert first["path"] == "/hooks/turn-end" and first["query"] == b"k=1" and first["method"] == "POST"
    for request in target.requests:
        verify(request)
        # A retry repeats the body, timestamp, nonce and signature byte for byte.
        for header in ("x-tansr-timestamp", "x-tansr-nonce", "x-tansr-signature"):
            assert request["headers"][header] == first["headers"][header]
        assert request["body"] == first["body"]
        assert "authorization" not in request["headers"] and "cookie" not in request["headers"]
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(target.requests, target.requests[1:], strict=False)]
    assert gaps[0] >= 0.05 * 0.9 and gaps[1] >= 0.1 * 0.9  # 500 ms ×2 scaled down
    statistics = deliveries.statistics()
    assert (statistics.attempts, statistics.retries, statistics.final_failures) == (3, 2, 0)
    assert await world.pending() == [] and world.failures == []
    assert [event["attempts"] for event in world.events("webhook_delivered")] == [3]


async def test_the_retries_run_out_after_three(world):
    target = await serve(world, Target(then=500))
    deliveries = world.deliveries()
    await world.nursery.start(deliveries.run)
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: world.failures)
    assert len(target.requests) == 4  # the first attempt and three retries
    assert world.failures == [WebhookFailure(world.failures[0].delivery_id, "s_1", "t1", 4, "http_500", 500)]
    assert await world.pending() == []
    [event] = world.events("webhook_failed")
    assert (event["key"], event["reason"], event["attempts"]) == ("s_1", "http_500", 4)


async def test_a_hanging_target_times_out_each_attempt(world):
    target = await serve(world, Target(then="hang"))
    deliveries = world.deliveries(WebhookLimits(attempt_timeout_seconds=0.1, retries_max=1, backoff_seconds=0.01,
                                                poll_seconds=0.05))
    await world.nursery.start(deliveries.run)
    started = trio.current_time()
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: world.failures)
    assert trio.current_time() - started < 1.0
    assert len(target.requests) == 2
    assert (world.failures[0].reason, world.failures[0].attempts) == ("timeout", 2)
    assert deliveries.statistics().final_failures == 1


async def test_a_refused_connection_is_a_network_failure(world):
    world.port = 1  # nothing listens there
    deliveries = world.deliveries(WebhookLimits(retries_max=0, poll_seconds=0.05))
    await world.nursery.start(deliveries.run)
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: world.failures)
    assert world.failures[0].reason.startswith("network:") and world.failures[0].attempts == 1


# -- the breaker --------------------------------------------------------------------------------


async def test_five_final_failures_open_the_breaker_then_a_probe_closes_it(world):
    target = await serve(world, Target(then=500))
    limits = WebhookLimits(retries_max=0, breaker_failures_max=5, breaker_open_seconds=0.3, poll_seconds=0.05)
    deliveries = world.deliveries(limits)
    await world.nursery.start(deliveries.run)
    for turn in range(4):
        await deliveries.enqueue_turn_end(notice(f"t{turn}"))
    await until(lambda: len(world.failures) == 4)
    assert not deliveries.breaker_open()  # four is still under the threshold
    await deliveries.enqueue_turn_end(notice("t4"))
    await until(lambda: len(world.failures) == 5)
    assert deliveries.breaker_open() and deliveries.statistics().breaker_opens == 1
    # Open: deliveries fail fast, as final failures, without touching the network.
    await deliveries.enqueue_turn_end(notice("t5"))
    await until(lambda: len(world.failures) == 6)
    assert world.failures[-1].reason == "circuit_open" and world.failures[-1].attempts == 0
    assert len(target.requests) == 5
    # After the open period one probe goes out; it fails: open again.
    await trio.sleep(0.35)
    await deliveries.enqueue_turn_end(notice("t6"))
    await until(lambda: len(world.failures) == 7)
    assert world.failures[-1].reason == "http_500" and len(target.requests) == 6
    assert deliveries.breaker_open() and deliveries.statistics().breaker_opens == 2
    # The target recovers; after the next open period the probe succeeds and closes it.
    target.then = 200
    await trio.sleep(0.35)
    await deliveries.enqueue_turn_end(notice("t7"))
    await until(lambda: deliveries.statistics().delivered == 1)
    assert not deliveries.breaker_open()
    await deliveries.enqueue_turn_end(notice("t8"))
    await until(lambda: deliveries.statistics().delivered == 2)
    assert deliveries.statistics().circuit_open_failures == 1
    assert await world.pending() == []


# -- the durable queue ------------------------------------------------------------------------------


async def test_a_full_queue_drops_the_newest_arrival(world):
    await serve(world, Target(then="hang"))
    limits = WebhookLimits(inflight_max=1, queue_max=2, attempt_timeout_seconds=30.0, poll_seconds=0.05)
    deliveries = world.deliveries(limits)
    await world.nursery.start(deliveries.run)
    outcomes = [await deliveries.enqueue_turn_end(notice(f"t{turn}")) for turn in range(3)]
    assert outcomes == ["accepted"] * 3  # at the bound: in flight 1 + waiting 2
    await until(lambda: deliveries.statistics().in_flight == 1)
    assert await deliveries.enqueue_turn_end(notice("t3")) == "queue_full"  # just over it
    assert [row.turn_id for row in await world.pending()] == ["t0", "t1", "t2"]
    assert (world.failures[0].turn_id, world.failures[0].reason, world.failures[0].attempts) == ("t3", "queue_full", 0)
    statistics = deliveries.statistics()
    assert (statistics.dropped_queue_full, statistics.final_failures, statistics.in_flight) == (1, 0, 1)
    # The dropped turn was decided: it is never queued later.
    assert await deliveries.enqueue_turn_end(notice("t3")) == "duplicate"
    assert [event["turn"] for event in world.events("webhook_failed")] == ["t3"]


async def test_once_per_turn(world):
    target = await serve(world, Target())
    deliveries = world.deliveries()
    await world.nursery.start(deliveries.run)
    assert await deliveries.enqueue_turn_end(notice("t1")) == "accepted"
    assert await deliveries.enqueue_turn_end(notice("t1", status="aborted")) == "duplicate"
    assert await deliveries.enqueue_turn_end(notice("t1", session="s_2")) == "accepted"
    await until(lambda: deliveries.statistics().delivered == 2)
    await trio.sleep(0.1)
    assert len(target.requests) == 2 and deliveries.statistics().duplicates == 1


async def test_draining_sends_nothing_and_a_restart_resends_the_pending_rows(world, nursery):
    target = await serve(world, Target())
    shutdown = ShutdownSignal()
    shutdown.set()  # the server is already shutting down
    first = world.deliveries(shutdown=shutdown)
    async with trio.open_nursery() as lifetime:
        await lifetime.start(first.run)
        assert await first.enqueue_turn_end(notice("t1")) == "accepted"  # durable, not sent
        assert await first.enqueue_turn_end(notice("t2")) == "accepted"
        await trio.sleep(0.2)  # several polls
        lifetime.cancel_scope.cancel()
    assert target.requests == [] and world.failures == []
    pending = await world.pending()
    assert [row.turn_id for row in pending] == ["t1", "t2"]
    # "Restart": the engine is closed and opened again from the same files.
    await world.engine.aclose()
    await world.open_engine()
    second = world.deliveries(WebhookLimits(inflight_max=1, poll_seconds=0.05))  # one at a time: FIFO visible
    await nursery.start(second.run)
    await until(lambda: second.statistics().delivered == 2)
    bodies = [request["body"] for request in target.requests]
    assert bodies == [row.body for row in pending]  # the same bytes, in queue order
    assert [request["headers"]["x-tansr-nonce"] for request in target.requests] == [row.nonce for row in pending]
    for request in target.requests:
        verify(request)
    assert await world.pending() == []
    assert await second.enqueue_turn_end(notice("t1")) == "duplicate"  # decided before the restart


async def test_draining_stops_a_delivery_between_retries_without_reporting_it(world):
    target = await serve(world, Target(then=503))
    deliveries = world.deliveries(WebhookLimits(backoff_seconds=10.0, poll_seconds=0.05))
    await world.nursery.start(deliveries.run)
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: len(target.requests) == 1)
    deliveries.begin_draining()
    await until(lambda: deliveries.statistics().left_pending_by_drain == 1, seconds=1.0)
    await trio.sleep(0.1)
    assert len(target.requests) == 1 and world.failures == []
    assert [row.turn_id for row in await world.pending()] == ["t1"]
    assert await deliveries.enqueue_turn_end(notice("t2")) == "accepted"  # kept for the next start
    await trio.sleep(0.1)
    assert len(target.requests) == 1


async def test_a_row_written_in_another_transaction_is_found(world):
    target = await serve(world, Target())
    deliveries = world.deliveries()
    await world.nursery.start(deliveries.run)
    delivery = new_pending_delivery(world.env, notice("t1"))
    outcome = await world.engine.write(functools.partial(webhook_enqueue, delivery=delivery, pending_max=10,
                                                         decided_at=world.env.clock.wall()))
    assert outcome == "accepted"  # no wake(): the poll finds it
    await until(lambda: len(target.requests) == 1)
    verify(target.requests[0])
    assert target.requests[0]["headers"]["x-tansr-nonce"] == delivery.nonce


async def test_standard_webhooks_headers_on_the_wire(world):
    target = await serve(world, Target())
    settings = world.settings(TANSR_SERVE_NOTIFY_STANDARD_WEBHOOKS="1")
    deliveries = WebhookDeliveries(settings, env=world.env, storage=world.engine, limits=fast)
    await world.nursery.start(deliveries.run)
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: target.requests)
    headers = target.requests[0]["headers"]
    assert headers["webhook-id"].startswith("msg_")
    assert int(headers["webhook-timestamp"]) == int(headers["x-tansr-timestamp"]) // 1000
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + target.requests[0]["body"]
    expected = base64.b64encode(hmac.new(SECRET.encode(), signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == "v1," + expected


async def test_disabled_settings_store_nothing(world):
    deliveries = WebhookDeliveries(WebhookSettings(), env=world.env, storage=world.engine)
    assert not deliveries.enabled
    assert await deliveries.enqueue_turn_end(notice("t1")) == "disabled"
    assert await world.pending() == []


def test_module_limits_hold_their_relations():
    assert delivery_module.webhook_retries_max >= 0
    total_backoff = sum(delivery_module.webhook_backoff_seconds * 2 ** retry
                        for retry in range(delivery_module.webhook_retries_max))
    assert total_backoff < delivery_module.webhook_breaker_open_seconds
    assert math.isclose(total_backoff, 3.5)


# -- the contract's timing, exactly, on trio's mock clock --------------------------------------------


class ScriptedTransport(httpx.AsyncBaseTransport):
    """An in-process target for the mock-clock tests (no socket: the clock may jump)."""

    def __init__(self, plan: list[int | str] | None = None, then: int | str = 200) -> None:
        self.plan = list(plan or [])
        self.then = then
        self.times: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.times.append(trio.current_time())
        action = self.plan.pop(0) if self.plan else self.then
        if action == "hang":
            await trio.sleep(3600)
        return httpx.Response(action)


@pytest.fixture
async def clocked(nursery, tmp_path):
    """Default limits, an inline storage executor (no threads, so the mock clock only jumps
    when everything waits on it) and a scripted transport."""
    env = real_env(str(tmp_path / "data"))
    env.executor = InlineExecutor()
    transport = ScriptedTransport()
    env.http = httpx.AsyncClient(transport=transport)
    engine = await Engine.open(env, nursery=nursery, migrations=webhook_migrations)
    failures: list[WebhookFailure] = []
    settings = WebhookSettings.from_environ({"TANSR_SERVE_NOTIFY_URL": "http://hooks.example/turn-end"})
    deliveries = WebhookDeliveries(settings, env=env, storage=engine, on_failure=failures.append)
    await nursery.start(deliveries.run)
    yield deliveries, transport, failures
    await env.http.aclose()


def gaps(times: list[float]) -> list[float]:
    return [round(later - earlier, 6) for earlier, later in zip(times, times[1:], strict=False)]


async def test_backoff_is_500_1000_2000_ms(clocked, autojump_clock):
    deliveries, transport, failures = clocked
    transport.plan = [500, 502, 503]
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: deliveries.statistics().delivered == 1, seconds=60)
    assert gaps(transport.times) == [0.5, 1.0, 2.0] and failures == []


async def test_each_attempt_times_out_after_5_seconds(clocked, autojump_clock):
    deliveries, transport, failures = clocked
    transport.then = "hang"
    await deliveries.enqueue_turn_end(notice("t1"))
    await until(lambda: failures, seconds=60)
    assert gaps(transport.times) == [5.5, 6.0, 7.0]  # timeout + backoff, three retries
    assert (failures[0].reason, failures[0].attempts) == ("timeout", 4)


async def test_the_breaker_opens_for_30_seconds(clocked, autojump_clock):
    deliveries, transport, failures = clocked
    transport.then = 500
    for turn in range(5):
        await deliveries.enqueue_turn_end(notice(f"t{turn}"))
    await until(lambda: len(failures) == 5, seconds=60)
    opened = trio.current_time()
    assert deliveries.breaker_open() and len(transport.times) == 20
    await trio.sleep(29.0 - (trio.current_time() - opened))
    await deliveries.enqueue_turn_end(notice("t5"))
    await until(lambda: len(failures) == 6, seconds=5)
    assert failures[-1].reason == "circuit_open" and len(transport.times) == 20
    await trio.sleep(31.0 - (trio.current_time() - opened))
    transport.then = 204
    await deliveries.enqueue_turn_end(notice("t6"))
    await until(lambda: deliveries.statistics().delivered == 1, seconds=5)
    assert not deliveries.breaker_open() and len(transport.times) == 21


# -- never in the session's way -------------------------------------------------------------------


class FlakyStorage:
    """The engine, except that the first ``failures`` reads and writes raise a storage error."""

    def __init__(self, engine: Engine, failures: int) -> None:
        self.engine = engine
        self.failures = failures

    def _fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StorageIOError("injected")

    async def read(self, job):
        self._fail()
        return await self.engine.read(job)

    async def write(self, job):
        self._fail()
        return await self.engine.write(job)


async def test_a_storage_failure_at_enqueue_is_reported_not_raised(world):
    deliveries = WebhookDeliveries(world.settings(), env=world.env, storage=FlakyStorage(world.engine, 1),
                                   limits=fast, on_failure=world.failures.append)
    assert await deliveries.enqueue_turn_end(notice("t1")) == "not_stored"
    assert (world.failures[0].reason, world.failures[0].attempts) == ("storage_error", 0)
    assert await world.pending() == []


async def test_the_dispatcher_survives_storage_failures(world):
    target = await serve(world, Target())
    storage = FlakyStorage(world.engine, 0)
    deliveries = WebhookDeliveries(world.settings(), env=world.env, storage=storage, limits=fast, tracer=world.tracer)
    assert await deliveries.enqueue_turn_end(notice("t1")) == "accepted"
    storage.failures = 2  # the first dispatch read and the first prune fail
    await world.nursery.start(deliveries.run)
    await until(lambda: deliveries.statistics().delivered == 1)
    assert len(target.requests) == 1 and world.events("webhook_storage_error")


def test_the_service_is_published_in_the_env(tmp_path):
    env = real_env(str(tmp_path))
    assert webhook_deliveries_in(env) is None
    disabled = WebhookDeliveries(WebhookSettings(), env=env, storage=None)
    disabled.publish()
    assert webhook_deliveries_in(env) is None  # nothing to notify with
    enabled = WebhookDeliveries(WebhookSettings.from_environ({"TANSR_SERVE_NOTIFY_URL": "http://h/x"}), env=env,
                                storage=None)
    enabled.publish()
    assert webhook_deliveries_in(env) is enabled
    assert enabled.child_spec().name == "sessions.webhooks"
