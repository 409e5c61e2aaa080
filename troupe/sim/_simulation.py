"""One simulated run: the real runtime and storage under a seeded Env, with faults.

The run is a sequence of *generations* (process lifetimes).  Each generation opens the storage
engine on the same directory, starts the actor system and the workloads' clients, and ends
either in a crash (the injector cancels everything at a random simulated moment and abandons
storage, as a dying process would) or, when the step budget is spent, in a quiet shutdown.
After every crash the next generation first checks the workloads' recovery invariants.

Determinism: a single ``trio.run`` with ``MockClock(autojump_threshold=0)`` and trio's private
deterministic-scheduling switch seeded from the seed; storage runs inline; every random choice
comes from seeded generators; the trace holds no text that depends on the machine.  The same
seed and code therefore give the same ``trace_sha256`` in any process.
"""

from __future__ import annotations

import os
import random as random_module
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import trio
import trio.testing

from troupe.runtime import ActorSystem, RestartIntensity, Tracer, no_fault_points, read_trace
from troupe.runtime import _limits as runtime_limits
from troupe.storage import Engine, FaultPlan, FaultyVFS, StorageError

from ._devices import multi_device, simulate_devices
from ._server import SimServer
from ._sim_env import sim_env
from ._swarm import (
    choose_fault_settings,
    clock_jump_seconds_max,
    crash_io_operations_mean,
    graceful_restart_share,
)
from ._violation import Violation, as_violation
from ._workload import World, make_workloads

fault_names = ("crash", "power_loss", "io", "disk_full", "clock", "runtime")
"""Kinds of fault a run may inject: process crashes (anywhere, including inside a commit),
power losses (un-synced writes dropped, kept in part or torn), I/O errors, disk full, wall
clock jumps, and the runtime's own fault points (``troupe.runtime.fault_point_names``)."""
clients_count = 4
quiescence_seconds = 120.0
live_actors_max = 5
"""Small on purpose: LRU eviction and re-activation happen all the time under the workload."""
generations_max = 1000
"""A run that needs more restarts than this is stuck, not unlucky."""
trace_moments_per_second = 1_000_000
"""The trace's time resolution: ``Tracer.record`` rounds each moment to whole microseconds."""


@dataclass(frozen=True)
class SimulationConfig:
    """One run.  ``faults`` are the kinds allowed; with ``swarm`` (the default) each seed
    arms its own subset of them at its own rates (swarm testing), without it every allowed
    kind is armed at the default rates."""

    seed: int
    steps: int = 2000
    faults: frozenset[str] = frozenset(fault_names)
    workloads: tuple[str, ...] = ()
    planted_bugs: frozenset[str] = frozenset()
    trace_path: str | None = None
    swarm: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(fault_names)
        assert not unknown, f"unknown faults {sorted(unknown)}"
        assert self.steps >= 0


@dataclass
class SimulationResult:
    """What one run did.  Process-level and actor-level counters are named apart:
    ``process_crashes`` counts simulated process deaths (of which ``power_losses`` also lost
    un-synced disk data) and ``process_lifetimes`` the generations; ``actor_crashes`` counts
    failed turns and ``actor_restarts`` the runtime's restarts of an actor after one."""

    seed: int
    steps: int
    process_crashes: int = 0
    power_losses: int = 0
    process_lifetimes: int = 0
    actor_crashes: int = 0
    actor_restarts: int = 0
    faults_injected: int = 0
    io_errors: int = 0
    disk_full: int = 0
    clock_jumps: int = 0
    runtime_faults: dict[str, int] = field(default_factory=dict)
    faults_armed: list[str] = field(default_factory=list)
    event_counts: dict[str, int] = field(default_factory=dict)
    undecided_keys: int = 0
    """Keys whose history the linearizability checker gave up on (too many configurations):
    checked for nothing, never reported as a violation."""
    violations: list[Violation] = field(default_factory=list)
    trace_sha256: str = ""
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "steps": self.steps,
            "violations": len(self.violations),
            "distinct_violations": len({violation.signature for violation in self.violations}),
            "process_crashes": self.process_crashes,
            "power_losses": self.power_losses,
            "process_lifetimes": self.process_lifetimes,
            "actor_crashes": self.actor_crashes,
            "actor_restarts": self.actor_restarts,
            "faults_injected": self.faults_injected,
            "io_errors": self.io_errors,
            "disk_full": self.disk_full,
            "clock_jumps": self.clock_jumps,
            "runtime_faults": dict(sorted(self.runtime_faults.items())),
            "faults_armed": sorted(self.faults_armed),
            "event_counts": dict(sorted(self.event_counts.items())),
            "undecided_keys": self.undecided_keys,
            "trace_sha256": self.trace_sha256,
            "simulated_seconds": round(self.simulated_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
        }


