"""Typed errors of ``troupe serve``.

Hierarchy::

    ServeError                 the server could not start or run as configured
    ├── ListenerRefused        a listener would bind a non-loopback address without
    │                          TROUPE_ALLOW_NON_LOOPBACK=1 (nothing was opened)
    ├── ListenerError          a listener address could not be resolved or bound
    └── UnknownSurface         a --listen / TROUPE_LISTEN_* names no surface this build has

``troupe._config.ConfigError`` (bad file, environment or flag) is re-exported beside these.
"""

from __future__ import annotations

from troupe._config import ConfigError


class ServeError(Exception):
    """The server could not start or run as configured."""


class ListenerRefused(ServeError):
    """A non-loopback bind without ``TROUPE_ALLOW_NON_LOOPBACK=1``."""


class ListenerError(ServeError):
    """A listener address could not be resolved or bound (in use, no such host...)."""


class UnknownSurface(ServeError):
    """The configuration names a surface this build does not have."""


__all__ = ["ConfigError", "ListenerError", "ListenerRefused", "ServeError", "UnknownSurface"]
