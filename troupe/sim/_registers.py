"""A workload whose actors behave like real ones, so that runtime bugs become visible.

The bank (``_bank.py``) changes memory only after a commit and de-duplicates by key, so a dirty
instance or a second delivery cannot show.  Here each ``register`` actor keeps a per-key log of
client operation ids cached in memory, and does the sloppy-but-legal things real actors do:

- it updates memory *before* its commit (a crash discards the instance, so the runtime's
  discard is what keeps memory honest), and some messages deliberately crash before or after
  the commit (``fail_before_commit`` / ``fail_after_commit``: a bug in the actor's own code);
- appending is not idempotent per delivery: each send carries its own ``trace_id`` (the
  operation id plus the attempt number), the workload counts deliveries per send outside the
  actor system, and the durable log lets the checker count applications per operation
  (acknowledged: exactly once; failed: never; unknown: at most once);
- reads answer from memory, and every client operation goes into a ``History`` checked for
  linearizability against an independent sequential model (``LogModel``), not the actor's code;
- ``schedule`` persists a pending entry and a durable reminder in one transaction; the reminder
  completes it (its first firing sometimes crashes on purpose), so a lost reminder leaves a
  pending entry that the quiescence check sees;
- each append starts a short in-memory timer whose firing is recorded: twice, into an instance
  that did not start it, or never although the instance went on receiving later messages, is
  a violation;
- ``on_passivate`` does real asynchronous work (a storage write and a pause), and the workload
  records every instance's life (live from ``on_activate`` until ``on_passivate`` returns or
  the runtime discards it): two live instances of one key at once is a violation;
- a supervised service (``services(world)``) writes a heartbeat and crashes now and then; being
  down longer than the root supervisor's restart policy allows is a violation.

Every check is recorded outside the actor system (in this workload object, which outlives
process crashes) and names trace sequences where it can.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from troupe.runtime import (
    Actor,
    ActorCrashed,
    ActorError,
    ActorKind,
    ChildSpec,
    Overloaded,
    Unavailable,
    UnknownActorKind,
)
from troupe.runtime import _limits as runtime_limits
from troupe.storage import (
    StorageError,
    journal_append,
    journal_load,
    reminder_set,
    reminders_for,
    state_put,
)

from ._fault_points import fault_point_delay_seconds_max
from ._history import History, check_linearizable
from ._trace_queries import PoisonedReminders
from ._violation import Violation
from ._workload import World, register_workload

kind_name = "register"
registers_count = 3
"""Few keys, so that clients collide on them and passivation races have company."""
idle_seconds = 3.0
"""Instances passivate between bursts (and on request, see below).  Longer than a timer's
delay plus its lateness, so an idle passivation proves every timer had its chance to fire."""
ask_timeout_seconds = 10.0
client_pause_seconds_max = 0.05
retry_probability = 0.7
"""After a failed or unknown outcome, the client retries the same operation id this often
(otherwise it gives up on it for good)."""
crash_probability_range = (0.003, 0.05)
"""Per seed (swarm testing), the chance an append crashes on purpose before its commit, and
again after it, is drawn log-uniformly from this range, or is zero in a third of the seeds:
crashes make dirty instances and redeliveries visible, while long-lived instances (no
crashes) are what show a timer that never fires."""
crash_first_reminder_probability_max = 0.3
schedule_delay_seconds_max = 1.5
timer_delay_seconds = 0.05
timer_late_seconds_max = fault_point_delay_seconds_max["timer_late"] + 0.5
"""The most the simulator's ``timer_late`` fault point delays a timer, plus scheduling slack:
a timer due this long before a later message was sent must have been delivered first."""
passivate_after_read_probability_range = (0.005, 0.1)
"""Per seed, the share of reads that ask the actor to passivate afterwards (log-uniform), as an
actor finishing a unit of work would: passivation is then frequent and often followed at once
by another message."""
passivate_pause_seconds = 0.02
"""``on_passivate`` pauses this long after its write, as a flush of buffers would."""
ticker_name = "register-ticker"
ticker_period_seconds = 0.5
ticker_crash_probability = 0.05
"""Per tick: the ticker crashes on its own about every ten seconds."""
service_down_seconds_max = runtime_limits.recovery_backoff_seconds_min * 2**3 + 1.0
"""How long the ticker may stay down: the root restarts a crashed child at once, or, when its
intensity is exhausted, after a backoff that starts at ``recovery_backoff_seconds_min`` and
doubles only when a start fails (the ticker's start cannot fail by itself; this allows three
failed starts), plus a second of slack.  Never more than the backoff bound."""

assert service_down_seconds_max <= runtime_limits.recovery_backoff_seconds_max + 1.0
assert timer_delay_seconds + timer_late_seconds_max < idle_seconds


class ActorBug(Exception):
    """A deliberate crash in the actor's own code (not the runtime's, not storage's)."""


