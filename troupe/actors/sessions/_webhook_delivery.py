"""Turn-end webhook delivery: a durable queue, bounded retries, a per-target breaker.

Why a service and not an actor: an actor handles one message at a time, while deliveries
wait on slow receivers (5 s per attempt, seconds of backoff) and up to
``webhook_inflight_max`` of them must be in flight at once.  So ``WebhookDeliveries`` owns
one task per delivery under its own nursery, and its ``run`` is a long-lived task (see
"Wiring" below).  The queue is never only in memory:

- ``enqueue_turn_end(notice)`` writes the delivery row and the turn's decision in one storage
  write before it answers ``"accepted"``; the same ``(sessionId, turnId)`` again answers
  ``"duplicate"`` (a turn is decided once, durably); with ``pending_max`` rows already waiting
  the newest arrival is dropped (``"queue_full"``, reported like a final failure with
  ``attempts == 0``).  It never raises into the session's path (a storage failure answers
  ``"not_stored"``).  A session actor that wants the decision inside its own turn-end
  transaction calls ``webhook_enqueue`` in its write job (with ``new_pending_delivery``
  made beforehand) and then ``after_enqueue()``; the service also looks for new rows every
  ``poll_seconds``.
- The dispatcher takes rows in id order up to ``inflight_max`` at a time.  A delivery POSTs
  through ``env.http`` only: 2xx is success; anything else (status, network error, the
  per-attempt timeout) is retried after 500 ms, 1 s, 2 s (``retries_max`` 3).  A delivery's
  row is removed when it ends, delivered or finally failed.
- Per target (scheme, host, port) a breaker counts consecutive final failures; at
  ``breaker_failures_max`` it opens for ``breaker_open_seconds``: deliveries then fail fast
  (``circuit_open``) without touching the network; after that one probe delivery goes out,
  and its outcome closes or reopens the breaker.
- Draining (``begin_draining()``, or the ``shutdown`` signal given at construction): nothing
  is sent any more, waits between retries end, and the rows stay for the next start, which
  sends them again.  Shutting down is not a delivery failure and is not reported as one.

Wiring: one instance per server lifetime, built where the Env and the Engine are known (the
sessions surface's ``create_app``), run either as a supervised ``child_spec()`` or in the
app's lifespan nursery (``run`` survives storage errors by retrying at the next poll), and
``publish()``-ed into ``env.extras`` so that session actors, whose kinds are static, find it
with ``webhook_deliveries_in(env)``.

Final failures (and drops) are reported three ways: the trace event ``webhook_failed``
(``reason``: ``http_<status>``, ``timeout``, ``network:<error>``, ``circuit_open``,
``queue_full``, ``storage_error``), the ``statistics()`` counters, and the optional ``on_failure`` hook (the
contract's ``onDeliveryFailure``).  Nothing here raises into the session's main path.

Trade-off: the queue is at least once across a crash.  A crash after a receiver answered 2xx
but before the row was removed resends that delivery at the next start, with the same body,
timestamp and nonce, which is the contract's dedupe key for receivers.  Within one run a
delivery is sent once (the dispatcher's cursor never goes back).

Time comes from the Env clock (the breaker) and trio's clock (timeouts, backoff), so the
simulator's mock clock drives it; the nonce and the delivery id come from the Env.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit

import apsw
import httpx
import trio

from troupe.runtime import ChildSpec, Env, Tracer
from troupe.storage import StorageError

from ._webhook_signing import (
    TurnEndNotice,
    WebhookSettings,
    credential_header_names,
    nonce_from_bytes,
    turn_end_body,
    webhook_headers,
)

webhook_inflight_max = 32
"""Deliveries in flight at once (``notifyMaxInflight``)."""
webhook_queue_max = 1024
"""Deliveries waiting beyond those in flight (``notifyMaxQueue``); full = drop the newest."""
webhook_attempt_timeout_seconds = 5.0
"""One POST, connect to response headers (``notifyTimeoutMs``)."""
webhook_backoff_seconds = 0.5
"""The first retry's wait; each next one doubles it: 0.5, 1, 2 s (``notifyBackoffMs``)."""
webhook_retries_max = 3
"""Retries after the first attempt (``notifyMaxRetries``): four attempts at most."""
webhook_breaker_failures_max = 5
"""Consecutive final failures of one target that open its breaker."""
webhook_breaker_open_seconds = 30.0
"""How long an open breaker fails deliveries fast before it lets one probe through."""
webhook_poll_seconds = 1.0
"""How often the dispatcher looks for rows written without a ``wake()``."""
webhook_decisions_retention_seconds = 7 * 24 * 3600.0
"""How long a turn's decision is kept for dedupe; far beyond any retry of that turn."""
webhook_prune_interval_seconds = 3600.0

