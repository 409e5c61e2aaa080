"""Listener sockets: resolve, refuse non-loopback, bind, and learn the real port.

Why troupe binds the sockets itself instead of handing ``HOST:PORT`` to hypercorn: the real
port (``port 0`` asks the OS for one) must be known and printed, the loopback rule must be
checked on the *resolved* addresses (``localhost`` could resolve to anything), and every
listener must be bound before storage is opened, so that a taken port fails the start at once
without touching the data directory.  Each bound socket is handed to hypercorn as
``fd://N`` (hypercorn adopts the descriptor and calls ``listen``); nothing accepts
connections until hypercorn has started.

Trade-off: one address per surface.  ``localhost`` binds its IPv4 address when it has one
(the first resolved address otherwise); listen twice under two names if both families are
needed.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import trio

from troupe._config import ListenAddress

from ._exceptions import ListenerError, ListenerRefused


@dataclass
class BoundListener:
    """A bound (not yet listening) socket for one surface and the URL it will answer on."""

    surface: str
    socket: socket.socket | None
    url: str

    def hand_over(self) -> str:
        """Give the descriptor away as a hypercorn ``fd://N`` bind; the socket object is
        detached so that it no longer closes the descriptor."""
        assert self.socket is not None, "a listener is handed over once"
        descriptor = self.socket.detach()
        self.socket = None
        return f"fd://{descriptor}"

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
            self.socket = None


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


async def resolve_listener(surface: str, address: ListenAddress, *, allow_non_loopback: bool) -> tuple:
    """The ``getaddrinfo`` entry to bind; refuses non-loopback unless allowed."""
    try:
        entries = await trio.socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenerError(f"listener {surface}: cannot resolve {address.host!r}: {exc}") from exc
    if not entries:
        raise ListenerError(f"listener {surface}: {address.host!r} resolves to nothing")
    outside = sorted({entry[4][0] for entry in entries if not _is_loopback(entry[4][0])})
    if outside and not allow_non_loopback:
        raise ListenerRefused(
            f"listener {surface}: {address} is not a loopback address ({', '.join(outside)}); "
            "set TROUPE_ALLOW_NON_LOOPBACK=1 to listen beyond this machine"
        )
    entries.sort(key=lambda entry: entry[0] != socket.AF_INET)
    return entries[0]


def bind_listener(surface: str, address: ListenAddress, entry: tuple) -> BoundListener:
    """Bind (without listening) and read back the real address."""
    family, socket_type, protocol, _, socket_address = entry
    listener = socket.socket(family, socket_type, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listener.bind(socket_address)
    except OSError as exc:
        listener.close()
        raise ListenerError(f"listener {surface}: cannot bind {address}: {exc.strerror or exc}") from exc
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    return BoundListener(surface, listener, f"http://{shown}:{port}")


__all__ = ["BoundListener", "bind_listener", "resolve_listener"]
