"""The D-Bus service as a supervised child of ``troupe serve`` (``TROUPE_KNOWLEDGE_DBUS``).

Why a supervised child of the knowledge surface (``Surface.services``): the bus connection
must live exactly as long as the server (started with the actor system, cancelled with it at
shutdown, so the name is released when the process stops) and must never take the HTTP
listeners down with it.  A bus that cannot be reached, or a name another process owns, is the
outside world's problem, not a crash: the child logs one line saying why (the ``troupe.dbus``
logger, shown on stderr), keeps the HTTP surface serving and tries again on a doubling
backoff (``dbus_retry_seconds_min`` to ``dbus_retry_seconds_max``); ``state`` says where it
stands.

Trade-off of the wiring: services are declared before the actor system exists, and the
service needs the running parts (Env, engine, actor system).  The child therefore reports
itself started at once and waits until the knowledge app is built (``bind``, called from the
surface's ``create_app``); a server whose knowledge listener is switched off never binds it,
so it never connects.

What a desktop user expects (the contract lists D-Bus beside HTTP and WebSocket, with no port
to configure): ``auto``, the default, serves ``com.kylin.pixiu.Memory`` on the session bus
whenever the ``dbus`` extra (``jeepney``) is installed and the process has a session bus
(``DBUS_SESSION_BUS_ADDRESS``); a headless server, or one without the extra, stays off
without a word.  ``session`` insists (a missing extra fails the start; a missing session bus
is logged), ``off`` never connects, and a D-Bus address (``unix:path=...``, ``tcp:...``)
names a bus explicitly (tests use a private ``dbus-daemon``).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from troupe.runtime import ChildSpec
from troupe.server import ServeError

from ._service import MemoryBusNameTaken, MemoryBusService, bus_name, serve_memory_bus

logger = logging.getLogger("troupe.dbus")

dbus_variable = "TROUPE_KNOWLEDGE_DBUS"
"""``auto`` (default) | ``session`` | ``off`` | a D-Bus address."""
session_bus_variable = "DBUS_SESSION_BUS_ADDRESS"
dbus_service_name = "knowledge_dbus"
dbus_retry_seconds_min = 1.0
dbus_retry_seconds_max = 60.0
dbus_address_prefixes = ("unix:", "tcp:", "nonce-tcp:", "launchd:", "autolaunch:")

assert 0 < dbus_retry_seconds_min <= dbus_retry_seconds_max


class MemoryBusUnavailable(ServeError):
    """``TROUPE_KNOWLEDGE_DBUS`` asks for D-Bus and this build cannot serve it (bad value, or
    ``session`` without the ``dbus`` extra): the start fails with this line."""


def dbus_extra_installed() -> bool:
    return importlib.util.find_spec("jeepney") is not None


@dataclass(frozen=True)
class MemoryBusSettings:
    mode: str = "off"
    """``off`` | ``auto`` | ``session`` | ``address``."""
    address: str | None = None
    """Where to connect; None when there is nothing to connect to."""

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> MemoryBusSettings:
        value = environ.get(dbus_variable, "auto").strip() or "auto"
        session = environ.get(session_bus_variable, "").strip() or None
        if value == "off":
            return cls("off")
        if value == "auto":
            return cls("auto", session if dbus_extra_installed() else None)
        if not dbus_extra_installed():
            raise MemoryBusUnavailable(f"{dbus_variable}={value} needs the dbus extra (pip install 'troupe[dbus]')")
        if value == "session":
            if session is None:
                logger.warning("D-Bus: %s=session but %s is not set; com.kylin.pixiu.Memory stays off",
                               dbus_variable, session_bus_variable)
            return cls("session", session)
        if value.startswith(dbus_address_prefixes):
            return cls("address", value)
        raise MemoryBusUnavailable(
            f"{dbus_variable} must be auto, session, off or a D-Bus address (unix:path=...), not {value!r}")


class MemoryBusChild:
    """The supervised child (``spec``); ``bind`` hands it the running server's parts."""

    def __init__(self, settings: MemoryBusSettings) -> None:
        assert settings.enabled
        self.settings = settings
        self.state = "waiting"
        """``waiting`` (for the knowledge app) | ``connecting`` | ``serving`` | ``unreachable``
        | ``name_taken``."""
        self.problem: str | None = None
        self.connections = 0
        self._parts: tuple[Any, Any, Any] | None = None
        self._bound: trio.Event | None = None

    @property
    def spec(self) -> ChildSpec:
        return ChildSpec(dbus_service_name, self.run)

    def bind(self, env: Any, engine: Any, system: Any) -> None:
        self._parts = (env, engine, system)
        if self._bound is not None:
            self._bound.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._bound = trio.Event()
        if self._parts is not None:
            self._bound.set()
        task_status.started()
        await self._bound.wait()
        assert self._parts is not None
        service = MemoryBusService(*self._parts)
        delay = dbus_retry_seconds_min
        while True:
            self.state = "connecting"
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_memory_bus, service, self.settings.address)
                    self.state, self.problem = "serving", None
                    self.connections += 1
                    delay = dbus_retry_seconds_min
                    logger.info("D-Bus: %s served on %s", bus_name, self.settings.address)
            except Exception as exc:  # the bus went away or never came: keep HTTP, try again later
                self._note_failure(exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, dbus_retry_seconds_max)

    def _note_failure(self, error: BaseException, delay: float) -> None:
        leaves = _leaves(error)
        taken = any(isinstance(leaf, MemoryBusNameTaken) for leaf in leaves)
        state = "name_taken" if taken else "unreachable"
        problem = "; ".join(f"{type(leaf).__name__}: {leaf}" for leaf in leaves)[:500]
        if (state, problem) != (self.state, self.problem):
            logger.warning("D-Bus: %s is not served on %s (%s); HTTP keeps serving, retrying in %.0f s",
                           bus_name, self.settings.address, problem, delay)
        self.state, self.problem = state, problem

    def statistics(self) -> dict[str, Any]:
        return {"state": self.state, "problem": self.problem, "connections": self.connections,
                "address": self.settings.address}


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def memory_bus_child(environ: Mapping[str, str]) -> MemoryBusChild | None:
    """The child for ``environ``'s ``TROUPE_KNOWLEDGE_DBUS``, or None when D-Bus is off."""
    settings = MemoryBusSettings.from_environment(environ)
    return MemoryBusChild(settings) if settings.enabled else None


__all__ = [
    "MemoryBusChild",
    "MemoryBusSettings",
    "MemoryBusUnavailable",
    "dbus_address_prefixes",
    "dbus_extra_installed",
    "dbus_retry_seconds_max",
    "dbus_retry_seconds_min",
    "dbus_service_name",
    "dbus_variable",
    "memory_bus_child",
    "session_bus_variable",
]
