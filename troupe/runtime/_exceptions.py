"""Typed errors the runtime raises to callers of ``ask``/``tell``.

Hierarchy::

    ActorError                      anything the runtime reports about an actor
    ├── Overloaded                  the mailbox is full: back off for ``retry_after_seconds``
    ├── Unavailable                 the actor kind is down (its subtree exhausted restarts)
    ├── AskTimeout                  no reply within the caller's timeout
    ├── ActorCrashed                the turn raised; the actor restarts from durable state
    │   └── PoisonMessage           this message crashed the actor twice; it is not run again
    └── UnknownActorKind            no kind of that name was registered

Surfaces map ``Overloaded`` and ``Unavailable`` to 503 with Retry-After, ``AskTimeout`` to 504
and ``ActorCrashed`` to 500 ``internal_error``.  Our own bugs are assertions, not these.
"""

from __future__ import annotations


class ActorError(Exception):
    """Base class of every error the runtime reports to a caller."""


class Overloaded(ActorError):
    """The target's mailbox is full; the caller should retry after ``retry_after_seconds``."""

    def __init__(self, kind: str, key: str, retry_after_seconds: float) -> None:
        super().__init__(f"{kind}/{key} is overloaded; retry after {retry_after_seconds:.3f}s")
        self.kind = kind
        self.key = key
        self.retry_after_seconds = retry_after_seconds

    def __reduce__(self):
        # Errors cross process boundaries (sweep workers): rebuild from the constructor's arguments.
        return (type(self), (self.kind, self.key, self.retry_after_seconds))


class Unavailable(ActorError):
    """The actor kind's supervisor exhausted its restarts and is recovering."""

    def __init__(self, kind: str, retry_after_seconds: float) -> None:
        super().__init__(f"actor kind {kind!r} is unavailable; retry after {retry_after_seconds:.3f}s")
        self.kind = kind
        self.retry_after_seconds = retry_after_seconds

    def __reduce__(self):
        return (type(self), (self.kind, self.retry_after_seconds))


class AskTimeout(ActorError):
    """The actor did not reply within the caller's timeout (the turn may still complete)."""


class ActorCrashed(ActorError):
    """The turn raised an exception; the actor was restarted from durable state."""

    def __init__(self, kind: str, key: str, reason: str) -> None:
        super().__init__(f"{kind}/{key} crashed: {reason}")
        self.kind = kind
        self.key = key
        self.reason = reason

    def __reduce__(self):
        return (type(self), (self.kind, self.key, self.reason))


class PoisonMessage(ActorCrashed):
    """The same message crashed the actor twice; it is reported and never run again."""


class UnknownActorKind(ActorError, LookupError):
    """``system.ref`` was given a kind that no ``ActorKind`` registered."""
