"""``host_surface``: the host contract as a ``troupe serve`` plug-in.

Its listener defaults to 127.0.0.1:8080 (the contract's address).  Allowed Host names are the
loopback names plus ``allowed_hosts`` from the configuration (``TROUPE_ALLOWED_HOSTS`` or
``[serve] allowed_hosts``) plus the contract's own ``IRIS_ALLOWED_HOSTS`` (comma-separated).
Readiness is the server's: every component ready (storage open, actor system running,
accepting).  The kinds and migrations are static, so the schema never depends on which
listeners are switched on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from troupe.actors.host import (
    entry_actor_kind,
    goals_actor_kind,
    host_migrations,
    learner_actor_kind,
    media_actor_kind,
    state_actor_kind,
)
from troupe.auth import auth_migrations
from troupe.http import ASGIApp
from troupe.server import ListenAddress, Surface, SurfaceContext

from ._app import HostAppDependencies, create_host_app

host_listen_default = ListenAddress("127.0.0.1", 8080)
allowed_hosts_variable = "IRIS_ALLOWED_HOSTS"


def contract_allowed_hosts(environ: Mapping[str, str]) -> tuple[str, ...]:
    names = (name.strip() for name in environ.get(allowed_hosts_variable, "").split(","))
    return tuple(name for name in names if name)


def _create(context: SurfaceContext) -> ASGIApp:
    state = context.state

    def readiness() -> bool:
        return all(state.readiness().values())

    dependencies = HostAppDependencies(
        env=context.env,
        engine=context.engine,
        system=context.system,
        readiness=readiness,
        allowed_hosts=(*context.options.allowed_hosts, *contract_allowed_hosts(os.environ)),
        shutdown=context.shutdown,
    )
    return create_host_app(dependencies)


host_surface = Surface(
    "host",
    host_listen_default,
    _create,
    actor_kinds=(entry_actor_kind(), media_actor_kind(), state_actor_kind(), learner_actor_kind(),
                 goals_actor_kind()),
    migrations=(*auth_migrations, *host_migrations),
)

__all__ = ["allowed_hosts_variable", "contract_allowed_hosts", "host_listen_default", "host_surface"]
