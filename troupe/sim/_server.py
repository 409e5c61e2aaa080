"""The whole server in the simulator: the same surfaces as ``troupe serve``, driven in-process.

``troupe serve`` collects every surface's actor kinds, migrations and services, starts one
``Engine`` and one ``ActorSystem`` and mounts each surface's app on a hypercorn listener.  The
simulator must run the same server, or the bugs between a surface and the runtime (a route
that forgets a timeout, readiness that lies after a restart) stay out of its reach.  So
``SimServer`` starts the same ``Surface`` list (``troupe.server.default_surfaces()``) with a
real ``SurfaceContext`` (the sim Env, the engine and system of the current process lifetime, a
``ShutdownSignal``, serve's own ``ServerState``) and puts an ``AsgiDriver`` where each listener
would be: no sockets, no hypercorn, everything on the mock clock.

Use, once per process lifetime (generation)::

    server = SimServer()                                    # once per run
    engine = await Engine.open(env, migrations=[*server.migrations(), ...], ...)
    system = ActorSystem(env, [*server.kinds(), ...], services=[*server.services(), ...], ...)
    world.apps = await server.start(world, engine, system, nursery)  # {"admin": AsgiDriver}
    ...
    await server.stop()                                     # before draining the system

A simulated crash needs no ``stop()``: cancelling ``nursery`` ends the lifespan tasks and any
request in flight, as the death of the process would.

Trade-off: the listener layer itself (binding, hypercorn's HTTP parsing, the socket-level
413 close) is not simulated; ``tests/test_serve.py`` and ``tests/http`` cover it on real sockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from troupe._config import ServeOptions
from troupe.http import ShutdownSignal
from troupe.runtime import ActorKind, ActorSystem, ChildSpec
from troupe.server import (
    ServerState,
    Surface,
    SurfaceContext,
    create_surface_apps,
    default_surfaces,
    surface_actor_kinds,
    surface_migrations,
    surface_services,
)
from troupe.storage import Engine, Migration

from ._asgi import AsgiDriver


class SimServer:
    """The surfaces of ``troupe serve`` for one simulated run (see the module docstring)."""

    def __init__(self, surfaces: Sequence[Surface] | None = None, *, options: ServeOptions | None = None) -> None:
        # An explicit empty environment: the process's variables never reach a simulated run
        # (and the knowledge surface's discovery and D-Bus stay off; see default_surfaces).
        self.surfaces = list(default_surfaces({}) if surfaces is None else surfaces)
        self.options = options or ServeOptions()
        self.state: ServerState | None = None
        self.shutdown: ShutdownSignal | None = None
        self.drivers: dict[str, AsgiDriver] = {}
        self.starts = 0

    def kinds(self) -> list[ActorKind]:
        return surface_actor_kinds(self.surfaces)

    def migrations(self) -> list[Migration]:
        return surface_migrations(self.surfaces)

    def services(self) -> list[ChildSpec]:
        return surface_services(self.surfaces)

    async def start(self, world: Any, engine: Engine, system: ActorSystem, nursery: trio.Nursery) -> dict[str, AsgiDriver]:
        """Build every surface's app for this process lifetime and run their lifespan startup
        in ``nursery`` (the generation's: a crash cancels it).  ``system`` must be running."""
        state = ServerState()
        state.engine = engine
        state.system = system
        state.storage_open = True
        shutdown = ShutdownSignal()
        context = SurfaceContext(self.options, world.env, engine, system, shutdown, state)
        apps = create_surface_apps(self.surfaces, context)
        drivers = {name: AsgiDriver(app) for name, app in apps.items()}
        for driver in drivers.values():
            await driver.startup(nursery)
        state.accepting = True
        self.state, self.shutdown, self.drivers = state, shutdown, drivers
        self.starts += 1
        return drivers

    async def stop(self) -> None:
        """Serve's shutdown order: readiness turns false, streams end, lifespans shut down."""
        if self.state is None or self.shutdown is None:
            return
        self.state.accepting = False
        self.shutdown.set()
        for driver in self.drivers.values():
            await driver.shutdown()
        self.state.storage_open = False


__all__ = ["SimServer"]
