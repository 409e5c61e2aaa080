"""``troupe serve`` runs com.kylin.pixiu.Memory as a supervised service of the knowledge
surface (``TROUPE_KNOWLEDGE_DBUS``), through the real start path (``troupe.server.serve``),
against a private dbus-daemon the test starts: the name is served while the server runs and
released at shutdown; an unreachable bus is logged and HTTP keeps serving; the settings'
defaults and refusals."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess

import httpx
import pytest
import trio

pytest.importorskip("jeepney", reason="the dbus extra (jeepney) is not installed")
if shutil.which("dbus-daemon") is None:
    pytest.skip("dbus-daemon is not installed on this machine", allow_module_level=True)

from jeepney import DBusAddress, MessageType, message_bus, new_method_call  # noqa: E402
from jeepney.io.trio import open_dbus_router  # noqa: E402

from troupe.dbus import (  # noqa: E402
    MemoryBusSettings,
    MemoryBusUnavailable,
    bus_name,
    interface_name,
    object_path,
)
from troupe.http.knowledge import new_knowledge_surface  # noqa: E402
from troupe.server import ListenAddress, ServeOptions, serve  # noqa: E402


@pytest.fixture
def bus_address():
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                              stdout=subprocess.PIPE, text=True)
    address = daemon.stdout.readline().strip()
    assert address, "dbus-daemon printed no address"
    yield address
    daemon.terminate()
    daemon.wait(timeout=5)


def options(tmp_path) -> ServeOptions:
    return ServeOptions(data_dir=str(tmp_path / "data"),
                        listen={"knowledge": ListenAddress("127.0.0.1", 0)})


async def start(nursery, tmp_path, monkeypatch, dbus: str):
    monkeypatch.setenv("TROUPE_KNOWLEDGE_DBUS", dbus)
    monkeypatch.setenv("TROUPE_KNOWLEDGE_DISCOVERY", "off")
    surface = new_knowledge_surface()  # what default_surfaces() builds: the process environment
    return await nursery.start(lambda task_status: serve(
        options(tmp_path), surfaces=[surface], handle_signals=False, print_line=lambda line: None,
        task_status=task_status)), surface


async def name_has_owner(router) -> bool:
    reply = await router.send_and_get_reply(message_bus.NameHasOwner(bus_name))
    return bool(reply.body[0])


async def test_serve_owns_the_name_answers_calls_and_releases_it_at_shutdown(tmp_path, monkeypatch, bus_address):
    target = DBusAddress(object_path, bus_name=bus_name, interface=interface_name)
    async with open_dbus_router(bus_address) as router:
        async with trio.open_nursery() as nursery:
            handle, surface = await start(nursery, tmp_path, monkeypatch, bus_address)
            [service] = surface.services
            assert service.name == "knowledge_dbus"
            with trio.fail_after(10):
                while not await name_has_owner(router):
                    await trio.sleep(0.05)
            write = {"source_type": "OCR", "scope": "user:alice", "raw": {"title": "家庭支出", "body": {"电费": 210}}}
            reply = await router.send_and_get_reply(
                new_method_call(target, "Write", "s", (json.dumps(write, ensure_ascii=False),)))
            assert reply.header.message_type == MessageType.method_return, reply.body
            evidence_id = json.loads(reply.body[0])["evidence_id"]
            # the same actors as HTTP: the evidence written over D-Bus is read over HTTP
            async with httpx.AsyncClient(base_url=handle.urls["knowledge"]) as client:
                evidence = await client.get(f"/evidence/{evidence_id}")
                assert evidence.status_code == 200 and evidence.json()["raw"]["title"] == "家庭支出"
            reply = await router.send_and_get_reply(new_method_call(target, "SyncStatus"))
            assert reply.header.message_type == MessageType.method_return
            assert "enabled" in json.loads(reply.body[0])
            handle.request_shutdown()
        # serve returned: the service was cancelled with the system and the name is free again
        with trio.fail_after(5):
            while await name_has_owner(router):
                await trio.sleep(0.05)


async def test_an_unreachable_bus_is_logged_and_http_keeps_serving(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="troupe.dbus")
    missing = f"unix:path={tmp_path}/no-such-bus"
    async with trio.open_nursery() as nursery:
        handle, surface = await start(nursery, tmp_path, monkeypatch, missing)
        async with httpx.AsyncClient(base_url=handle.urls["knowledge"]) as client:
            assert (await client.get("/health")).status_code == 200
        with trio.fail_after(5):
            while not any("is not served" in record.getMessage() for record in caplog.records):
                await trio.sleep(0.05)
        async with httpx.AsyncClient(base_url=handle.urls["knowledge"]) as client:
            assert (await client.get("/health")).status_code == 200
        handle.request_shutdown()
    [record] = [record for record in caplog.records if "is not served" in record.getMessage()]
    assert missing in record.getMessage() and "HTTP keeps serving" in record.getMessage()


async def test_a_second_server_finds_the_name_taken_and_says_so(tmp_path, monkeypatch, caplog, bus_address):
    caplog.set_level(logging.WARNING, logger="troupe.dbus")
    async with open_dbus_router(bus_address) as router:
        await router.send_and_get_reply(message_bus.RequestName(bus_name, 4))  # someone else owns it
        async with trio.open_nursery() as nursery:
            handle, surface = await start(nursery, tmp_path, monkeypatch, bus_address)
            with trio.fail_after(5):
                while not any("owned by another process" in record.getMessage() for record in caplog.records):
                    await trio.sleep(0.05)
            handle.request_shutdown()


def test_settings_defaults_and_refusals(monkeypatch):
    assert MemoryBusSettings.from_environment({}).address is None  # auto without a session bus: off
    auto = MemoryBusSettings.from_environment({"DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus"})
    assert (auto.mode, auto.address) == ("auto", "unix:path=/run/user/1000/bus")
    off = MemoryBusSettings.from_environment({"TROUPE_KNOWLEDGE_DBUS": "off",
                                              "DBUS_SESSION_BUS_ADDRESS": "unix:path=/x"})
    assert not off.enabled
    assert MemoryBusSettings.from_environment({"TROUPE_KNOWLEDGE_DBUS": "session"}).address is None
    with pytest.raises(MemoryBusUnavailable):
        MemoryBusSettings.from_environment({"TROUPE_KNOWLEDGE_DBUS": "yes please"})
    # a surface built from an explicit mapping (tests, the simulator) never connects by itself
    assert new_knowledge_surface({"DBUS_SESSION_BUS_ADDRESS": "unix:path=/x"}, os_release_text="").services == ()
