"""Several simulated devices in one run: each its own disk, process lifetimes and listener, all
joined by one simulated network between them.

Why a run of its own: device sync (the knowledge surface's pairing and CRDT replication) is a
property of several servers at once: what one device acknowledged must reach the others
through crashes of a single device, partitions, delays, duplicated and reordered requests.
The single-server run (``_simulation``) stays as it was (its traces are unchanged for every
seed); a workload that sets ``devices_count`` > 1 gets this run instead (``simulate_devices``).

What each device has of its own: a data directory behind its own fault-injecting VFS and
``FaultPlan`` (crashes, power losses, I/O errors and disk full strike one device at a time),
an Env with its own seeded random stream (so its own Ed25519 identity), its own id source
(ids carry the device, as real ids never collide across devices), the knowledge surface behind
an in-process ASGI driver that says it listens on ``127.0.0.1:<port of the device>``, and its
own ``env.http`` whose transport is the ``DeviceMesh``.  What they share: the trio clock and
scheduler, the wall clock (clock jumps move every device's clock: peer requests are signed with
a bounded skew, and a household's desktops agree on the time within seconds), the tracer (the
runtime's records carry the device in their key, ``d1:main``) and the step budget.

The mesh (``DeviceMesh``) routes a request to the target device's live driver, or refuses the
connection while that device is down or the pair is partitioned; with the seed's random source
it delays requests (so concurrent ones arrive reordered), drops requests, loses replies (the
target applied what the caller thinks failed) and delivers duplicates later (a replay that
arrives after newer requests).  Partitions come and go on a seeded schedule; ``heal()`` ends
every network fault for the quiet end.

The quiet end: when the step budget is spent each device stops injecting faults and waits for
the others; the mesh heals, the devices run for ``quiescence_seconds`` (gossip and
anti-entropy), and then the workloads' ``at_quiescence`` runs for each device in turn while
every device is still up.

Trade-off: a request runs the target's app in the caller's task (as the single-server
network does), so a caller that crashes cancels its request inside the target's app, which is
what a dropped connection does.
"""

from __future__ import annotations

import os
import random as random_module
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import httpx
import trio

from troupe._config import ServeOptions
from troupe.http import ShutdownSignal
from troupe.runtime import ActorSystem, RestartIntensity, Tracer, no_fault_points
from troupe.runtime import _limits as runtime_limits
from troupe.server import (
    ServerState,
    Surface,
    SurfaceContext,
    create_surface_apps,
    surface_actor_kinds,
    surface_migrations,
    surface_services,
)
from troupe.storage import Engine, FaultPlan, FaultyVFS, InlineExecutor, StorageError

from ._asgi import AsgiDriver, AsgiError
from ._sim_env import SimClock, SimRandom, SimStorageOpener
from ._swarm import (
    FaultSettings,
    clock_jump_seconds_max,
    crash_io_operations_mean,
    graceful_restart_share,
)
from ._violation import Violation, as_violation
from ._workload import World

devices_count_max = 4
device_port_base = 18_765
"""Device ``i`` listens (in the simulation) on ``127.0.0.1:device_port_base + i``: loopback,
so the knowledge gate's Host check lets peers in, as on a real household's loopback tests."""
clients_per_device = 2
quiescence_seconds = 40.0
"""Settling time at the quiet end: four anti-entropy intervals of the workload's sync settings
(the workload then forces rounds on every device before it compares)."""
live_actors_max = 5
generations_max = 1000

network_latency_seconds_max_range = (0.0, 0.5)
drop_request_probability_max = 0.1
lose_reply_probability_max = 0.1
duplicate_probability_max = 0.2
duplicate_delay_seconds_max = 5.0
partition_interval_seconds_range = (2.0, 20.0)
partition_seconds_mean = 4.0
peer_request_seconds_default = 10.0
"""A peer request with no read timeout of its own gives up after this long."""
assert 0 <= drop_request_probability_max + lose_reply_probability_max < 1


def device_name(index: int) -> str:
    return f"d{index}"


def device_address(index: int) -> tuple[str, int]:
    return ("127.0.0.1", device_port_base + index)


def device_base_url(index: int) -> str:
    host, port = device_address(index)
    return f"http://{host}:{port}"


