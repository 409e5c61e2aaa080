"""``host_surface``: the host contract as a ``troupe serve`` plug-in.

Its listener defaults to 127.0.0.1:8080 (the contract's address).  Allowed Host names are the
loopback names plus ``allowed_hosts`` from the configuration (``TROUPE_ALLOWED_HOSTS`` or
``[serve] allowed_hosts``) plus the contract's own ``IRIS_ALLOWED_HOSTS`` (comma-separated).
Readiness is the server's: every component ready (storage open, actor system running,
accepting).  The kinds and migrations are static, so the schema never depends on which
listeners are switched on.

Goal dedup knobs come from the environment, read once when the surface is built
(``new_host_surface``): ``TROUPE_HOST_GOAL_JUDGEMENT`` (``on``/``off``: whether a possible
duplicate goal is judged by the model in the background) and
``TROUPE_HOST_GOAL_FALLBACK_SECONDS`` (how long a held goal waits for a verdict before it is
injected with the pending mark; ``0`` injects at once).  The contract names both switches
("关闭判断或将兜底设为 0"); the environment, like the character and knowledge surfaces' knobs,
because they are deployment settings, not per-request ones.  A bad value stops the server at
start with a ``ServeError`` naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from troupe.actors.host import (
    GoalSettings,
    dedup_fallback_seconds_default,
    entry_actor_kind,
    goals_actor_kind,
    host_migrations,
    learner_actor_kind,
    media_actor_kind,
    state_actor_kind,
)
from troupe.auth import auth_migrations
from troupe.http import ASGIApp
from troupe.server import ListenAddress, ServeError, Surface, SurfaceContext

from ._app import HostAppDependencies, create_host_app

host_listen_default = ListenAddress("127.0.0.1", 8080)
allowed_hosts_variable = "IRIS_ALLOWED_HOSTS"
goal_judgement_variable = "TROUPE_HOST_GOAL_JUDGEMENT"
goal_fallback_seconds_variable = "TROUPE_HOST_GOAL_FALLBACK_SECONDS"
goal_fallback_seconds_max = 7 * 24 * 3600.0
"""A held goal waits at most a week for its verdict: longer would hide it from prepare for good."""


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


def goal_settings_from_environment(environ: Mapping[str, str]) -> GoalSettings:
    """The goals actor's dedup knobs from ``environ``; ``ServeError`` for a value that is not
    ``on``/``off`` or not a number of seconds in [0, ``goal_fallback_seconds_max``]."""
    judgement_text = environ.get(goal_judgement_variable, "").strip().lower() or "on"
    if judgement_text not in ("on", "off"):
        raise ServeError(f"{goal_judgement_variable} must be on or off, got {judgement_text!r}")
    fallback_text = environ.get(goal_fallback_seconds_variable, "").strip()
    fallback_seconds = dedup_fallback_seconds_default
    if fallback_text:
        try:
            fallback_seconds = float(fallback_text)
        except ValueError:
            fallback_seconds = -1.0
        if not 0.0 <= fallback_seconds <= goal_fallback_seconds_max:
            raise ServeError(f"{goal_fallback_seconds_variable} must be seconds in "
                             f"[0, {goal_fallback_seconds_max:.0f}], got {fallback_text!r}")
    return GoalSettings(judgement_enabled=judgement_text == "on", fallback_seconds=fallback_seconds)


def new_host_surface(environ: Mapping[str, str] | None = None) -> Surface:
    """A host surface whose goal knobs come from ``environ`` (default ``os.environ``)."""
    settings = goal_settings_from_environment(os.environ if environ is None else environ)
    return Surface(
        "host",
        host_listen_default,
        _create,
        actor_kinds=(entry_actor_kind(), media_actor_kind(), state_actor_kind(), learner_actor_kind(),
                     goals_actor_kind(settings)),
        migrations=(*auth_migrations, *host_migrations),
    )


host_surface = new_host_surface({})
"""The surface with the built-in defaults (no environment read); ``default_surfaces()`` builds
its own with ``new_host_surface()``."""

__all__ = [
    "allowed_hosts_variable",
    "contract_allowed_hosts",
    "goal_fallback_seconds_max",
    "goal_fallback_seconds_variable",
    "goal_judgement_variable",
    "goal_settings_from_environment",
    "host_listen_default",
    "host_surface",
    "new_host_surface",
]
