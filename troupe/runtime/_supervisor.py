"""Supervisors: restart what crashes, and give up upwards when restarts do not help.

A ``Supervisor`` runs a list of long-lived children (services, and one ``KindSupervisor`` per
actor kind) with one of OTP's strategies:

- ``one_for_one``: restart only the child that crashed;
- ``one_for_all``: stop every child and start them all again;
- ``rest_for_one``: stop the children started after the crashed one, restart it and them.

Restart intensity follows OTP: if more than ``restarts_max`` restarts happen within
``period_seconds`` the supervisor stops its children and raises ``SupervisorEscalated``, so its
parent sees it crash.  The root is different (``escalate=False``): it never lets an exception
reach the process; a child that exhausted its intensity is marked down, its
``on_unavailable`` hook tells the system to answer ``Unavailable``, and the root starts it again
after a backoff that doubles up to a bound, forever.

Every decision is a trace event (``child_crash``, ``restart``, ``escalate``, ``unavailable``,
``recover``), so the simulator's trace shows exactly what supervision did.

A child whose spec names a ``fault_point`` may be crashed on purpose by the simulator: while
the supervisor's fault points are armed, a companion task asks ``fires(point)`` every
``service_fault_check_seconds`` and, when it fires, cancels the child and reports
``InjectedFault`` as its crash (trace event ``fault``).  Production passes ``no_fault_points``
and starts no companion task.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from enum import Enum

import trio

from . import _limits
from ._fault_points import FaultPoints, InjectedFault, no_fault_points
from ._limits import RestartIntensity
from ._trace import Tracer

service_fault_check_seconds = 1.0
"""How often an armed supervisor asks whether a child with a ``fault_point`` crashes now."""


class Strategy(Enum):
    one_for_one = "one_for_one"
    one_for_all = "one_for_all"
    rest_for_one = "rest_for_one"


class SupervisorEscalated(Exception):
    """A supervisor exceeded its restart intensity; its parent decides what happens next."""

    def __init__(self, name: str, cause: BaseException | None) -> None:
        super().__init__(f"supervisor {name!r} exceeded its restart intensity")
        self.name = name
        self.cause = cause


@dataclass
class ChildSpec:
    """A supervised child: ``run`` must call ``task_status.started()`` once it is ready.

    ``on_unavailable(retry_after_seconds)`` and ``on_recovered()`` are called by a root
    supervisor when the child is given up on and when it is started again.
    """

    name: str
    run: Callable[..., Awaitable[None]]
    on_unavailable: Callable[[float], None] | None = None
    on_recovered: Callable[[], None] | None = None
    fault_point: str | None = None
    """The fault point (``fault_point_names``) that may crash this child in the simulator;
    ``ActorSystem`` gives services ``service_crashes`` unless they name their own."""


@dataclass
class _RunningChild:
    spec: ChildSpec
    generation: int
    scope: trio.CancelScope
    stopped: trio.Event = field(default_factory=trio.Event)
    injected: InjectedFault | None = None
    """Set when a fault point crashed the child: its cancellation is then a crash."""
    crasher: bool = False


class Supervisor:
    """Runs ``children`` under ``strategy`` with OTP restart intensity."""

    def __init__(
        self,
        name: str,
        children: list[ChildSpec],
        *,
        strategy: Strategy = Strategy.one_for_one,
        intensity: RestartIntensity | None = None,
        clock: Callable[[], float] = trio.current_time,
        tracer: Tracer | None = None,
        escalate: bool = True,
        fault_points: FaultPoints = no_fault_points,
        planted_bugs: Collection[str] = frozenset(),
    ) -> None:
        """``fault_points`` may crash children that name a ``fault_point``; an object with an
        ``armed`` property is asked at each child start (the ActorSystem's view of its Env).
        ``planted_bugs``: the simulator's deliberate bugs (empty in production)."""
        names = [child.name for child in children]
        assert len(names) == len(set(names)), "child names must be unique"
        self.name = name
        self.children = list(children)
        self.strategy = strategy
        self.intensity = intensity or RestartIntensity()
        self._clock = clock
        self._tracer = tracer or Tracer(enabled=False)
        self._escalate = escalate
        self._fault_points = fault_points
        self._planted_bugs = frozenset(planted_bugs)
        self._restart_times: deque[float] = deque()
        self._running: dict[str, _RunningChild] = {}
        self._generation = 0
        self.restarts = 0
        self.escalations = 0
        self.down: dict[str, float] = {}
        """Children the root gave up on, with the time they will be retried."""

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        send_exits, receive_exits = trio.open_memory_channel[tuple[str, int, BaseException | None]](
            len(self.children) * 2 + 8
        )
        self._escalation: SupervisorEscalated | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._exits = send_exits
            for spec in self.children:
                await self._start_child(spec)
            task_status.started()
            async for name, generation, error in receive_exits:
                running = self._running.get(name)
                if running is None or running.generation != generation:
                    continue  # an exit we caused on purpose, or a stale report
                await self._on_child_exit(running, error)
        # Raised here, outside the nursery, so the parent sees it bare, not in an ExceptionGroup.
        if self._escalation is not None:
            raise self._escalation

    async def _start_child(self, spec: ChildSpec) -> None:
        self._generation += 1
        running = _RunningChild(spec, self._generation, trio.CancelScope())
        self._running[spec.name] = running
        try:
            await self._launch(running)
        except Exception as error:  # failed before it was ready: same as a crash
            await self._on_child_exit(running, error)

    async def _launch(self, running: _RunningChild) -> None:
        await self._nursery.start(self._child_task, running)
        if self._fault_points_armed():
            self._start_crasher(running)

    def _fault_points_armed(self) -> bool:
        fault_points = self._fault_points
        return fault_points is not no_fault_points and getattr(fault_points, "armed", True)

    def arm_fault_points(self) -> None:
        """The fault points were armed after the children started: watch them from now."""
        if self._fault_points_armed():
            for running in list(self._running.values()):
                self._start_crasher(running)

    def _start_crasher(self, running: _RunningChild) -> None:
        if running.spec.fault_point is not None and not running.crasher and not running.stopped.is_set():
            running.crasher = True
            self._nursery.start_soon(self._crash_when_fired, running)

    async def _crash_when_fired(self, running: _RunningChild) -> None:
        point = running.spec.fault_point
        while True:
            await trio.sleep(service_fault_check_seconds)
            if running.stopped.is_set() or self._running.get(running.spec.name) is not running:
                return
            if self._fault_points.fires(point):
                self._tracer.record("fault", "supervisor", self.name, point=point, child=running.spec.name)
                running.injected = InjectedFault(f"{point}: {running.spec.name}")
                running.scope.cancel()
                return

    async def _child_task(self, running: _RunningChild, *, task_status=trio.TASK_STATUS_IGNORED):
        relay = _StartedRelay(task_status)
        error: BaseException | None = None
        try:
            with running.scope:
                await running.spec.run(task_status=relay)
        except BaseException as exception:
            cancelled, failures = _split_cancelled(exception)
            if cancelled is not None:
                if failures is not None:
                    # Failures met while being cancelled (say, storage refusing a write while the
                    # process stops) are not crashes to restart from: the child is stopping
                    # anyway.  Recorded, then only the cancellation goes on.
                    self._tracer.record("child_crash", "supervisor", self.name, child=running.spec.name,
                                        error=type(failures).__name__, stopping=True)
                raise cancelled from None
            if not relay.started_called or not isinstance(exception, Exception):
                raise  # nursery.start() reports it to _start_child
            error = exception
        finally:
            running.stopped.set()
        if running.injected is not None:
            error = running.injected
        elif running.scope.cancelled_caught:
            return  # we stopped it on purpose
        if error is None:
            error = RuntimeError(f"child {running.spec.name!r} returned")
        self._exits.send_nowait((running.spec.name, running.generation, error))

    async def _on_child_exit(self, running: _RunningChild, error: BaseException | None) -> None:
        spec = running.spec
        self._tracer.record("child_crash", "supervisor", self.name, child=spec.name, error=type(error).__name__)
        # PLANTED BUG (simulator tests only): leave the crashed child down, say nothing.
        if "no_service_restart" in self._planted_bugs:
            self._running.pop(spec.name, None)
            return
        if not self._within_intensity():
            self.escalations += 1
            if self._escalate:
                self._tracer.record("escalate", "supervisor", self.name, child=spec.name)
                await self._stop_children(self.children)
                self._escalation = SupervisorEscalated(self.name, error)
                self._nursery.cancel_scope.cancel()
                await trio.lowlevel.checkpoint()  # raises Cancelled: unwinds to run()
            self._restart_times.clear()
            self._nursery.start_soon(self._recover_later, spec)
            return
        await self._restart(spec)

    def _within_intensity(self) -> bool:
        return self.intensity.admits(self._restart_times, self._clock())

    async def _restart(self, spec: ChildSpec) -> None:
        index = self.children.index(spec)
        if self.strategy is Strategy.one_for_one:
            affected = [spec]
        elif self.strategy is Strategy.one_for_all:
            affected = list(self.children)
        else:
            affected = self.children[index:]
        await self._stop_children(affected)
        self.restarts += 1
        for child in affected:
            self._tracer.record("restart", "supervisor", self.name, child=child.name, strategy=self.strategy.value)
            await self._start_child(child)

    async def _stop_children(self, children: list[ChildSpec]) -> None:
        # Stop in reverse start order, as OTP does, and wait until each has really ended.
        for child in reversed(children):
            running = self._running.pop(child.name, None)
            if running is not None:
                running.scope.cancel()
                await running.stopped.wait()

    async def _recover_later(self, spec: ChildSpec) -> None:
        """Root only: mark ``spec`` down, then retry it with a doubling backoff, forever."""
        backoff = _limits.recovery_backoff_seconds_min
        while True:
            await self._stop_children([spec])
            self.down[spec.name] = self._clock() + backoff
            self._tracer.record("unavailable", "supervisor", self.name, child=spec.name, retry_after=backoff)
            if spec.on_unavailable is not None:
                spec.on_unavailable(backoff)
            await trio.sleep(backoff)
            self._generation += 1
            running = _RunningChild(spec, self._generation, trio.CancelScope())
            self._running[spec.name] = running
            try:
                await self._launch(running)
            except Exception:
                backoff = min(backoff * 2, _limits.recovery_backoff_seconds_max)
                continue
            del self.down[spec.name]
            self._tracer.record("recover", "supervisor", self.name, child=spec.name)
            if spec.on_recovered is not None:
                spec.on_recovered()
            return


class _StartedRelay:
    """Remembers whether the child reported ready, so a failure before that is a failed start."""

    def __init__(self, status) -> None:
        self._status = status
        self.started_called = False

    def started(self, value=None) -> None:
        self.started_called = True
        self._status.started(value)


def _split_cancelled(
    exception: BaseException,
) -> tuple[BaseException | None, BaseException | None]:
    """``(the cancellation in it, everything else)``, either part ``None`` when absent."""
    if isinstance(exception, trio.Cancelled):
        return exception, None
    if isinstance(exception, BaseExceptionGroup):
        return exception.split(trio.Cancelled)
    return None, exception
