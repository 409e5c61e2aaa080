"""Surface plug-ins: what each HTTP surface brings to ``troupe serve``.

A surface is one contract on one listener: its quart-trio app, the actor kinds behind it and
the storage migrations those kinds need.  ``serve`` collects the kinds and migrations of
every surface before it starts the shared ``ActorSystem`` and ``Engine``, then builds each app
with a ``SurfaceContext`` holding the running parts.  Today ``default_surfaces`` serves
``admin``, ``host``, ``sessions``, ``character`` and ``knowledge``.

Trade-off: kinds and migrations are static per surface (declared, not computed from the
configuration), so the storage schema never depends on which listeners are switched on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from troupe._config import ListenAddress, ServeOptions
from troupe.http import ASGIApp, ShutdownSignal, create_admin_app
from troupe.runtime import ActorKind, ActorSystem, ChildSpec, Env
from troupe.storage import Engine, Migration


@dataclass(frozen=True)
class SurfaceContext:
    """The running server as a surface's app sees it."""

    options: ServeOptions
    env: Env
    engine: Engine
    system: ActorSystem
    shutdown: ShutdownSignal
    state: Any  # the server's AdminSource (readiness and statistics)
    request_shutdown: Callable[[], None] | None = None
    """Asks the whole server to shut down gracefully (a surface's own shutdown route); None
    where nothing can be stopped that way (tests, the simulator)."""
    listen_urls: Mapping[str, str] = field(default_factory=dict)
    """Each bound listener's URL by surface name (real ports, also for ``:0``); empty where
    there are no listeners (tests that build an app themselves, the simulator)."""


@dataclass(frozen=True)
class Surface:
    """One HTTP surface: ``create_app(context)`` returns its (already protected) ASGI app."""

    name: str
    listen_default: ListenAddress
    create_app: Callable[[SurfaceContext], ASGIApp]
    actor_kinds: tuple[ActorKind, ...] = ()
    migrations: tuple[Migration, ...] = ()
    services: tuple[ChildSpec, ...] = ()


admin_listen_default = ListenAddress("127.0.0.1", 8700)


def _create_admin(context: SurfaceContext) -> ASGIApp:
    return create_admin_app(
        context.state,
        allowed_hosts=context.options.allowed_hosts,
        request_body_bytes_max=context.options.request_body_bytes_max,
    )


admin_surface = Surface("admin", admin_listen_default, _create_admin)


def default_surfaces(environ: Mapping[str, str] | None = None) -> list[Surface]:
    """Every surface this build serves, in listener start order, configured from ``environ``.

    ``None`` (``troupe serve``) is the process environment and turns on what a desktop
    process may do on its own (the knowledge surface's mDNS discovery and D-Bus service); an
    explicit mapping (the simulator passes ``{}``) configures only from that mapping and keeps
    those off, so nothing outside the ``Env`` opens a socket and a seed replays the same."""
    # Imported here: the surface packages import troupe.server themselves.
    from troupe.http.character import new_character_surface
    from troupe.http.host import new_host_surface
    from troupe.http.knowledge import new_knowledge_surface
    from troupe.http.sessions import sessions_surface

    return [admin_surface, new_host_surface(environ), sessions_surface, new_character_surface(environ),
            new_knowledge_surface(environ)]


# What the shared ActorSystem and Engine need from every surface, collected in one place so
# that ``troupe serve`` and the simulator (``troupe.sim.SimServer``) start the same server.


def surface_actor_kinds(surfaces: Sequence[Surface]) -> list[ActorKind]:
    return [kind for surface in surfaces for kind in surface.actor_kinds]


def surface_migrations(surfaces: Sequence[Surface]) -> list[Migration]:
    """Every surface's migrations once each: surfaces share components (tokens, for one)."""
    return list(dict.fromkeys(migration for surface in surfaces for migration in surface.migrations))


def surface_services(surfaces: Sequence[Surface]) -> list[ChildSpec]:
    return [service for surface in surfaces for service in surface.services]


def create_surface_apps(surfaces: Sequence[Surface], context: SurfaceContext) -> dict[str, ASGIApp]:
    """Each surface's app, by surface name, built with the same ``context``."""
    return {surface.name: surface.create_app(context) for surface in surfaces}


__all__ = [
    "Surface",
    "SurfaceContext",
    "admin_listen_default",
    "admin_surface",
    "create_surface_apps",
    "default_surfaces",
    "surface_actor_kinds",
    "surface_migrations",
    "surface_services",
]
