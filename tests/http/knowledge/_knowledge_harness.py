"""A knowledge surface on a real hypercorn (127.0.0.1, free port) over a real Engine and
ActorSystem, built from ``new_knowledge_surface`` exactly as ``troupe serve`` builds it, with
the offline model and the hashed embedder; and a minimal WebSocket client (wsproto on a trio
socket: the venv has no WebSocket client library).

``faults`` lets a test make the app's asks fail the way the runtime fails them (a crashed
turn, a full mailbox) for chosen request types, while everything else reaches the real
actors."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio
import wsproto
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from tests.http._harness import start_hypercorn
from troupe._config import ServeOptions
from troupe.http import ShutdownSignal
from troupe.http.knowledge import new_knowledge_surface
from troupe.models import HashedEmbedder, LocalModel
from troupe.runtime import ActorCrashed, ActorSystem, Overloaded, real_env
from troupe.server import SurfaceContext
from troupe.storage import Engine


class FaultySystem:
    """The real system, except that asking with a message whose type is in ``faults`` raises
    that fault."""

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

            def tell(self, message: Any) -> None:
                real.tell(message)

        return Ref()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.system, name)


@dataclass
class KnowledgeServer:
    env: Any
    engine: Engine
    system: ActorSystem
    shutdown: ShutdownSignal
    port: int = 0
    faults: dict[type, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=30, **options)


async def start_knowledge_server(nursery: trio.Nursery, data_dir: str, *, migrations: list | None = None,
                                 **surface_options: Any) -> KnowledgeServer:
    env = real_env(data_dir)
    env.model = LocalModel()
    env.embedder = HashedEmbedder(64)
    surface = new_knowledge_surface({}, os_release_text='ID="debian"\nVERSION_ID="12"\n', **surface_options)
    engine = await Engine.open(env, nursery=nursery,
                               migrations=list(surface.migrations) if migrations is None else migrations)
    system = ActorSystem(env, list(surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    shutdown = ShutdownSignal()
    server = KnowledgeServer(env, engine, system, shutdown)
    faulty = FaultySystem(system, server.faults)
    context = SurfaceContext(ServeOptions(), env, engine, faulty, shutdown, None)  # type: ignore[arg-type]
    server.port = await start_hypercorn(nursery, surface.create_app(context))
    return server


# -- requests --------------------------------------------------------------------------------


def conversation(turn: int = 3, *, user: str = "请保持回答简洁", scope: str = "user:alice",
                 key: str | None = None) -> dict[str, Any]:
    return {
        "source_type": "CONVERSATION",
        "raw": {"user": user, "assistant": "好的，我会记住。"},
        "scope": scope,
        "idempotency_key": key or f"session-01:turn-{turn:02d}",
        "provenance": {"session_id": "session-01", "run_id": "run-01", "turn_id": f"turn-{turn:02d}",
                       "occurred_at": 1788393600},
    }


def bill(scope: str = "shared:home", amount: float = 210.0) -> dict[str, Any]:
    return {
        "source_type": "OCR",
        "raw": {"title": "2026年4月家庭支出清单",
                "body": {"items": [{"category": "水电燃气", "vendor": "国家电网", "amount": amount}]},
                "entities": ["国家电网"], "relations": [{"from": "国家电网", "to": "水电燃气", "type": "BELONG_TO"}]},
        "scope": scope,
        "context": {"source_device": "书房工作站", "trigger_event": "OCR_RESULT"},
    }


def lifecycle(event: str = "PRE_COMPRESS", *, key: str = "session-01:pre-compress:04", **extra: Any) -> dict[str, Any]:
    body = {"event": event, "scope": "user:alice", "session_id": "session-01", "run_id": "run-01",
            "turn_id": "turn-04", "occurred_at": 1788393600, "idempotency_key": key,
            "data": {"summary": "压缩前的受控摘要"}}
    body.update(extra)
    return body


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    document = response.json()
    assert set(document) == {"error", "message", "request_id"}, document
    assert document["error"] == code, document
    assert document["request_id"] == response.headers["x-request-id"]
    return document


async def wait_until(check: Any, *, seconds: float = 10.0, step: float = 0.02) -> Any:
    with trio.fail_after(seconds):
        while True:
            value = await check()
            if value:
                return value
            await trio.sleep(step)


# -- a minimal WebSocket client --------------------------------------------------------------


class WebSocketRejected(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"handshake rejected with {status}")
        self.status = status


class WebSocketClient:
    """One connection: ``receive_json()`` the next text message; ``closed`` holds the close
    code once the server closed."""

    def __init__(self, stream: trio.SocketStream, connection: wsproto.WSConnection) -> None:
        self.stream = stream
        self.connection = connection
        self.pending: list[Any] = []
        self.partial: list[Any] = []
        self.closed: tuple[int, str] | None = None
        self.headers: dict[str, str] = {}

    @classmethod
    async def connect(cls, port: int, path: str = "/events", *, host: str = "127.0.0.1",
                      headers: list[tuple[bytes, bytes]] | None = None) -> WebSocketClient:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        connection = wsproto.WSConnection(wsproto.ConnectionType.CLIENT)
        await stream.send_all(connection.send(Request(host=host, target=path, extra_headers=headers or [])))
        client = cls(stream, connection)
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise WebSocketRejected(0)
            connection.receive_data(data)
            for event in connection.events():
                if isinstance(event, AcceptConnection):
                    client.headers = {name.decode().lower(): value.decode() for name, value in event.extra_headers}
                    return client
                if isinstance(event, RejectConnection):
                    raise WebSocketRejected(event.status_code)
                if isinstance(event, RejectData):
                    continue

    async def receive_json(self, *, seconds: float = 10.0) -> Any:
        with trio.fail_after(seconds):
            while not self.pending:
                if self.closed is not None:
                    raise ConnectionError(f"closed {self.closed}")
                await self._pump()
        return self.pending.pop(0)

    async def wait_closed(self, *, seconds: float = 10.0) -> tuple[int, str]:
        with trio.fail_after(seconds):
            while self.closed is None:
                await self._pump()
        return self.closed

    async def _pump(self) -> None:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.closed = self.closed or (1006, "")
            return
        self.connection.receive_data(data)
        for event in self.connection.events():
            if isinstance(event, (TextMessage, BytesMessage)):
                self.partial.append(event.data)
                if event.message_finished:
                    whole = "".join(self.partial) if isinstance(event, TextMessage) else b"".join(self.partial)
                    self.partial = []
                    self.pending.append(json.loads(whole) if isinstance(whole, str) else whole)
            elif isinstance(event, CloseConnection):
                self.closed = (event.code, event.reason)
                try:
                    await self.stream.send_all(self.connection.send(event.response()))
                except Exception:
                    pass

    async def send_text(self, text: str) -> None:
        await self.stream.send_all(self.connection.send(TextMessage(data=text)))

    async def close(self) -> None:
        try:
            if self.closed is None:
                await self.stream.send_all(self.connection.send(CloseConnection(code=1000)))
        except Exception:
            pass
        await self.stream.aclose()
