"""The memory server's process-wide lifecycle: ``("character_lifecycle", "main")``.

What it owns: limited mode (the contract's "storage is being chosen, migrated or recovered"
switch), the per-process ``instance_id`` that ``/health`` reports, whether ``/shutdown`` is
honoured, and ``/reload`` orchestration across characters.

Why one actor: continue/block and reload are read-modify-write over process-wide state; one
actor turn each means two of them never interleave.  The HTTP gate reads its state without
a turn: the actor publishes it (``CharacterLifecycleSettings.published``) at activation and
after every turn, and unpublishes it while a turn that may change it runs; meanwhile, or when
nothing is published, the gate asks ``Health`` and so waits behind that turn, as every
request did when each one asked.  The state is loaded once at activation and written
through on every switch.

Why the limited-mode state is durable but keyed by ``instance_id``: a restart of this actor
inside one process (a crash, passivation) must not forget a ``continue``, while a new process
starts from configuration (``start_blocked``), because the storage it chose last time may be
exactly what the upstream is about to migrate.

Reload ("rebuild and atomically swap the memory components"): every durable piece of a
character lives in the one storage engine, so what a reload rebuilds is in-memory: the recall
indexes and caches the character actors hold.  ``CharacterComponents`` is the per-system
generation counter both kinds share; bumping it is one synchronous step, so every character
actor sees the swap before its next message and drops its in-memory components (rebuilt from
storage on demand).  Then the listed claim tokens are released and the listed generations are
published, character by character, even when an earlier step failed (they finish a release
transaction the caller started; leaving them would hold admission closed forever).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import apsw

from troupe.runtime import Actor, ActorContext, ActorKind, Env
from troupe.storage import StorageError, state_get, state_put

from ._protocol import (
    CharacterFailed,
    CharacterReloaded,
    Health,
    LifecycleState,
    Reload,
    ReloadCharacter,
    Reloaded,
    RequestShutdown,
    ResetConfirmedAt,
    ResetDone,
    ShutdownAnswer,
    StartupBlock,
    StartupContinue,
    StartupSwitched,
    character_kind_name,
    lifecycle_kind_name,
    reason_characters_max,
    reload_names_max,
)
from ._store import reset_confirmed_at

logger = logging.getLogger(__name__)

instance_id_prefix = "mem_"
lifecycle_state_kind = "character_lifecycle"
lifecycle_state_key = "main"
reload_character_timeout_seconds = 30.0
"""One character's part of a reload (it waits for that character's running turn)."""
lifecycle_mailbox_messages_max = 1_024
"""While nothing is published (a switch or reload running, a failed turn), every HTTP
request asks ``Health`` first: the mailbox must absorb a burst of them."""
default_blocking_reason = "storage startup is not complete"

assert reload_character_timeout_seconds > 0


def new_instance_id(env: Env) -> str:
    """A fresh per-process instance id from the Env (replays repeat it)."""
    return env.ids.new_id(instance_id_prefix)


class CharacterComponents:
    """The generation of the memory components, shared by the lifecycle actor (which bumps
    it on reload) and every character actor (which rebuilds its in-memory components when
    it sees a newer one).  One per actor system, never a module global."""

    __slots__ = ("generation",)

    def __init__(self) -> None:
        self.generation = 0

    def swap(self) -> int:
        self.generation += 1
        return self.generation


ResetConfirmedAtFunction = Callable[[apsw.Connection, float], int]
"""Reset the confirmed-at anchor of every character's confirmed reflections to ``now``
inside the caller's write; returns how many rows changed."""


def reset_confirmed_at_all(connection: apsw.Connection, now: float) -> int:
    """The default reset: every confirmed reflection of every character restarts its clock
    (strong memory ON → OFF, so the time-driven promotion runs its full period again)."""
    return reset_confirmed_at(connection, now)


@dataclass
class CharacterLifecycleSettings:
    """Configuration of one process's lifecycle.  ``components`` is shared with the
    character kind (``character_actor_kind``) so reloads reach every character."""

    instance_id: str
    start_blocked: bool = False
    blocking_reason: str | None = None
    shutdown_enabled: bool = False
    components: CharacterComponents = field(default_factory=CharacterComponents)
    reset_confirmed_at: ResetConfirmedAtFunction = reset_confirmed_at_all
    reload_character_timeout_seconds: float = reload_character_timeout_seconds
    published: LifecycleState | None = field(default=None, compare=False)
    """The lifecycle's state as its actor last published it, for the HTTP gate to read
    without a turn (``published_state``); ``None`` while a turn that may change it runs,
    and after such a turn failed."""

    def published_state(self) -> LifecycleState | None:
        """The published state of THIS start (``instance_id``), or ``None``: then ask the
        actor (``Health``), whose activation publishes again."""
        state = self.published
        return state if state is not None and state.instance_id == self.instance_id else None