def run_simulation(config: SimulationConfig) -> SimulationResult:
    """Run one seed to completion in this process (blocking)."""
    started = time.perf_counter()
    data_dir = tempfile.mkdtemp(prefix=f"troupe-sim-{config.seed}-", dir=_scratch_dir())
    sink: BinaryIO | None = open(config.trace_path, "wb") if config.trace_path else None
    _seed_scheduler(config.seed)
    try:
        clock = trio.testing.MockClock(autojump_threshold=0)
        result = trio.run(_simulate, config, data_dir, sink, clock=clock)
    finally:
        _unseed_scheduler()
        if sink is not None:
            sink.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    result.wall_seconds = time.perf_counter() - started
    return result


def _scratch_dir() -> str | None:
    # Storage in the simulator is real SQLite files; memory-backed ones keep sweeps fast.
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _seed_scheduler(seed: int) -> None:
    # Private trio hooks (trio pinned in pyproject; tests/sim prove determinism across processes).
    trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING = True
    trio._core._run._r.seed(seed)


def _unseed_scheduler() -> None:
    trio._core._run._r.seed()


async def _simulate(config: SimulationConfig, data_dir: str, sink: BinaryIO | None) -> SimulationResult:
    result = SimulationResult(seed=config.seed, steps=config.steps)
    decisions = random_module.Random(config.seed)
    settings = choose_fault_settings(
        config.faults, config.swarm, decisions, random_module.Random(config.seed * 6151 + 3)
    )
    result.faults_armed = sorted(settings.armed)
    fault_plan = FaultPlan(
        random=random_module.Random(config.seed * 7919 + 1),
        io_error_probability=settings.io_error_probability if "io" in settings.armed else 0.0,
        disk_full_probability=settings.disk_full_probability if "disk_full" in settings.armed else 0.0,
        read_faults="io" in settings.armed and settings.read_faults,
        enabled=False,
    )
    vfs_name = f"troupe-sim-{config.seed}-{os.getpid()}"
    vfs = FaultyVFS(vfs_name, fault_plan)
    env = sim_env(config.seed, data_dir, vfs_name=vfs_name)
    env.planted_bugs = config.planted_bugs
    tracer = Tracer(time_source=trio.current_time, keep_in_memory=True, sink=sink)
    fault_plan.observer = lambda fault, operation: tracer.record("fault", "storage", "", point=fault,
                                                                 operation=operation)
    fault_points = None
    if settings.fault_point_rates:
        from ._fault_points import SeededFaultPoints

        fault_points = SeededFaultPoints(random_module.Random(config.seed * 4099 + 5), settings.fault_point_rates)
    world = World(env=env, random=env.random, tracer=tracer, planted_bugs=config.planted_bugs)
    workloads = make_workloads(list(config.workloads) or None)
    server = SimServer()
    migrations = [*server.migrations(), *(migration for workload in workloads for migration in workload.migrations())]
    lifetime = _Lifetime(server, config, settings, world, workloads, migrations, fault_plan, vfs, fault_points,
                         decisions, result)
    devices_run = None
    try:
        if multi_device(workloads):
            # Several devices (``_devices``): a run of its own; single-server runs are unchanged.
            devices_run = await simulate_devices(config, data_dir, sink, workloads, result, settings, tracer,
                                                 fault_points, decisions)
        while devices_run is None:
            world.generation += 1
            result.process_lifetimes += 1
            if world.generation > generations_max:
                result.violations.append(Violation("simulation stuck in a restart loop", checker="simulator"))
                break
            if world.generation > 1:
                tracer.record("sim_restart", "sim", "", generation=world.generation)
            if await lifetime.run():
                break
    except Exception as error:
        # Something escaped the server and the checkers (a surface or a checker itself): that
        # is a finding like any violation, and the sweep must go on to the next seed.
        sequence = tracer.record("sim_aborted", "sim", "", error=type(error).__name__)
        result.violations.append(Violation(f"simulation aborted: {_describe_error(error)}", (sequence,),
                                           checker="simulator"))
    finally:
        vfs.unregister()
    for violation in _check_restart_intensity(tracer):
        result.violations.append(as_violation(violation, "restart_intensity"))
    result.io_errors = fault_plan.io_errors_injected
    result.disk_full = fault_plan.disk_full_injected
    result.clock_jumps = env.clock.jumps
    if devices_run is not None:
        result.io_errors, result.disk_full = devices_run.io_errors, devices_run.disk_full
        result.clock_jumps = devices_run.clock_jumps
    result.runtime_faults = dict(fault_points.injected) if fault_points is not None else {}
    result.faults_injected = (result.process_crashes + result.io_errors + result.disk_full
                              + result.clock_jumps + sum(result.runtime_faults.values()))
    result.event_counts = dict(tracer.counts)
    result.undecided_keys = sum(getattr(workload, "undecided_keys", 0) for workload in workloads)
    result.actor_crashes = tracer.counts.get("crash", 0)
    result.actor_restarts = tracer.counts.get("restart", 0)
    result.trace_sha256 = tracer.sha256()
    result.simulated_seconds = trio.current_time()
    return result


