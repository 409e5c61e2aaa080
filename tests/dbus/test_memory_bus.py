"""com.kylin.pixiu.Memory against a private dbus-daemon the test starts (never the user's
session bus): Write, Query, Forget, SyncStatus and a refusal as a D-Bus error."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import trio

pytest.importorskip("jeepney", reason="the dbus extra (jeepney) is not installed")
if shutil.which("dbus-daemon") is None:
    pytest.skip("dbus-daemon is not installed on this machine", allow_module_level=True)

from jeepney import DBusAddress, MessageType, new_method_call  # noqa: E402
from jeepney.io.trio import open_dbus_router  # noqa: E402

from troupe.dbus import MemoryBusService, bus_name, interface_name, object_path, serve_memory_bus  # noqa: E402
from troupe.http.knowledge import new_knowledge_surface  # noqa: E402
from troupe.models import HashedEmbedder, LocalModel  # noqa: E402
from troupe.runtime import ActorSystem, real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402


@pytest.fixture
def bus_address():
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                              stdout=subprocess.PIPE, text=True)
    address = daemon.stdout.readline().strip()
    assert address, "dbus-daemon printed no address"
    yield address
    daemon.terminate()
    daemon.wait(timeout=5)


async def test_write_query_forget_and_sync_status(nursery, tmp_path, bus_address):
    env = real_env(str(tmp_path / "data"))
    env.model, env.embedder = LocalModel(), HashedEmbedder(64)
    surface = new_knowledge_surface({}, os_release_text="")
    engine = await Engine.open(env, nursery=nursery, migrations=list(surface.migrations))
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    await nursery.start(serve_memory_bus, MemoryBusService(env, engine, system), bus_address)

    target = DBusAddress(object_path, bus_name=bus_name, interface=interface_name)
    async with open_dbus_router(bus_address) as router:
        async def call(method, document=None):
            body = () if document is None else (json.dumps(document, ensure_ascii=False),)
            reply = await router.send_and_get_reply(
                new_method_call(target, method, "s" if body else None, body))
            return reply.header.message_type, reply

        write = {"source_type": "OCR", "scope": "user:alice", "raw": {"title": "家庭支出", "body": {"电费": 210}}}
        kind, reply = await call("Write", write)
        assert kind == MessageType.method_return, reply.body
        evidence_id = json.loads(reply.body[0])["evidence_id"]
        assert evidence_id.startswith("evd_")

        with trio.fail_after(10):
            while True:
                kind, reply = await call("Query", {"text": "电费", "scope": "user:alice"})
                assert kind == MessageType.method_return, reply.body
                if json.loads(reply.body[0]).get("source_evidence"):
                    break
                await trio.sleep(0.1)

        kind, reply = await call("Forget", {"command": "忘记家庭支出", "scope": "user:alice", "confirm": False})
        assert kind == MessageType.method_return, reply.body
        assert "targets" in json.loads(reply.body[0])

        kind, reply = await call("SyncStatus")
        assert kind == MessageType.method_return
        assert "enabled" in json.loads(reply.body[0])

        kind, reply = await call("Write", {"source_type": "NOPE", "scope": "user:alice", "raw": {}})
        assert kind == MessageType.error
        assert reply.header.fields[4] == "com.kylin.pixiu.Memory.Error.INVALID_REQUEST"  # error name
        assert json.loads(reply.body[0])["error"] == "INVALID_REQUEST"
    nursery.cancel_scope.cancel()
