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
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import trio
import trio.testing

from troupe.runtime import ActorSystem, RestartIntensity, Tracer, read_trace
from troupe.runtime import _limits as runtime_limits
from troupe.storage import Engine, FaultPlan, FaultyVFS, StorageError

from ._sim_env import sim_env
from ._workload import World, make_workloads

fault_names = ("crash", "io", "disk_full", "clock")
clients_count = 4
crash_interval_seconds_mean = 4.0
clock_jump_interval_seconds_mean = 5.0
clock_jump_seconds_max = 3600.0
io_error_probability = 0.002
disk_full_probability = 0.001
quiescence_seconds = 120.0
live_actors_max = 5
"""Small on purpose: LRU eviction and re-activation happen all the time under the workload."""
generations_max = 1000
"""A run that needs more restarts than this is stuck, not unlucky."""


@dataclass(frozen=True)
class SimulationConfig:
    seed: int
    steps: int = 2000
    faults: frozenset[str] = frozenset(fault_names)
    workloads: tuple[str, ...] = ()
    planted_bugs: frozenset[str] = frozenset()
    trace_path: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(fault_names)
        assert not unknown, f"unknown faults {sorted(unknown)}"
        assert self.steps >= 0


@dataclass
class SimulationResult:
    seed: int
    steps: int
    crashes: int = 0
    restarts: int = 0
    faults_injected: int = 0
    violations: list[str] = field(default_factory=list)
    trace_sha256: str = ""
    simulated_seconds: float = 0.0
    wall_seconds: float = 0.0
    generations: int = 0
    clock_jumps: int = 0
    io_errors: int = 0
    disk_full: int = 0
    actor_restarts: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "steps": self.steps,
            "crashes": self.crashes,
            "restarts": self.restarts,
            "faults_injected": self.faults_injected,
            "violations": len(self.violations),
            "trace_sha256": self.trace_sha256,
            "simulated_seconds": round(self.simulated_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "generations": self.generations,
            "clock_jumps": self.clock_jumps,
            "io_errors": self.io_errors,
            "disk_full": self.disk_full,
            "actor_restarts": self.actor_restarts,
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


class _Crash(Exception):
    pass


async def _simulate(config: SimulationConfig, data_dir: str, sink: BinaryIO | None) -> SimulationResult:
    result = SimulationResult(seed=config.seed, steps=config.steps)
    decisions = random_module.Random(config.seed)
    fault_plan = FaultPlan(
        random=random_module.Random(config.seed * 7919 + 1),
        io_error_probability=io_error_probability if "io" in config.faults else 0.0,
        disk_full_probability=disk_full_probability if "disk_full" in config.faults else 0.0,
        enabled=False,
    )
    vfs_name = f"troupe-sim-{config.seed}-{os.getpid()}"
    vfs = FaultyVFS(vfs_name, fault_plan)
    env = sim_env(config.seed, data_dir, vfs_name=vfs_name)
    env.extras["planted_bugs"] = config.planted_bugs
    # Deterministic random for workloads, apart from the fault and decision streams.
    tracer = Tracer(time_source=trio.current_time, keep_in_memory=True, sink=sink)
    world = World(env=env, random=env.random, tracer=tracer, planted_bugs=config.planted_bugs)
    workloads = make_workloads(list(config.workloads) or None)
    migrations = [migration for workload in workloads for migration in workload.migrations()]
    steps_left = [config.steps]
    try:
        while True:
            world.generation += 1
            result.generations += 1
            assert world.generation <= generations_max, "simulation stuck in a restart loop"
            if world.generation > 1:
                result.restarts += 1
                tracer.record("sim_restart", "sim", "", generation=world.generation)
            finished = await _generation(config, world, workloads, migrations, fault_plan, decisions, steps_left, result)
            if finished:
                break
            result.crashes += 1
    finally:
        vfs.unregister()
    result.violations.extend(_check_restart_intensity(tracer))
    result.io_errors = fault_plan.io_errors_injected
    result.disk_full = fault_plan.disk_full_injected
    result.clock_jumps = env.clock.jumps
    result.faults_injected = result.crashes + result.io_errors + result.disk_full + result.clock_jumps
    result.actor_restarts = tracer.counts.get("restart", 0)
    result.trace_sha256 = tracer.sha256()
    result.simulated_seconds = trio.current_time()
    return result


async def _generation(config, world, workloads, migrations, fault_plan, decisions, steps_left, result) -> bool:
    """One process lifetime. Returns True when the run ended quietly, False after a crash."""
    env = world.env
    with trio.CancelScope() as lifetime:
        async with trio.open_nursery() as nursery:
            engine = await Engine.open(env, migrations=migrations, nursery=nursery, readers_max=1)
            world.engine = engine
            kinds = [kind for workload in workloads for kind in workload.actor_kinds(world)]
            system = ActorSystem(
                env,
                kinds,
                storage=engine,
                tracer=world.tracer,
                live_actors_max=live_actors_max,
                root_intensity=RestartIntensity(runtime_limits.restarts_max, runtime_limits.period_seconds),
                transient_errors=(StorageError,),
            )
            world.system = system
            await nursery.start(system.run)
            if world.generation > 1:
                for workload in workloads:
                    for violation in await workload.after_restart(world):
                        result.violations.append(f"[generation {world.generation}] {violation}")
            fault_plan.enabled = bool({"io", "disk_full"} & config.faults)

            def crash() -> None:
                world.tracer.record("sim_crash", "sim", "", generation=world.generation)
                fault_plan.enabled = False
                engine.crash()
                lifetime.cancel()

            async with trio.open_nursery() as injectors:
                if "crash" in config.faults:
                    delay = decisions.expovariate(1 / crash_interval_seconds_mean)
                    injectors.start_soon(_crash_injector, delay, crash)
                if "clock" in config.faults:
                    injectors.start_soon(_clock_jumper, env, decisions)
                async with trio.open_nursery() as clients:
                    for client in range(clients_count):
                        clients.start_soon(_client, world, workloads, client, steps_left)
                injectors.cancel_scope.cancel()
            # The step budget is spent: stop injecting, let the system settle, check, shut down.
            fault_plan.enabled = False
            await trio.sleep(quiescence_seconds)
            for workload in workloads:
                for violation in await workload.at_quiescence(world):
                    result.violations.append(f"[quiescence] {violation}")
            await system.drain()
            await engine.aclose()
            nursery.cancel_scope.cancel()
            return True
    return not lifetime.cancelled_caught


async def _client(world: World, workloads, client: int, steps_left: list[int]) -> None:
    while steps_left[0] > 0:
        steps_left[0] -= 1
        workload = workloads[world.random.randrange(0, len(workloads))]
        await workload.client_step(world, client)


async def _crash_injector(delay: float, crash) -> None:
    await trio.sleep(delay)
    crash()


async def _clock_jumper(env, decisions: random_module.Random) -> None:
    while True:
        await trio.sleep(decisions.expovariate(1 / clock_jump_interval_seconds_mean))
        jump = (decisions.random() * 2 - 1) * clock_jump_seconds_max
        env.clock.jump(jump)


def _check_restart_intensity(tracer: Tracer) -> list[str]:
    """No actor restarted more often than its intensity allows before escalating."""
    restarts: dict[tuple[str, str], list[float]] = defaultdict(list)
    violations = []
    intensity = RestartIntensity()
    for record in read_trace(b"".join(tracer.records)):
        _, moment, event, kind, key, _ = record
        if kind in ("sim", "supervisor"):
            if event == "sim_restart":
                restarts.clear()  # a new process: every actor starts with a fresh history
            continue
        address = (kind, key)
        if event == "escalate":
            restarts.pop(address, None)
        elif event == "restart":
            times = restarts[address]
            times.append(moment / 1_000_000)
            recent = [moment_ for moment_ in times if times[-1] - moment_ <= intensity.period_seconds]
            if len(recent) > intensity.restarts_max:
                violations.append(f"restart intensity exceeded for {kind}/{key} without escalation")
    return violations