class _Lifetime:
    """Runs process lifetimes (generations) one after another on the same data directory."""

    def __init__(self, server, config, settings, world, workloads, migrations, fault_plan, vfs, fault_points,
                 decisions, result) -> None:
        self.server = server
        self.config = config
        self.settings = settings
        self.world = world
        self.workloads = workloads
        self.migrations = migrations
        self.fault_plan = fault_plan
        self.vfs = vfs
        self.fault_points = fault_points
        self.decisions = decisions
        self.result = result
        self.steps_left = [config.steps]
        self.power_loss_pending = False

    def _record_violations(self, violations, label: str) -> None:
        for violation in violations:
            item = as_violation(violation)
            self.result.violations.append(replace(item, text=f"[{label}] {item.text}"))

    async def run(self) -> bool:
        """One process lifetime.  Returns True when the run ended quietly, False after a crash
        or a clean restart (another lifetime follows)."""
        world, settings, fault_plan = self.world, self.settings, self.fault_plan
        env = world.env
        if self.power_loss_pending:
            self.power_loss_pending = False
            lost = self.vfs.power_loss(self.decisions)
            self.result.power_losses += 1
            world.tracer.record("sim_power_loss", "sim", "", **lost)
        fault_plan.revive()
        # The runtime's fault points stay quiet while the process starts and recovers.
        env.fault_points = no_fault_points
        with trio.CancelScope() as lifetime_scope:
            async with trio.open_nursery() as nursery:
                engine = await Engine.open(env, migrations=self.migrations, nursery=nursery, readers_max=1,
                                           tracer=world.tracer)
                world.engine = engine
                kinds = [*self.server.kinds(), *(kind for workload in self.workloads for kind in workload.actor_kinds(world))]
                services = [*self.server.services(),
                            *(service for workload in self.workloads for service in _services(workload, world))]
                system = ActorSystem(
                    env,
                    kinds,
                    storage=engine,
                    tracer=world.tracer,
                    live_actors_max=live_actors_max,
                    root_intensity=RestartIntensity(runtime_limits.restarts_max, runtime_limits.period_seconds),
                    services=services,
                    transient_errors=(StorageError,),
                )
                world.system = system
                await nursery.start(system.run)
                world.apps = await self.server.start(world, engine, system, nursery)
                if world.generation > 1:
                    for workload in self.workloads:
                        self._record_violations(await workload.after_restart(world), f"generation {world.generation}")
                fault_plan.enabled = bool({"io", "disk_full"} & settings.armed)
                if self.fault_points is not None:
                    env.fault_points = self.fault_points

                def crash(where: str) -> None:
                    if lifetime_scope.cancel_called:
                        return
                    power_loss = self.decisions.random() < settings.power_loss_share
                    world.tracer.record("sim_crash", "sim", "", generation=world.generation, where=where,
                                        power_loss=power_loss)
                    self.result.process_crashes += 1
                    self.power_loss_pending = power_loss
                    fault_plan.enabled = False
                    env.fault_points = no_fault_points
                    engine.crash()
                    lifetime_scope.cancel()

                restart = trio.Event()
                async with trio.open_nursery() as injectors:
                    if settings.crashes:
                        injectors.start_soon(self._crash_injector, crash, restart)
                    if "clock" in settings.armed:
                        injectors.start_soon(self._clock_jumper, env)
                    async with trio.open_nursery() as clients:
                        for client in range(clients_count):
                            clients.start_soon(self._client, client, restart)
                    injectors.cancel_scope.cancel()
                env.fault_points = no_fault_points
                fault_plan.enabled = False
                fault_plan.revive()  # disarms a crash armed at an I/O count that never came
                if restart.is_set():
                    # A clean shutdown and restart: drain, close, come back.
                    world.tracer.record("sim_clean_restart", "sim", "", generation=world.generation)
                    await self.server.stop()
                    await system.drain()
                    await engine.aclose()
                    nursery.cancel_scope.cancel()
                    return False
                # The step budget is spent: let the system settle, check, shut down.
                await trio.sleep(quiescence_seconds)
                for workload in self.workloads:
                    self._record_violations(await workload.at_quiescence(world), "quiescence")
                await self.server.stop()
                await system.drain()
                await engine.aclose()
                nursery.cancel_scope.cancel()
                return True
        return False

    async def _client(self, client: int, restart: trio.Event) -> None:
        world, workloads, steps_left = self.world, self.workloads, self.steps_left
        while steps_left[0] > 0 and not restart.is_set():
            steps_left[0] -= 1
            workload = workloads[world.random.randrange(0, len(workloads))]
            await workload.client_step(world, client)

    async def _crash_injector(self, crash, restart: trio.Event) -> None:
        settings, decisions = self.settings, self.decisions
        await trio.sleep(decisions.expovariate(1 / settings.crash_interval_seconds))
        if decisions.random() < graceful_restart_share:
            restart.set()
            return
        if decisions.random() < settings.crash_inside_io_share:
            # Land the crash at an I/O operation: between jobs, inside COMMIT, in a checkpoint.
            operations = 1 + int(decisions.expovariate(1 / crash_io_operations_mean))
            self.fault_plan.crash_after(operations, lambda: crash("io_operation"))
            return
        crash("between_batches")

    async def _clock_jumper(self, env) -> None:
        decisions = self.decisions
        while True:
            await trio.sleep(decisions.expovariate(1 / self.settings.clock_jump_interval_seconds))
            jump = (decisions.random() * 2 - 1) * clock_jump_seconds_max
            env.clock.jump(jump)


