"""The simulator's network: an httpx transport that never opens a socket.

Outbound HTTP in troupe goes through ``env.http`` (an ``httpx.AsyncClient``).  In the simulator
that client's transport is a ``SimulatedNetwork``: requests are routed by host to in-process
handlers (a webhook target, a model provider) and, with the seeded random source, delayed on
trio's mock clock, refused, or left hanging until the caller's timeout.  Everything is a
function of the seed, like the rest of the run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import trio

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]

hang_seconds = 3600.0
"""How long a hanging request hangs: longer than any client timeout we configure."""


@dataclass
class NetworkFaults:
    """Probabilities per request; the counters say what was injected."""

    refuse_probability: float = 0.0
    hang_probability: float = 0.0
    latency_seconds_max: float = 0.0
    refused: int = 0
    hung: int = 0

    def __post_init__(self) -> None:
        assert 0.0 <= self.refuse_probability + self.hang_probability <= 1.0
        assert self.latency_seconds_max >= 0.0


routed_host_address = "93.184.216.34"


class SimulatedNetwork(httpx.AsyncBaseTransport):
    def __init__(self, random, faults: NetworkFaults | None = None) -> None:
        self._random = random
        self.faults = faults or NetworkFaults()
        self._routes: dict[str, Handler] = {}
        self.requests: list[tuple[str, str]] = []

    def route(self, host: str, handler: Handler) -> None:
        """Send requests for ``host`` (``name`` or ``name:port``) to ``handler``."""
        self._routes[host] = handler

    async def resolve(self, host: str) -> list[str]:
        """Name resolution on this network (``env.extras["resolver"]``): a routed name has one
        public address (documentation's example.com, never a private one, so outbound-target
        checks treat it as the internet); any other name does not exist."""
        if host in self._routes or any(route.split(":", 1)[0] == host for route in self._routes):
            return [routed_host_address]
        raise OSError(f"simulated network: {host} does not resolve")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host if request.url.port is None else f"{request.url.host}:{request.url.port}"
        self.requests.append((request.method, str(request.url)))
        handler = self._routes.get(host) or self._routes.get(request.url.host)
        faults = self.faults
        if faults.latency_seconds_max:
            await trio.sleep(self._random.random() * faults.latency_seconds_max)
        draw = self._random.random()
        if handler is None or draw < faults.refuse_probability:
            if handler is not None:
                faults.refused += 1
            raise httpx.ConnectError(f"simulated network: connection to {host} refused", request=request)
        if draw < faults.refuse_probability + faults.hang_probability:
            faults.hung += 1
            # httpx enforces timeouts in the transport, so a simulated hang must honour them.
            read_timeout = (request.extensions.get("timeout") or {}).get("read")
            await trio.sleep(hang_seconds if read_timeout is None else min(read_timeout, hang_seconds))
            raise httpx.ReadTimeout(f"simulated network: {host} did not answer", request=request)
        await request.aread()
        response = await handler(request)
        response.request = request
        return response


def simulated_http_client(network: SimulatedNetwork) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=network)
