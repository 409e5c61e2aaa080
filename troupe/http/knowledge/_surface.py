"""``knowledge_surface``: the PIXIU memory API as a ``troupe serve`` plug-in.

Listener: 127.0.0.1:8765 by default, the contract's address (``--listen knowledge=HOST:PORT``,
``TROUPE_LISTEN_KNOWLEDGE`` or ``[serve.listen] knowledge`` move it; ``off`` turns it off).
Loopback only unless the operator opened every listener (``TROUPE_ALLOW_NON_LOOPBACK=1``); the
gate still refuses a non-loopback Host.

Configuration read from the environment at start (``_handshake``): ``TROUPE_PRODUCT_VERSION``
(injected by the release's service unit; ``development`` otherwise),
``TROUPE_KNOWLEDGE_EMBEDDING`` and ``TROUPE_KNOWLEDGE_VECTOR_STORE`` (``auto`` | ``local``;
``kylin`` fails the start: this build has no Kylin adapter); ``TROUPE_KNOWLEDGE_DISCOVERY``
and ``TROUPE_KNOWLEDGE_DBUS`` (mDNS discovery and the D-Bus service: ``_desktop``; both off
when the surface is built from an explicit mapping).

Why a factory (``new_knowledge_surface``) beside the ready-made ``knowledge_surface``: tests
and the simulator choose the scope actors' settings (a failing sensitivity detector, a
scripted structurer) and the hub's (a short heartbeat, a small queue); the kinds and
migrations are the same every time, so the schema never depends on configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from troupe.actors.knowledge import (
    EventsHubSettings,
    ScopeSettings,
    events_hub_kind,
    knowledge_migrations,
    scope_actor_kind,
)
from troupe.actors.knowledge.discovery import DiscoverySettings
from troupe.actors.knowledge.monitor import monitor_actor_kind, monitor_migrations
from troupe.actors.knowledge.sync import (
    SyncSettings,
    sync_actor_kind,
    sync_migrations,
    sync_settings_from_environment,
)
from troupe.http import ASGIApp
from troupe.retrieval import retrieval_migrations
from troupe.server import ListenAddress, Surface, SurfaceContext

from ._app import KnowledgeAppDependencies, create_knowledge_app
from ._desktop import desktop_services
from ._events import EventsSettings
from ._handshake import HandshakeSettings, read_os_release

knowledge_port_default = 8765
knowledge_listen_default = ListenAddress("127.0.0.1", knowledge_port_default)


def new_knowledge_surface(
    environ: Mapping[str, str] | None = None,
    *,
    scope_settings: ScopeSettings | None = None,
    hub_settings: EventsHubSettings | None = None,
    events_settings: EventsSettings | None = None,
    os_release_text: str | None = None,
    sync_settings: SyncSettings | None = None,
    discovery_settings: DiscoverySettings | None = None,
) -> Surface:
    """A knowledge surface configured from ``environ`` (default ``os.environ``); raises
    ``KnowledgeBackendUnavailable`` (a ``ServeError``) when a backend is configured strictly
    and cannot run.  ``os_release_text`` replaces ``/etc/os-release``."""
    real_environment = environ is None
    environ = os.environ if environ is None else environ
    handshake = HandshakeSettings.from_environment(
        environ, read_os_release() if os_release_text is None else os_release_text)
    events = events_settings or EventsSettings()
    sync = sync_settings or sync_settings_from_environment(environ)
    desktop = desktop_services(environ, real_environment=real_environment, discovery=discovery_settings)

    def create(context: SurfaceContext) -> ASGIApp:
        desktop.bind(context)
        return create_knowledge_app(KnowledgeAppDependencies(
            env=context.env, engine=context.engine, system=context.system, shutdown=context.shutdown,
            handshake=handshake, events=events, allowed_hosts=tuple(context.options.allowed_hosts)))

    return Surface(
        "knowledge",
        knowledge_listen_default,
        create,
        actor_kinds=(scope_actor_kind(scope_settings), events_hub_kind(hub_settings), monitor_actor_kind(),
                     sync_actor_kind(sync)),
        migrations=tuple(dict.fromkeys((*retrieval_migrations(), *knowledge_migrations, *monitor_migrations,
                                            *sync_migrations))),
        services=desktop.services,
    )


knowledge_surface = new_knowledge_surface({}, os_release_text="")
"""The surface with the built-in defaults (no environment or file read); ``default_surfaces()``
uses ``new_knowledge_surface()`` instead."""

__all__ = [
    "knowledge_listen_default",
    "knowledge_port_default",
    "knowledge_surface",
    "new_knowledge_surface",
]
