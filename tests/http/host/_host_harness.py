"""A host surface on a real hypercorn (127.0.0.1, free port) over a real Engine and
ActorSystem, with a clock the test can move (rate buckets) and a readiness switch."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from tests.http._harness import (
    UploadOutcome,
    UploadProgress,
    start_hypercorn,
    upload_over_raw_socket,
)
from troupe.auth import TokenScope, new_token_secret, token_create, token_revoke
from troupe.http.host import HostAppDependencies, create_host_app, host_surface
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine


class MovableClock:
    """The real clock plus an offset the test advances (no sleeping); ``freeze()`` stops the
    real part so that only ``advance`` moves time."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.offset = 0.0
        self._frozen: tuple[float, float] | None = None

    def freeze(self) -> None:
        self._frozen = (self._real.monotonic(), self._real.wall())

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def monotonic(self) -> float:
        base = self._frozen[0] if self._frozen else self._real.monotonic()
        return base + self.offset

    def wall(self) -> float:
        base = self._frozen[1] if self._frozen else self._real.wall()
        return base + self.offset

    def wall_datetime(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.wall(), tz=datetime.UTC)


@dataclass
class HostServer:
    env: Any
    engine: Engine
    system: ActorSystem
    port: int
    clock: MovableClock
    ready: list[bool] = field(default_factory=lambda: [True])
    app: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, secret: str | None = None, **options: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **options)

    async def token(self, name: str, scope: TokenScope | None = None) -> str:
        secret = new_token_secret(self.env.random)
        scope = scope or TokenScope.all()
        now = self.env.clock.wall()
        await self.engine.write(lambda connection: token_create(
            connection, name=name, scope=scope, secret=secret, created_at=now))
        return secret

    async def revoke(self, name: str) -> None:
        now = self.env.clock.wall()
        await self.engine.write(lambda connection: token_revoke(connection, name=name, revoked_at=now))

    async def rows(self, sql: str, *parameters: Any) -> list[tuple]:
        return await self.engine.read(lambda connection: list(connection.execute(sql, parameters)))


async def start_host_server(nursery: trio.Nursery, data_dir: str, **app_options: Any) -> HostServer:
    env = real_env(data_dir)
    clock = MovableClock(env.clock)
    env.clock = clock
    engine = await Engine.open(env, nursery=nursery, migrations=list(host_surface.migrations))
    system = ActorSystem(env, list(host_surface.actor_kinds), storage=engine)
    await nursery.start(system.run)
    server = HostServer(env, engine, system, 0, clock)
    dependencies = HostAppDependencies(
        env=env, engine=engine, system=system, readiness=lambda: server.ready[0], **app_options
    )
    server.app = create_host_app(dependencies)
    server.port = await start_hypercorn(nursery, server.app)
    return server


def message(dedupe_key: str, **fields: Any) -> dict[str, Any]:
    document = {
        "sender": "小林",
        "content": "今晚看星星",
        "occurred_at": "2026-10-10T20:00:00+08:00",
        "dedupe_key": dedupe_key,
    }
    document.update(fields)
    return document


async def raw_upload(
    port: int,
    path: str,
    *,
    headers: dict[str, str],
    body_bytes: int,
    chunked: bool,
    declared_bytes: int | None = None,
    chunk_bytes: int = 256 * 1024,
) -> UploadOutcome:
    """POST ``body_bytes`` of filler (chunked, or with ``Content-Length: declared_bytes``) over a
    raw socket, reading the response concurrently; ends when the server closes or the body is
    all sent and the response has arrived."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {declared_bytes or body_bytes}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send_body(stream: trio.SocketStream, progress: UploadProgress) -> None:
        await stream.send_all(head)
        while progress.body_bytes_sent < body_bytes:
            size = min(chunk_bytes, body_bytes - progress.body_bytes_sent)
            chunk = b"x" * size
            await stream.send_all(b"%x\r\n" % size + chunk + b"\r\n" if chunked else chunk)
            progress.body_bytes_sent += size
        if chunked:
            await stream.send_all(b"0\r\n\r\n")
        with trio.move_on_after(10):
            while b"\r\n\r\n" not in progress.response:
                await trio.sleep(0.01)

    return await upload_over_raw_socket(port, send_body)