def _describe_error(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}"[:300]


def _services(workload, world) -> list:
    offer = getattr(workload, "services", None)
    return list(offer(world)) if offer is not None else []


def _check_restart_intensity(tracer: Tracer) -> list[Violation]:
    """No actor restarted more often than its intensity allows before escalating (read from
    the trace, so the runtime's own bookkeeping is not trusted).

    The runtime counts a restart ``period_seconds`` or less before the latest one (OTP), on
    its exact clock; the trace has only whole microseconds, each moment rounded by up to half
    of one.  Two restarts whose moments differ by exactly the period may therefore really be
    a little more than the period apart, and the runtime was right not to count the older one
    (seed 2 of the character workload: 5.0000001 s apart, both moments ``.968041``).  So a
    restart counts here only when its moment is at least one microsecond inside the period:
    then it certainly was inside it.  What this gives up is a burst whose spacing falls
    within a microsecond of the period, which the trace cannot tell from a legal one."""
    restarts: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    violations = []
    intensity = RestartIntensity()
    period_moments = round(intensity.period_seconds * trace_moments_per_second)
    for record in read_trace(b"".join(tracer.records)):
        sequence, moment, event, kind, key, _ = record
        if kind in ("sim", "supervisor"):
            if event == "sim_restart":
                restarts.clear()  # a new process: every actor starts with a fresh history
            continue
        address = (kind, key)
        if event == "escalate":
            restarts.pop(address, None)
        elif event == "restart":
            history = restarts[address]
            history.append((moment, sequence))
            recent = [number for when, number in history if moment - when < period_moments]
            if len(recent) > intensity.restarts_max:
                violations.append(Violation(f"restart intensity exceeded for {kind}/{key} without escalation",
                                            tuple(recent), (address,), checker="restart_intensity"))
                history.clear()  # report each burst once
    return violations
