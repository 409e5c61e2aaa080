"""/sync/discover against the real sync actor, through the real ``troupe serve`` start path:
two servers on loopback (``TROUPE_KNOWLEDGE_DISCOVERY=127.0.0.1``, never a real network) see
each other before any request reached them, on their bound ports; after pairing, each shows
the other ``paired: true``; sync switched off answers ``{"devices": []}``.  Also the
surface's defaults: discovery follows sync under ``troupe serve``, off for an explicit
environment."""

from __future__ import annotations

import httpx
import pytest

from troupe.actors.knowledge.discovery import DiscoverySettings
from troupe.http.knowledge import new_knowledge_surface
from troupe.http.knowledge._desktop import desktop_services
from troupe.server import ListenAddress, ServeOptions, serve

from ._knowledge_harness import wait_until
from .sync._sync_harness import device_id, pair

# Every instance on loopback sees every announcement: announcing tests take turns (conftest).
pytestmark = pytest.mark.usefixtures("mdns_turn")


async def start(nursery, data_dir: str, name: str, monkeypatch):
    monkeypatch.setenv("TROUPE_KNOWLEDGE_DISCOVERY", "127.0.0.1")
    monkeypatch.setenv("TROUPE_KNOWLEDGE_DBUS", "off")
    monkeypatch.setenv("TROUPE_DEVICE_NAME", name)
    surface = new_knowledge_surface()
    options = ServeOptions(data_dir=data_dir, listen={"knowledge": ListenAddress("127.0.0.1", 0)})
    handle = await nursery.start(lambda task_status: serve(
        options, surfaces=[surface], handle_signals=False, print_line=lambda line: None, task_status=task_status))
    return handle.urls["knowledge"], handle


async def test_two_servers_discover_each_other_and_show_paired(nursery, tmp_path, monkeypatch):
    url_a, handle_a = await start(nursery, str(tmp_path / "a"), "书房工作站", monkeypatch)
    url_b, handle_b = await start(nursery, str(tmp_path / "b"), "客厅一体机", monkeypatch)
    port_b = int(url_b.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=url_a, timeout=10) as a, httpx.AsyncClient(base_url=url_b, timeout=10) as b:
        # Other test processes on this machine may announce on loopback too: look at A and B only.
        # Before any request reached B, A sees B on B's bound port (not learned from a request).
        async def on_port_b():
            devices = (await a.get("/sync/discover")).json()["devices"]
            return next((device for device in devices if device["port"] == port_b), None)

        device = await wait_until(on_port_b, seconds=20, step=0.25)
        id_a, id_b = await device_id(a), await device_id(b)

        async def seen(client, other):
            devices = (await client.get("/sync/discover")).json()["devices"]
            return next((device for device in devices if device["device_id"] == other), None)

        assert device == {"device_id": id_b, "device_name": "客厅一体机", "addresses": ["127.0.0.1"],
                          "port": port_b, "pairable": True, "paired": False}

        await pair(b, a)  # B joins A's shared domain

        async def paired_both_ways():
            seen_by_a, seen_by_b = await seen(a, id_b), await seen(b, id_a)
            return seen_by_a and seen_by_b and seen_by_a["paired"] and seen_by_b["paired"]

        await wait_until(paired_both_ways, seconds=20, step=0.25)

        # sync off on B: B answers [] at once, and A stops seeing B once B withdrew
        assert (await b.put("/sync/settings", json={"enabled": False, "paused": False})).status_code == 200
        assert (await b.get("/sync/discover")).json() == {"devices": []}

        async def b_gone():
            return await seen(a, id_b) is None

        await wait_until(b_gone, seconds=20, step=0.25)
    handle_a.request_shutdown()
    handle_b.request_shutdown()


def test_defaults_follow_the_environment_they_come_from():
    served = desktop_services({}, real_environment=True)
    assert served.discovery == DiscoverySettings(enabled=True, interfaces=None)  # follows sync, every interface
    assert desktop_services({"TROUPE_KNOWLEDGE_DISCOVERY": "off"}, real_environment=True).discovery.enabled is False
    loopback = desktop_services({"TROUPE_KNOWLEDGE_DISCOVERY": "127.0.0.1"}, real_environment=True).discovery
    assert loopback.interfaces == ("127.0.0.1",)
    assert desktop_services({}, real_environment=False).discovery.enabled is False  # tests, the simulator