class ServiceFault(Exception):
    """The ticker service crashing on its own."""


@dataclass(frozen=True)
class Append:
    operation_id: str
    trace_id: str
    sent_at: float
    fail_before_commit: bool = False
    fail_after_commit: bool = False


@dataclass(frozen=True)
class Read:
    trace_id: str
    sent_at: float
    passivate_after: bool = False


@dataclass(frozen=True)
class Schedule:
    operation_id: str
    trace_id: str
    sent_at: float
    delay_seconds: float
    crash_first_reminder: bool = False


@dataclass(frozen=True)
class TimerFired:
    token: str


def log_digest(operation_ids: Any) -> tuple[int, int]:
    """A read's answer as the model sees it: the log's length and a chained hash (cheap to
    compare and to memoise on, unlike the whole log)."""
    chain = 0
    for identity in operation_ids:
        chain = _chained(chain, identity)
    return len(operation_ids), chain


def _chained(chain: int, identity: Any) -> int:
    # Not hash(): str hashes change with PYTHONHASHSEED, and reads land in the trace.
    digest = hashlib.blake2b(f"{chain}:{identity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class LogModel:
    """The sequential specification of one register, written apart from the actor: an
    append-only log of operation ids.  ``append`` answers the position it took, ``read`` the
    log (as ``log_digest``), ``schedule`` only that it was accepted."""

    initial = (0, 0)
    read_only = frozenset({"read"})

    def step(self, state: tuple[int, int], name: str, argument: Any) -> tuple[Any, Any]:
        length, chain = state
        if name == "append":
            return (length + 1, _chained(chain, argument)), length + 1
        if name == "read":
            return state, state
        return state, "scheduled"


@dataclass(eq=False)
class _Instance:
    """One actor instance's life, as the workload saw it."""

    number: int
    key: str
    generation: int
    context: Any
    sequence: int
    state: str = "active"  # active -> passivating -> gone, or active -> crashed
    passivate_sequence: int = 0
    timers: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Token -> (due monotonic time, timer drops the runtime had traced when it was started)."""
    reported: bool = False
    turn_ended: float = 0.0
    """Monotonic end of the instance's latest turn (or of its activation)."""


@dataclass
class _Durable:
    """One key's durable log, decoded by the checker (not by the actor's code)."""

    appends: list[str] = field(default_factory=list)
    scheduled: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    reminder_names: set[str] = field(default_factory=set)


class Register(Actor):
    def __init__(self, context: Any, workload: RegistersWorkload) -> None:
        super().__init__(context)
        self.workload = workload

    async def on_activate(self) -> None:
        self.instance = self.workload._activated(self.context)
        key = self.context.key
        try:
            loaded = await self.context.storage.read(lambda connection: journal_load(connection, kind_name, key))
        except BaseException:
            self.instance.state = "crashed"
            raise
        self.log: list[str] = []
        self.positions: dict[str, int] = {}
        self.pending: set[str] = set()
        self.scheduled: set[str] = set()
        for _, record in loaded.records:
            if record["type"] == "append":
                self.log.append(record["op"])
                self.positions[record["op"]] = len(self.log)
            elif record["type"] == "schedule":
                self.scheduled.add(record["op"])
                self.pending.add(record["op"])
            else:
                self.pending.discard(record["op"])
        self.instance.turn_ended = self.context.env.clock.monotonic()

    async def receive(self, message: Any) -> Any:
        self.workload._turn(self.instance, message)
        try:
            if isinstance(message, Append):
                return await self._append(message)
            if isinstance(message, Read):
                if message.passivate_after:
                    self.context.passivate()
                return list(self.log)
            if isinstance(message, Schedule):
                return await self._schedule(message)
            if isinstance(message, TimerFired):
                self.workload._timer_fired(self.instance, message.token)
                return None
            raise AssertionError(f"unexpected message {message!r}")
        except BaseException:
            self.instance.state = "crashed"
            raise
        finally:
            self.instance.turn_ended = self.context.env.clock.monotonic()

    async def _append(self, message: Append) -> int:
        position = self.positions.get(message.operation_id)
        if position is not None:
            return position  # a retry of an operation already applied
        # Memory first, then the commit: legal only because a crash discards this instance.
        self.log.append(message.operation_id)
        position = self.positions[message.operation_id] = len(self.log)
        if message.fail_before_commit:
            raise ActorBug("crashed before its commit")
        record = {"type": "append", "op": message.operation_id, "delivery": message.trace_id}
        key = self.context.key
        await self.context.storage.write(lambda connection: journal_append(connection, kind_name, key, [record]))
        self.workload._timer_started(self.instance, message.trace_id)
        self.context.start_timer(f"settle-{message.trace_id}", timer_delay_seconds, TimerFired(message.trace_id))
        if message.fail_after_commit:
            raise ActorBug("crashed after its commit")
        return position

    async def _schedule(self, message: Schedule) -> str:
        identity = message.operation_id
        if identity in self.scheduled:
            return "scheduled"
        self.scheduled.add(identity)
        self.pending.add(identity)
        key = self.context.key
        name = f"complete-{identity}"
        due = self.context.env.clock.wall() + message.delay_seconds
        record = {"type": "schedule", "op": identity, "delivery": message.trace_id}
        payload = {"op": identity, "crash_first": message.crash_first_reminder}

        def write(connection) -> None:
            journal_append(connection, kind_name, key, [record])
            reminder_set(connection, kind_name, key, name, due, payload)

        await self.context.storage.write(write)
        self.context.reminder_armed(name, due)
        return "scheduled"

    async def on_reminder(self, name: str, payload: Any) -> None:
        self.workload._turn(self.instance, None)
        try:
            identity = payload["op"]
            attempts = self.workload._reminder_attempt(identity)
            if payload["crash_first"] and attempts == 1:
                raise ActorBug("reminder turn crashed on its first firing")
            if identity not in self.pending:
                return  # fired again after its completion committed: at least once, applied once
            self.pending.discard(identity)
            key = self.context.key
            record = {"type": "done", "op": identity}
            await self.context.storage.write(lambda connection: journal_append(connection, kind_name, key, [record]))
        except BaseException:
            self.instance.state = "crashed"
            raise
        finally:
            self.instance.turn_ended = self.context.env.clock.monotonic()

    async def on_passivate(self) -> None:
        self.workload._passivating(self.instance)
        try:
            key = self.context.key
            number = self.instance.number
            await self.context.storage.write(
                lambda connection: state_put(connection, "register-passivation", key, number)
            )
            await trio.sleep(passivate_pause_seconds)
        finally:
            self.workload._passivated(self.instance)


class RegistersWorkload:
    """Clients append, read and schedule on a few registers, retrying with the same ids."""

    name = "registers"

    def __init__(self) -> None:
        self.keys = [f"reg-{index}" for index in range(registers_count)]
        self.history: History | None = None
        self.violations: list[Violation] = []
        self.counter = 0
        self.retries: dict[int, tuple[str, str, str, Any] | None] = {}
        self.deliveries: Counter[str] = Counter()
        self.delivery_sequences: dict[str, int] = {}
        self.reminder_attempts: Counter[str] = Counter()
        self.instances: dict[str, list[_Instance]] = {}
        self.instance_count = 0
        self.timers_fired: set[str] = set()
        self.timer_owners: dict[str, _Instance] = {}
        self.world: World | None = None
        self.last_seen: dict[int, float] = {}
        """Per process generation: the last moment the workload saw it running."""
        self.service_generation = 0
        self.service_down_since: float | None = None
        self.service_down_sequence = 0
        self.service_attempt_since: float | None = None
        self.undecided_keys = 0
        self.crash_probability = 0.0
        self.crash_first_reminder_probability = 0.0
        self.passivate_after_read_probability = 0.0

    # -- plug-in interface --------------------------------------------------------------

    def actor_kinds(self, world: World) -> list[ActorKind]:
        self._bind(world)
        return [ActorKind(kind_name, partial(Register, workload=self), idle_seconds=idle_seconds)]

    def migrations(self) -> list[Any]:
        return []

    def services(self, world: World) -> list[ChildSpec]:
        """Long-lived children for ``ActorSystem(services=...)``."""
        self._bind(world)
        return [ChildSpec(ticker_name, partial(self._ticker, world))]

    def _bind(self, world: World) -> None:
        if self.history is None:
            self.history = History(world.tracer)
            self._choose_rates(world.random)
        self.world = world

    def _choose_rates(self, random: Any) -> None:
        """This seed's own mix (swarm testing), drawn once from the workload's seeded stream."""

        def log_uniform(low: float, high: float) -> float:
            return math.exp(math.log(low) + random.random() * (math.log(high) - math.log(low)))

        crashing = random.random() >= 1 / 3
        self.crash_probability = log_uniform(*crash_probability_range) if crashing else 0.0
        self.crash_first_reminder_probability = random.random() * crash_first_reminder_probability_max if crashing else 0.0
        self.passivate_after_read_probability = log_uniform(*passivate_after_read_probability_range)

    async def client_step(self, world: World, client: int) -> None:
        self._bind(world)
        clock = world.env.clock
        self._seen(world)
        self._check_service(world, clock.monotonic())
        random = world.random
        retry = self.retries.get(client)
        self.retries[client] = None
        first_attempt = retry is None or random.random() >= retry_probability
        if first_attempt:
            self.counter += 1
            identity = f"r{client}-{self.counter}"
            key = self.keys[random.randrange(0, len(self.keys))]
            draw = random.random()
            name = "append" if draw < 0.45 else "read" if draw < 0.8 else "schedule"
            argument = identity if name == "append" else None
        else:
            name, key, identity, argument = retry
        attempt = self.history.invoke(client, key, name, argument, operation_id=identity)
        trace_id = f"{identity}.{len(attempt.operation.attempts)}"
        now = clock.monotonic()
        if name == "append":
            draw = random.random() if first_attempt else 1.0
            message = Append(identity, trace_id, now,
                             fail_before_commit=draw < self.crash_probability,
                             fail_after_commit=1 - draw < self.crash_probability)
        elif name == "read":
            message = Read(trace_id, now, passivate_after=random.random() < self.passivate_after_read_probability)
        else:
            message = Schedule(identity, trace_id, now, random.random() * schedule_delay_seconds_max,
                               crash_first_reminder=random.random() < self.crash_first_reminder_probability)
        outcome, value = await self._ask(world, key, message)
        if name == "read" and outcome == "ok":
            value = log_digest(value)
        self.history.complete(attempt, outcome, value)
        if outcome != "ok" and name != "read":
            self.retries[client] = (name, key, identity, argument)
        self._seen(world)
        await trio.sleep(random.random() * client_pause_seconds_max)

    async def _ask(self, world: World, key: str, message: Any) -> tuple[str, Any]:
        try:
            value = await world.system.ref(kind_name, key).ask(message, timeout=ask_timeout_seconds)
        except (Overloaded, Unavailable, UnknownActorKind):
            # Refused before it was queued (or queued in a cell that stopped before serving it).
            return "fail", None
        except ActorCrashed:
            # The turn may have committed before it crashed, unless it crashed on purpose first.
            certain = isinstance(message, Append) and message.fail_before_commit
            return ("fail" if certain else "unknown"), None
        except (ActorError, StorageError):
            return "unknown", None  # a timeout: the turn may still run and commit
        return "ok", value

    async def after_restart(self, world: World) -> list[Violation]:
        self._bind(world)
        self._check_service(world, world.env.clock.monotonic())
        durable = await self._durable(world)
        self._resolve(durable)
        return self._take() + self._durable_violations(durable, world, final=False)

    async def at_quiescence(self, world: World) -> list[Violation]:
        self._bind(world)
        self._check_service(world, world.env.clock.monotonic())
        for key in self.keys:
            attempt = self.history.invoke("checker", key, "read", None)
            outcome, value = await self._ask(world, key, Read(f"check-{key}-{world.generation}", 0.0))
            self.history.complete(attempt, outcome, log_digest(value) if outcome == "ok" else None)
        durable = await self._durable(world)
        self._resolve(durable)
        violations = self._take() + self._durable_violations(durable, world, final=True)
        for key in self.keys:
            operation = self.history.operations(key)[-1]
            if operation.status == "ok" and operation.value != log_digest(durable[key].appends):
                violations.append(Violation(
                    f"register memory differs from storage: {key} answers {operation.value[0]} "
                    f"operations, its journal holds {len(durable[key].appends)}",
                    operation.sequences, ((kind_name, key),), "registers",
                ))
        violations += check_linearizable(self.history, LogModel(), checker="registers", kind=kind_name)
        self.undecided_keys = len(self.history.undecided_keys)
        return violations

    # -- what the actors report (outside the actor system) ------------------------------

    def _activated(self, context: Any) -> _Instance:
        world = self.world
        self.instance_count += 1
        sequence = world.tracer.record("workload_instance", kind_name, context.key, phase="live", instance=self.instance_count)
        instance = _Instance(self.instance_count, context.key, world.generation, context, sequence)
        lives = [other for other in self.instances.get(context.key, ())
                 if other.generation == world.generation and other.state in ("active", "passivating")]
        for other in lives:
            discarded = getattr(other.context, "discarded", None)
            if other.state == "passivating" or discarded is False:
                phase = "still passivating" if other.state == "passivating" else "still live"
                self.violations.append(Violation(
                    f"two live instances: {context.key} activated while an earlier instance was {phase}",
                    tuple(number for number in (other.sequence, other.passivate_sequence, sequence) if number),
                    ((kind_name, context.key),), "single-activation",
                ))
        self.instances[context.key] = [*lives, instance]
        return instance

    def _turn(self, instance: _Instance, message: Any) -> None:
        if instance.state != "active" and not instance.reported:
            instance.reported = True
            what = "whose turn crashed (the runtime kept a dirty instance)" if instance.state == "crashed" else f"that was {instance.state}"
            self.violations.append(Violation(
                f"turn ran on an instance {what}: {instance.key}",
                (instance.sequence,), ((kind_name, instance.key),), "single-activation",
            ))
        trace_id = getattr(message, "trace_id", None)
        if trace_id is not None:
            self.deliveries[trace_id] += 1
            if self.deliveries[trace_id] == 2:
                self.violations.append(Violation(
                    f"message delivered twice: {trace_id} to {instance.key}",
                    (self._attempt_sequence(trace_id),), ((kind_name, instance.key),), "delivery",
                ))
        sent_at = getattr(message, "sent_at", None)
        if sent_at:
            self._check_timers(instance, sent_at)

    def _attempt_sequence(self, trace_id: str) -> int:
        identity, _, number = trace_id.rpartition(".")
        operation = self.history.get(identity)
        if operation is None or not number.isdigit() or int(number) > len(operation.attempts):
            return 0
        return operation.attempts[int(number) - 1].sequence

    def _timer_started(self, instance: _Instance, token: str) -> None:
        now = self.world.env.clock.monotonic()
        instance.timers[token] = (now + timer_delay_seconds, self.world.tracer.counts.get("timer_dropped", 0))
        self.timer_owners[token] = instance

    def _timer_fired(self, instance: _Instance, token: str) -> None:
        # A timer's message may reach a later instance of the same cell: it was queued before
        # the instance that started it crashed.  Only a second firing is wrong.
        if token in self.timers_fired:
            self.violations.append(Violation(
                f"timer fired twice: {token} on {instance.key}", (self._attempt_sequence(token),),
                ((kind_name, instance.key),), "timers",
            ))
            return
        self.timers_fired.add(token)
        owner = self.timer_owners.pop(token, None)
        if owner is not None:
            owner.timers.pop(token, None)

    def _check_timers(self, instance: _Instance, sent_at: float) -> None:
        # A message sent well after a timer was due reached this instance's mailbox, so the
        # mailbox was open when the timer fired: its message was queued first (FIFO).
        # ``sent_at`` may also be a moment the mailbox is known to have been open.
        drops = self.world.tracer.counts.get("timer_dropped", 0)
        for token, (due, drops_then) in list(instance.timers.items()):
            if sent_at > due + timer_late_seconds_max and drops == drops_then:
                del instance.timers[token]
                self.timer_owners.pop(token, None)
                self.violations.append(Violation(
                    f"timer never fired: {token} on {instance.key}, due {sent_at - due:.1f}s before a later message",
                    (self._attempt_sequence(token),), ((kind_name, instance.key),), "timers",
                ))

    def _reminder_attempt(self, identity: str) -> int:
        self.reminder_attempts[identity] += 1
        return self.reminder_attempts[identity]

    def _passivating(self, instance: _Instance) -> None:
        now = self.world.env.clock.monotonic()
        if now > instance.turn_ended:
            # No turn ran at this moment, so the mailbox closed empty and passivation began at
            # once: it was open until now, and a timer due long enough ago was delivered.
            self._check_timers(instance, now)
        instance.state = "passivating"
        instance.passivate_sequence = self.world.tracer.record(
            "workload_instance", kind_name, instance.key, phase="passivating", instance=instance.number
        )

    def _passivated(self, instance: _Instance) -> None:
        instance.state = "gone"

    # -- the supervised service ---------------------------------------------------------

    async def _ticker(self, world: World, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._service_up(world)
        task_status.started()
        try:
            beats = 0
            while True:
                await trio.sleep(ticker_period_seconds)
                self._seen(world)
                if world.random.random() < ticker_crash_probability:
                    raise ServiceFault("the ticker crashed on its own")
                beats += 1
                await world.engine.write(partial(_write_beats, beats=beats))
        finally:
            self._service_down(world)

    def _service_up(self, world: World) -> None:
        now = world.env.clock.monotonic()
        self._check_service(world, now)
        self.service_generation = world.generation
        self.service_down_since = None

    def _service_down(self, world: World) -> None:
        self.service_generation = world.generation
        self.service_down_since = world.env.clock.monotonic()
        self.service_down_sequence = world.tracer.record("workload_service_down", "workload", ticker_name)

    def _seen(self, world: World) -> None:
        self.last_seen[world.generation] = world.env.clock.monotonic()

    def _check_service(self, world: World, now: float) -> None:
        """The ticker may be down only as long as the restart policy allows, while its process
        runs (a process crash takes it down with everything else)."""
        if self.service_down_since is None:
            return
        if self.service_generation != world.generation:
            now = self.last_seen.get(self.service_generation, self.service_down_since)
        down = now - self.service_down_since
        if down > service_down_seconds_max:
            self.violations.append(Violation(
                f"service down too long: {ticker_name} down {down:.1f}s (restart policy allows {service_down_seconds_max:.1f}s)",
                (self.service_down_sequence,), (), "services",
            ))
            self.service_down_since = None  # reported once per outage

    # -- durable state, decoded by the checker -----------------------------------------

    async def _durable(self, world: World) -> dict[str, _Durable]:
        def load(connection):
            return {key: (journal_load(connection, kind_name, key), reminders_for(connection, kind_name, key))
                    for key in self.keys}

        loaded = await world.engine.read(load)
        durable = {}
        for key, (journal, reminders) in loaded.items():
            assert journal.snapshot is None, "registers never snapshot"
            state = _Durable(reminder_names={row.name for row in reminders})
            for _, record in journal.records:
                {"append": state.appends, "schedule": state.scheduled, "done": state.done}[record["type"]].append(record["op"])
            durable[key] = state
        return durable

    def _resolve(self, durable: dict[str, _Durable]) -> None:
        """Settle operations whose outcome was unknown by what storage holds now."""
        for operation in self.history.unsettled():
            state = durable[operation.key]
            if operation.name == "append":
                applied = operation.identity in state.appends
                position = state.appends.index(operation.identity) + 1 if applied else None
                self.history.resolve(operation, applied, position)
            elif operation.name == "schedule":
                self.history.resolve(operation, operation.identity in state.scheduled, "scheduled")

    def _durable_violations(self, durable: dict[str, _Durable], world: World, *, final: bool) -> list[Violation]:
        violations = []
        poisoned: set[tuple[str, str]] | None = None
        for key, state in durable.items():
            actors = ((kind_name, key),)
            for identity, count in sorted(Counter(state.appends).items()):
                if count > 1:
                    violations.append(self._about(identity, f"effect applied twice: {identity} is {count} times in {key}'s log", actors))
            for identity, count in sorted(Counter(state.done).items()):
                if count > 1:
                    violations.append(self._about(identity, f"reminder completed twice: {identity} on {key}", actors))
            for operation in self.history.operations(key):
                violations += self._operation_violations(operation, state, actors)
            done = set(state.done)
            for identity in state.scheduled:
                if identity in done:
                    continue
                name = f"complete-{identity}"
                if name in state.reminder_names and not final:
                    continue
                if poisoned is None:
                    poisoned = PoisonedReminders(world.tracer).of_kind(kind_name)
                if (key, name) in poisoned:
                    continue  # crashed twice: the runtime drops it, as documented
                what = "its reminder is gone" if name not in state.reminder_names else "its reminder never completed it"
                violations.append(self._about(identity, f"scheduled operation never completed: {identity} on {key}, {what}", actors))
        return violations

    def _operation_violations(self, operation: Any, state: _Durable, actors: Any) -> list[Violation]:
        identity = operation.identity
        status = operation.status
        if operation.name == "append":
            present = identity in state.appends
            if status == "ok" and not present:
                return [self._about(identity, f"acknowledged write lost: {identity} on {operation.key}", actors)]
            if status == "ok" and operation.first_ok() is not None and state.appends.index(identity) + 1 != operation.value:
                return [self._about(identity, f"acknowledged result changed: {identity} on {operation.key}", actors)]
            if status == "fail" and present:
                return [self._about(identity, f"failed write applied: {identity} on {operation.key}", actors)]
        elif operation.name == "schedule" and status == "ok" and identity not in state.scheduled:
            return [self._about(identity, f"acknowledged schedule lost: {identity} on {operation.key}", actors)]
        return []

    def _about(self, identity: str, text: str, actors: Any) -> Violation:
        operation = self.history.get(identity)
        sequences = operation.sequences if operation is not None else ()
        return Violation(text, sequences, actors, "registers")

    def _take(self) -> list[Violation]:
        violations, self.violations = self.violations, []
        return violations


def _write_beats(connection: Any, beats: int) -> None:
    state_put(connection, ticker_name, "beats", beats)


register_workload("registers", RegistersWorkload)