assert webhook_backoff_seconds * 2 ** webhook_retries_max < webhook_breaker_open_seconds
assert webhook_decisions_retention_seconds > webhook_prune_interval_seconds

EnqueueOutcome = Literal["accepted", "duplicate", "queue_full", "disabled", "not_stored"]

webhook_deliveries_extra = "sessions.webhook_deliveries"
"""The ``Env.extras`` key under which a server publishes its ``WebhookDeliveries`` (one per
server lifetime), so that actors built from static kinds can reach it."""

reason_circuit_open = "circuit_open"
reason_queue_full = "queue_full"
reason_timeout = "timeout"
reason_storage_error = "storage_error"

trace_kind = "webhooks"
"""The trace's ``kind`` for webhook events; the ``key`` is the session id."""


@dataclass(frozen=True)
class WebhookLimits:
    """Every bound of the delivery service; tests shrink them, production keeps the contract's."""

    inflight_max: int = webhook_inflight_max
    queue_max: int = webhook_queue_max
    attempt_timeout_seconds: float = webhook_attempt_timeout_seconds
    backoff_seconds: float = webhook_backoff_seconds
    retries_max: int = webhook_retries_max
    breaker_failures_max: int = webhook_breaker_failures_max
    breaker_open_seconds: float = webhook_breaker_open_seconds
    poll_seconds: float = webhook_poll_seconds
    decisions_retention_seconds: float = webhook_decisions_retention_seconds

    def __post_init__(self) -> None:
        assert self.inflight_max >= 1 and self.queue_max >= 0
        assert self.attempt_timeout_seconds > 0 and self.backoff_seconds >= 0
        assert self.retries_max >= 0 and self.breaker_failures_max >= 1
        assert self.breaker_open_seconds > 0 and self.poll_seconds > 0
        assert self.decisions_retention_seconds > 0

    @property
    def pending_max(self) -> int:
        """Rows the durable queue may hold: those in flight plus those waiting."""
        return self.inflight_max + self.queue_max


@dataclass(frozen=True)
class PendingDelivery:
    """One durable row: everything a (re)send needs except the secret."""

    delivery_id: str
    session_id: str
    turn_id: str
    body: bytes
    timestamp_ms: int
    nonce: str
    row_id: int = 0
    """The table's id (0 until stored); the dispatcher's FIFO cursor."""


@dataclass(frozen=True)
class WebhookFailure:
    """A delivery that will not be sent (any more): what ``on_failure`` receives."""

    delivery_id: str
    session_id: str
    turn_id: str
    attempts: int
    reason: str
    status: int | None = None


@dataclass
class WebhookStatistics:
    enqueued: int = 0
    duplicates: int = 0
    dropped_queue_full: int = 0
    delivered: int = 0
    attempts: int = 0
    retries: int = 0
    final_failures: int = 0
    """Deliveries that ended without a 2xx, circuit-open fast failures included."""
    circuit_open_failures: int = 0
    breaker_opens: int = 0
    in_flight: int = 0
    left_pending_by_drain: int = 0


