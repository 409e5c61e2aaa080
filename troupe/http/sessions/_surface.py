"""``sessions_surface``: the sessions contract as a ``troupe serve`` plug-in.

Its listener defaults to 127.0.0.1:8787 (the contract's ``tansr serve`` port).  Allowed Host
names are the loopback names plus ``allowed_hosts`` from the configuration.  Readiness is the
server's (every component ready); once shutdown begins the gate answers 503 ``draining`` and
live streams get a long ``retry:`` frame.  The legacy-prefix knob is read from the environment
at start (``TANSR_SERVE_LEGACY_PREFIX``, ``TANSR_SERVE_LEGACY_SUNSET``); an unknown mode stops
the start-up with a configuration error rather than serving writes an operator meant to retire.
The kinds and migrations are static, so the schema never depends on which listeners are on.
"""

from __future__ import annotations

import os

from troupe.actors.sessions import sessions_migrations, webhook_migrations
from troupe.auth import auth_migrations
from troupe.http import ASGIApp
from troupe.server import ListenAddress, Surface, SurfaceContext

from ._app import SessionsAppDependencies, create_sessions_app
from ._routes import LegacyPrefixPolicy

try:
    from troupe.actors.sessions import end_user_actor_kind, session_actor_kind
except ImportError:  # until troupe.actors.sessions re-exports them (the actor slice's edit)
    from troupe.actors.sessions._end_users import end_user_actor_kind
    from troupe.actors.sessions._session import session_actor_kind

sessions_listen_default = ListenAddress("127.0.0.1", 8787)


def _create(context: SurfaceContext) -> ASGIApp:
    state = context.state

    def readiness() -> bool:
        return all(state.readiness().values()) and not context.shutdown.is_set()

    dependencies = SessionsAppDependencies(
        env=context.env,
        engine=context.engine,
        system=context.system,
        readiness=readiness,
        shutdown=context.shutdown,
        allowed_hosts=tuple(context.options.allowed_hosts),
        legacy_policy=LegacyPrefixPolicy.from_environ(os.environ),
    )
    return create_sessions_app(dependencies)


sessions_surface = Surface(
    "sessions",
    sessions_listen_default,
    _create,
    actor_kinds=(session_actor_kind(), end_user_actor_kind()),
    migrations=(*auth_migrations, *sessions_migrations, *webhook_migrations),
)

__all__ = ["sessions_listen_default", "sessions_surface"]
