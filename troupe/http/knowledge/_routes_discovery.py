"""``GET /sync/discover`` (§3.17) and the announcer that keeps this device visible.

The device list comes from the discovery port (``troupe.actors.knowledge.discovery``: mDNS
through zeroconf in production, a fake in the simulator).  What the list needs from sync —
whether the sync runtime is on, this device's id and name, and the trust list — comes from the
sync actor (``ListPeers`` on ``("knowledge_sync", "main")``); while the sync runtime is off, or
not installed, the answer is ``{"devices": []}`` and nothing is announced.

The announcer is a loop in the app's nursery (every ``discovery_refresh_seconds``): it
announces this device while sync is on (``pairable`` while it has room for another peer) and
withdraws the announcement when sync is turned off, so ``/sync/settings`` applies to
discovery without a restart.  The announced port is the knowledge listener's bound port (from
the server, ``env.extras["knowledge_listen_port"]``); an app built without it learns the port
from its first request (the contract's default 8765 until then).

Whether discovery runs is the surface's choice (``_desktop``): under ``troupe serve`` it
follows the sync runtime on every interface unless ``TROUPE_KNOWLEDGE_DISCOVERY`` says ``off``
or names the IPv4 addresses to use (``127.0.0.1`` in tests); an app built from an explicit
environment (tests, the simulator) has it off unless asked, so no test touches a real network.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from quart import Response, request

from troupe.actors.knowledge.discovery import (
    Announcement,
    DiscoverySettings,
    discovery_port_of,
    visible_devices,
)

logger = logging.getLogger("troupe.knowledge")

discovery_refresh_seconds = 2.0
sync_ask_timeout_seconds = 5.0
announce_port_default = 8765
sync_facts_extra = "sync_facts"
"""``env.extras`` key of a replacement for ``sync_facts`` (tests and the simulator)."""
discovery_settings_extra = "discovery_settings"
"""``env.extras`` key of the ``DiscoverySettings`` (set by the surface from its environment;
off when absent)."""
listen_port_extra = "knowledge_listen_port"
"""``env.extras`` key of the knowledge listener's bound port (set by the surface from
``SurfaceContext.listen_urls``)."""


@dataclass(frozen=True)
class SyncFacts:
    enabled: bool
    self_id: str = ""
    self_name: str = ""
    paired_ids: frozenset[str] = frozenset()
    peers_max: int = 32


sync_off = SyncFacts(enabled=False)


async def sync_facts(system: Any) -> SyncFacts:
    """What discovery needs from the sync runtime (``sync_peers``); ``sync_off`` when it is
    off or absent."""
    try:
        from troupe.actors.knowledge.sync import peers_max, sync_kind_name, sync_peers
    except ImportError:
        return sync_off
    if sync_kind_name not in getattr(system, "kinds", ()):
        return sync_off
    try:
        peers = await sync_peers(system, timeout=sync_ask_timeout_seconds)
    except Exception as exc:  # overloaded, crashed, timed out: show nothing rather than fail
        logger.warning("discovery could not ask the sync runtime: %s", type(exc).__name__)
        return sync_off
    if not getattr(peers, "enabled", False) or not hasattr(peers, "peers"):
        return sync_off
    me = next((peer for peer in peers.peers if peer.is_self), None)
    if me is None:
        return sync_off
    return SyncFacts(enabled=True, self_id=me.id, self_name=me.name,
                     paired_ids=frozenset(peer.id for peer in peers.peers if not peer.is_self),
                     peers_max=peers_max)


def install_discovery_routes(app: Any, dependencies: Any) -> None:
    from ._app import _register, json_response

    env = dependencies.env
    settings = env.extras.get(discovery_settings_extra) or DiscoverySettings()
    port = discovery_port_of(env, settings)
    facts_of: Callable[[], Awaitable[SyncFacts]] = env.extras.get(sync_facts_extra) or (
        lambda: sync_facts(dependencies.system))
    bound_port = env.extras.get(listen_port_extra)
    listener_port = [bound_port or announce_port_default, bound_port is not None]

    @_register(app, "sync_discover")
    async def sync_discover() -> Response:
        facts = await facts_of()
        if not facts.enabled or port is None:
            return json_response({"devices": []})
        return json_response({"devices": visible_devices(port.devices(), self_id=facts.self_id,
                                                         paired_ids=facts.paired_ids)})

    if port is None:
        return

    @app.before_request
    async def learn_port() -> None:
        if not listener_port[1]:
            server = request.scope.get("server")
            if server and server[1]:
                listener_port[0], listener_port[1] = int(server[1]), True

    async def announce_forever() -> None:
        try:
            while True:
                facts = await facts_of()
                announcement = None
                if facts.enabled:
                    announcement = Announcement(facts.self_id, facts.self_name, listener_port[0],
                                                pairable=len(facts.paired_ids) < facts.peers_max)
                try:
                    await port.announce(announcement)
                except Exception as exc:  # a network error must not end discovery for good
                    logger.warning("mDNS announcement failed: %r", exc)
                await trio.sleep(discovery_refresh_seconds)
        finally:
            with trio.CancelScope(shield=True):
                await port.close()

    @app.before_serving
    async def start_announcer() -> None:
        app.nursery.start_soon(announce_forever)


__all__ = [
    "SyncFacts",
    "announce_port_default",
    "discovery_refresh_seconds",
    "discovery_settings_extra",
    "install_discovery_routes",
    "listen_port_extra",
    "sync_facts",
    "sync_facts_extra",
    "sync_off",
    "sync_ask_timeout_seconds",
]
