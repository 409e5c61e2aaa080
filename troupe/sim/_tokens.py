"""Writing a workload's bearer tokens into the simulated storage, shared by the HTTP workloads.

Why one helper: the host, goals, sessions and sessions-api workloads each keep their tokens'
secrets in memory and (re)write the tokens after every restart, since a power loss can take
an unsynced write with it.  The write is the same everywhere: every token in one storage job,
a name already stored is kept (the secret is the same), and a storage refusal means "not now",
so the caller skips its step and tries again on the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from troupe.auth import TokenNameTaken, TokenScope, host_audience, token_create
from troupe.storage import StorageError


@dataclass(frozen=True)
class TokenGrant:
    """One token to store: its name, scope, secret and audience (the surface it opens)."""

    name: str
    scope: TokenScope
    secret: str
    audience: str = host_audience


async def write_tokens(world: Any, grants: Sequence[TokenGrant]) -> bool:
    """Store ``grants`` (created now on the world's wall clock) in one write; True when written
    (names already there are kept), False when storage refused."""
    now = world.env.clock.wall()

    def job(connection: Any) -> None:
        for grant in grants:
            try:
                token_create(connection, name=grant.name, scope=grant.scope, secret=grant.secret, created_at=now,
                             audience=grant.audience)
            except TokenNameTaken:
                pass

    try:
        await world.engine.write(job)
    except StorageError:
        return False
    return True


__all__ = ["TokenGrant", "write_tokens"]