class LifecycleActor(Actor):
    """See the module docstring."""

    def __init__(self, context: ActorContext, settings: CharacterLifecycleSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.limited_mode = settings.start_blocked
        self.reason: str | None = settings.blocking_reason if settings.start_blocked else None

    async def on_activate(self) -> None:
        storage = self.context.storage
        if storage is None:
            return
        stored = await storage.read(lambda connection: state_get(connection, lifecycle_state_kind, lifecycle_state_key))
        if isinstance(stored, dict) and stored.get("instance_id") == self.settings.instance_id:
            self.limited_mode = bool(stored.get("limited_mode"))
            self.reason = stored.get("reason")
        self.settings.published = self._state()

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Health):
            state = self._state()
            self.settings.published = state
            return state
        # A turn that may change the state unpublishes it first: meanwhile the gate asks
        # ``Health``, which waits behind this turn, as every request did before the state
        # was published.  A turn that fails leaves it unpublished, so the next request asks
        # and the next activation reads the durable state again.
        self.settings.published = None
        answer = await self._receive_change(message)
        self.settings.published = self._state()
        return answer

    async def _receive_change(self, message: Any) -> Any:
        if isinstance(message, StartupContinue):
            return await self._switch(False, message.reason)
        if isinstance(message, StartupBlock):
            return await self._switch(True, message.reason)
        if isinstance(message, RequestShutdown):
            return ShutdownAnswer(self.settings.shutdown_enabled)
        if isinstance(message, Reload):
            return await self._reload(message)
        if isinstance(message, ResetConfirmedAt):
            return await self._reset_confirmed_at()
        raise TypeError(f"unexpected message {type(message).__name__}")

    def _state(self) -> LifecycleState:
        return LifecycleState(
            instance_id=self.settings.instance_id,
            limited_mode=self.limited_mode,
            blocking_reason=(self.reason or default_blocking_reason) if self.limited_mode else None,
            shutdown_enabled=self.settings.shutdown_enabled,
            components_generation=self.settings.components.generation,
        )

    async def _switch(self, limited_mode: bool, reason: str | None) -> StartupSwitched:
        if reason is not None:
            reason = reason[:reason_characters_max]
        record = {"instance_id": self.settings.instance_id, "limited_mode": limited_mode, "reason": reason}
        storage = self.context.storage
        if storage is not None:
            # Durable before the reply: an acknowledged continue survives this actor's restart.
            await storage.write(lambda connection: state_put(connection, lifecycle_state_kind, lifecycle_state_key, record))
        self.limited_mode = limited_mode
        self.reason = reason
        self.context.trace("character_limited_mode", limited_mode=limited_mode)
        return StartupSwitched(limited_mode=limited_mode, reason=reason)

    async def _reload(self, message: Reload) -> Reloaded | CharacterFailed:
        publish = dict(zip(message.resume_names, message.resume_generations, strict=True))
        names = sorted(set(publish) | set(message.release_claims))
        if len(names) > reload_names_max:
            return CharacterFailed(f"a reload may name at most {reload_names_max} characters")
        generation = self.settings.components.swap()
        self.context.trace("character_components_swapped", generation=generation)
        failed: list[str] = []
        for name in names:
            request = ReloadCharacter(
                release_tokens=tuple(message.release_claims.get(name, ())),
                publish_generation=publish.get(name),
                components_generation=generation,
            )
            try:
                reply = await self.context.ref(character_kind_name, name).ask(
                    request, timeout=self.settings.reload_character_timeout_seconds
                )
            except Exception:
                logger.exception("reload could not finish the release transaction of %r", name)
                reply = None
            if not isinstance(reply, CharacterReloaded):
                failed.append(name)
        if failed:
            return CharacterFailed(f"reload could not update {len(failed)} character(s): {', '.join(failed)}")
        return Reloaded(
            message=f"memory components reloaded (generation {generation}); {len(names)} character(s) updated",
            components_generation=generation,
        )

    async def _reset_confirmed_at(self) -> ResetDone | CharacterFailed:
        storage = self.context.storage
        if storage is None:
            return CharacterFailed("memory stores are not initialised")
        now = self.context.env.clock.wall()
        reset = self.settings.reset_confirmed_at
        try:
            count = await storage.write(lambda connection: reset(connection, now))
        except StorageError:
            logger.exception("reset_confirmed_at failed")
            return CharacterFailed("resetting confirmed reflections failed")
        return ResetDone(count)


def character_lifecycle_kind(settings: CharacterLifecycleSettings) -> ActorKind:
    """The lifecycle kind; its single actor is ``("character_lifecycle", "main")``."""
    return ActorKind(
        name=lifecycle_kind_name,
        factory=lambda context: LifecycleActor(context, settings),
        mailbox_messages_max=lifecycle_mailbox_messages_max,
    )


__all__ = [
    "CharacterComponents",
    "LifecycleActor",
    "CharacterLifecycleSettings",
    "ResetConfirmedAtFunction",
    "character_lifecycle_kind",
    "default_blocking_reason",
    "instance_id_prefix",
    "lifecycle_mailbox_messages_max",
    "new_instance_id",
    "reload_character_timeout_seconds",
    "reset_confirmed_at_all",
]
