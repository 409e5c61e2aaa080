"""Typed errors of host tokens and their command line.

Hierarchy::

    AuthError                  base of everything raised by ``troupe.auth``
    ├── InvalidScope           a scope (entry list or prefix) breaks the entry-id rules
    ├── InvalidTokenName       a token name is empty, too long or has control characters
    ├── TokenNameTaken         an active token already has that name
    └── UnknownToken           no active token has that name (revoke)

A request that carries a missing, unknown, revoked or no-longer-valid token is not an
exception: ``authenticate`` answers ``None`` and the surface replies 401.
"""

from __future__ import annotations


class AuthError(Exception):
    """Base class of the errors ``troupe.auth`` raises."""


class InvalidScope(AuthError):
    """A scope names an entry id (or a prefix) that the entry-id rules forbid."""


class InvalidTokenName(AuthError):
    """Token names are 1..100 characters, not all whitespace, without control characters."""


class TokenNameTaken(AuthError):
    """Names identify tokens (they are the source recorded on operations): one active each."""


class UnknownToken(AuthError):
    """No active token has this name."""


__all__ = ["AuthError", "InvalidScope", "InvalidTokenName", "TokenNameTaken", "UnknownToken"]
