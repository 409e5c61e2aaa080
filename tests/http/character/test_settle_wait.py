"""``/new_dialog`` and ``/release_character`` wait for a running renew/settle and then answer
(found by the character simulator workload: both answered 500, because the character actor
defers them with ``ReplyDeferred`` while the settle lock is held and the routes asked plainly)."""

from __future__ import annotations

import json

import trio

from troupe._config import ServeOptions
from troupe.actors.character import StoreMemory
from troupe.http import ShutdownSignal
from troupe.http.character import new_character_surface
from troupe.models import LocalModel
from troupe.runtime import ActorSystem, real_env
from troupe.server import SurfaceContext
from troupe.sim._asgi import AsgiDriver
from troupe.storage import Engine

from ._character_harness import history_body


class GatedMemory(StoreMemory):
    """The real memory, except that the settle's compression waits for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.compressing = trio.Event()

    async def run_task(self, port, task):
        if task.kind == "recent_compression":
            self.compressing.set()
            await self.gate.wait()
        return await super().run_task(port, task)


async def test_new_dialog_and_release_wait_for_the_settle(nursery, tmp_path):
    env = real_env(str(tmp_path / "data"))
    env.model = LocalModel()
    memory = GatedMemory()
    surface = new_character_surface({}, memory=memory)
    engine = await Engine.open(env, nursery=nursery, migrations=list(surface.migrations))
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    context = SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)
    driver = AsgiDriver(surface.create_app(context))
    await driver.startup(nursery)
    body = json.dumps(history_body(("user", "我喜欢吃寿司"), ("assistant", "记住啦"))).encode()
    headers = [("content-type", "application/json")]

    settled = await driver.request("POST", "/settle/%E5%B0%8F%E5%A4%A9", headers=headers, body=body)
    assert settled.json() == {"status": "settled"}
    await memory.compressing.wait()
    answers: dict[str, object] = {}

    async def ask(name: str, method: str, path: str) -> None:
        answers[name] = await driver.request(method, path)

    async with trio.open_nursery() as requests:
        requests.start_soon(ask, "new_dialog", "GET", "/new_dialog/%E5%B0%8F%E5%A4%A9")
        requests.start_soon(ask, "release", "POST", "/release_character/%E5%B0%8F%E5%A4%A9"
                            "?derived_task_claim_token=op-1&derived_task_claim_generation=0")
        await trio.sleep(3)
        assert answers == {}  # both wait for the settle lock
        memory.gate.set()
    new_dialog, release = answers["new_dialog"], answers["release"]
    assert new_dialog.status == 200, new_dialog.body
    assert "我喜欢吃寿司" in new_dialog.body.decode()
    assert release.status == 200, release.body
    assert release.json()["status"] == "success"
    await driver.shutdown()


class TwoCrashes:
    """Fault points that make the next two turns raise after they ran, then stay quiet."""

    def __init__(self) -> None:
        self.left = 2

    def fires(self, point: str) -> bool:
        if point == "turn_raises_after" and self.left:
            self.left -= 1
            return True
        return False

    def delay_seconds(self, point: str) -> float:
        return 0.0


async def test_two_crashed_health_checks_do_not_take_the_surface_down(nursery, tmp_path):
    # Two crashes of one message make it poison, refused from then on; every Health was
    # the same message, so every route answered 500 until the process restarted.
    env = real_env(str(tmp_path / "data"))
    env.model = LocalModel()
    surface = new_character_surface({})
    engine = await Engine.open(env, nursery=nursery, migrations=list(surface.migrations))
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    driver = AsgiDriver(surface.create_app(SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)))
    await driver.startup(nursery)
    env.fault_points = TwoCrashes()
    statuses = [(await driver.request("GET", "/health")).status for _ in range(2)]
    assert statuses == [500, 500]
    assert (await driver.request("GET", "/health")).status == 200
    assert (await driver.request("GET", "/get_recent_history/%E5%B0%8F%E5%A4%A9")).status == 200
    await driver.shutdown()
