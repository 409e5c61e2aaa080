"""Typed errors of the shared HTTP layer.

Hierarchy::

    HttpError                  base of everything raised by ``troupe.http``
    ├── SendTimeout            a response send did not finish within its bound: the client
    │                          stopped reading (or vanished without closing the connection)
    └── MetricsError           statistics could not be rendered as Prometheus text (our bug)

Rejections of the outside world's requests (bad Host, body too large) are not exceptions:
the middleware answers them with the surface's error envelope and never calls the app.
"""

from __future__ import annotations


class HttpError(Exception):
    """Base class of the errors ``troupe.http`` raises."""


class SendTimeout(HttpError):
    """A send to the client took longer than ``send_seconds_max``; the connection is dropped."""


class MetricsError(HttpError):
    """A metric name or label broke the exposition format's rules."""


__all__ = ["HttpError", "MetricsError", "SendTimeout"]