def new_pending_delivery(env: Env, notice: TurnEndNotice) -> PendingDelivery:
    """The row for ``notice``: id, nonce and ``ts`` from the Env, made outside any storage
    job (the Env's random source must be drawn on the trio side, in a fixed order)."""
    timestamp_ms = int(env.clock.wall() * 1000)
    return PendingDelivery(
        delivery_id=env.ids.new_id("msg_"),
        session_id=notice.session_id,
        turn_id=notice.turn_id,
        body=turn_end_body(notice, timestamp_ms),
        timestamp_ms=timestamp_ms,
        nonce=nonce_from_bytes(env.random.token_bytes(16)),
    )


def webhook_enqueue(connection: apsw.Connection, delivery: PendingDelivery, *, pending_max: int,
                    decided_at: float) -> EnqueueOutcome:
    """Storage job: decide ``delivery``'s turn once and queue it if there is room."""
    connection.execute(
        "INSERT OR IGNORE INTO sessions_webhook_turns (session_id, turn_id, decided_at, outcome) "
        "VALUES (?, ?, ?, 'accepted')",
        (delivery.session_id, delivery.turn_id, decided_at),
    )
    if connection.changes() == 0:
        return "duplicate"
    (pending,) = connection.execute("SELECT count(*) FROM sessions_webhook_deliveries").fetchone()
    if pending >= pending_max:
        connection.execute(
            "UPDATE sessions_webhook_turns SET outcome = ? WHERE session_id = ? AND turn_id = ?",
            (reason_queue_full, delivery.session_id, delivery.turn_id),
        )
        return "queue_full"
    connection.execute(
        "INSERT INTO sessions_webhook_deliveries (delivery_id, session_id, turn_id, body, timestamp_ms, nonce, enqueued_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (delivery.delivery_id, delivery.session_id, delivery.turn_id, delivery.body, delivery.timestamp_ms,
         delivery.nonce, decided_at),
    )
    return "accepted"


def webhook_pending(connection: apsw.Connection, after_row_id: int = 0, limit: int = -1) -> list[PendingDelivery]:
    """Storage read: queued deliveries after ``after_row_id``, oldest first."""
    rows = connection.execute(
        "SELECT id, delivery_id, session_id, turn_id, body, timestamp_ms, nonce FROM sessions_webhook_deliveries "
        "WHERE id > ? ORDER BY id LIMIT ?",
        (after_row_id, limit),
    )
    return [
        PendingDelivery(delivery_id, session_id, turn_id, bytes(body), timestamp_ms, nonce, row_id)
        for row_id, delivery_id, session_id, turn_id, body, timestamp_ms, nonce in rows
    ]


def _forget(connection: apsw.Connection, row_id: int) -> None:
    connection.execute("DELETE FROM sessions_webhook_deliveries WHERE id = ?", (row_id,))


def _prune_decisions(connection: apsw.Connection, before: float) -> int:
    connection.execute("DELETE FROM sessions_webhook_turns WHERE decided_at < ?", (before,))
    return connection.changes()


def webhook_deliveries_in(env: Env) -> WebhookDeliveries | None:
    """The server's published delivery service, or None (no webhook configured / not yet)."""
    deliveries = env.extras.get(webhook_deliveries_extra)
    return deliveries if deliveries is not None and deliveries.enabled else None


class _Breaker:
    """One target's circuit: closed → (failures_max final failures) → open → probe → closed
    or open again.  ``now`` is the Env's monotonic clock."""

    def __init__(self, failures_max: int, open_seconds: float) -> None:
        self._failures_max = failures_max
        self._open_seconds = open_seconds
        self.failures = 0
        self.open_until: float | None = None
        self.probe: str | None = None
        """The delivery allowed through while half-open, if any."""

    def admits(self, delivery_id: str, now: float) -> bool:
        if self.open_until is None:
            return True
        if self.probe is not None:
            return self.probe == delivery_id
        if now < self.open_until:
            return False
        self.probe = delivery_id
        return True

    def succeeded(self) -> None:
        self.failures = 0
        self.open_until = None
        self.probe = None

    def failed(self, delivery_id: str, now: float) -> bool:
        """A final failure; True when it (re)opened the breaker."""
        if self.probe == delivery_id:
            self.probe = None
            self.open_until = now + self._open_seconds
            return True
        self.failures += 1
        if self.open_until is None and self.failures >= self._failures_max:
            self.open_until = now + self._open_seconds
            return True
        return False

    def released(self, delivery_id: str) -> None:
        """A probe stopped by draining leaves the half-open slot free again."""
        if self.probe == delivery_id:
            self.probe = None


