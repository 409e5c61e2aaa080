"""``character_surface``: the N.E.K.O memory server contract as a ``troupe serve`` plug-in.

Listener: 127.0.0.1:48912 by default, the contract's address.  ``MEMORY_SERVER_PORT`` (the
contract's configuration item) changes the default port; an explicit listen setting
(``--listen character=HOST:PORT``, ``TROUPE_LISTEN_CHARACTER`` or ``[serve.listen]
character``) wins over it, and ``off`` turns the listener off.  Loopback only unless the
operator opened every listener (``TROUPE_ALLOW_NON_LOOPBACK=1``); the gate still refuses a
non-loopback Host or Origin.

Configuration read from the environment at start (deliberately not flags: the companion app's
launcher sets them for the process it starts):

- ``TROUPE_CHARACTER_START_BLOCKED=1`` starts in limited mode (every route but the four
  exempt ones answers 409 until ``/internal/storage/startup/continue``);
  ``TROUPE_CHARACTER_BLOCKING_REASON`` is the ``blocking_reason`` shown meanwhile;
- ``TROUPE_CHARACTER_ENABLE_SHUTDOWN=1`` makes ``/shutdown`` stop the whole process (the
  contract's standalone ``--enable-shutdown``); otherwise it answers ``shutdown_disabled``.

Why a factory (``new_character_surface``) beside the ready-made ``character_surface``: the
lifecycle settings (instance id, the shared component generation) belong to one running
server, never to a module, so ``default_surfaces()`` builds a fresh surface per server.  The
kinds and migrations are the same every time, so the schema never depends on configuration.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from troupe.actors.character import (
    CharacterLifecycleSettings,
    CharacterSettings,
    character_actor_kind,
    character_lifecycle_kind,
    character_surface_migrations,
    default_character_memory,
    new_instance_id,
)
from troupe.http import ASGIApp
from troupe.server import ListenAddress, Surface, SurfaceContext

from ._app import CharacterAppDependencies, create_character_app

character_port_default = 48912
port_variable = "MEMORY_SERVER_PORT"
start_blocked_variable = "TROUPE_CHARACTER_START_BLOCKED"
blocking_reason_variable = "TROUPE_CHARACTER_BLOCKING_REASON"
enable_shutdown_variable = "TROUPE_CHARACTER_ENABLE_SHUTDOWN"

character_listen_default = ListenAddress("127.0.0.1", character_port_default)


def character_listen_address(environ: Mapping[str, str]) -> ListenAddress:
    """The default listener: ``MEMORY_SERVER_PORT`` when it is a port number (0 = a free
    port), else 127.0.0.1:48912.  A malformed value is ignored with the default kept, as the
    contract's own server does; ``troupe serve`` prints the address it bound."""
    text = environ.get(port_variable, "").strip()
    if text.isdigit() and 0 <= int(text) <= 65535:
        return replace(character_listen_default, port=int(text))
    return character_listen_default


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _raise_termination() -> None:
    """Stop this process the way SIGTERM does (only where the server offers no
    ``SurfaceContext.request_shutdown``; ``troupe serve`` does)."""
    signal.raise_signal(signal.SIGTERM)


def new_character_surface(
    environ: Mapping[str, str] | None = None,
    *,
    request_shutdown: Callable[[], None] = _raise_termination,
    memory: Any = None,
) -> Surface:
    """A character surface configured from ``environ`` (default ``os.environ``);
    ``memory`` replaces ``default_character_memory()`` behind the character actors."""
    environ = os.environ if environ is None else environ
    settings = CharacterLifecycleSettings(
        instance_id="",  # set per start, from that start's Env (see _create)
        start_blocked=_flag(environ, start_blocked_variable),
        blocking_reason=environ.get(blocking_reason_variable) or None,
        shutdown_enabled=_flag(environ, enable_shutdown_variable),
    )

    def create(context: SurfaceContext) -> ASGIApp:
        # Every start (a process, or a simulated restart) is a new instance.  The lifecycle
        # actor is activated by the first request, after this, so it reads the new id.
        settings.instance_id = new_instance_id(context.env)
        dependencies = CharacterAppDependencies(
            env=context.env,
            system=context.system,
            allowed_hosts=tuple(context.options.allowed_hosts),
            request_shutdown=(context.request_shutdown or request_shutdown) if settings.shutdown_enabled else None,
            published_lifecycle=settings.published_state,
        )
        return create_character_app(dependencies)

    return Surface(
        "character",
        character_listen_address(environ),
        create,
        actor_kinds=(
            character_actor_kind(CharacterSettings(
                memory=default_character_memory() if memory is None else memory,
                components=settings.components,
            )),
            character_lifecycle_kind(settings),
        ),
        # The recall engine's tables are the same Migration objects the host surface lists, so
        # the surfaces together run them once (``surface_migrations`` de-duplicates).
        migrations=character_surface_migrations,
    )


character_surface = new_character_surface({})
"""The surface with the built-in defaults (no environment read); ``default_surfaces()``
uses ``new_character_surface()`` instead."""

__all__ = [
    "blocking_reason_variable",
    "character_listen_address",
    "character_listen_default",
    "character_port_default",
    "character_surface",
    "enable_shutdown_variable",
    "new_character_surface",
    "port_variable",
    "start_blocked_variable",
]