class DeviceIds:
    """Counter ids that name their device: ``knw_d1x000000000000002a``."""

    def __init__(self, index: int) -> None:
        self._index = index
        self._counter = 0

    def new_id(self, prefix: str = "") -> str:
        self._counter += 1
        return f"{prefix}d{self._index}x{self._counter:014x}"


class DeviceTracer:
    """One device's view of the run's tracer: same sequence numbers, its keys prefixed with
    the device (``d1:main``) so per-actor checks never mix two devices' actors."""

    def __init__(self, shared: Tracer, index: int) -> None:
        self.shared = shared
        self.prefix = f"{device_name(index)}:"

    def record(self, event: str, kind: str = "", key: str = "", **fields: Any) -> int:
        return self.shared.record(event, kind, self.prefix + key, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


class _DeviceDriver(AsgiDriver):
    """An ASGI driver whose ``server`` scope entry is the device's own address, so the app
    advertises it in pairing tokens."""

    def __init__(self, app: Any, address: tuple[str, int], **options: Any) -> None:
        super().__init__(app, **options)
        self.address = address

    def _scope(self, *args: Any, **kwargs: Any) -> Any:
        scope = super()._scope(*args, **kwargs)
        scope["server"] = self.address
        return scope


# ---------------------------------------------------------------------------------------------
# The network between devices
# ---------------------------------------------------------------------------------------------


@dataclass
class MeshFaults:
    """Per-request probabilities of the mesh (drawn per seed) and what was injected."""

    latency_seconds_max: float = 0.0
    drop_request_probability: float = 0.0
    lose_reply_probability: float = 0.0
    duplicate_probability: float = 0.0
    partition_interval_seconds: float = 0.0
    """Mean seconds between partitions; 0: no partitions."""
    delivered: int = 0
    refused: int = 0
    dropped: int = 0
    replies_lost: int = 0
    duplicates: int = 0
    partitions: int = 0

    def counters(self) -> dict[str, int]:
        return {"delivered": self.delivered, "refused": self.refused, "dropped": self.dropped,
                "replies_lost": self.replies_lost, "duplicates": self.duplicates, "partitions": self.partitions}


def choose_mesh_faults(decisions: random_module.Random, armed: bool) -> MeshFaults:
    """A seed's network faults: each kind on in about two thirds of the seeds, at its own rate."""
    if not armed:
        return MeshFaults()
    low, high = network_latency_seconds_max_range

    def maybe(value: float) -> float:
        return value if decisions.random() < 0.65 else 0.0

    return MeshFaults(
        latency_seconds_max=maybe(low + (high - low) * decisions.random()),
        drop_request_probability=maybe(drop_request_probability_max * decisions.random()),
        lose_reply_probability=maybe(lose_reply_probability_max * decisions.random()),
        duplicate_probability=maybe(duplicate_probability_max * decisions.random()),
        partition_interval_seconds=maybe(partition_interval_seconds_range[0] + (
            partition_interval_seconds_range[1] - partition_interval_seconds_range[0]) * decisions.random()),
    )


class DeviceMesh:
    """Routes one device's ``env.http`` requests to another device's app (see the module
    docstring)."""

    def __init__(self, random: random_module.Random, faults: MeshFaults, tracer: Tracer) -> None:
        self._random = random
        self.faults = faults
        self._tracer = tracer
        self._drivers: dict[int, AsgiDriver] = {}
        self._by_address = {}
        self.cut: set[frozenset[int]] = set()
        self.healed = False
        self.nursery: trio.Nursery | None = None

    def register(self, index: int) -> None:
        host, port = device_address(index)
        self._by_address[f"{host}:{port}"] = index

    def up(self, index: int, driver: AsgiDriver) -> None:
        self._drivers[index] = driver

    def down(self, index: int) -> None:
        self._drivers.pop(index, None)

    def partition(self, left: int, right: int) -> None:
        self.cut.add(frozenset((left, right)))
        self.faults.partitions += 1
        self._tracer.record("sim_partition", "sim", "", devices=sorted((left, right)))

    def heal(self) -> None:
        """End every network fault (the quiet end)."""
        self.healed = True
        self.cut.clear()
        self._tracer.record("sim_heal", "sim", "")

    def reachable(self, source: int, target: int) -> bool:
        return target in self._drivers and frozenset((source, target)) not in self.cut

    def transport(self, source: int) -> httpx.AsyncBaseTransport:
        return _MeshTransport(self, source)

    async def resolve(self, host: str) -> list[str]:
        if any(address.split(":", 1)[0] == host for address in self._by_address):
            return [host]
        raise OSError(f"simulated network: {host} does not resolve")

    async def deliver(self, source: int, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        target = self._by_address.get(host)
        faults, healed = self.faults, self.healed
        if not healed and faults.latency_seconds_max:
            await trio.sleep(self._random.random() * faults.latency_seconds_max)
        if target is None or not self.reachable(source, target):
            faults.refused += 1
            raise httpx.ConnectError(f"simulated network: connection to {host} refused", request=request)
        draw = self._random.random()
        if not healed and draw < faults.drop_request_probability:
            faults.dropped += 1
            raise httpx.ConnectError(f"simulated network: request to {host} lost", request=request)
        body = await request.aread()
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in request.headers.raw]
        target_path = request.url.raw_path.decode("ascii")
        timeout = (request.extensions.get("timeout") or {}).get("read") or peer_request_seconds_default
        if not healed and self.nursery is not None and self._random.random() < faults.duplicate_probability:
            faults.duplicates += 1
            delay = self._random.random() * duplicate_delay_seconds_max
            self.nursery.start_soon(self._duplicate, source, target, request.method, target_path, headers, body,
                                    host, timeout, delay)
        driver = self._drivers[target]
        try:
            response = await driver.request(request.method, target_path, headers=headers, body=body, host=host,
                                            seconds_max=timeout)
        except AsgiError as error:
            raise httpx.ReadTimeout(f"simulated network: {host} did not answer", request=request) from error
        faults.delivered += 1
        if not healed and self._random.random() < faults.lose_reply_probability:
            faults.replies_lost += 1
            raise httpx.ReadError(f"simulated network: the reply from {host} was lost", request=request)
        return httpx.Response(response.status, headers=list(response.headers), content=response.body,
                              request=request)

    async def _duplicate(self, source: int, target: int, method: str, path: str, headers: Any, body: bytes,
                         host: str, timeout: float, delay: float) -> None:
        await trio.sleep(delay)
        driver = self._drivers.get(target)
        if driver is None or not self.reachable(source, target):
            return
        try:
            await driver.request(method, path, headers=headers, body=body, host=host, seconds_max=timeout)
        except AsgiError:
            pass  # a duplicate's answer goes nowhere

    async def run_partitions(self, devices: Sequence[int], decisions: random_module.Random) -> None:
        """Cut a random pair now and then, and heal it a while later (until ``heal()``)."""
        interval = self.faults.partition_interval_seconds
        if not interval or len(devices) < 2:
            return
        while not self.healed:
            await trio.sleep(decisions.expovariate(1 / interval))
            if self.healed:
                return
            left, right = decisions.sample(list(devices), 2)
            self.partition(left, right)
            await trio.sleep(decisions.expovariate(1 / partition_seconds_mean))
            self.cut.discard(frozenset((left, right)))


class _MeshTransport(httpx.AsyncBaseTransport):
    def __init__(self, mesh: DeviceMesh, source: int) -> None:
        self._mesh = mesh
        self._source = source

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._mesh.deliver(self._source, request)


# ---------------------------------------------------------------------------------------------
# Devices and their lifetimes
# ---------------------------------------------------------------------------------------------


@dataclass
class Device:
    index: int
    world: World
    surfaces: list[Surface]
    fault_plan: FaultPlan
    vfs: FaultyVFS
    decisions: random_module.Random
    drivers: dict[str, AsgiDriver] = field(default_factory=dict)
    state: ServerState | None = None
    shutdown: ShutdownSignal | None = None
    power_loss_pending: bool = False
    up: bool = False

    @property
    def name(self) -> str:
        return device_name(self.index)


class DeviceCluster:
    """The devices of one run and what they share; workloads see it as
    ``world.notes["cluster"]`` (and their own device as ``world.notes["device"]``)."""

    def __init__(self, devices: list[Device], mesh: DeviceMesh, tracer: Tracer) -> None:
        self.devices = devices
        self.mesh = mesh
        self.tracer = tracer
        self.quiet_arrivals = 0
        self.all_quiet = trio.Event()
        self.checks_done = trio.Event()

    def world(self, index: int) -> World:
        return self.devices[index].world

    def is_up(self, index: int) -> bool:
        return self.devices[index].up


def _device_surfaces(workloads: Sequence[Any]) -> list[Surface]:
    surfaces: list[Surface] = []
    for workload in workloads:
        offer = getattr(workload, "device_surfaces", None)
        if offer is not None:
            surfaces.extend(surface for surface in offer() if surface.name not in {s.name for s in surfaces})
    if not surfaces:
        from troupe.http.knowledge import new_knowledge_surface

        surfaces.append(new_knowledge_surface({}, os_release_text=""))
    return surfaces


async def simulate_devices(config: Any, data_dir: str, sink: BinaryIO | None, workloads: list[Any],
                           result: Any, settings: FaultSettings, tracer: Tracer, fault_points: Any,
                           decisions: random_module.Random) -> DevicesRunCounters:
    """Run ``workloads`` (each with ``devices_count``) on several devices; adds crashes,
    lifetimes and violations to ``result`` and returns the injected-fault counters."""
    count = max(getattr(workload, "devices_count", 1) for workload in workloads)
    assert 2 <= count <= devices_count_max, count
    clock = SimClock()
    mesh = DeviceMesh(random_module.Random(config.seed * 15_485_863 + 11),
                      choose_mesh_faults(random_module.Random(config.seed * 32_452_843 + 13),
                                         bool(settings.armed)), tracer)
    devices: list[Device] = []
    from troupe.models import HashedEmbedder, LocalModel

    surfaces = _device_surfaces(workloads)
    for index in range(count):
        mesh.register(index)
        directory = os.path.join(data_dir, device_name(index))
        os.makedirs(directory, exist_ok=True)
        plan = FaultPlan(
            random=random_module.Random(config.seed * 7919 + 1 + 1000 * index),
            io_error_probability=settings.io_error_probability if "io" in settings.armed else 0.0,
            disk_full_probability=settings.disk_full_probability if "disk_full" in settings.armed else 0.0,
            read_faults="io" in settings.armed and settings.read_faults,
            enabled=False,
        )
        vfs_name = f"troupe-sim-{config.seed}-{os.getpid()}-{device_name(index)}"
        vfs = FaultyVFS(vfs_name, plan)
        device_tracer = DeviceTracer(tracer, index)
        plan.observer = lambda fault, operation, device_tracer=device_tracer: device_tracer.record(
            "fault", "storage", "", point=fault, operation=operation)
        from troupe.runtime._env import Env

        env = Env(clock=clock, random=SimRandom(config.seed * 1_000_003 + index), ids=DeviceIds(index),
                  storage=SimStorageOpener(directory, vfs_name), executor=InlineExecutor(),
                  http=httpx.AsyncClient(transport=mesh.transport(index)), model=LocalModel(),
                  embedder=HashedEmbedder(), extras={"network": mesh, "resolver": mesh.resolve,
                                                     "device_name": device_name(index)})
        env.planted_bugs = config.planted_bugs
        world = World(env=env, random=random_module.Random(config.seed * 104_729 + 17 + index),
                      tracer=device_tracer, planted_bugs=config.planted_bugs)  # type: ignore[arg-type]
        devices.append(Device(index, world, surfaces, plan, vfs,
                              random_module.Random(config.seed * 2_038_074_743 + index)))
    cluster = DeviceCluster(devices, mesh, tracer)
    for device in devices:
        device.world.notes.update(cluster=cluster, device=device.index, steps_total=config.steps)
    steps_left = [config.steps]
    runner = _DeviceRunner(cluster, config, settings, workloads, fault_points, result, steps_left,
                           decisions)
    try:
        async with trio.open_nursery() as background:
            mesh.nursery = background
            background.start_soon(mesh.run_partitions, [device.index for device in devices],
                                  random_module.Random(config.seed * 49_979_687 + 19))
            async with trio.open_nursery() as nursery:
                for device in devices:
                    nursery.start_soon(runner.run_device, device)
            background.cancel_scope.cancel()
    except Exception as error:
        from ._simulation import _describe_error

        sequence = tracer.record("sim_aborted", "sim", "", error=type(error).__name__)
        result.violations.append(Violation(f"simulation aborted: {_describe_error(error)}", (sequence,),
                                           checker="simulator"))
    finally:
        for device in devices:
            device.vfs.unregister()
            await device.world.env.http.aclose()
    tracer.record("sim_network", "sim", "", **mesh.faults.counters())
    return DevicesRunCounters(sum(device.fault_plan.io_errors_injected for device in devices),
                              sum(device.fault_plan.disk_full_injected for device in devices), clock.jumps,
                              mesh.faults.counters())


@dataclass(frozen=True)
class DevicesRunCounters:
    """What a run of several devices injected, for the run's summary."""

    io_errors: int
    disk_full: int
    clock_jumps: int
    network: dict[str, int]


class _DeviceRunner:
    def __init__(self, cluster: DeviceCluster, config: Any, settings: FaultSettings, workloads: list[Any],
                 fault_points: Any, result: Any, steps_left: list[int], decisions: random_module.Random) -> None:
        self.cluster = cluster
        self.config = config
        self.settings = settings
        self.workloads = workloads
        self.fault_points = fault_points
        self.result = result
        self.steps_left = steps_left
        self.decisions = decisions

    def _record_violations(self, violations: Any, label: str) -> None:
        for violation in violations:
            item = as_violation(violation)
            self.result.violations.append(replace(item, text=f"[{label}] {item.text}"))

    async def run_device(self, device: Device) -> None:
        world = device.world
        while True:
            world.generation += 1
            self.result.process_lifetimes += 1
            if world.generation > generations_max:
                self.result.violations.append(Violation(f"{device.name}: simulation stuck in a restart loop",
                                                        checker="simulator"))
                await self._quiet_arrive(device, checked=False)
                return
            if world.generation > 1:
                world.tracer.record("sim_restart", "sim", "", generation=world.generation)
            if await self._lifetime(device):
                return

    async def _start(self, device: Device, nursery: trio.Nursery) -> None:
        world, env = device.world, device.world.env
        migrations = surface_migrations(device.surfaces)
        engine = await Engine.open(env, migrations=migrations, nursery=nursery, readers_max=1,
                                   tracer=world.tracer)  # type: ignore[arg-type]
        world.engine = engine
        system = ActorSystem(env, surface_actor_kinds(device.surfaces), storage=engine,
                             tracer=world.tracer,  # type: ignore[arg-type]
                             live_actors_max=live_actors_max,
                             root_intensity=RestartIntensity(runtime_limits.restarts_max,
                                                             runtime_limits.period_seconds),
                             services=surface_services(device.surfaces), transient_errors=(StorageError,))
        world.system = system
        await nursery.start(system.run)
        state = ServerState()
        state.engine, state.system, state.storage_open = engine, system, True
        shutdown = ShutdownSignal()
        context = SurfaceContext(ServeOptions(), env, engine, system, shutdown, state)
        apps = create_surface_apps(device.surfaces, context)
        drivers = {name: _DeviceDriver(app, device_address(device.index)) for name, app in apps.items()}
        for driver in drivers.values():
            await driver.startup(nursery)
        state.accepting = True
        device.state, device.shutdown, device.drivers = state, shutdown, drivers
        world.apps = dict(drivers)
        if "knowledge" in drivers:
            self.cluster.mesh.up(device.index, drivers["knowledge"])
        device.up = True

    async def _stop(self, device: Device) -> None:
        self.cluster.mesh.down(device.index)
        device.up = False
        if device.state is not None and device.shutdown is not None:
            device.state.accepting = False
            device.shutdown.set()
            for driver in device.drivers.values():
                await driver.shutdown()
            device.state.storage_open = False
        assert device.world.system is not None and device.world.engine is not None
        await device.world.system.drain()
        await device.world.engine.aclose()

    async def _lifetime(self, device: Device) -> bool:
        world, settings, plan = device.world, self.settings, device.fault_plan
        env = world.env
        if device.power_loss_pending:
            device.power_loss_pending = False
            lost = device.vfs.power_loss(device.decisions)
            self.result.power_losses += 1
            world.tracer.record("sim_power_loss", "sim", "", **lost)
        plan.revive()
        env.fault_points = no_fault_points
        with trio.CancelScope() as lifetime_scope:
            async with trio.open_nursery() as nursery:
                await self._start(device, nursery)
                if world.generation > 1:
                    for workload in self.workloads:
                        self._record_violations(await workload.after_restart(world),
                                                f"{device.name} generation {world.generation}")
                plan.enabled = bool({"io", "disk_full"} & settings.armed)
                if self.fault_points is not None:
                    env.fault_points = self.fault_points

                def crash(where: str) -> None:
                    if lifetime_scope.cancel_called:
                        return
                    power_loss = device.decisions.random() < settings.power_loss_share
                    world.tracer.record("sim_crash", "sim", "", generation=world.generation, where=where,
                                        power_loss=power_loss)
                    self.result.process_crashes += 1
                    device.power_loss_pending = power_loss
                    plan.enabled = False
                    env.fault_points = no_fault_points
                    self.cluster.mesh.down(device.index)
                    device.up = False
                    assert world.engine is not None
                    world.engine.crash()
                    lifetime_scope.cancel()

                restart = trio.Event()
                async with trio.open_nursery() as injectors:
                    if settings.crashes:
                        injectors.start_soon(self._crash_injector, device, crash, restart)
                    if "clock" in settings.armed and device.index == 0:
                        injectors.start_soon(self._clock_jumper, env)
                    async with trio.open_nursery() as clients:
                        for client in range(clients_per_device):
                            clients.start_soon(self._client, device, client, restart)
                    injectors.cancel_scope.cancel()
                env.fault_points = no_fault_points
                plan.enabled = False
                plan.revive()
                if restart.is_set():
                    world.tracer.record("sim_clean_restart", "sim", "", generation=world.generation)
                    await self._stop(device)
                    nursery.cancel_scope.cancel()
                    return False
                await self._quiet_arrive(device, checked=True)
                await self._stop(device)
                nursery.cancel_scope.cancel()
                return True
        device.up = False
        self.cluster.mesh.down(device.index)
        return False

    async def _quiet_arrive(self, device: Device, *, checked: bool) -> None:
        """Wait for every device to reach its quiet end; the last one to arrive heals the
        network, lets the devices settle, and runs the checks of every device."""
        cluster = self.cluster
        cluster.quiet_arrivals += 1
        if cluster.quiet_arrivals < len(cluster.devices):
            await cluster.checks_done.wait()
            return
        cluster.mesh.heal()
        await trio.sleep(quiescence_seconds)
        for other in cluster.devices:
            if not other.up:
                continue
            for workload in self.workloads:
                self._record_violations(await workload.at_quiescence(other.world), f"quiescence {other.name}")
        cluster.checks_done.set()

    async def _client(self, device: Device, client: int, restart: trio.Event) -> None:
        world, workloads, steps_left = device.world, self.workloads, self.steps_left
        while steps_left[0] > 0 and not restart.is_set():
            steps_left[0] -= 1
            workload = workloads[world.random.randrange(0, len(workloads))]
            await workload.client_step(world, client)

    async def _crash_injector(self, device: Device, crash: Any, restart: trio.Event) -> None:
        settings, decisions = self.settings, device.decisions
        # Each device crashes on its own schedule; with several devices the mean interval per
        # device is stretched so the cluster as a whole is not down all the time.
        interval = settings.crash_interval_seconds * len(self.cluster.devices)
        await trio.sleep(decisions.expovariate(1 / interval))
        if decisions.random() < graceful_restart_share:
            restart.set()
            return
        if decisions.random() < settings.crash_inside_io_share:
            operations = 1 + int(decisions.expovariate(1 / crash_io_operations_mean))
            device.fault_plan.crash_after(operations, lambda: crash("io_operation"))
            return
        crash("between_batches")

    async def _clock_jumper(self, env: Any) -> None:
        decisions = self.decisions
        while True:
            await trio.sleep(decisions.expovariate(1 / self.settings.clock_jump_interval_seconds))
            env.clock.jump((decisions.random() * 2 - 1) * clock_jump_seconds_max)


def multi_device(workloads: Sequence[Any]) -> bool:
    """Whether the selected workloads need a run of several devices."""
    return any(getattr(workload, "devices_count", 1) > 1 for workload in workloads)


__all__ = [
    "Device",
    "DeviceCluster",
    "DeviceIds",
    "DeviceMesh",
    "DeviceTracer",
    "DevicesRunCounters",
    "MeshFaults",
    "choose_mesh_faults",
    "clients_per_device",
    "device_address",
    "device_base_url",
    "device_name",
    "device_port_base",
    "devices_count_max",
    "multi_device",
    "quiescence_seconds",
    "simulate_devices",
]
