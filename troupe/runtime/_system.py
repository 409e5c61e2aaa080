"""The actor system: virtual actors, bounded mailboxes, turns, crashes and passivation.

Each live actor is a *cell*: a bounded trio memory channel (its mailbox) and one task that takes
one message at a time.  ``system.ref(kind, key)`` never fails and costs nothing; the first
message creates the cell in its kind supervisor's nursery.  Posting is synchronous
(``send_nowait``), which is what makes the life cycle race-free: a cell is removed from the live
map *before* its mailbox closes, so a message posted a moment later creates a fresh cell, which
waits for the old one to finish passivating before it loads state.

Trade-offs: one task per live actor keeps turns simple and costs a few KB per actor; the
live-actor cap (LRU) bounds the total.  Turns run to completion or to their timeout; a crash
fails only that turn's caller, discards the instance and the next message re-activates it from
storage.  Restart intensity is per actor (OTP's default, 1 restart in 5 s); exceeding it
escalates to the kind supervisor, which absorbs a bounded number of escalations before it
gives up and the root marks the kind ``Unavailable`` while it recovers.

Fault points and planted bugs (``troupe.runtime._fault_points``) are consulted on the Env at
the moment of use, because the simulator arms them only once a process has started.  With the
production ``no_fault_points`` each point costs one identity comparison; the ``_fault`` helper
(trace record included) runs only when the simulator armed something.  Every branch guarded by
``env.planted_bugs`` is a deliberate bug that only the simulator's own tests switch on.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from . import _limits
from ._actor import Actor, ActorContext, ActorKind, ReminderFired, TaskEnded
from ._env import Env
from ._exceptions import (
    ActorCrashed,
    ActorError,
    AskTimeout,
    Overloaded,
    PoisonMessage,
    Unavailable,
    UnknownActorKind,
)
from ._fault_points import InjectedFault, no_fault_points
from ._limits import RestartIntensity
from ._reminders import ReminderService
from ._supervisor import ChildSpec, Strategy, Supervisor, SupervisorEscalated
from ._trace import Tracer

runtime_event_kinds = (
    # actors
    "activate", "activation_failed", "turn", "crash", "restart", "escalate", "poison",
    "poison_refused", "turn_timeout", "passivate", "passivate_failed", "evict", "kind_failed",
    # posting
    "overloaded", "unavailable_refused",
    # in-memory timers
    "timer", "timer_dropped",
    # background tasks (ActorContext.start_task)
    "task_started", "task_ended",
    # durable reminders
    "reminder_fire", "reminder_poison", "reminder_error",
    # supervisors (kind "supervisor"; "restart" and "escalate" are shared with actors)
    "child_crash", "unavailable", "recover",
    # an armed fault point fired (field ``point``)
    "fault",
)
"""Every trace event kind the runtime records (``troupe sim sweep`` reports which it saw).
Actors may record their own kinds through ``ActorContext.trace``; those are not listed."""

runtime_planted_bugs = (
    "keep_instance_after_crash",
    "no_service_restart",
    "redeliver_after_crash",
    "skip_predecessor_wait",
    "no_restart_intensity",
    "reminder_lost_on_crash",
    "late_timer_dropped",
    "timer_fires_twice",
)
"""Deliberate runtime bugs ``troupe sim --plant-bug`` can switch on (``Env.planted_bugs``):
a crashed actor keeps its dirty instance; a supervisor leaves a crashed child down; a message
whose turn crashed is delivered once more; a new activation loads state while its predecessor
still passivates; actors never escalate; a reminder is deleted before its turn ran; a late
in-memory timer is dropped; an in-memory timer delivers its message twice."""

turn_latency_buckets_seconds = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Envelope:
    __slots__ = ("message", "done", "result", "error")

    def __init__(self, message: Any, wants_reply: bool) -> None:
        self.message = message
        self.done = trio.Event() if wants_reply else None
        self.result: Any = None
        self.error: BaseException | None = None

    def succeed(self, result: Any) -> None:
        if self.done is not None:
            self.result = result
            self.done.set()

    def fail(self, error: BaseException) -> None:
        if self.done is not None:
            self.error = error
            self.done.set()


class _RedeliveredEnvelope(_Envelope):
    """PLANTED BUG ``redeliver_after_crash`` only: a crashed message queued a second time."""

    __slots__ = ()


def _identity(message: Any) -> dict[str, str]:
    """The trace fields naming a message: its ``trace_id`` when it has a str one (ids and
    idempotency keys are deterministic; reprs may hold paths or addresses and are not)."""
    trace_id = getattr(message, "trace_id", None)
    return {"id": trace_id} if isinstance(trace_id, str) else {}


class _EnvFaultPoints:
    """The Env's fault points as they are at the moment of use: the supervisor holds this
    view because the simulator arms the Env's points only after the system has started."""

    __slots__ = ("_env",)

    def __init__(self, env: Env) -> None:
        self._env = env

    @property
    def armed(self) -> bool:
        return self._env.fault_points is not no_fault_points

    def fires(self, point: str) -> bool:
        return self._env.fault_points.fires(point)

    def delay_seconds(self, point: str) -> float:
        return self._env.fault_points.delay_seconds(point)