@dataclass(frozen=True)
class _Sent:
    """How one delivery ended: ``delivered``, ``failed`` (final) or ``stopped`` (draining)."""

    end: Literal["delivered", "failed", "stopped"]
    attempts: int
    reason: str = ""
    status: int | None = None


_no_auth = httpx.Auth()
"""Passed to every send: no client-level auth and no basic auth from the URL, ever."""


class WebhookDeliveries:
    """The delivery service for one configured target (see the module docstring)."""

    def __init__(
        self,
        settings: WebhookSettings,
        *,
        env: Env,
        storage: Any,
        tracer: Tracer | None = None,
        limits: WebhookLimits | None = None,
        shutdown: Any = None,
        on_failure: Callable[[WebhookFailure], None] | None = None,
        name: str = "sessions.webhooks",
    ) -> None:
        """``storage`` is the ``troupe.storage.Engine``; ``shutdown`` anything with ``is_set()``
        and ``async wait()`` (``troupe.http.ShutdownSignal``): once set, the service drains."""
        self.settings = settings
        self.env = env
        self.storage = storage
        self.tracer = tracer or Tracer(enabled=False)
        self.limits = limits or WebhookLimits()
        self.name = name
        self._shutdown = shutdown
        self._on_failure = on_failure
        self._statistics = WebhookStatistics()
        self._breakers: dict[str, _Breaker] = {}
        self._changed = trio.Event()
        self._drain = trio.Event()
        self._cursor = 0
        self._in_flight: set[int] = set()

    # -- public API ---------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    @property
    def draining(self) -> bool:
        return self._drain.is_set() or (self._shutdown is not None and self._shutdown.is_set())

    def child_spec(self) -> ChildSpec:
        return ChildSpec(self.name, self.run)

    def publish(self) -> None:
        """Make this service the one ``webhook_deliveries_in(self.env)`` finds."""
        self.env.extras[webhook_deliveries_extra] = self

    def statistics(self) -> WebhookStatistics:
        return replace(self._statistics, in_flight=len(self._in_flight))

    def wake(self) -> None:
        """New rows were written (by ``webhook_enqueue`` in someone's transaction): look now."""
        self._changed.set()

    def begin_draining(self) -> None:
        """Send nothing more; the rows stay for the next start."""
        self._drain.set()
        self._changed.set()

    def breaker_open(self, now: float | None = None) -> bool:
        """Whether the configured target's breaker refuses deliveries now (statistics, tests)."""
        breaker = self._breakers.get(self._target_key())
        if breaker is None or breaker.open_until is None:
            return False
        now = self.env.clock.monotonic() if now is None else now
        return breaker.probe is not None or now < breaker.open_until

    async def enqueue_turn_end(self, notice: TurnEndNotice) -> EnqueueOutcome:
        """Decide ``notice``'s turn once and queue its delivery durably; the answer comes after
        the commit.  Never raises into the session's path: a storage failure answers
        ``"not_stored"`` and is reported as a failure (``storage_error``); that turn is then
        not notified (at most once wins over at least once here)."""
        if not self.enabled:
            return "disabled"
        delivery = new_pending_delivery(self.env, notice)
        job = functools.partial(webhook_enqueue, delivery=delivery, pending_max=self.limits.pending_max,
                                decided_at=self.env.clock.wall())
        try:
            outcome: EnqueueOutcome = await self.storage.write(job)
        except StorageError:
            outcome = "not_stored"
        self.after_enqueue(delivery, outcome)
        return outcome

    def after_enqueue(self, delivery: PendingDelivery, outcome: EnqueueOutcome) -> None:
        """Count and report an enqueue (also one done by ``webhook_enqueue`` in someone
        else's write job), and wake the dispatcher."""
        statistics = self._statistics
        if outcome == "accepted":
            statistics.enqueued += 1
            self.tracer.record("webhook_enqueued", trace_kind, delivery.session_id, turn=delivery.turn_id,
                               delivery=delivery.delivery_id)
            self.wake()
        elif outcome == "duplicate":
            statistics.duplicates += 1
        elif outcome == "queue_full":
            statistics.dropped_queue_full += 1
            self._report(delivery, _Sent("failed", 0, reason_queue_full))
        elif outcome == "not_stored":
            self._report(delivery, _Sent("failed", 0, reason_storage_error))

    # -- the service ----------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled.  Starts from the table: rows a previous run left pending
        are sent again (in id order)."""
        assert self.enabled, "run the service only when a webhook URL is configured"
        assert self.env.http is not None, "outbound HTTP goes through env.http"
        self._cursor = 0
        self._in_flight.clear()
        last_prune = -math.inf
        async with trio.open_nursery() as nursery:
            if self._shutdown is not None:
                nursery.start_soon(self._watch_shutdown)
            task_status.started()
            while True:
                self._changed = trio.Event()
                # A storage failure here is retried at the next poll rather than crashing:
                # the service may run outside a supervisor (in an app's lifespan).
                try:
                    if not self.draining:
                        await self._dispatch(nursery)
                    if self.env.clock.monotonic() - last_prune >= webhook_prune_interval_seconds:
                        await self._prune()
                        last_prune = self.env.clock.monotonic()
                except StorageError as error:
                    self.tracer.record("webhook_storage_error", trace_kind, "", error=type(error).__name__)
                with trio.move_on_after(self.limits.poll_seconds):
                    await self._changed.wait()

    async def _watch_shutdown(self) -> None:
        await self._shutdown.wait()
        self.begin_draining()

    async def _prune(self) -> None:
        before = self.env.clock.wall() - self.limits.decisions_retention_seconds
        await self.storage.write(functools.partial(_prune_decisions, before=before))

    async def _dispatch(self, nursery: trio.Nursery) -> None:
        free = self.limits.inflight_max - len(self._in_flight)
        if free <= 0:
            return
        rows = await self.storage.read(functools.partial(webhook_pending, after_row_id=self._cursor, limit=free))
        for delivery in rows:
            if self.draining:
                return
            self._cursor = delivery.row_id
            self._in_flight.add(delivery.row_id)
            nursery.start_soon(self._deliver, delivery)

    async def _deliver(self, delivery: PendingDelivery) -> None:
        try:
            sent = await self._send(delivery)
            if sent.end == "stopped":
                self._statistics.left_pending_by_drain += 1
                return
            try:
                await self.storage.write(functools.partial(_forget, row_id=delivery.row_id))
            except StorageError as error:
                # The row stays; the next start sends it again (at least once, same nonce).
                self.tracer.record("webhook_forget_failed", trace_kind, delivery.session_id,
                                   turn=delivery.turn_id, error=type(error).__name__)
            if sent.end == "delivered":
                self._statistics.delivered += 1
                self.tracer.record("webhook_delivered", trace_kind, delivery.session_id, turn=delivery.turn_id,
                                   delivery=delivery.delivery_id, attempts=sent.attempts)
            else:
                self._report(delivery, sent)
        finally:
            self._in_flight.discard(delivery.row_id)
            self._changed.set()

    async def _send(self, delivery: PendingDelivery) -> _Sent:
        """Attempts with backoff until a 2xx, the retries run out, the breaker refuses or the
        service drains."""
        limits = self.limits
        breaker = self._breaker()
        attempts = 0
        last = _Sent("failed", 0)
        while True:
            if self.draining:
                breaker.released(delivery.delivery_id)
                return _Sent("stopped", attempts)
            if not breaker.admits(delivery.delivery_id, self.env.clock.monotonic()):
                self._statistics.circuit_open_failures += 1
                return _Sent("failed", attempts, reason_circuit_open)
            attempts += 1
            self._statistics.attempts += 1
            reason, status = await self._post(delivery)
            if reason is None:
                breaker.succeeded()
                return _Sent("delivered", attempts, status=status)
            last = _Sent("failed", attempts, reason, status)
            if attempts > limits.retries_max:
                break
            self._statistics.retries += 1
            with trio.move_on_after(limits.backoff_seconds * 2 ** (attempts - 1)):
                await self._drain.wait()
        if breaker.failed(delivery.delivery_id, self.env.clock.monotonic()):
            self._statistics.breaker_opens += 1
            self.tracer.record("webhook_breaker_open", trace_kind, delivery.session_id, target=self._target_key())
        return last

    async def _post(self, delivery: PendingDelivery) -> tuple[str | None, int | None]:
        """One POST: ``(None, status)`` on 2xx, else ``(reason, status or None)``."""
        settings = self.settings
        assert settings.url is not None
        headers = webhook_headers(settings, delivery_id=delivery.delivery_id, timestamp_ms=delivery.timestamp_ms,
                                  nonce=delivery.nonce, body=delivery.body)
        client: httpx.AsyncClient = self.env.http
        request = client.build_request("POST", settings.url, content=delivery.body, headers=headers)
        for name in credential_header_names:
            request.headers.pop(name, None)  # a client's default headers or cookie jar
        status: int | None = None
        with trio.move_on_after(self.limits.attempt_timeout_seconds):
            try:
                response = await client.send(request, auth=_no_auth, follow_redirects=False, stream=True)
            except httpx.HTTPError as error:
                return f"network:{type(error).__name__}", None
            status = response.status_code
            await response.aclose()  # the receiver's body is not read
        if status is None:
            return reason_timeout, None
        if 200 <= status < 300:
            return None, status
        return f"http_{status}", status

    def _target_key(self) -> str:
        assert self.settings.url is not None
        parts = urlsplit(self.settings.url)
        return f"{parts.scheme}://{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"

    def _breaker(self) -> _Breaker:
        key = self._target_key()
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = _Breaker(self.limits.breaker_failures_max, self.limits.breaker_open_seconds)
            self._breakers[key] = breaker
        return breaker

    def _report(self, delivery: PendingDelivery, sent: _Sent) -> None:
        if sent.reason != reason_queue_full:
            self._statistics.final_failures += 1
        self.tracer.record("webhook_failed", trace_kind, delivery.session_id, turn=delivery.turn_id,
                           delivery=delivery.delivery_id, attempts=sent.attempts, reason=sent.reason,
                           status=sent.status)
        failure = WebhookFailure(delivery.delivery_id, delivery.session_id, delivery.turn_id, sent.attempts,
                                 sent.reason, sent.status)
        if self._on_failure is not None:
            try:
                self._on_failure(failure)
            except Exception as error:  # the operator's hook must not stop deliveries
                self.tracer.record("webhook_hook_failed", trace_kind, delivery.session_id, error=type(error).__name__)


__all__ = [
    "EnqueueOutcome",
    "PendingDelivery",
    "WebhookDeliveries",
    "WebhookFailure",
    "WebhookLimits",
    "WebhookStatistics",
    "new_pending_delivery",
    "webhook_attempt_timeout_seconds",
    "webhook_backoff_seconds",
    "webhook_breaker_failures_max",
    "webhook_breaker_open_seconds",
    "webhook_decisions_retention_seconds",
    "webhook_deliveries_extra",
    "webhook_deliveries_in",
    "webhook_enqueue",
    "webhook_inflight_max",
    "webhook_pending",
    "webhook_poll_seconds",
    "webhook_queue_max",
    "webhook_retries_max",
]
