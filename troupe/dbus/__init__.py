"""troupe.dbus: the knowledge surface on the D-Bus session bus (``com.kylin.pixiu.Memory``;
the optional ``dbus`` extra, ``jeepney``).  ``_service`` answers the methods; ``_supervised``
runs it as a supervised child of ``troupe serve`` (``TROUPE_KNOWLEDGE_DBUS``)."""

from ._service import (
    MemoryBusError,
    MemoryBusNameTaken,
    MemoryBusService,
    bus_name,
    dbus_ask_timeout_seconds,
    dbus_calls_concurrent_max,
    dbus_request_characters_max,
    error_prefix,
    interface_name,
    methods,
    object_path,
    serve_memory_bus,
)
from ._supervised import (
    MemoryBusChild,
    MemoryBusSettings,
    MemoryBusUnavailable,
    dbus_address_prefixes,
    dbus_extra_installed,
    dbus_retry_seconds_max,
    dbus_retry_seconds_min,
    dbus_service_name,
    dbus_variable,
    memory_bus_child,
    session_bus_variable,
)

__all__ = [
    "MemoryBusChild",
    "MemoryBusError",
    "MemoryBusNameTaken",
    "MemoryBusService",
    "MemoryBusSettings",
    "MemoryBusUnavailable",
    "bus_name",
    "dbus_address_prefixes",
    "dbus_ask_timeout_seconds",
    "dbus_calls_concurrent_max",
    "dbus_extra_installed",
    "dbus_request_characters_max",
    "dbus_retry_seconds_max",
    "dbus_retry_seconds_min",
    "dbus_service_name",
    "dbus_variable",
    "error_prefix",
    "interface_name",
    "memory_bus_child",
    "methods",
    "object_path",
    "serve_memory_bus",
    "session_bus_variable",
]