class _Task:
    """One background task of a cell (``ActorContext.start_task``)."""

    __slots__ = ("scope",)

    def __init__(self) -> None:
        self.scope = trio.CancelScope()


class _Cell:
    __slots__ = (
        "runtime", "key", "send", "receive", "actor", "context", "timers", "tasks",
        "passivate_requested", "detached", "stopped", "finished", "last_active",
        "turn_started", "deadline_scope", "predecessor",
    )

    def __init__(self, runtime: _KindRuntime, key: str) -> None:
        self.runtime = runtime
        self.key = key
        self.send, self.receive = trio.open_memory_channel[_Envelope](runtime.spec.mailbox_messages_max)
        self.actor: Actor | None = None
        self.context: ActorContext | None = None
        self.timers: dict[str, trio.CancelScope] = {}
        self.tasks: dict[str, _Task] = {}
        """Background tasks of the current instance; they keep the cell from idling."""
        self.passivate_requested = False
        self.detached = False
        self.stopped = False
        self.finished = trio.Event()
        self.last_active = 0.0
        self.turn_started: float | None = None
        """Monotonic start of the turn (or activation) in progress; None between turns."""
        self.deadline_scope: trio.CancelScope | None = None
        self.predecessor: trio.Event | None = runtime.passivating.get(key)
        """Set when the previous cell of this key has finished passivating: captured at
        creation, because by the time this cell's task starts it may have been detached too."""


@dataclass
class KindStatistics:
    """Counters for one actor kind (see ``ActorSystem.statistics``)."""

    live: int = 0
    mailbox_depth: int = 0
    activations: int = 0
    passivations: int = 0
    turns: int = 0
    turn_seconds_total: float = 0.0
    turn_latency_counts: list[int] = field(default_factory=lambda: [0] * (len(turn_latency_buckets_seconds) + 1))
    crashes: int = 0
    restarts: int = 0
    escalations: int = 0
    poison: int = 0
    overloaded: int = 0
    available: bool = True


class _KindRuntime:
    """Per-kind state: its supervisor's nursery, poison memory, availability, statistics."""

    def __init__(self, spec: ActorKind) -> None:
        self.spec = spec
        self.nursery: trio.Nursery | None = None
        self.available = False
        self.retry_at = 0.0
        self.failed = trio.Event()
        self.escalation_times: deque[float] = deque()
        self.passivating: dict[str, trio.Event] = {}
        self.cells: dict[_Cell, None] = {}
        """Every cell whose task runs, live or detached (insertion-ordered: deterministic)."""
        self.crash_counts: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()
        """(key, message fingerprint) -> (crashes, monotonic time of the last one)."""
        self.restart_histories: OrderedDict[str, deque[float]] = OrderedDict()
        """Recent restarts per actor key.  They outlive the cell: an actor that crashes,
        passivates and comes back must not get a fresh intensity budget each time."""
        self.statistics = KindStatistics()


def _fingerprint(message: Any) -> str:
    # Messages are frozen dataclasses; their repr is deterministic and names every field.
    return f"{type(message).__qualname__}:{message!r}"


