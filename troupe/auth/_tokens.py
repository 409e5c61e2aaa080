"""Bearer tokens: creation, listing, revocation and the per-request lookup.

A token is a high-entropy secret (32 bytes from ``Env.random``, which is the OS's secrets
source in production) shown once at creation; only its SHA-256 is stored.  Looking a token up
is one indexed read of the committed table, done on every request: that read *is* the
revocation check, so a ``troupe token revoke`` from another process takes effect on the very
next request without any cache to invalidate.  Trade-off: a read per request instead of an
in-memory table that could go stale; ``TokenLookups`` (``_lookups``) lets concurrent requests
share that read without weakening the guarantee.

The functions taking a connection are synchronous and run inside the engine's read or write
jobs; ``authenticate`` is the async helper surfaces call.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import apsw

from ._exceptions import InvalidTokenName, TokenNameTaken, UnknownToken
from ._scope import TokenScope

token_secret_bytes = 32
"""Random bytes in a secret (256 bits)."""

token_secret_prefix = "troupe_"
token_secret_characters_max = 200
"""A presented secret longer than this is refused without a lookup."""

token_name_characters_max = 100
host_audience = "host"
sessions_audience = "sessions"
"""Tokens of the sessions surface: each is bound to one end user (``TokenScope.of_end_user``)."""

assert token_secret_bytes >= 16


@dataclass(frozen=True)
class TokenGrant:
    """What an authenticated request carries: the token's id, name and scope.

    The name is the source recorded on operations (never a request field)."""

    id: int
    name: str
    scope: TokenScope


@dataclass(frozen=True)
class TokenRecord:
    """One row of ``troupe token list`` (never the secret)."""

    id: int
    audience: str
    name: str
    scope: TokenScope
    created_at: float
    revoked_at: float | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def new_token_secret(random: Any) -> str:
    """A fresh secret from ``random.token_bytes`` (an ``Env.random``)."""
    raw = random.token_bytes(token_secret_bytes)
    return token_secret_prefix + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def token_name_problem(name: str) -> str | None:
    if not name or name.isspace():
        return "a token name must not be empty"
    if len(name) > token_name_characters_max:
        return f"a token name has at most {token_name_characters_max} characters"
    if any(not character.isprintable() for character in name):
        return "a token name must not contain control characters"
    return None


def token_create(
    connection: apsw.Connection,
    *,
    name: str,
    scope: TokenScope,
    secret: str,
    created_at: float,
    audience: str = host_audience,
) -> TokenRecord:
    """Insert a token (inside a write job).  Raises ``InvalidTokenName``, ``TokenNameTaken``."""
    problem = token_name_problem(name)
    if problem is not None:
        raise InvalidTokenName(problem)
    assert scope.problem() is None, "scopes are validated when built"
    taken = connection.execute(
        "SELECT 1 FROM auth_tokens WHERE audience = ? AND name = ? AND revoked_at IS NULL",
        (audience, name),
    ).fetchone()
    if taken:
        raise TokenNameTaken(f"an active {audience} token is already named {name!r}")
    kind, value = scope.encode()
    connection.execute(
        "INSERT INTO auth_tokens (audience, name, secret_sha256, scope_kind, scope_value, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (audience, name, secret_digest(secret), kind, value, created_at),
    )
    return TokenRecord(connection.last_insert_rowid(), audience, name, scope, created_at, None)


def token_list(connection: apsw.Connection, *, audience: str = host_audience) -> list[TokenRecord]:
    """Every token of ``audience``, revoked ones included, oldest first."""
    rows = connection.execute(
        "SELECT id, audience, name, scope_kind, scope_value, created_at, revoked_at "
        "FROM auth_tokens WHERE audience = ? ORDER BY id",
        (audience,),
    )
    return [
        TokenRecord(row[0], row[1], row[2], TokenScope.decode(row[3], row[4]), row[5], row[6])
        for row in rows
    ]


def token_revoke(
    connection: apsw.Connection, *, name: str, revoked_at: float, audience: str = host_audience
) -> None:
    """Revoke the active token called ``name``.  Raises ``UnknownToken``."""
    connection.execute(
        "UPDATE auth_tokens SET revoked_at = ? WHERE audience = ? AND name = ? AND revoked_at IS NULL",
        (revoked_at, audience, name),
    )
    if connection.changes() == 0:
        raise UnknownToken(f"no active {audience} token is named {name!r}")


def token_lookup(
    connection: apsw.Connection, secret: str, *, audience: str = host_audience
) -> TokenGrant | None:
    """The grant of an active token with this secret, or None.  A token whose stored scope
    breaks today's entry-id rules is treated as invalid (None)."""
    row = connection.execute(
        "SELECT id, name, scope_kind, scope_value FROM auth_tokens "
        "WHERE secret_sha256 = ? AND audience = ? AND revoked_at IS NULL",
        (secret_digest(secret), audience),
    ).fetchone()
    if row is None:
        return None
    scope = TokenScope.decode(row[2], row[3])
    if scope.problem() is not None:
        return None
    return TokenGrant(row[0], row[1], scope)


async def authenticate(engine: Any, secret: str | None, *, audience: str = host_audience) -> TokenGrant | None:
    """Look ``secret`` up in the committed token table (raises ``StorageError`` when the
    database cannot be read; the surface answers 503)."""
    if not secret or len(secret) > token_secret_characters_max:
        return None
    return await engine.read(lambda connection: token_lookup(connection, secret, audience=audience))


def bearer_secret(header_values: list[bytes]) -> str | None:
    """The secret of exactly one ``Authorization: Bearer <secret>`` header, or None."""
    if len(header_values) != 1:
        return None
    try:
        text = header_values[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    scheme, _, secret = text.strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret or " " in secret:
        return None
    return secret


__all__ = [
    "TokenGrant",
    "TokenRecord",
    "authenticate",
    "bearer_secret",
    "host_audience",
    "new_token_secret",
    "sessions_audience",
    "secret_digest",
    "token_create",
    "token_list",
    "token_lookup",
    "token_name_characters_max",
    "token_name_problem",
    "token_revoke",
    "token_secret_bytes",
    "token_secret_characters_max",
]
