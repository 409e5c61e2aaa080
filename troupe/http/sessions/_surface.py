"""``sessions_surface``: the sessions contract as a ``troupe serve`` plug-in.

Its listener defaults to 127.0.0.1:8787 (the contract's ``tansr serve`` port).  Allowed Host
names are the loopback names plus ``allowed_hosts`` from the configuration.  Readiness is the
server's (every component ready); once shutdown begins the gate answers 503 ``draining`` and
live streams get a long ``retry:`` frame.  The legacy-prefix knob is read from the environment
at start (``TANSR_SERVE_LEGACY_PREFIX``, ``TANSR_SERVE_LEGACY_SUNSET``); an unknown mode stops
the start-up with a configuration error rather than serving writes an operator meant to retire.
So are the slow-consumer knobs (``TANSR_SERVE_SLOW_SUBSCRIBER_POLICY``,
``TANSR_SERVE_MAX_SUBSCRIBER_BUFFER_BYTES``, ``TANSR_SERVE_SLOW_SUBSCRIBER_GRACE_MS``).
The kinds and migrations are static, so the schema never depends on which listeners are on.
"""

from __future__ import annotations

import os
import sys

from troupe.actors.sessions import (
    WebhookDeliveries,
    WebhookSettings,
    end_user_actor_kind,
    session_actor_kind,
    sessions_migrations,
    webhook_migrations,
)
from troupe.auth import auth_migrations
from troupe.http import ASGIApp
from troupe.server import ListenAddress, Surface, SurfaceContext

from ._app import SessionsAppDependencies, create_sessions_app
from ._events import EventStreamSettings
from ._routes import LegacyPrefixPolicy

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
        events=EventStreamSettings.from_environ(os.environ),
    )
    app = create_sessions_app(dependencies)
    _install_webhooks(app, context)
    return app


def _install_webhooks(app: ASGIApp, context: SurfaceContext) -> None:
    """With ``TANSR_SERVE_NOTIFY_URL`` set, the turn-end deliveries run for as long as the app
    serves (in its nursery, so a simulated crash takes them down with it) and session actors
    find them in the Env.  A bad URL turns the webhook off with a warning on stderr."""
    settings = WebhookSettings.from_environ(os.environ)
    for warning in settings.warnings:
        print(f"troupe: sessions: {warning}", file=sys.stderr)
    if not settings.enabled:
        return
    deliveries = WebhookDeliveries(
        settings, env=context.env, storage=context.engine, tracer=context.system.tracer,
        shutdown=context.shutdown,
    )
    deliveries.publish()

    @app.before_serving  # type: ignore[attr-defined]
    async def start_deliveries() -> None:
        app.nursery.start_soon(deliveries.run)  # type: ignore[attr-defined]


sessions_surface = Surface(
    "sessions",
    sessions_listen_default,
    _create,
    actor_kinds=(session_actor_kind(), end_user_actor_kind()),
    migrations=(*auth_migrations, *sessions_migrations, *webhook_migrations),
)

__all__ = ["sessions_listen_default", "sessions_surface"]
