"""troupe.server: ``troupe serve``, the process that mounts every surface.

``serve(options)`` runs one actor system and one storage engine and one hypercorn listener
per ``Surface``; ``serve_main(arguments)`` is what the CLI calls (it returns the exit code).
Configuration is ``troupe._config`` (re-exported here); the stdout interface
(``listening SURFACE URL`` lines, then ``ready``) is described in ``_serve`` and
``docs/operations.md``.
"""

from troupe._config import ConfigError, ListenAddress, ServeOptions, load_serve_options

from ._exceptions import ListenerError, ListenerRefused, ServeError, UnknownSurface
from ._serve import ServerHandle, ServerState, serve, serve_main
from ._surfaces import (
    Surface,
    SurfaceContext,
    admin_listen_default,
    admin_surface,
    create_surface_apps,
    default_surfaces,
    surface_actor_kinds,
    surface_migrations,
    surface_services,
)

__all__ = [
    "ConfigError",
    "ListenAddress",
    "ListenerError",
    "ListenerRefused",
    "ServeError",
    "ServeOptions",
    "ServerHandle",
    "ServerState",
    "Surface",
    "SurfaceContext",
    "UnknownSurface",
    "admin_listen_default",
    "admin_surface",
    "create_surface_apps",
    "default_surfaces",
    "load_serve_options",
    "serve",
    "serve_main",
    "surface_actor_kinds",
    "surface_migrations",
    "surface_services",
]
