"""A sessions surface on a real hypercorn (127.0.0.1, free port) over a real Engine and
ActorSystem, with a readiness switch, the app's ShutdownSignal and end-user tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from tests.http._harness import start_hypercorn
from troupe.actors.sessions import sessions_migrations, webhook_migrations
from troupe.auth import (
    TokenScope,
    auth_migrations,
    new_token_secret,
    sessions_audience,
    token_create,
    token_revoke,
)
from troupe.http import ShutdownSignal
from troupe.http.sessions import SessionsAppDependencies, create_sessions_app
from troupe.models import LocalModel
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine


def session_actor_kinds(settings: Any = None) -> list[Any]:
    """The session and end-user kinds (``settings``: the sessions' ``SessionSettings``)."""
    from troupe.actors.sessions import end_user_actor_kind, session_actor_kind

    return [session_actor_kind(settings), end_user_actor_kind()]


@dataclass
class SessionsServer:
    env: Any
    engine: Engine
    system: ActorSystem
    shutdown: ShutdownSignal
    port: int = 0
    ready: list[bool] = field(default_factory=lambda: [True])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, secret: str | None = None, **options: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {secret}"} if secret else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=30, **options)

    async def token(self, name: str, end_user_id: str = "u_1", *, scope: TokenScope | None = None,
                    audience: str = sessions_audience) -> str:
        secret = new_token_secret(self.env.random)
        scope = scope or TokenScope.of_end_user(end_user_id)
        now = self.env.clock.wall()
        await self.engine.write(lambda connection: token_create(
            connection, name=name, scope=scope, secret=secret, created_at=now, audience=audience))
        return secret

    async def revoke(self, name: str) -> None:
        now = self.env.clock.wall()
        await self.engine.write(lambda connection: token_revoke(
            connection, name=name, revoked_at=now, audience=sessions_audience))


async def start_sessions_server(
    nursery: trio.Nursery, data_dir: str, *, system_override: Any = None, session_settings: Any = None,
    **app_options: Any
) -> SessionsServer:
    """``system_override``: what the app asks instead of the real system (crash tests);
    ``session_settings``: a ``SessionSettings`` for the session kind (short bridge deadlines)."""
    env = real_env(data_dir)
    if env.model is None:
        env.model = LocalModel()
    migrations = list(dict.fromkeys([*auth_migrations, *sessions_migrations, *webhook_migrations]))
    engine = await Engine.open(env, nursery=nursery, migrations=migrations)
    system = ActorSystem(env, session_actor_kinds(session_settings), storage=engine)
    await nursery.start(system.run)
    shutdown = ShutdownSignal()
    server = SessionsServer(env, engine, system, shutdown)
    dependencies = SessionsAppDependencies(
        env=env, engine=engine, system=system_override or system, shutdown=shutdown,
        readiness=lambda: server.ready[0] and not shutdown.is_set(), **app_options,
    )
    server.port = await start_hypercorn(nursery, create_sessions_app(dependencies))
    return server
