"""troupe.actors.knowledge.discovery: mDNS discovery of PIXIU devices on the local network
(``/sync/discover``): the ``DiscoveryPort``, ``ZeroconfDiscovery`` and the listing rules
(``_discovery``)."""

from ._discovery import (
    Announcement,
    DiscoveredDevice,
    DiscoveryPort,
    DiscoverySettings,
    ZeroconfDiscovery,
    api_level,
    devices_max,
    discovery_extra,
    discovery_port_of,
    discovery_variable,
    resolve_timeout_milliseconds,
    service_type,
    txt_value_characters_max,
    visible_devices,
)

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
