"""Token lookups shared between concurrent requests: one read for every request waiting.

Why: every token-protected request looks its token up in the committed table, and that read
*is* the revocation check (``troupe token revoke`` from another process must take effect on
the next request).  A read is cheap for SQLite but not for the process: it is a hop to a
storage thread and back, which under load cost about as much CPU as the whole rest of a
single-message intake request.  Caching grants would save the hop but answer from a snapshot
that may predate a revocation, so there is no cache here.  Instead lookups are *coalesced*:
the requests that arrive while one lookup read is running form the next round, and that round
is answered by a single read that looks up all of their secrets.

Why this keeps the guarantee: a round's read begins only after every one of its requests
joined it, so each request is answered from a snapshot taken after it arrived, exactly as
with a read of its own; a revocation committed before a request arrived is always seen.

Shape: there is no background task (the gate has no nursery, and the simulator restarts apps
freely).  The first request of a round to find no read running leads the round: it runs the
read inside a shielded cancel scope, so that a leader whose client went away still answers the
requests that joined its round (a read is short and bounded by the engine).  Everyone else
waits for the running round to finish and then either finds its own round answered or leads
it.  A failed read (``StorageError``) is raised to every request of its round.  Trade-off: a
request that arrives just after a read started waits for that read and then its own, so at
low concurrency latency can grow by up to one read; at high concurrency the read count per
request falls towards one per round.
"""

from __future__ import annotations

from typing import Any

import trio

from troupe.storage import StorageError

from ._tokens import TokenGrant, host_audience, token_lookup, token_secret_characters_max

secrets_per_round_max = 1000
"""Distinct secrets looked up by one read; a round that fills up closes and the next begins."""

assert secrets_per_round_max >= 1


class _Round:
    """The secrets that share one read, and what the read found."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.grants: dict[str, TokenGrant | None] = {}
        self.error: BaseException | None = None
        self.finished = trio.Event()


class TokenLookups:
    """``await lookups.authenticate(secret)``: the secret's grant, or None (see the module
    docstring).  One instance per surface app; ``engine`` is the storage ``Engine``."""

    def __init__(self, engine: Any, *, audience: str = host_audience) -> None:
        self.engine = engine
        self.audience = audience
        self._gathering = _Round()
        self._running: _Round | None = None
        self.reads = 0
        """Lookup reads made so far (a statistic for benchmarks and tests)."""

    async def authenticate(self, secret: str | None) -> TokenGrant | None:
        """The grant of the active token with this secret, or None; raises ``StorageError``
        when the database cannot be read (the surface answers 503)."""
        if not secret or len(secret) > token_secret_characters_max:
            return None
        if len(self._gathering.secrets) >= secrets_per_round_max and secret not in self._gathering.secrets:
            await self._wait_for_room()
        round_ = self._gathering
        round_.secrets.add(secret)
        while not round_.finished.is_set():
            running = self._running
            if running is None:
                await self._lead(round_)
            else:
                await running.finished.wait()
        error = round_.error
        if isinstance(error, StorageError):
            # A fresh exception per request: one object raised in many tasks would collect
            # every task's traceback.
            raise type(error)(str(error)) from error
        if error is not None:
            raise error
        return round_.grants.get(secret)

    async def _wait_for_room(self) -> None:
        while len(self._gathering.secrets) >= secrets_per_round_max:
            full = self._gathering
            if self._running is None:
                await self._lead(full)
            else:
                await self._running.finished.wait()

    async def _lead(self, round_: _Round) -> None:
        assert self._running is None and round_ is self._gathering
        self._gathering = _Round()
        self._running = round_
        secrets = sorted(round_.secrets)
        audience = self.audience

        def lookup_all(connection: Any) -> dict[str, TokenGrant | None]:
            return {secret: token_lookup(connection, secret, audience=audience) for secret in secrets}

        try:
            with trio.CancelScope(shield=True):
                self.reads += 1
                round_.grants = await self.engine.read(lookup_all)
        except Exception as exc:
            round_.error = exc
        finally:
            self._running = None
            round_.finished.set()


__all__ = ["TokenLookups", "secrets_per_round_max"]
