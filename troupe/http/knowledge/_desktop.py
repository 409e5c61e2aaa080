"""The knowledge surface's desktop services: mDNS discovery settings and the D-Bus child.

Why in one place: both are configured from the environment when the surface is built, both
need the running server (the D-Bus child needs the actor system; the announcer needs the
knowledge listener's real port), and both must stay off the network unless the operator's
real environment asks for them.

Defaults (``docs/knowledge.md``, "Discovery" and "D-Bus"):
- built from the process environment (``new_knowledge_surface()``, what ``troupe serve``
  does): discovery follows the sync runtime on every interface (``TROUPE_KNOWLEDGE_DISCOVERY``
  unset = ``all``; the announcer announces and browses only while sync is enabled, and
  ``/sync/discover`` answers ``{"devices": []}`` while it is off, as §3.17 says); D-Bus is
  ``auto`` (on when the ``dbus`` extra is installed and a session bus exists);
- built from an explicit mapping (tests, the simulator, ``knowledge_surface``): both are off
  unless the mapping switches them on, so no test ever touches a real network or bus by
  default.

The announced port is the knowledge listener's bound port (``SurfaceContext.listen_urls``),
known before the first request; a context without it (tests that build the app themselves)
falls back to learning it from the first request.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from troupe.actors.knowledge.discovery import DiscoverySettings
from troupe.dbus import MemoryBusChild, MemoryBusSettings
from troupe.runtime import ChildSpec

from ._routes_discovery import discovery_settings_extra, listen_port_extra

surface_name = "knowledge"


@dataclass
class DesktopServices:
    discovery: DiscoverySettings
    bus: MemoryBusChild | None = None

    @property
    def services(self) -> tuple[ChildSpec, ...]:
        return () if self.bus is None else (self.bus.spec,)

    def bind(self, context: Any) -> None:
        """Hand the running server to the services (from the surface's ``create_app``)."""
        extras = context.env.extras
        extras.setdefault(discovery_settings_extra, self.discovery)
        port = listen_port_of(context)
        if port is not None:
            extras[listen_port_extra] = port
        if self.bus is not None:
            self.bus.bind(context.env, context.engine, context.system)


def listen_port_of(context: Any) -> int | None:
    """The knowledge listener's bound port, when the context knows it."""
    url = (getattr(context, "listen_urls", None) or {}).get(surface_name)
    if not url:
        return None
    port = urllib.parse.urlsplit(url).port
    return port or None


def desktop_services(environ: Mapping[str, str], *, real_environment: bool,
                     discovery: DiscoverySettings | None = None) -> DesktopServices:
    """The services for ``environ`` (see the module docstring for the defaults); raises
    ``MemoryBusUnavailable`` (a ``ServeError``) or ``ValueError`` for a bad setting."""
    if discovery is None:
        discovery = DiscoverySettings.from_environment(environ, default="all" if real_environment else "off")
    bus_settings = MemoryBusSettings.from_environment(
        environ if real_environment else {"TROUPE_KNOWLEDGE_DBUS": "off", **environ})
    return DesktopServices(discovery, MemoryBusChild(bus_settings) if bus_settings.enabled else None)


__all__ = ["DesktopServices", "desktop_services", "listen_port_of"]
