"""/sync/discover with real mDNS (zeroconf) on loopback: three instances announce and browse
on 127.0.0.1 only (never a real network).  The sync runtime's facts (on/off, this device,
the trust list) are given per instance through ``env.extras["sync_facts"]``."""

from __future__ import annotations

import pytest
import trio

from tests.http._harness import start_hypercorn
from troupe._config import ServeOptions
from troupe.actors.knowledge.discovery import DiscoverySettings
from troupe.http import ShutdownSignal
from troupe.http.knowledge import new_knowledge_surface
from troupe.http.knowledge._routes_discovery import SyncFacts, sync_off
from troupe.models import HashedEmbedder, LocalModel
from troupe.runtime import ActorSystem, real_env
from troupe.server import SurfaceContext
from troupe.storage import Engine

from ._knowledge_harness import wait_until

# Every instance on loopback sees every announcement: announcing tests take turns (conftest).
pytestmark = pytest.mark.usefixtures("mdns_turn")

loopback = DiscoverySettings(enabled=True, interfaces=("127.0.0.1",))


class Device:
    def __init__(self, device_id: str, name: str) -> None:
        self.facts = SyncFacts(enabled=True, self_id=device_id, self_name=name)
        self.port = 0

    async def current(self) -> SyncFacts:
        return self.facts


async def start(nursery, data_dir: str, device: Device, settings=loopback) -> str:
    env = real_env(data_dir)
    env.model, env.embedder = LocalModel(), HashedEmbedder(64)
    env.extras.update(discovery_settings=settings, sync_facts=device.current)
    surface = new_knowledge_surface({}, os_release_text="")
    engine = await Engine.open(env, nursery=nursery, migrations=list(surface.migrations))
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    context = SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)  # type: ignore[arg-type]
    device.port = await start_hypercorn(nursery, surface.create_app(context))
    return f"http://127.0.0.1:{device.port}"


async def test_three_devices_find_each_other_on_loopback(nursery, tmp_path):
    import httpx

    alpha, beta, gamma = Device("dev_alpha", "Alpha"), Device("dev_beta", "书房"), Device("dev_gamma", "Gamma")
    alpha.facts = SyncFacts(enabled=True, self_id="dev_alpha", self_name="Alpha", paired_ids=frozenset({"dev_beta"}))
    urls = [await start(nursery, str(tmp_path / name), device)
            for name, device in (("a", alpha), ("b", beta), ("c", gamma))]
    async with httpx.AsyncClient(timeout=10) as client:
        for url in urls:  # the first request teaches each announcer its real port
            assert (await client.get(url + "/health")).status_code == 200

        async def both_seen():
            devices = (await client.get(urls[0] + "/sync/discover")).json()["devices"]
            return devices if len(devices) == 2 and all(d["port"] != 8765 for d in devices) else None

        devices = await wait_until(both_seen, seconds=20, step=0.25)
        by_id = {device["device_id"]: device for device in devices}
        assert set(by_id) == {"dev_beta", "dev_gamma"}  # itself filtered out
        assert by_id["dev_beta"] == {"device_id": "dev_beta", "device_name": "书房", "addresses": ["127.0.0.1"],
                                     "port": beta.port, "pairable": True, "paired": True}
        assert by_id["dev_gamma"]["paired"] is False and by_id["dev_gamma"]["port"] == gamma.port

        # sync off on gamma: it answers [] and withdraws itself; alpha stops seeing it
        gamma.facts = sync_off
        assert (await client.get(urls[2] + "/sync/discover")).json() == {"devices": []}

        async def gamma_gone():
            devices = (await client.get(urls[0] + "/sync/discover")).json()["devices"]
            return [d["device_id"] for d in devices] == ["dev_beta"]

        await wait_until(gamma_gone, seconds=20, step=0.25)


async def test_discovery_off_answers_an_empty_list(nursery, tmp_path):
    import httpx

    device = Device("dev_solo", "Solo")
    url = await start(nursery, str(tmp_path / "solo"), device, settings=DiscoverySettings(enabled=False))
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(url + "/sync/discover")
        assert response.status_code == 200 and response.json() == {"devices": []}
        assert (await client.post(url + "/sync/discover")).status_code == 405
    await trio.sleep(0)
