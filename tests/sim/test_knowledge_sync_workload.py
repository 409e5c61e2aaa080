"""The multi-device simulation (``troupe/sim/_devices.py``) and the ``knowledge-sync`` workload."""

from __future__ import annotations

import random

import httpx
import pytest
import trio

from troupe.runtime import Tracer
from troupe.sim import SimulationConfig, make_workloads, run_simulation, workload_names
from troupe.sim._asgi import AsgiDriver
from troupe.sim._devices import DeviceIds, DeviceMesh, MeshFaults, device_base_url, multi_device


def test_registered_outside_the_default_set():
    assert "knowledge-sync" in workload_names()
    assert "knowledge-sync" not in {workload.name for workload in make_workloads(None)}
    assert multi_device(make_workloads(["knowledge-sync"]))
    assert not multi_device(make_workloads(None))


def test_device_ids_never_collide_across_devices():
    first, second = DeviceIds(0), DeviceIds(1)
    ids = {first.new_id("knw_") for _ in range(3)} | {second.new_id("knw_") for _ in range(3)}
    assert len(ids) == 6
    assert first.new_id("knw_").startswith("knw_d0x")


async def _counting_app(scope, receive, send):
    if scope["type"] != "http":
        return
    _counting_app.calls.append(scope["path"])
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


def _mesh(faults: MeshFaults) -> DeviceMesh:
    mesh = DeviceMesh(random.Random(3), faults, Tracer())
    for index in range(3):
        mesh.register(index)
    return mesh


async def test_mesh_routes_refuses_partitions_and_heals():
    _counting_app.calls = []
    mesh = _mesh(MeshFaults())
    mesh.up(1, AsgiDriver(_counting_app))
    client = httpx.AsyncClient(transport=mesh.transport(0))
    assert (await client.post(device_base_url(1) + "/sync/peer/ops", content=b"{}")).status_code == 200
    with pytest.raises(httpx.ConnectError):
        await client.post(device_base_url(2) + "/x")  # device 2 is down
    mesh.partition(0, 1)
    with pytest.raises(httpx.ConnectError):
        await client.post(device_base_url(1) + "/x")
    mesh.heal()
    assert (await client.get(device_base_url(1) + "/y")).status_code == 200
    assert _counting_app.calls == ["/sync/peer/ops", "/y"]
    assert mesh.faults.refused == 2 and mesh.faults.partitions == 1


async def test_mesh_loses_replies_after_applying_and_delivers_late_duplicates():
    _counting_app.calls = []
    mesh = _mesh(MeshFaults(lose_reply_probability=0.999, duplicate_probability=1.0))
    mesh.up(1, AsgiDriver(_counting_app))
    async with trio.open_nursery() as nursery:
        mesh.nursery = nursery
        client = httpx.AsyncClient(transport=mesh.transport(0))
        with pytest.raises(httpx.ReadError):
            await client.post(device_base_url(1) + "/sync/peer/ops", content=b"{}")
        assert _counting_app.calls == ["/sync/peer/ops"]  # applied, though the caller saw an error
        await trio.sleep(10)
    assert _counting_app.calls == ["/sync/peer/ops", "/sync/peer/ops"]  # the duplicate, later
    assert mesh.faults.duplicates == 1 and mesh.faults.replies_lost == 1


def test_three_devices_converge_without_faults():
    result = run_simulation(SimulationConfig(seed=2, steps=40, workloads=("knowledge-sync",), faults=frozenset()))
    assert [violation.text for violation in result.violations] == []
    assert result.process_lifetimes == 3  # one per device
    assert result.event_counts.get("sim_heal") == 1
    again = run_simulation(SimulationConfig(seed=2, steps=40, workloads=("knowledge-sync",), faults=frozenset()))
    assert again.trace_sha256 == result.trace_sha256


def test_single_device_crashes_and_network_faults_are_injected():
    result = run_simulation(SimulationConfig(seed=5, steps=60, workloads=("knowledge-sync",),
                                             faults=frozenset({"crash", "power_loss"}), swarm=False))
    assert result.process_crashes >= 1
    assert result.process_lifetimes == 3 + result.process_crashes + result.event_counts.get("sim_clean_restart", 0)
    assert not [violation for violation in result.violations if "aborted" in violation.text]