class ActorRef:
    """A cheap, always-valid address of a virtual actor."""

    __slots__ = ("_system", "kind", "key")

    def __init__(self, system: ActorSystem, kind: str, key: str) -> None:
        self._system = system
        self.kind = kind
        self.key = key

    async def ask(self, message: Any, timeout: float | None = None) -> Any:
        """Send ``message`` and wait for the reply; raises ``ActorError`` subclasses."""
        envelope = _Envelope(message, wants_reply=True)
        self._system._post(self.kind, self.key, envelope)
        if timeout is None:
            await envelope.done.wait()
        else:
            with trio.move_on_after(timeout):
                await envelope.done.wait()
            if not envelope.done.is_set():
                raise AskTimeout(f"{self.kind}/{self.key} did not reply within {timeout}s")
        if envelope.error is not None:
            raise envelope.error
        return envelope.result

    def tell(self, message: Any) -> None:
        """Fire and forget; raises ``Overloaded``/``Unavailable`` if it cannot be queued."""
        self._system._post(self.kind, self.key, _Envelope(message, wants_reply=False))

    def __repr__(self) -> str:
        return f"ActorRef({self.kind!r}, {self.key!r})"


class ActorSystem:
    """Owns the kinds, the live cells, the root supervisor and the reminder service."""

    def __init__(
        self,
        env: Env,
        kinds: list[ActorKind],
        *,
        storage: Any = None,
        tracer: Tracer | None = None,
        live_actors_max: int = _limits.live_actors_max,
        root_intensity: RestartIntensity | None = None,
        services: list[ChildSpec] | None = None,
        transient_errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        """``transient_errors``: failures of the infrastructure (storage I/O, an overloaded
        peer) rather than of the message; they crash the turn but never make it poison."""
        assert live_actors_max >= 1
        self.transient_errors = (ActorError, *transient_errors)
        self.env = env
        self.storage = storage
        self.tracer = tracer or Tracer(enabled=False)
        self.live_actors_max = live_actors_max
        self._kinds: dict[str, _KindRuntime] = {}
        for spec in kinds:
            assert spec.name not in self._kinds, f"duplicate actor kind {spec.name!r}"
            self._kinds[spec.name] = _KindRuntime(spec)
        self._live: OrderedDict[tuple[str, str], _Cell] = OrderedDict()
        self.reminders = ReminderService(self)
        children = [ChildSpec("reminders", self.reminders.run, fault_point="reminder_service_crashes")]
        children += [
            service if service.fault_point is not None else dataclasses.replace(service, fault_point="service_crashes")
            for service in services or []
        ]
        children += [self._kind_child(runtime) for runtime in self._kinds.values()]
        self.root = Supervisor(
            "root",
            children,
            strategy=Strategy.one_for_one,
            intensity=root_intensity,
            clock=env.clock.monotonic,
            tracer=self.tracer,
            escalate=False,
            fault_points=_EnvFaultPoints(env),
            planted_bugs=env.planted_bugs,
        )
        self._supervision_armed = False
        self.running = False
        """True while ``run`` runs (readiness probes read it)."""

    # -- public API ---------------------------------------------------------------------

    def ref(self, kind: str, key: str) -> ActorRef:
        return ActorRef(self, kind, key)

    @property
    def kinds(self) -> list[str]:
        return list(self._kinds)

    def statistics(self) -> dict[str, KindStatistics]:
        """A snapshot per kind; ``live`` and ``mailbox_depth`` are counted now."""
        for runtime in self._kinds.values():
            runtime.statistics.live = 0
            runtime.statistics.mailbox_depth = 0
            runtime.statistics.available = runtime.available
        for cell in self._live.values():
            statistics = cell.runtime.statistics
            statistics.live += 1
            statistics.mailbox_depth += cell.send.statistics().current_buffer_used
        return {name: runtime.statistics for name, runtime in self._kinds.items()}

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the root supervisor until cancelled."""
        self.running = True
        try:
            await self.root.run(task_status=task_status)
        finally:
            self.running = False

    async def drain(self) -> None:
        """Graceful shutdown: passivate every live actor after its queued messages."""
        cells = list(self._live.values())
        for cell in cells:
            self._detach(cell)
        for cell in cells:
            await cell.finished.wait()

    # -- posting ------------------------------------------------------------------------

    def _post(self, kind: str, key: str, envelope: _Envelope) -> None:
        runtime = self._kinds.get(kind)
        if runtime is None:
            raise UnknownActorKind(kind)
        if not runtime.available or runtime.nursery is None:
            self.tracer.record("unavailable_refused", kind, key, **_identity(envelope.message))
            raise Unavailable(kind, max(runtime.retry_at - self.env.clock.monotonic(), _limits.retry_after_seconds_min))
        if self.env.fault_points is not no_fault_points and self._fault("mailbox_full", kind, key, envelope.message):
            runtime.statistics.overloaded += 1
            self.tracer.record("overloaded", kind, key, **_identity(envelope.message))
            raise Overloaded(kind, key, _limits.retry_after_seconds_min)
        address = (kind, key)
        cell = self._live.get(address)
        if cell is None:
            cell = self._create_cell(runtime, key)
        else:
            self._live.move_to_end(address)
        try:
            cell.send.send_nowait(envelope)
        except trio.WouldBlock:
            runtime.statistics.overloaded += 1
            self.tracer.record("overloaded", kind, key, **_identity(envelope.message))
            raise Overloaded(kind, key, self._retry_after(runtime, cell)) from None

    def _retry_after(self, runtime: _KindRuntime, cell: _Cell) -> float:
        statistics = runtime.statistics
        average = statistics.turn_seconds_total / statistics.turns if statistics.turns else 0.01
        depth = cell.send.statistics().current_buffer_used
        return min(max(depth * average, _limits.retry_after_seconds_min), _limits.retry_after_seconds_max)

    def _fault(self, point: str, kind: str, key: str, message: Any = None) -> bool:
        """Whether the armed fault ``point`` fires now; traces it when it does.  Callers test
        ``env.fault_points is not no_fault_points`` first, so production never gets here."""
        if not self._supervision_armed:
            # The simulator armed the Env after the system started: let the supervisors start
            # crashing their services too.
            self._supervision_armed = True
            self.root.arm_fault_points()
        if not self.env.fault_points.fires(point):
            return False
        self.tracer.record("fault", kind, key, point=point, **_identity(message))
        return True

    def _create_cell(self, runtime: _KindRuntime, key: str) -> _Cell:
        while len(self._live) >= self.live_actors_max:
            _, oldest = next(iter(self._live.items()))
            self.tracer.record("evict", oldest.runtime.spec.name, oldest.key)
            self._detach(oldest)
        cell = _Cell(runtime, key)
        cell.last_active = self.env.clock.monotonic()
        self._live[(runtime.spec.name, key)] = cell
        runtime.cells[cell] = None
        runtime.nursery.start_soon(self._run_cell, cell)
        return cell

    def _detach(self, cell: _Cell) -> None:
        """Stop accepting messages for ``cell``: queued ones still run, then it passivates."""
        if cell.detached:
            return
        cell.detached = True
        address = (cell.runtime.spec.name, cell.key)
        if self._live.get(address) is cell:
            del self._live[address]
        cell.runtime.passivating[cell.key] = cell.finished
        cell.send.close()

    # -- the cell's task ----------------------------------------------------------------

    async def _run_cell(self, cell: _Cell) -> None:
        runtime = cell.runtime
        try:
            # PLANTED BUG (simulator tests only): load state while the predecessor passivates.
            if cell.predecessor is not None and "skip_predecessor_wait" not in self.env.planted_bugs:
                await cell.predecessor.wait()
            await self._cell_loop(cell)
        finally:
            self._discard(cell)
            self._detach(cell)
            for scope in cell.timers.values():
                scope.cancel()
            cell.timers.clear()
            error = Unavailable(runtime.spec.name, _limits.retry_after_seconds_min)
            while True:
                try:
                    cell.receive.receive_nowait().fail(error)
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            if runtime.passivating.get(cell.key) is cell.finished:
                del runtime.passivating[cell.key]
            runtime.cells.pop(cell, None)
            cell.finished.set()

    async def _cell_loop(self, cell: _Cell) -> None:
        # One cancel scope serves every turn of the cell.  The kind's sweeper cancels it when a
        # turn has run past ``turn_timeout_seconds`` (a watchdog costs a float per turn, where a
        # fail_after per message costs two trips through trio's deadline heap).  Then that turn
        # crashed, and the loop goes on in a fresh scope.  Idleness is found by the same sweeper.
        while not cell.stopped:
            scope = trio.CancelScope()
            cell.deadline_scope = scope
            current: list[_Envelope] = []
            with scope:
                await self._serve(cell, current)
            if not scope.cancelled_caught:
                break
            cell.turn_started = None
            spec = cell.runtime.spec
            self.tracer.record("turn_timeout", spec.name, cell.key, **_identity(current[0].message))
            timeout = trio.TooSlowError(f"turn exceeded {spec.turn_timeout_seconds}s")
            await self._after_crash(cell, current[0], timeout)
        await self._passivate(cell)

    async def _serve(self, cell: _Cell, current: list[_Envelope]) -> None:
        """Take messages until the mailbox closes or the cell stops; ``current`` names the
        envelope in hand so a timeout can fail the right caller."""
        clock = self.env.clock
        while not cell.stopped:
            try:
                envelope = cell.receive.receive_nowait()
            except trio.WouldBlock:
                try:
                    envelope = await cell.receive.receive()
                except trio.EndOfChannel:
                    return
            except trio.EndOfChannel:
                return
            else:
                # receive_nowait is not a checkpoint: yield once per turn, as receive() would.
                await trio.lowlevel.checkpoint()
            current[:] = [envelope]
            cell.turn_started = clock.monotonic()
            if cell.actor is None and not await self._activate(cell, envelope):
                cell.turn_started = None
                continue
            await self._turn(cell, envelope)
            cell.turn_started = None
            if cell.passivate_requested:
                self._detach(cell)

    async def _activate(self, cell: _Cell, envelope: _Envelope) -> bool:
        runtime = cell.runtime
        spec = runtime.spec
        context = ActorContext(spec.name, cell.key, self, cell)
        faults = self.env.fault_points is not no_fault_points
        try:
            if faults and self._fault("activate_fails", spec.name, cell.key, envelope.message):
                raise InjectedFault("activate_fails (before on_activate)")
            actor = spec.factory(context)
            await actor.on_activate()
            if faults and self._fault("activate_fails", spec.name, cell.key, envelope.message):
                raise InjectedFault("activate_fails (after on_activate)")
        except Exception as error:
            context._discarded = True
            self.tracer.record("activation_failed", spec.name, cell.key, error=type(error).__name__)
            await self._after_crash(cell, envelope, error)
            return False
        cell.actor = actor
        cell.context = context
        runtime.statistics.activations += 1
        self.tracer.record("activate", spec.name, cell.key)
        return True

    async def _turn(self, cell: _Cell, envelope: _Envelope) -> None:
        runtime = cell.runtime
        spec = runtime.spec
        message = envelope.message
        # Fingerprints cost a repr: only compute them once this kind has seen a crash.
        fingerprint = None
        if runtime.crash_counts:
            fingerprint = (cell.key, _fingerprint(message))
            crashes, last_crash = runtime.crash_counts.get(fingerprint, (0, 0.0))
            if crashes >= 2:
                if self.env.clock.monotonic() - last_crash < _limits.poison_quarantine_seconds:
                    self.tracer.record(
                        "poison_refused", spec.name, cell.key, message=type(message).__name__, **_identity(message)
                    )
                    envelope.fail(PoisonMessage(spec.name, cell.key, "message is quarantined as poison"))
                    return
                # The quarantine is over: the message gets one more chance.
        # The hot path: no helper call and no keyword merge unless the message has an id.
        trace_id = getattr(message, "trace_id", None)
        if trace_id.__class__ is str:
            self.tracer.record("turn", spec.name, cell.key, message=type(message).__name__, id=trace_id)
        else:
            self.tracer.record("turn", spec.name, cell.key, message=type(message).__name__)
        clock = self.env.clock
        faults = self.env.fault_points is not no_fault_points
        try:
            if faults:
                await self._before_turn_faults(cell, message)
            if isinstance(message, ReminderFired):
                await cell.actor.on_reminder(message.name, message.payload)
                await self.reminders.completed(spec.name, cell.key, message)
                result = None
            else:
                result = await cell.actor.receive(message)
            if faults and self._fault("turn_raises_after", spec.name, cell.key, message):
                raise InjectedFault("turn_raises_after")
        except Exception as error:
            await self._after_crash(cell, envelope, error)
            return
        if fingerprint is not None:
            runtime.crash_counts.pop(fingerprint, None)  # it ran: whatever crashed it was not it
        finished = clock.monotonic()
        cell.last_active = finished
        elapsed = finished - cell.turn_started
        statistics = runtime.statistics
        statistics.turns += 1
        statistics.turn_seconds_total += elapsed
        bucket = bisect.bisect_left(turn_latency_buckets_seconds, elapsed)
        statistics.turn_latency_counts[bucket] += 1
        envelope.succeed(result)

    async def _before_turn_faults(self, cell: _Cell, message: Any) -> None:
        name = cell.runtime.spec.name
        if self._fault("turn_raises_before", name, cell.key, message):
            raise InjectedFault("turn_raises_before")
        if self._fault("turn_overruns", name, cell.key, message):
            # Run well past the limit so the kind's watchdog, not this sleep, ends the turn.
            overrun = self.env.fault_points.delay_seconds("turn_overruns")
            await trio.sleep(2 * cell.runtime.spec.turn_timeout_seconds + overrun)

    async def _after_crash(self, cell: _Cell, envelope: _Envelope, error: Exception) -> None:
        runtime = cell.runtime
        spec = runtime.spec
        statistics = runtime.statistics
        statistics.crashes += 1
        count = 0
        if not isinstance(error, self.transient_errors):
            fingerprint = (cell.key, _fingerprint(envelope.message))
            count = runtime.crash_counts.pop(fingerprint, (0, 0.0))[0] + 1
            runtime.crash_counts[fingerprint] = (count, self.env.clock.monotonic())
            while len(runtime.crash_counts) > _limits.poison_fingerprints_max:
                runtime.crash_counts.popitem(last=False)
        # Only the type goes into the trace: messages may hold paths or addresses, which would
        # make the same seed hash differently on another machine.
        identity = _identity(envelope.message)
        message_type = type(envelope.message).__name__
        self.tracer.record("crash", spec.name, cell.key, message=message_type, error=type(error).__name__, **identity)
        if count >= 2:
            statistics.poison += 1
            self.tracer.record("poison", spec.name, cell.key, message=message_type, **identity)
            envelope.fail(PoisonMessage(spec.name, cell.key, _describe(error)))
        else:
            envelope.fail(ActorCrashed(spec.name, cell.key, _describe(error)))
        planted_bugs = self.env.planted_bugs
        if planted_bugs:
            self._planted_after_crash(cell, envelope, planted_bugs)
        # Discard the instance: the next message re-activates it from durable state.
        # PLANTED BUG (simulator tests only): keep the dirty instance instead.
        if "keep_instance_after_crash" not in planted_bugs:
            self._discard(cell)
        for scope in cell.timers.values():
            scope.cancel()
        cell.timers.clear()
        now = self.env.clock.monotonic()
        history = runtime.restart_histories.pop(cell.key, None) or deque()
        runtime.restart_histories[cell.key] = history
        while len(runtime.restart_histories) > _limits.restart_histories_max:
            runtime.restart_histories.popitem(last=False)
        # PLANTED BUG (simulator tests only): never escalate, whatever the restart rate.
        if spec.intensity.admits(history, now) or "no_restart_intensity" in planted_bugs:
            statistics.restarts += 1
            self.tracer.record("restart", spec.name, cell.key)
            return
        statistics.escalations += 1
        del runtime.restart_histories[cell.key]  # escalation hands the decision upwards
        self.tracer.record("escalate", spec.name, cell.key)
        cell.stopped = True
        self._detach(cell)
        if not spec.kind_intensity.admits(runtime.escalation_times, now):
            self._kind_failed(runtime)

    def _planted_after_crash(self, cell: _Cell, envelope: _Envelope, planted_bugs: frozenset[str]) -> None:
        # PLANTED BUG (simulator tests only): deliver the crashed message once more.
        if "redeliver_after_crash" in planted_bugs and not isinstance(envelope, _RedeliveredEnvelope):
            try:
                cell.send.send_nowait(_RedeliveredEnvelope(envelope.message, wants_reply=False))
            except (trio.WouldBlock, trio.ClosedResourceError):
                pass

    def _discard(self, cell: _Cell) -> None:
        """Throw the instance away; its context reports ``discarded`` from now on."""
        self._cancel_tasks(cell)
        cell.actor = None
        if cell.context is not None:
            cell.context._discarded = True
            cell.context = None

    async def _passivate(self, cell: _Cell) -> None:
        actor = cell.actor
        if actor is None:
            return
        runtime = cell.runtime
        name = runtime.spec.name
        runtime.statistics.passivations += 1
        self.tracer.record("passivate", name, cell.key)
        # Tasks end with the instance; cancelling them first lets on_passivate find them
        # winding down rather than still producing.
        self._cancel_tasks(cell)
        try:
            with trio.fail_after(runtime.spec.turn_timeout_seconds):
                if self.env.fault_points is not no_fault_points and self._fault("passivate_fails", name, cell.key):
                    raise InjectedFault("passivate_fails")
                await actor.on_passivate()
        except Exception as error:
            self.tracer.record("passivate_failed", name, cell.key, error=type(error).__name__)
        finally:
            self._discard(cell)

    # -- timers -------------------------------------------------------------------------

    def _start_timer(self, cell: _Cell, name: str, delay_seconds: float, message: Any) -> None:
        previous = cell.timers.pop(name, None)
        if previous is not None:
            previous.cancel()
        scope = trio.CancelScope()
        nursery = cell.runtime.nursery
        if nursery is None:
            # The kind is going down with its cells: the timer could never be delivered.
            self.tracer.record("timer_dropped", cell.runtime.spec.name, cell.key, name=name)
            return
        cell.timers[name] = scope
        nursery.start_soon(self._timer_task, cell, name, scope, delay_seconds, message)

    async def _timer_task(self, cell: _Cell, name: str, scope: trio.CancelScope, delay: float, message: Any) -> None:
        kind = cell.runtime.spec.name
        with scope:
            await trio.sleep(delay)
            if self.env.fault_points is not no_fault_points and self._fault("timer_late", kind, cell.key):
                # PLANTED BUG (simulator tests only): a late timer is silently dropped.
                if "late_timer_dropped" in self.env.planted_bugs:
                    if cell.timers.get(name) is scope:
                        del cell.timers[name]
                    return
                await trio.sleep(self.env.fault_points.delay_seconds("timer_late"))
            if cell.timers.get(name) is scope:
                del cell.timers[name]
            self.tracer.record("timer", kind, cell.key, name=name)
            # PLANTED BUG (simulator tests only): the timer delivers its message twice.
            deliveries = 2 if "timer_fires_twice" in self.env.planted_bugs else 1
            for _ in range(deliveries):
                try:
                    cell.send.send_nowait(_Envelope(message, wants_reply=False))
                except (trio.WouldBlock, trio.ClosedResourceError):
                    self.tracer.record("timer_dropped", kind, cell.key, name=name)

    # -- background tasks ---------------------------------------------------------------

    def _start_task(self, cell: _Cell, name: str, function: Any) -> None:
        kind = cell.runtime.spec.name
        previous = cell.tasks.pop(name, None)
        if previous is not None:
            previous.scope.cancel()
        nursery = cell.runtime.nursery
        if nursery is None:
            # The kind is going down with its cells: the task would be cancelled at once.
            self.tracer.record("task_ended", kind, cell.key, name=name, outcome="dropped")
            return
        task = _Task()
        cell.tasks[name] = task
        self.tracer.record("task_started", kind, cell.key, name=name)
        nursery.start_soon(self._task_runner, cell, name, task, function)

    def _cancel_tasks(self, cell: _Cell) -> None:
        """The instance goes away: its tasks end unreported (no one is left to hear them)."""
        for task in cell.tasks.values():
            task.scope.cancel()
        cell.tasks.clear()

    async def _task_runner(self, cell: _Cell, name: str, task: _Task, function: Any) -> None:
        kind = cell.runtime.spec.name
        result: Any = None
        error: Exception | None = None
        with task.scope:
            try:
                result = await function()
            except Exception as exc:
                error = exc
        if cell.tasks.get(name) is not task:
            self.tracer.record("task_ended", kind, cell.key, name=name, outcome="discarded")
            return
        del cell.tasks[name]
        cell.last_active = self.env.clock.monotonic()
        cancelled = task.scope.cancelled_caught
        if cancelled:
            outcome = "cancelled"
        elif error is not None:
            outcome = "failed"
        else:
            outcome = "finished"
        fields = {"error": type(error).__name__} if error is not None else {}
        self.tracer.record("task_ended", kind, cell.key, name=name, outcome=outcome, **fields)
        ended = TaskEnded(name, result, error, cancelled)
        try:
            # Waits for mailbox room rather than dropping: an actor that never hears its task
            # ended would wait for it forever.  A closed mailbox means the cell is going away.
            await cell.send.send(_Envelope(ended, wants_reply=False))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    # -- kind supervision ---------------------------------------------------------------

    def _kind_child(self, runtime: _KindRuntime) -> ChildSpec:
        name = runtime.spec.name

        async def run(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
            runtime.failed = trio.Event()
            runtime.escalation_times.clear()
            async with trio.open_nursery() as nursery:
                runtime.nursery = nursery
                runtime.available = True
                try:
                    nursery.start_soon(self._sweeper, runtime)
                    task_status.started()
                    await runtime.failed.wait()
                    nursery.cancel_scope.cancel()
                finally:
                    # Once this body ends (the kind failed, or the system is being cancelled)
                    # the nursery takes no new tasks while its cells finish: posts must hear
                    # Unavailable from now on, not trio's "closed to new arrivals".
                    if runtime.nursery is nursery:
                        runtime.nursery = None
                        runtime.available = False
            raise SupervisorEscalated(f"kind:{name}", None)

        def unavailable(retry_after_seconds: float) -> None:
            runtime.available = False
            runtime.retry_at = self.env.clock.monotonic() + retry_after_seconds

        return ChildSpec(f"kind:{name}", run, on_unavailable=unavailable)

    async def _sweeper(self, runtime: _KindRuntime) -> None:
        """Per kind: passivates actors idle for ``idle_seconds`` and cancels turns running past
        ``turn_timeout_seconds``, each found within a quarter of its limit.  One task per kind
        replaces a timeout scope per message."""
        spec = runtime.spec
        period = min(spec.idle_seconds, spec.turn_timeout_seconds) / 4
        clock = self.env.clock
        while True:
            await trio.sleep(period)
            now = clock.monotonic()
            idle_cutoff = now - spec.idle_seconds
            turn_cutoff = now - spec.turn_timeout_seconds
            idle = []
            for cell in runtime.cells:
                if cell.turn_started is not None:
                    if cell.turn_started <= turn_cutoff and cell.deadline_scope is not None:
                        cell.deadline_scope.cancel()
                elif (
                    not cell.detached
                    and not cell.tasks
                    and cell.last_active <= idle_cutoff
                    and cell.send.statistics().current_buffer_used == 0
                ):
                    idle.append(cell)
            for cell in idle:
                self._detach(cell)

    def _kind_failed(self, runtime: _KindRuntime) -> None:
        self.tracer.record("kind_failed", runtime.spec.name, "")
        runtime.available = False
        runtime.retry_at = self.env.clock.monotonic() + _limits.recovery_backoff_seconds_min
        runtime.nursery = None
        runtime.failed.set()


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text[:200]


@asynccontextmanager
async def open_actor_system(env: Env, kinds: list[ActorKind], **options: Any) -> AsyncIterator[ActorSystem]:
    """Start an ``ActorSystem`` in a nursery of its own; on exit drain it and stop."""
    system = ActorSystem(env, kinds, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(system.run)
        try:
            yield system
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(_limits.turn_timeout_seconds):
                await system.drain()
            nursery.cancel_scope.cancel()


__all__ = [
    "ActorRef",
    "ActorSystem",
    "KindStatistics",
    "open_actor_system",
    "runtime_event_kinds",
    "runtime_planted_bugs",
]
