"""A character surface on a real hypercorn (127.0.0.1, free port) over a real Engine and
ActorSystem, built from ``new_character_surface`` exactly as ``troupe serve`` builds it.

``faults`` lets a test make the app's asks fail the way the runtime fails them (a crashed
turn, a full mailbox) for chosen request types, while everything else reaches the real
actors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from tests.http._harness import start_hypercorn
from troupe._config import ServeOptions
from troupe.http import ShutdownSignal
from troupe.http.character import new_character_surface
from troupe.models import LocalModel
from troupe.runtime import ActorCrashed, ActorSystem, Overloaded, real_env
from troupe.server import SurfaceContext
from troupe.storage import Engine


class FaultySystem:
    """The real system, except that asking with a message whose type is in ``faults``
    raises that fault (an exception instance, raised fresh each time)."""

    def __init__(self, system: ActorSystem, faults: dict[type, str]) -> None:
        self.system = system
        self.faults = faults

    def ref(self, kind: str, key: str) -> Any:
        real = self.system.ref(kind, key)
        faults = self.faults

        class Ref:
            async def ask(self, message: Any, *, timeout: float) -> Any:
                fault = faults.get(type(message))
                if fault == "crash":
                    raise ActorCrashed(kind, key, "injected by the test")
                if fault == "overloaded":
                    raise Overloaded(kind, key, 2.0)
                return await real.ask(message, timeout=timeout)

        return Ref()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.system, name)


@dataclass
class CharacterServer:
    env: Any
    engine: Engine
    system: ActorSystem
    port: int = 0
    faults: dict[type, str] = field(default_factory=dict)
    shutdown_requests: list[bool] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30, **options)


async def start_character_server(
    nursery: trio.Nursery, data_dir: str, *, environ: dict[str, str] | None = None,
) -> CharacterServer:
    env = real_env(data_dir)
    if env.model is None:
        env.model = LocalModel()
    server_box: list[CharacterServer] = []
    surface = new_character_surface(environ or {}, request_shutdown=lambda: server_box[0].shutdown_requests.append(True))
    engine = await Engine.open(env, nursery=nursery, migrations=list(surface.migrations))
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    server = CharacterServer(env, engine, system)
    server_box.append(server)
    faulty = FaultySystem(system, server.faults)
    context = SurfaceContext(ServeOptions(), env, engine, faulty, ShutdownSignal(), None)  # type: ignore[arg-type]
    server.port = await start_hypercorn(nursery, surface.create_app(context))
    return server


def history_body(*messages: tuple[str, str]) -> dict[str, str]:
    """``{"input_history": "<JSON array>"}`` of ``(role, content)`` pairs."""
    import json

    return {"input_history": json.dumps([{"role": role, "content": content} for role, content in messages],
                                        ensure_ascii=False)}
