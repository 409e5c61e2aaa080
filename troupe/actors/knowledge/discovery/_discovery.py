"""Local-network discovery of PIXIU devices (``GET /sync/discover``, §3.17): mDNS announce and
browse behind a port.

Why a port: mDNS is real network I/O, which the simulator must replace (and tests must keep on
loopback).  The knowledge app reaches it through ``env.extras["discovery"]`` when the Env
provides one, else builds ``ZeroconfDiscovery`` from ``DiscoverySettings`` (off unless the
server was started from the real environment or ``TROUPE_KNOWLEDGE_DISCOVERY`` asks for it).

``ZeroconfDiscovery`` uses ``python-zeroconf``'s thread-based API: zeroconf runs its own event
loop in its own thread; registering (which probes the network for about a second) and closing
run in a trio worker thread; the browser's callbacks arrive on zeroconf's thread and update a
lock-guarded table that the HTTP handler reads without waiting.  Each device announces
``<device_id>._pixiu._tcp.local.`` with TXT ``device_id``, ``device_name``, ``pairable``
(``1``/``0``; an announcement without it reads as not pairable, as the contract says of older
announcements) and ``api`` (the PIXIU API level).  Announcing ``None`` withdraws the
announcement and stops browsing: a device whose sync runtime is off neither shows itself nor
looks at others.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio

discovery_extra = "discovery"
service_type = "_pixiu._tcp.local."
discovery_variable = "TROUPE_KNOWLEDGE_DISCOVERY"
"""``off`` | ``all`` (every interface) | comma-separated IPv4 addresses to use (``127.0.0.1``)."""
devices_max = 256
"""Devices remembered from the network; announcements beyond are ignored."""
txt_value_characters_max = 128
resolve_timeout_milliseconds = 3_000
api_level = "1"


@dataclass(frozen=True)
class Announcement:
    device_id: str
    device_name: str
    port: int
    pairable: bool


@dataclass(frozen=True)
class DiscoveredDevice:
    device_id: str
    device_name: str
    addresses: tuple[str, ...]
    port: int
    pairable: bool

    def encode(self, *, paired: bool) -> dict[str, Any]:
        return {"device_id": self.device_id, "device_name": self.device_name, "addresses": list(self.addresses),
                "port": self.port, "pairable": self.pairable, "paired": paired}


class DiscoveryPort(Protocol):
    async def announce(self, announcement: Announcement | None) -> None:
        """Announce this device (replacing an earlier announcement), or withdraw it and stop
        browsing (``None``)."""

    def devices(self) -> list[DiscoveredDevice]:
        """What the network announces now (this device included when it announces)."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class DiscoverySettings:
    enabled: bool = False
    interfaces: tuple[str, ...] | None = None
    """None: every interface."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], *, default: str = "off") -> DiscoverySettings:
        value = environ.get(discovery_variable, default).strip()
        if value in ("", "off"):
            return cls(enabled=False)
        if value == "all":
            return cls(enabled=True)
        addresses = tuple(part.strip() for part in value.split(",") if part.strip())
        for address in addresses:
            socket.inet_aton(address)  # a ValueError/OSError names a bad setting at start-up
        return cls(enabled=True, interfaces=addresses)


def _text(properties: Mapping[bytes, bytes | None], name: str) -> str:
    value = properties.get(name.encode("ascii"))
    if value is None:
        return ""
    return value.decode("utf-8", errors="replace")[:txt_value_characters_max]


class ZeroconfDiscovery:
    """The production port (see the module docstring)."""

    def __init__(self, settings: DiscoverySettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._devices: dict[str, DiscoveredDevice] = {}
        self._zeroconf: Any = None
        self._browser: Any = None
        self._info: Any = None

    async def announce(self, announcement: Announcement | None) -> None:
        await trio.to_thread.run_sync(self._announce, announcement)

    def devices(self) -> list[DiscoveredDevice]:
        with self._lock:
            return list(self._devices.values())

    async def close(self) -> None:
        await trio.to_thread.run_sync(self._announce, None)

    # -- on worker threads -------------------------------------------------------------------

    def _announce(self, announcement: Announcement | None) -> None:
        if announcement is None:
            self._stop()
            return
        self._start()
        info = self._service_info(announcement)
        if self._info is not None:
            if (self._info.properties, self._info.port) == (info.properties, info.port):
                return
            self._zeroconf.unregister_service(self._info)
        self._zeroconf.register_service(info, allow_name_change=False)
        self._info = info

    def _start(self) -> None:
        if self._zeroconf is not None:
            return
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, Zeroconf

        interfaces = InterfaceChoice.All if self.settings.interfaces is None else list(self.settings.interfaces)
        self._zeroconf = Zeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
        self._browser = ServiceBrowser(self._zeroconf, service_type, handlers=[self._changed])

    def _stop(self) -> None:
        if self._zeroconf is None:
            return
        zeroconf, self._zeroconf, self._info = self._zeroconf, None, None
        if self._browser is not None:
            self._browser.cancel()
            self._browser = None
        zeroconf.unregister_all_services()
        zeroconf.close()
        with self._lock:
            self._devices.clear()

    def _addresses(self) -> list[bytes]:
        if self.settings.interfaces is not None:
            return [socket.inet_aton(address) for address in self.settings.interfaces]
        from zeroconf import get_all_addresses

        return [socket.inet_aton(address) for address in get_all_addresses() if not address.startswith("127.")]

    def _service_info(self, announcement: Announcement) -> Any:
        from zeroconf import ServiceInfo

        return ServiceInfo(
            service_type, f"{announcement.device_id}.{service_type}", port=announcement.port,
            addresses=self._addresses(),
            properties={"device_id": announcement.device_id,
                        "device_name": announcement.device_name[:txt_value_characters_max],
                        "pairable": "1" if announcement.pairable else "0", "api": api_level},
            server=f"{announcement.device_id.replace('_', '-')}.local.")

    def _changed(self, zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        """Browser callback on zeroconf's thread: resolve added/updated services, drop removed."""
        from zeroconf import ServiceStateChange

        if state_change is ServiceStateChange.Removed:
            with self._lock:
                for device_id in list(self._devices):
                    if name.startswith(f"{device_id}."):
                        del self._devices[device_id]
            return
        info = zeroconf.get_service_info(service_type, name, timeout=resolve_timeout_milliseconds)
        if info is None:
            return
        properties = info.properties or {}
        device_id = _text(properties, "device_id")
        if not device_id.startswith("dev_"):
            return
        device = DiscoveredDevice(
            device_id=device_id, device_name=_text(properties, "device_name"),
            addresses=tuple(sorted(info.parsed_addresses())), port=int(info.port or 0),
            pairable=_text(properties, "pairable") == "1")
        with self._lock:
            if device_id in self._devices or len(self._devices) < devices_max:
                self._devices[device_id] = device


def discovery_port_of(env: Any, settings: DiscoverySettings) -> DiscoveryPort | None:
    """The Env's port when it has one, else zeroconf when ``settings`` enable it, else None."""
    port = getattr(env, "extras", {}).get(discovery_extra)
    if port is not None:
        return port
    return ZeroconfDiscovery(settings) if settings.enabled else None


def visible_devices(devices: Sequence[DiscoveredDevice], *, self_id: str,
                    paired_ids: frozenset[str]) -> list[dict[str, Any]]:
    """``/sync/discover``'s list: this device filtered out, ``paired`` from the trust list,
    sorted by name then id."""
    shown = sorted((device for device in devices if device.device_id != self_id),
                   key=lambda device: (device.device_name, device.device_id))
    return [device.encode(paired=device.device_id in paired_ids) for device in shown]


__all__ = [
    "Announcement",
    "DiscoveredDevice",
    "DiscoveryPort",
    "DiscoverySettings",
    "ZeroconfDiscovery",
    "api_level",
    "devices_max",
    "discovery_extra",
    "discovery_port_of",
    "discovery_variable",
    "resolve_timeout_milliseconds",
    "service_type",
    "txt_value_characters_max",
    "visible_devices",
]
