"""The ``("character", name)`` actor: one companion character's memory, its settle lock, its
claim tokens and identity generation, derived-task admission and its background work.

What it owns (and nothing else may touch): the claims (durable, ``actor_state``), which
outbox task runs now (one runner task at a time, ``start_task("outbox")``), the requests that
wait for the settle lock, and whether the character's in-memory stores (the recall handle)
are open.  Everything else is in storage; the actor reads it through ``CharacterMemory``.

Why the pieces fit this way:

- **Request path is one write.**  ``/cache``, ``/process``, ``/renew`` and ``/settle`` append
  the history (recent history + raw time-indexed rows, via ``CharacterMemory.append_history``)
  and register their outbox tasks in ONE write job, before the reply: an acknowledged turn is
  durable together with the promise to process it.  No model call runs in the request path.
- **The settle lock is durable.**  ``/renew`` and ``/settle`` register a detailed
  ``recent_compression`` task; the lock is held while one is pending or running.  The
  compression runs in the outbox runner, beside the actor's turns, so the mailbox stays
  responsive.  ``NewDialog`` (and ``ReleaseCharacter``) arriving while the lock is held answer
  ``ReplyDeferred`` and are fulfilled in the turn that sees the lock released, before any
  later message: they see exactly the settled state, never half of it.  Because the lock is
  the outbox row, a crash mid-compression leaves it held; the next incarnation runs the
  compression again (``recover_claims``) and only then renders context.
- **Exactly-once background work.**  The runner claims a task (a write), runs
  ``CharacterMemory.run_task`` (model calls, no writes) and then commits ``complete`` and the
  task's effects in ONE write, effects only when ``complete`` says this claim is current.  A
  crash, a cancellation or a stale claim therefore never applies a task's effects twice.
- **Claims and generations** (``/release_character``, ``/reload``): a live claim closes
  derived-task admission (every outbox kind but ``recent_compression``): the running derived
  task is cancelled, nothing derived is claimed until the claim is gone.  It also closes the
  character's stores: the recall handle is dropped and ``/query_memory`` answers
  ``MemoryUnavailable`` (503) until a reload ends the claim (durable, as the claims are; a
  foreground write does not reopen them).  ``hold_admission``
  additionally cancels the character's pending derived tasks and keeps its stores closed
  (foreground writes answer ``status: "error"``, recall answers 503) until reload publishes.
  A token that a reload released, or that publication removed, is remembered (bounded) and a
  later release with it is refused (``ClaimRefused``: replayed or revoked); so is a claim that
  captured a generation older than the published one.  ``ReloadCharacter`` releases exactly
  the listed tokens and publishes a generation, removing only claims of older generations.

- **The background kinds** (``StoreMemory.run_task``): the post-turn signal extracts facts;
  ``history_review`` reads the dialogue past its cursor, denies the reflections a negative
  remark targets and records persona corrections, each with a ``correction`` task that
  applies it (``/cancel_correction`` cancels both); ``reflection_synthesis`` adds up to
  ``reflections_per_synthesis_max`` reflections; ``promotion`` runs one bounded lifecycle pass
  (confirm, promote or merge into the persona, archive); ``index_catch_up`` syncs the recall
  index.  Every transition logs its funnel event in the completing write, and a write that
  changed facts or reflections marks the recall handle stale (``memory_changed``).
- **The periodic loop**: a durable reminder (``memory_loop``, every
  ``memory_loop_interval_seconds``) registers a synthesis and a promotion task, coalesced with
  ones still pending.  The character's first write after activation arms it; it re-arms
  itself until the character has been silent for ``memory_loop_idle_seconds_max``.
  ``/reflect`` synthesises one reflection at once and queues promotion (fire and forget, so
  ``auto_transitions`` is 0).

- **Recall runs beside the turns.**  A ``/query_memory`` turn (``QueryMemory(leased=True)``)
  only admits the query: the same checks as ever (claims, stores open, the index opened, in
  the background when it is not, ``RecallOpening``), a sync of the handle when writes marked
  it stale, and then it answers a ``RecallLease`` (``_recall``) that the HTTP route runs.  So
  one character's queries overlap (SQLite's FTS5 leaves the interpreter lock in its read
  threads) and its mailbox keeps moving.  The leases live in the engine's ``RecallLeases``,
  not here: ``/release_character`` and a reload (``_close_stores``) wait for the character's
  reading leases, at most ``lease_drain_seconds_max``, then revoke them (503), and only then
  drop the handle, also when the leases came from an incarnation that crashed since.

A crash discards the instance: claims, the settle lock and the outbox are durable, so the next
activation restores them; waiting requests re-ask (``ask_waiting``) and are queued again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import apsw
import trio

from troupe.runtime import Actor, ActorContext, ActorKind, Env, TaskEnded
from troupe.storage import StorageError, reminder_set, reminders_for, state_get, state_put

from ._funnel import funnel_counts
from ._lifecycle import CharacterComponents
from ._outbox import (
    OutboxTask,
    active_tasks,
    cancel_tasks,
    claim_next,
    complete_task,
    fail_task,
    outbox_task_kinds,
    recover_claims,
    register_task,
    retry_backoff_seconds,
)
from ._protocol import (
    CacheHistory,
    CancelCorrection,
    CharacterFailed,
    CharacterReleased,
    CharacterReloaded,
    CharacterState,
    CharacterStatus,
    ClaimRefused,
    ContextText,
    ConversationGap,
    CorrectionCancelled,
    FollowupTopics,
    Funnel,
    FunnelCounts,
    GetPersona,
    GetSettings,
    HistoryCached,
    HistoryMessage,
    HistoryProcessed,
    HistorySettled,
    LastConversationGap,
    MemoryUnavailable,
    NewDialog,
    PersonaDocument,
    ProcessHistory,
    QueryMemory,
    RecentHistory,
    RecordSurfaced,
    Reflect,
    ReflectResult,
    ReleaseCharacter,
    ReloadCharacter,
    RenewHistory,
    ReplyDeferred,
    ReplyWaiter,
    SettleHistory,
    SurfacedRecorded,
    Topics,
    character_kind_name,
    claim_token_characters_max,
    claim_tokens_per_character_max,
    reflection_ids_max,
)

logger = logging.getLogger(__name__)

claims_state_kind = "character_claims"
"""``actor_state`` kind of a character's claims (key = the character name)."""
outbox_task_name = "outbox"
outbox_reminder_name = "outbox"
compression_kind = "recent_compression"
derived_task_kinds: tuple[str, ...] = tuple(kind for kind in outbox_task_kinds if kind != compression_kind)
"""What a claim stops: every background kind except the settle compression, which is part of
the foreground request that registered it."""

released_claim_tokens_max = 4_096
"""Released or removed claim tokens remembered per character (to refuse their replay)."""
waiters_max = 1_000
"""Requests that may wait for one character's settle lock at once."""
post_turn_kind = "post_turn_signal"
"""The outbox kind every ``/cache``, ``/process``, ``/renew`` and ``/settle`` registers."""
outbox_tasks_per_run_max = 32
"""Tasks one runner claims before it yields (the next run starts from the task-ended turn)."""
outbox_task_seconds_max = 300.0
"""One task's work (model calls); longer is a failed attempt."""
outbox_batch_seconds = 1.0
"""A runner started while the character is not settling waits this long before its first
claim, so that the post-turn signals of the turns meanwhile coalesce into one pending task
(one claim, one extraction, one completion for all of them).  A renew or settle cuts the wait
short: the settle lock never waits for batching.  Nor does a runner claim, after its first
task, a post-turn signal that turns registered meanwhile (only a continuation of a capped
extraction): it ends, and the next runner waits again.  Under the bench (100 characters, a
few turns a second each) 0.2 s gave 0.79 tasks per turn; the post-turn work is per task, so
the window sets its cost per turn.  The contract puts no extraction in the request path and
no deadline on it."""
character_mailbox_messages_max = 256
task_id_prefix = "task_"
memory_loop_reminder_name = "memory_loop"
memory_loop_interval_seconds = 3_600.0
"""The periodic synthesis and promotion loop of a character runs this often (a durable
reminder, armed by the character's first write after activation)."""
memory_loop_idle_seconds_max = 30 * 24 * 3_600.0
"""The loop stops re-arming itself once the last conversation is older than this (the next
write arms it again): longer than a pending reflection's expiry plus its promotion delay."""
recall_open_task_name = "recall_open"
recall_open_wait_seconds = 1.0
"""A ``/query_memory`` that finds the character's recall index not open starts opening it in
the background and waits this long for it inside its turn; a larger character (100k facts:
about a minute, longer than a turn may run) answers 503 meanwhile."""
recall_opening_retry_after_seconds = 5.0
"""``Retry-After`` of that 503."""
loop_dedupe_keys = {"reflection_synthesis": "synthesis", "promotion": "promotion"}
"""What one loop run registers (coalesced with a registration still pending)."""

assert claim_tokens_per_character_max <= released_claim_tokens_max
assert outbox_tasks_per_run_max >= 1
assert 0 < recall_open_wait_seconds < outbox_task_seconds_max
assert 0 <= outbox_batch_seconds < outbox_task_seconds_max


# ---------------------------------------------------------------------------------------------
# What the actor needs from the store and memory slices
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CharacterPort:
    """What a memory function gets: the character, its published identity generation, the
    Env (model, embedder, clock, ids) and the storage engine."""

    name: str
    generation: int
    env: Env
    storage: Any


Effects = Callable[[apsw.Connection], None]
"""A task's durable effects, applied in the write job that completes the task."""


class CharacterMemory(Protocol):
    """The store and memory slices behind the actor (``default_character_memory`` wires the
    real ones).  Sync methods run inside the actor's write or read job; async ones may call
    the model and read storage, and never write (their writes are ``Effects``)."""

    def append_history(self, connection: apsw.Connection, name: str, messages: Sequence[HistoryMessage],
                       now: float, *, only_uncached: bool) -> int:
        """Append to recent history and the raw time-indexed rows; update the last
        conversation time.  ``only_uncached`` skips the messages already at the tail of the
        recent history (``/settle``).  Returns how many messages were written."""
        ...

    def character_known(self, connection: apsw.Connection, name: str) -> bool: ...

    def last_conversation_at(self, connection: apsw.Connection, name: str) -> float | None: ...

    def record_surfaced(self, connection: apsw.Connection, name: str, reflection_ids: Sequence[str],
                        now: float) -> int: ...

    async def new_dialog_text(self, port: CharacterPort) -> str: ...

    async def recent_history_text(self, port: CharacterPort) -> str: ...

    async def settings_text(self, port: CharacterPort) -> str: ...

    async def persona(self, port: CharacterPort) -> dict[str, Any]: ...

    async def followup_topics(self, port: CharacterPort) -> list[dict[str, Any]]: ...

    async def reflect(self, port: CharacterPort) -> tuple[dict[str, Any] | None, Effects | None]:
        """Synthesise a reflection now: the reflection (``None`` when nothing to say) and its
        effects (written by the actor before the reply)."""
        ...

    async def run_task(self, port: CharacterPort, task: OutboxTask) -> Effects | None:
        """Do one outbox task's work; its effects are applied with its completion."""
        ...

    async def query_memory(self, port: CharacterPort, query: str | None, time: str | None) -> Any:
        """``MemoryResults`` | ``MemoryUnavailable`` (``_recall.query_memory``)."""
        ...

    def memory_changed(self, port: CharacterPort) -> None:
        """A write that may have changed the character's facts or reflections committed
        (task effects, ``/reflect``): recall must see it before its next answer."""
        ...

    def close_stores(self, port: CharacterPort) -> bool:
        """Forget the character's in-memory stores and indexes (release, reload); they are
        rebuilt from storage on next use.  True when something was open."""
        ...

    # Optional, found with ``getattr`` (``StoreMemory`` has both; a memory without them
    # answers queries inside the turn, as before leases):
    #   async lease_recall(port, query, time, *, trace) -> RecallLease | RecallOpening | reply
    #   async drain_leases(port) -> int   (before ``close_stores``: leases end or are revoked)


@dataclass
class CharacterSettings:
    memory: CharacterMemory = field(default_factory=lambda: default_character_memory())
    components: CharacterComponents = field(default_factory=CharacterComponents)
    outbox_task_seconds_max: float = outbox_task_seconds_max
    outbox_tasks_per_run_max: int = outbox_tasks_per_run_max
    outbox_batch_seconds: float = outbox_batch_seconds
    memory_loop_interval_seconds: float = memory_loop_interval_seconds
    memory_loop_idle_seconds_max: float = memory_loop_idle_seconds_max
    recall_open_wait_seconds: float = recall_open_wait_seconds

    def __post_init__(self) -> None:
        assert 0 < self.memory_loop_interval_seconds <= self.memory_loop_idle_seconds_max


@dataclass(frozen=True, kw_only=True)
class RunMemoryLoop:
    """Run the periodic loop now: register a synthesis and a promotion task (what the
    ``memory_loop`` reminder does; operators and tests may send it).  → ``MemoryLoopQueued``."""


@dataclass(frozen=True)
class MemoryLoopQueued:
    tasks: int
    """Tasks registered (a registration still pending coalesces: 0 then)."""


@dataclass(frozen=True)
class RecallOpening:
    """``CharacterMemory.query_memory``'s answer while the character's recall index is not
    open: ``open()`` opens it, which may take far longer than a turn (100k facts to index or
    reconcile), so the actor runs it as a background task and answers 503 meanwhile."""

    open: Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class OutboxIdle:
    """What the outbox runner returns when its last claim found nothing: the character's
    active tasks as that claim's write job saw them, and the actor's outbox change count when
    the job was queued.  The task-ended turn uses them instead of reading the outbox again
    when no turn changed the outbox since (``CharacterActor.outbox_changes``)."""

    tasks: tuple[OutboxTask, ...]
    changes: int = 0


@dataclass(frozen=True)
class ContinuedExtraction:
    """A post-turn extraction's effects when it stopped at its cap and registered a
    continuation: the runner claims that continuation at once (a backlog is not batched)."""

    effects: Effects

    def __call__(self, connection: apsw.Connection) -> None:
        self.effects(connection)


@dataclass(frozen=True)
class TaskFailure:
    """A task's work raised: the attempt is recorded as failed (``fail_task``)."""

    reason: str


# ---------------------------------------------------------------------------------------------
# Claims (durable)
# ---------------------------------------------------------------------------------------------


@dataclass
class Claims:
    """A character's identity generation, its live claims and the tokens it must refuse."""

    generation: int = 0
    live: dict[str, tuple[int, bool]] = field(default_factory=dict)
    """token → (generation it captured, hold admission)."""
    retired: list[str] = field(default_factory=list)
    """Released or removed tokens, oldest first (bounded)."""

    @property
    def held(self) -> bool:
        return any(hold for _, hold in self.live.values())

    def retire(self, token: str) -> None:
        if token in self.retired:
            self.retired.remove(token)
        self.retired.append(token)
        del self.retired[:-released_claim_tokens_max]

    def encode(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "live": {token: [generation, hold] for token, (generation, hold) in self.live.items()},
            "retired": list(self.retired),
        }

    @classmethod
    def decode(cls, value: Any) -> Claims:
        if not isinstance(value, dict):
            return cls()
        live = {token: (int(pair[0]), bool(pair[1])) for token, pair in value.get("live", {}).items()}
        return cls(int(value.get("generation", 0)), live, list(value.get("retired", [])))


# ---------------------------------------------------------------------------------------------
# The actor
# ---------------------------------------------------------------------------------------------


class CharacterActor(Actor):
    """See the module docstring."""

    def __init__(self, context: ActorContext, settings: CharacterSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.memory = settings.memory
        self.name = context.key
        self.claims = Claims()
        self.settling = False
        self.waiters: list[tuple[ReplyWaiter, Any]] = []
        self.running_task: OutboxTask | None = None
        self.components_generation = settings.components.generation
        self.stores_open = True
        self.cancelled_while_running = 0
        self.loop_armed = False
        self.outbox_changes = 0
        """Counts this instance's turns that wrote outbox rows (after their write): the
        runner's idle report is current only while it is unchanged."""
        self.recall_opened = trio.Event()
        self.outbox_batching: trio.CancelScope | None = None
        """The runner's batching wait, while it lasts (a renew or settle cancels it)."""

    # -- activation ------------------------------------------------------------------------

    async def on_activate(self) -> None:
        name = self.name
        now = self.context.env.clock.wall()

        def restore(connection: apsw.Connection) -> tuple[Any, list[OutboxTask], bool]:
            # The previous incarnation's claims on running tasks died with it.
            recover_claims(connection, name, now)
            armed = any(reminder.name == memory_loop_reminder_name
                        for reminder in reminders_for(connection, character_kind_name, name))
            return (state_get(connection, claims_state_kind, name),
                    active_tasks(connection, name, [compression_kind]), armed)

        stored, compressions, self.loop_armed = await self.context.storage.write(restore)
        self.claims = Claims.decode(stored)
        # A release closes the stores until a reload ends its claim (durable: the claims).
        self.stores_open = not self.claims.live
        self.settling = any(_detailed(task) for task in compressions)
        self._pump()

    async def on_passivate(self) -> None:
        # Waiters re-ask (``ask_waiting``); the next incarnation queues them again.
        self.waiters.clear()

    async def on_reminder(self, name: str, payload: Any) -> None:
        if name == outbox_reminder_name:
            self._pump()
        elif name == memory_loop_reminder_name:
            await self._memory_loop(rearm=True)

    # -- dispatch --------------------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        await self._follow_components()
        if isinstance(message, TaskEnded):
            return await self._task_ended(message)
        if isinstance(message, CacheHistory):
            return await self._write_turn(message.messages, "cache")
        if isinstance(message, ProcessHistory):
            return await self._write_turn(message.messages, "process")
        if isinstance(message, RenewHistory):
            return await self._write_turn(message.messages, "renew")
        if isinstance(message, SettleHistory):
            return await self._write_turn(message.messages, "settle")
        if isinstance(message, NewDialog):
            if self.settling:
                return self._defer(message.waiter, message)
            return await self._new_dialog()
        if isinstance(message, ReleaseCharacter):
            if self.settling:
                return self._defer(message.waiter, message)
            return await self._release(message)
        if isinstance(message, ReloadCharacter):
            return await self._reload(message)
        if isinstance(message, QueryMemory):
            return await self._query_memory(message)
        if isinstance(message, RecentHistory):
            return ContextText(await self.memory.recent_history_text(self._port()))
        if isinstance(message, GetSettings):
            return ContextText(await self.memory.settings_text(self._port()))
        if isinstance(message, GetPersona):
            return PersonaDocument(await self.memory.persona(self._port()))
        if isinstance(message, LastConversationGap):
            return await self._gap()
        if isinstance(message, Reflect):
            return await self._reflect()
        if isinstance(message, FollowupTopics):
            return Topics(tuple(await self.memory.followup_topics(self._port())))
        if isinstance(message, RecordSurfaced):
            return await self._record_surfaced(message)
        if isinstance(message, CancelCorrection):
            return await self._cancel_correction()
        if isinstance(message, Funnel):
            return await self._funnel(message)
        if isinstance(message, RunMemoryLoop):
            return MemoryLoopQueued(await self._memory_loop(rearm=False))
        if isinstance(message, CharacterStatus):
            return await self._status()
        raise TypeError(f"unexpected message {type(message).__name__}")

    def _port(self) -> CharacterPort:
        return CharacterPort(self.name, self.claims.generation, self.context.env, self.context.storage)

    async def _follow_components(self) -> None:
        """A reload swapped the components: drop the in-memory ones (rebuilt on next use),
        once the leased recalls of the old ones ended."""
        generation = self.settings.components.generation
        if generation != self.components_generation:
            self.components_generation = generation
            await self._close_stores()

    async def _close_stores(self) -> int:
        """Drop the in-memory stores (rebuilt on next use), and stop opening them.  Leased
        recalls still reading them are waited for, bounded (``drain_leases``), then revoked:
        no handle is read after this returns.  Returns how many leases were revoked."""
        self.context.cancel_task(recall_open_task_name)
        drain = getattr(self.memory, "drain_leases", None)
        revoked = await drain(self._port()) if drain is not None else 0
        self.memory.close_stores(self._port())
        return revoked

    # -- dialogue persistence --------------------------------------------------------------

    async def _write_turn(self, messages: tuple[HistoryMessage, ...], route: str) -> Any:
        if self.claims.held:
            return CharacterFailed("the character is released until the next reload")
        name, memory = self.name, self.memory
        env = self.context.env
        now = env.clock.wall()
        generation = self.claims.generation
        plan = _tasks_for(route, len(messages))
        task_ids = [env.ids.new_id(task_id_prefix) for _ in plan]
        loop_due = None if self.loop_armed else self._reminder_now() + self.settings.memory_loop_interval_seconds

        def write(connection: apsw.Connection) -> int:
            if loop_due is not None:
                reminder_set(connection, character_kind_name, name, memory_loop_reminder_name, loop_due, None)
            count = memory.append_history(connection, name, messages, now, only_uncached=route == "settle")
            for task_id, (kind, payload, dedupe_key) in zip(task_ids, plan, strict=True):
                if kind == "post_turn_signal" and count == 0:
                    continue
                payload = {**payload, "count": count, "route": route}
                # A post-turn signal not yet claimed covers this turn too (its extraction
                # reads every raw row past the cursor when it runs): a backlog of turns
                # becomes one task, not one claim, model call and completion per turn.
                register_task(connection, name, task_id=task_id, kind=kind, payload=payload,
                              generation=generation, now=now, dedupe_key=dedupe_key,
                              coalesce_pending=kind == "post_turn_signal")
            return count

        try:
            count = await self.context.storage.write(write)
        except StorageError:
            logger.exception("writing %s history of %r failed", route, name)
            return CharacterFailed("the history could not be stored")
        finally:
            self.outbox_changes += 1
        if route in ("renew", "settle"):
            self.settling = True
            if self.outbox_batching is not None:
                self.outbox_batching.cancel()
        if loop_due is not None:
            self.context.reminder_armed(memory_loop_reminder_name, loop_due)
            self.loop_armed = True
        self._pump()
        if route == "cache":
            return HistoryCached(count)
        if route == "settle":
            return HistorySettled()
        return HistoryProcessed()

    # -- settle lock -----------------------------------------------------------------------

    def _defer(self, waiter: ReplyWaiter | None, message: Any) -> Any:
        if waiter is not None and all(queued is not waiter for queued, _ in self.waiters):
            if len(self.waiters) >= waiters_max:
                return CharacterFailed("too many requests wait for this character's settle")
            self.waiters.append((waiter, message))
        return ReplyDeferred()

    async def _answer_waiters(self) -> None:
        """The settle lock was released: answer the queued requests in arrival order, in
        this turn, so each sees the settled state and nothing that came after."""
        waiters, self.waiters = self.waiters, []
        for waiter, message in waiters:
            if self.settling:
                # A release answered above may not change the lock, but stay safe.
                self.waiters.append((waiter, message))
                continue
            if isinstance(message, NewDialog):
                waiter.fulfil(await self._new_dialog())
            elif isinstance(message, ReleaseCharacter):
                waiter.fulfil(await self._release(message))

    async def _new_dialog(self) -> ContextText:
        name = self.name
        known = await self.context.storage.read(lambda connection: self.memory.character_known(connection, name))
        if not known:
            return ContextText("")
        return ContextText(await self.memory.new_dialog_text(self._port()))

    # -- claims ----------------------------------------------------------------------------

    async def _release(self, message: ReleaseCharacter) -> CharacterReleased | ClaimRefused | CharacterFailed:
        token = message.claim_token
        claims = self.claims
        assert token and len(token) <= claim_token_characters_max, "the HTTP layer checks the token"
        if token in claims.retired:
            return ClaimRefused(self.name, token, "release claim was already withdrawn")
        if token not in claims.live and message.claim_generation < claims.generation:
            claims.retire(token)
            await self._save_claims()
            return ClaimRefused(self.name, token, "release claim belongs to an older identity generation")
        if token not in claims.live and len(claims.live) >= claim_tokens_per_character_max:
            return CharacterFailed("too many live claims on this character")
        previous = claims.live.get(token)
        hold = message.hold_admission or (previous is not None and previous[1])
        claims.live[token] = (previous[0] if previous else message.claim_generation, hold)
        stopped = self._stop_running_derived()
        name = self.name
        now = self.context.env.clock.wall()
        state = claims.encode()

        def write(connection: apsw.Connection) -> int:
            # Queued after any write the stopped runner had in flight, so nothing derived
            # lands after this commit.
            count = cancel_tasks(connection, name, now, kinds=derived_task_kinds) if hold else 0
            if stopped and not hold:
                # The stopped task's claim died with its runner: pending again, for later.
                recover_claims(connection, name, now)
                count += 1
            state_put(connection, claims_state_kind, name, state)
            return count

        try:
            cancelled = await self.context.storage.write(write)
        except StorageError:
            logger.exception("release of %r failed", name)
            del claims.live[token]
            return CharacterFailed("the release could not be stored")
        finally:
            self.outbox_changes += 1
        self.stores_open = False
        revoked = await self._close_stores()
        self.context.trace("character_released", tokens=len(claims.live), cancelled=cancelled, hold=hold,
                           leases_revoked=revoked)
        return CharacterReleased(self.name, cancelled, token)

    def _stop_running_derived(self) -> bool:
        """Cancel the runner when it runs a derived task (a held release then cancels the
        task itself in the outbox and counts it there)."""
        task = self.running_task
        if task is None or task.kind not in derived_task_kinds:
            return False
        self.context.cancel_task(outbox_task_name)
        self.running_task = None
        return True

    async def _reload(self, message: ReloadCharacter) -> CharacterReloaded:
        claims = self.claims
        for token in message.release_tokens:
            claims.live.pop(token, None)
            claims.retire(token)
        if message.publish_generation is not None:
            published = message.publish_generation
            claims.generation = max(claims.generation, published)
            for token, (generation, _) in list(claims.live.items()):
                if generation < published:
                    del claims.live[token]
                    claims.retire(token)
        await self._save_claims()
        await self._close_stores()
        self.stores_open = not claims.live
        self._pump()
        return CharacterReloaded(self.name, len(message.release_tokens), claims.generation, not claims.live)

    async def _save_claims(self) -> None:
        name, state = self.name, self.claims.encode()
        await self.context.storage.write(lambda connection: state_put(connection, claims_state_kind, name, state))

    # -- background work -------------------------------------------------------------------

    def _claimable_kinds(self) -> tuple[str, ...]:
        if self.claims.held:
            return ()
        if self.claims.live:
            return (compression_kind,)
        return outbox_task_kinds

    def _reminder_now(self) -> float:
        """The outbox's clock: the reminder service's wall time, which never goes back.  A
        task's ``available_at`` decides both when the outbox reminder fires and when a claim
        may take the task, so the two must read one clock: after the wall clock jumped back, a
        claim on ``env.clock.wall()`` refused what the reminder (on its high-water mark) found
        due, and ``_task_ended`` re-armed the reminder at that moment again and again."""
        return self.context.system.reminders.now()

    def _pump(self) -> None:
        """Start the runner if it is not running and something may be claimable."""
        if self.context.task_running(outbox_task_name) or not self._claimable_kinds():
            return
        self.context.start_task(outbox_task_name, self._run_outbox)

    async def _run_outbox(self) -> OutboxIdle | None:
        """Claims and runs tasks one at a time, compression first.  A task's completion (with
        its effects) and the next claim are ONE write job, and a claim that finds nothing
        reports the active tasks it saw (``OutboxIdle``), so the task-ended turn need not read
        them again.  Runs outside turns: it reads the actor's state only between awaits.
        Returns ``None`` when it stopped for another reason (the turn then reads)."""
        storage = self.context.storage
        if self._batching():
            with trio.move_on_after(self.settings.outbox_batch_seconds) as self.outbox_batching:
                await trio.sleep_forever()
            self.outbox_batching = None
        ran = 0
        finished: OutboxTask | None = None
        outcome: Effects | TaskFailure | None = None
        while True:
            more = ran < self.settings.outbox_tasks_per_run_max
            kinds = self._claimable_kinds() if more else ()
            if ran and not isinstance(outcome, ContinuedExtraction) and self._batching():
                # The turns' signal registered while this task ran waits for the next
                # runner's batching wait (see ``outbox_batch_seconds``).
                kinds = tuple(kind for kind in kinds if kind != post_turn_kind)
            changes = self.outbox_changes
            job = self._finish_and_claim(finished, outcome, kinds, self._reminder_now())
            try:
                completed, task, idle = await storage.write(job)
            finally:
                # Also when the write failed: whether it committed may be unknown, and a
                # recall that syncs for nothing costs one read.
                if finished is not None and outcome is not None and not isinstance(outcome, TaskFailure):
                    self.memory.memory_changed(self._port())
            if finished is not None and not isinstance(outcome, TaskFailure):
                self.context.trace("character_task", task=finished.kind, task_id=finished.task_id,
                                   completed=completed)
            if task is None:
                return None if idle is None else replace(idle, changes=changes)
            if task.kind in derived_task_kinds and self.claims.live:
                # A release arrived while the claim was in flight: hand it back untouched.
                await storage.write(partial(recover_claims, name=self.name, now=self._reminder_now()))
                return None
            self.running_task = task
            try:
                outcome = await self._work(task)
            finally:
                if self.running_task is task:
                    self.running_task = None
            finished = task
            ran += 1

    def _batching(self) -> bool:
        return self.settings.outbox_batch_seconds > 0 and not self.settling

    async def _work(self, task: OutboxTask) -> Effects | TaskFailure | None:
        """One task's work (model calls, reads): its effects, or the failed attempt."""
        try:
            with trio.fail_after(self.settings.outbox_task_seconds_max):
                return await self.memory.run_task(self._port(), task)
        except Exception as error:
            logger.warning("outbox task %s (%s) of %r failed: %s", task.task_id, task.kind, self.name,
                           type(error).__name__)
            return TaskFailure(type(error).__name__)

    def _finish_and_claim(self, finished: OutboxTask | None, outcome: Effects | TaskFailure | None,
                          kinds: tuple[str, ...], now: float,
                          ) -> Callable[[apsw.Connection], tuple[bool, OutboxTask | None, OutboxIdle | None]]:
        """The runner's write job: complete (effects only when ``complete_task`` says the
        claim is current) or fail the finished task, then claim the next one of ``kinds``
        (compression first), or report the active tasks when there is none."""
        name = self.name

        def job(connection: apsw.Connection) -> tuple[bool, OutboxTask | None, OutboxIdle | None]:
            completed = False
            if finished is not None:
                claim = finished.claim or ""
                if isinstance(outcome, TaskFailure):
                    fail_task(connection, finished.task_id, claim, now, outcome.reason)
                elif complete_task(connection, finished.task_id, claim, now):
                    completed = True
                    if outcome is not None:
                        outcome(connection)
            if not kinds:
                return completed, None, None
            preferred = (compression_kind,) if compression_kind in kinds else ()
            task = claim_next(connection, name, now, kinds, preferred_kinds=preferred)
            if task is not None:
                return completed, task, None
            return completed, None, OutboxIdle(tuple(active_tasks(connection, name)))

        return job

    async def _task_ended(self, ended: TaskEnded) -> None:
        if ended.name == recall_open_task_name:
            if ended.error is not None:
                logger.error("opening the recall index of %r failed: %s", self.name, type(ended.error).__name__)
            return None
        if ended.name != outbox_task_name:
            return None
        name = self.name
        now = self._reminder_now()
        if ended.error is not None:
            # Storage trouble under the runner: its task stays claimed until recovery; try
            # again after a backoff rather than spinning.
            logger.error("the outbox runner of %r failed: %s", name, type(ended.error).__name__)
            await self.context.set_reminder(outbox_reminder_name, now + retry_backoff_seconds)
            return None
        idle = ended.result
        if isinstance(idle, OutboxIdle) and idle.changes == self.outbox_changes:
            # No turn wrote to the outbox since the runner's last claim: what it saw is current.
            tasks = list(idle.tasks)
        else:
            tasks = await self.context.storage.read(lambda connection: active_tasks(connection, name))
        was_settling = self.settling
        self.settling = any(task.kind == compression_kind and _detailed(task) for task in tasks)
        if was_settling and not self.settling:
            await self._answer_waiters()
        claimable = set(self._claimable_kinds())
        waiting = [task for task in tasks if task.kind in claimable and task.state == "pending"]
        if not waiting:
            return None
        due = min(task.available_at for task in waiting)
        if due <= now:
            self._pump()
        else:
            await self.context.set_reminder(outbox_reminder_name, max(due, now))
        return None

    async def _memory_loop(self, *, rearm: bool) -> int:
        """One run of the periodic loop: register the synthesis and promotion tasks (each
        bounded per run, see ``StoreMemory``), and with ``rearm`` set the next reminder while
        the character is not idle.  Returns how many tasks were registered."""
        name, env = self.name, self.context.env
        now, generation = env.clock.wall(), self.claims.generation
        task_ids = {kind: env.ids.new_id(task_id_prefix) for kind in loop_dedupe_keys}

        def write(connection: apsw.Connection) -> tuple[int, float | None]:
            registered = 0
            for kind, dedupe_key in loop_dedupe_keys.items():
                task = register_task(connection, name, task_id=task_ids[kind], kind=kind, payload={},
                                     generation=generation, now=now, dedupe_key=dedupe_key)
                registered += task is not None and task.task_id == task_ids[kind]
            return registered, self.memory.last_conversation_at(connection, name)

        try:
            registered, last = await self.context.storage.write(write)
        finally:
            self.outbox_changes += 1
        if rearm:
            active = last is not None and now - last <= self.settings.memory_loop_idle_seconds_max
            if active:
                await self.context.set_reminder(memory_loop_reminder_name,
                                                self._reminder_now() + self.settings.memory_loop_interval_seconds)
            self.loop_armed = active
        self._pump()
        return registered

    # -- reads and small writes ------------------------------------------------------------

    async def _query_memory(self, message: QueryMemory) -> Any:
        if self.claims.live or not self.stores_open:
            # ``/release_character`` released the stores: closed until a reload ends the claim.
            return MemoryUnavailable("the character is released until the next reload")
        reply = await self._admit_query(message)
        if not isinstance(reply, RecallOpening):
            return reply
        return await self._open_recall(reply, message)

    async def _admit_query(self, message: QueryMemory) -> Any:
        """A leased query (``message.leased``) gets a ``RecallLease`` to run outside this
        turn when the memory hands them out (``lease_recall``); otherwise the query runs
        here.  Either may be ``RecallOpening``."""
        lease_recall = getattr(self.memory, "lease_recall", None) if message.leased else None
        if lease_recall is not None:
            return await lease_recall(self._port(), message.query, message.time, trace=self.context.trace)
        return await self.memory.query_memory(self._port(), message.query, message.time)

    async def _open_recall(self, opening: RecallOpening, message: QueryMemory) -> Any:
        """The recall index is not open (first query after start-up, a release or a reload):
        open it in a background task, so no turn ever indexes or reconciles 100k facts
        (a minute; the turn limit would crash the actor), and wait for it at most
        ``recall_open_wait_seconds`` here: a small character answers this very query, a
        large one answers 503 with ``Retry-After`` until the index is ready."""
        if not self.context.task_running(recall_open_task_name):
            opened = self.recall_opened = trio.Event()

            async def open_recall() -> None:
                try:
                    await opening.open()
                finally:
                    opened.set()  # also on failure: the waiting query answers 503, the next retries

            self.context.start_task(recall_open_task_name, open_recall)
        opened = self.recall_opened
        with trio.move_on_after(self.settings.recall_open_wait_seconds):
            await opened.wait()
        if opened.is_set():
            reply = await self._admit_query(message)
            if not isinstance(reply, RecallOpening):
                return reply
        return MemoryUnavailable("the memory stores are being opened",
                                 retry_after_seconds=recall_opening_retry_after_seconds)

    async def _gap(self) -> ConversationGap:
        name = self.name
        last = await self.context.storage.read(lambda connection: self.memory.last_conversation_at(connection, name))
        if last is None:
            return ConversationGap(-1)
        return ConversationGap(round(max(0.0, self.context.env.clock.wall() - last), 3))

    async def _reflect(self) -> ReflectResult:
        if self.claims.live:
            # Synthesis is derived work: a claimed character does none.
            return ReflectResult(None)
        reflection, effects = await self.memory.reflect(self._port())
        name, env = self.name, self.context.env
        now, generation = env.clock.wall(), self.claims.generation
        task_id = env.ids.new_id(task_id_prefix)

        def write(connection: apsw.Connection) -> None:
            if effects is not None:
                effects(connection)
            # Promotion is fire and forget: an outbox task (so auto_transitions stays 0).
            register_task(connection, name, task_id=task_id, kind="promotion", payload={},
                          generation=generation, now=now, dedupe_key="promotion")

        try:
            await self.context.storage.write(write)
        except StorageError:
            logger.exception("storing the reflection of %r failed", name)
            return ReflectResult(None)
        finally:
            self.outbox_changes += 1
            if effects is not None:
                self.memory.memory_changed(self._port())
        self._pump()
        return ReflectResult(reflection)

    async def _record_surfaced(self, message: RecordSurfaced) -> SurfacedRecorded:
        ids = tuple(dict.fromkeys(message.reflection_ids))[:reflection_ids_max]
        if not ids:
            return SurfacedRecorded(0)
        name, now = self.name, self.context.env.clock.wall()
        try:
            recorded = await self.context.storage.write(
                lambda connection: self.memory.record_surfaced(connection, name, ids, now))
        except Exception:
            # The contract: persisting failures are logged, the caller still gets ok.
            logger.exception("recording surfaced reflections of %r failed", name)
            recorded = 0
        return SurfacedRecorded(recorded)

    async def _cancel_correction(self) -> CorrectionCancelled:
        name, now = self.name, self.context.env.clock.wall()
        running = self.running_task is not None and self.running_task.kind == "correction"
        if running:
            self.context.cancel_task(outbox_task_name)
            self.running_task = None
        def cancel(connection: apsw.Connection) -> int:
            from ._store import list_corrections, set_correction_state

            # The proposals wait with their tasks: cancel both, so neither is applied later.
            for correction in list_corrections(connection, name, ("pending",)):
                set_correction_state(connection, correction.id, "cancelled", now)
            return cancel_tasks(connection, name, now, kinds=["correction"])

        try:
            count = await self.context.storage.write(cancel)
        finally:
            self.outbox_changes += 1
        return CorrectionCancelled("cancelled" if count or running else "no_task")

    async def _funnel(self, message: Funnel) -> FunnelCounts:
        name = self.name
        counts = await self.context.storage.read(
            lambda connection: funnel_counts(connection, name, message.since, message.until))
        return FunnelCounts(name, message.since, message.until, counts)

    async def _status(self) -> CharacterState:
        name = self.name
        tasks = await self.context.storage.read(lambda connection: active_tasks(connection, name))
        return CharacterState(
            character_name=name,
            generation=self.claims.generation,
            claims=tuple((token, generation) for token, (generation, _) in self.claims.live.items()),
            admission_open=not self.claims.live,
            stores_open=self.stores_open and not self.claims.held,
            settling=self.settling,
            outbox_pending=len(tasks),
        )


def _detailed(task: OutboxTask) -> bool:
    return bool(task.payload.get("detailed"))


def _tasks_for(route: str, count: int) -> list[tuple[str, dict[str, Any], str | None]]:
    """The outbox tasks one history write registers: (kind, payload, dedupe key)."""
    post_turn = ("post_turn_signal", {}, None)
    if route == "cache":
        return [post_turn]
    review = ("history_review", {}, "review")
    if route == "process":
        return [post_turn, (compression_kind, {"detailed": False}, "routine"), review]
    # renew and settle: the detailed compression is the settle lock.
    return [(compression_kind, {"detailed": True}, None), post_turn, review]


# ---------------------------------------------------------------------------------------------
# The real memory: the store, recall, context and reflection slices
# ---------------------------------------------------------------------------------------------

post_turn_rows_per_task_max = 200
"""Raw rows one post-turn task reads past its cursor (the rest wait for the next task)."""
post_turn_cursor = "post_turn"
post_turn_known_facts_max = 1_000
"""Newest active facts whose texts a post-turn extraction deduplicates against."""
review_rows_per_task_max = 200
"""Raw rows one history review reads past its cursor."""
review_cursor = "history_review"
corrections_per_review_max = 4
"""Persona corrections one history review may propose."""
reflections_per_synthesis_max = 4
"""Reflections one synthesis task (one loop run) may add."""
synthesis_facts_max = 1_000
"""Newest active facts a synthesis considers."""
synthesis_reflections_read_max = 20_000
"""Reflections read to know which facts were already used (the store keeps at most 10,000
live and 10,000 archived)."""
lifecycle_statuses = ("pending", "confirmed", "denied")
lifecycle_reflections_per_status_max = 200
"""Reflections of each status one lifecycle pass considers (oldest first)."""
lifecycle_facts_max = 500
"""Newest active facts a lifecycle pass checks for support (each against each pending
reflection: the pass is quadratic in these two bounds)."""

assert reflections_per_synthesis_max >= 1 and corrections_per_review_max >= 1


class StoreMemory:
    """``CharacterMemory`` over the real slices: ``_store`` for history, ``_context`` for the
    texts, ``_recall`` for ``/query_memory``, ``_reflection`` (through ``models``) for the
    background work."""

    def __init__(self, models: Any = None, recall_indexes: Any = None, lifecycle: Any = None) -> None:
        from ._reflection import LifecycleSettings

        self.models = models
        self.recall_indexes = recall_indexes
        self.lifecycle = lifecycle if lifecycle is not None else LifecycleSettings()

    def _models(self, port: CharacterPort) -> Any:
        from ._reflection import ReflectionModels

        return self.models if self.models is not None else ReflectionModels.single(port.env.model)

    def _indexes(self) -> Any:
        if self.recall_indexes is None:
            from ._recall import character_recall_indexes

            self.recall_indexes = character_recall_indexes
        return self.recall_indexes

    def append_history(self, connection: apsw.Connection, name: str, messages: Sequence[HistoryMessage],
                       now: float, *, only_uncached: bool) -> int:
        from ._store import append_recent, append_time_indexed, ensure_character, read_recent

        ensure_character(connection, name, now)
        if only_uncached and messages:
            messages = _uncached(read_recent(connection, name), messages)
        if not messages:
            return 0
        append_recent(connection, name, messages, now)
        append_time_indexed(connection, name, messages, now)
        return len(messages)

    def character_known(self, connection: apsw.Connection, name: str) -> bool:
        from ._store import character_exists

        return character_exists(connection, name)

    def last_conversation_at(self, connection: apsw.Connection, name: str) -> float | None:
        from ._store import last_conversation_at

        return last_conversation_at(connection, name)

    def record_surfaced(self, connection: apsw.Connection, name: str, reflection_ids: Sequence[str],
                        now: float) -> int:
        from ._store import record_surfaced

        return record_surfaced(connection, name, reflection_ids, now)

    async def _snapshot(self, port: CharacterPort) -> Any:
        from ._context import load_context_snapshot

        return await port.storage.read(lambda connection: load_context_snapshot(connection, port.name))

    async def new_dialog_text(self, port: CharacterPort) -> str:
        from ._context import render_new_dialog

        return render_new_dialog(await self._snapshot(port), now=port.env.clock.wall())

    async def recent_history_text(self, port: CharacterPort) -> str:
        from ._context import render_recent_history

        return render_recent_history(await self._snapshot(port))

    async def settings_text(self, port: CharacterPort) -> str:
        from ._context import render_settings

        return render_settings(await self._snapshot(port))

    async def persona(self, port: CharacterPort) -> dict[str, Any]:
        from ._store import read_document

        document = await port.storage.read(lambda connection: read_document(connection, port.name, "persona"))
        return document or {}

    async def followup_topics(self, port: CharacterPort) -> list[dict[str, Any]]:
        from ._context import load_followup_topics

        now = port.env.clock.wall()
        return await port.storage.read(lambda connection: load_followup_topics(connection, port.name, now=now))

    async def _synthesis_inputs(self, port: CharacterPort) -> list[Any]:
        """The facts no reflection (of any status) was made from yet, of the newest
        ``synthesis_facts_max`` active facts."""
        from ._reflection import unreflected_facts
        from ._store import list_facts, list_reflections, reflection_statuses

        def read(connection: apsw.Connection) -> tuple[list[Any], list[Any]]:
            return (list_facts(connection, port.name, limit=synthesis_facts_max),
                    list_reflections(connection, port.name, reflection_statuses,
                                     limit=synthesis_reflections_read_max))

        facts, reflections = await port.storage.read(read)
        return unreflected_facts(facts, reflections)

    async def _synthesise(self, port: CharacterPort, count_max: int) -> list[Any]:
        """Up to ``count_max`` new reflections over disjoint sets of unreflected facts."""
        from ._reflection import synthesise_reflection

        remaining = await self._synthesis_inputs(port)
        reflections: list[Any] = []
        while len(reflections) < count_max:
            reflection = await synthesise_reflection(self._models(port), remaining, new_id=port.env.ids.new_id)
            if reflection is None:
                break
            reflections.append(reflection)
            used = set(reflection.source_fact_ids)
            remaining = [fact for fact in remaining if fact.id not in used]
        return reflections

    def _adding_reflections(self, port: CharacterPort, reflections: Sequence[Any]) -> Effects:
        from ._store import add_reflection

        now = port.env.clock.wall()
        follow_up = self._index_follow_up(port)

        def effects(connection: apsw.Connection) -> None:
            for reflection in reflections:
                add_reflection(connection, port.name, reflection, now)  # reflections_synthesized
            follow_up(connection)

        return effects

    async def reflect(self, port: CharacterPort) -> tuple[dict[str, Any] | None, Effects | None]:
        from ._reflection import reflection_summary

        reflections = await self._synthesise(port, 1)
        if not reflections:
            return None, None
        return reflection_summary(reflections[0]), self._adding_reflections(port, reflections)

    async def run_task(self, port: CharacterPort, task: OutboxTask) -> Effects | None:
        if task.kind == compression_kind:
            return await self._compress(port, bool(task.payload.get("detailed")))
        if task.kind in ("post_turn_signal", "fact_extraction"):
            return await self._extract_facts(port)
        if task.kind == "reflection_synthesis":
            reflections = await self._synthesise(port, reflections_per_synthesis_max)
            return self._adding_reflections(port, reflections) if reflections else None
        if task.kind == "promotion":
            return await self._advance_lifecycle(port)
        if task.kind == "history_review":
            return await self._review_history(port)
        if task.kind == "correction":
            return await self._apply_correction(port, task)
        if task.kind == "index_catch_up":
            recall = self._indexes().opened(port.storage, port.name)
            # While the index is being opened, the opening task's own catch-up covers this.
            if recall is not None and recall.reconciled:
                await recall.sync()
            return None
        raise ValueError(f"unknown outbox task kind {task.kind!r}")

    def _index_follow_up(self, port: CharacterPort) -> Effects:
        """Registers (coalesced) the background catch-up of the recall index after a write
        that changed facts or reflections, so the next query need not index them itself."""
        task_id, now = port.env.ids.new_id(task_id_prefix), port.env.clock.wall()

        def register(connection: apsw.Connection) -> None:
            register_task(connection, port.name, task_id=task_id, kind="index_catch_up", payload={},
                          generation=port.generation, now=now, dedupe_key="index")

        return register

    async def _advance_lifecycle(self, port: CharacterPort) -> Effects | None:
        """One bounded pass of the reflection lifecycle (``plan_lifecycle``): confirm,
        promote or merge, archive; every transition and persona write logs its funnel event
        (the store functions do it in the same job)."""
        from ._reflection import plan_lifecycle
        from ._store import list_facts, list_persona_entries, list_reflections

        def read(connection: apsw.Connection) -> tuple[list[Any], list[Any], list[Any]]:
            reflections = [
                reflection
                for status in lifecycle_statuses
                for reflection in list_reflections(connection, port.name, (status,),
                                                   limit=lifecycle_reflections_per_status_max)
            ]
            return (reflections, list_facts(connection, port.name, limit=lifecycle_facts_max),
                    list_persona_entries(connection, port.name))

        reflections, facts, entries = await port.storage.read(read)
        if not reflections:
            return None
        now = port.env.clock.wall()
        plan = await plan_lifecycle(self._models(port), reflections, facts, entries, now=now,
                                    new_id=port.env.ids.new_id, settings=self.lifecycle)
        if plan.is_empty:
            return None
        follow_up = self._index_follow_up(port)

        def effects(connection: apsw.Connection) -> None:
            _apply_plan(connection, port.name, plan)
            follow_up(connection)

        return effects

    async def _review_history(self, port: CharacterPort) -> Effects | None:
        """Reads the dialogue past the review cursor: a user's negative remark denies the
        reflection it targets (emotion tier); a trusted correction ("其实我现在…") becomes a
        pending persona correction with its own ``correction`` task (correction tier), which
        ``/cancel_correction`` may still cancel."""
        from ._outbox import cursor_get, cursor_put
        from ._reflection import DialogueLine, detect_denials, propose_correction
        from ._store import (
            list_persona_entries,
            list_reflections,
            read_time_indexed,
            record_correction,
            transition_reflection,
        )

        def read(connection: apsw.Connection) -> tuple[list[Any], list[Any], list[Any]]:
            cursor = cursor_get(connection, port.name, review_cursor)
            return (read_time_indexed(connection, port.name, cursor, review_rows_per_task_max),
                    list_reflections(connection, port.name), list_persona_entries(connection, port.name))

        rows, reflections, entries = await port.storage.read(read)
        if not rows:
            return None
        models, now = self._models(port), port.env.clock.wall()
        lines = [DialogueLine(row.role, row.content_text, row.at) for row in rows]
        denials = await detect_denials(models, lines, reflections, now=now)
        proposals = []
        for line in lines:
            if len(proposals) >= corrections_per_review_max:
                break
            if line.role == "user":
                proposal = await propose_correction(models, entries, line.text)
                if proposal is not None:
                    proposals.append((port.env.ids.new_id("correction_"), port.env.ids.new_id(task_id_prefix),
                                      proposal))
        position = rows[-1].seq
        follow_up = self._index_follow_up(port)

        def effects(connection: apsw.Connection) -> None:
            for denial in denials:
                transition_reflection(connection, port.name, denial.reflection_id, "denied", now)
            for correction_id, task_id, proposal in proposals:
                task = register_task(connection, port.name, task_id=task_id, kind="correction",
                                     payload={"correction_id": correction_id}, generation=port.generation,
                                     now=now)
                if task is not None:
                    record_correction(connection, port.name, correction_id, proposal.entry_id,
                                      proposal.proposed_text, task_id, now)
            # The cursor moves with the work it covers, in the completing write: exactly once.
            cursor_put(connection, port.name, review_cursor, position, now)
            if denials:
                follow_up(connection)

        return effects

    async def _apply_correction(self, port: CharacterPort, task: OutboxTask) -> Effects | None:
        """Applies a pending persona correction (``persona_entries_rewritten``); one that
        was cancelled meanwhile, or whose entry is gone, is not applied."""
        from ._reflection import CorrectionProposal, apply_correction
        from ._store import (
            get_correction,
            get_persona_entry,
            rewrite_persona_entry,
            set_correction_state,
        )

        correction_id = task.payload.get("correction_id")
        if not isinstance(correction_id, str):
            return None
        correction = await port.storage.read(lambda connection: get_correction(connection, correction_id))
        if correction is None or correction.state != "pending" or correction.name != port.name:
            return None
        now = port.env.clock.wall()

        def effects(connection: apsw.Connection) -> None:
            entry = None
            if correction.entry_id is not None:
                entry = get_persona_entry(connection, port.name, correction.entry_id)
            if entry is None or entry.status != "active":
                set_correction_state(connection, correction_id, "rejected", now)
                return
            if not set_correction_state(connection, correction_id, "applied", now):
                return  # cancelled after this task read it
            proposal = CorrectionProposal(entry.id, entry.section, correction.proposed_text)
            write = apply_correction(entry, proposal, now=now)
            rewrite_persona_entry(connection, port.name, entry.id, write.text, now)

        return effects

    async def _compress(self, port: CharacterPort, detailed: bool) -> Effects | None:
        from ._context import history_summary_meta_key
        from ._reflection import DialogueLine, compress_history
        from ._store import fold_recent_prefix, read_recent_meta, read_recent_positioned

        def read(connection: apsw.Connection) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
            return read_recent_positioned(connection, port.name), read_recent_meta(connection, port.name)

        recent, meta = await port.storage.read(read)
        lines = [DialogueLine(message.role, _text_of(message.content), message.at) for _, message in recent]
        previous = meta.get(history_summary_meta_key)
        compression = await compress_history(
            self._models(port), lines, previous_summary=previous if isinstance(previous, str) else "",
            detailed=detailed)
        if compression is None:
            return None
        # The summary covers the prefix read above, no more: turns may have appended while the
        # model ran, so the effect deletes by position instead of rewriting the window.
        through_position = recent[compression.compressed_count - 1][0] if compression.compressed_count else -1
        now = port.env.clock.wall()
        metadata = compression.metadata(now=now)
        return lambda connection: fold_recent_prefix(connection, port.name, through_position, metadata, now)

    async def _extract_facts(self, port: CharacterPort) -> Effects | None:
        """The post-turn work: facts stated in the raw rows past the cursor (at most
        ``post_turn_rows_per_task_max``; a continuation task is registered when more are
        left, since turns coalesce into one pending task).  The known facts' texts are read
        only when the model found something to deduplicate."""
        from ._outbox import cursor_get, cursor_put
        from ._reflection import (
            DialogueLine,
            dialogue_characters_max,
            find_dialogue_facts,
            new_dialogue_facts,
        )
        from ._store import add_facts, list_fact_texts, read_time_indexed

        def read(connection: apsw.Connection) -> list[Any]:
            cursor = cursor_get(connection, port.name, post_turn_cursor)
            return read_time_indexed(connection, port.name, cursor, post_turn_rows_per_task_max)

        read_rows = await port.storage.read(read)
        if not read_rows:
            return None
        rows = _rows_within(read_rows, dialogue_characters_max)
        lines = [DialogueLine(row.role, row.content_text, row.at) for row in rows]
        found = await find_dialogue_facts(self._models(port), lines, character_name=port.name)
        known: list[str] = []
        if found:
            known = await port.storage.read(
                lambda connection: list_fact_texts(connection, port.name, limit=post_turn_known_facts_max))
        extraction = new_dialogue_facts(found, known, new_id=port.env.ids.new_id)
        # The cursor stops after the last line the extraction fully covered (at least one,
        # so a line with more facts than one extraction takes cannot stall the loop).
        covered = len(rows) if extraction.lines_covered is None else max(1, extraction.lines_covered)
        position, now = rows[covered - 1].seq, port.env.clock.wall()
        more = covered < len(read_rows) or len(read_rows) >= post_turn_rows_per_task_max
        continuation = port.env.ids.new_id(task_id_prefix) if more else None

        def effects(connection: apsw.Connection) -> None:
            # The cursor moves with the facts, in the completing write: exactly once.
            add_facts(connection, port.name, extraction.facts, now)
            cursor_put(connection, port.name, post_turn_cursor, position, now)
            if continuation is not None:
                register_task(connection, port.name, task_id=continuation, kind="post_turn_signal",
                              payload={"route": "continuation"}, generation=port.generation, now=now,
                              coalesce_pending=True)

        return effects if continuation is None else ContinuedExtraction(effects)

    async def query_memory(self, port: CharacterPort, query: str | None, time: str | None) -> Any:
        from ._recall import query_memory

        indexes = self._indexes()
        recall = indexes.opened(port.storage, port.name)
        if recall is None or not recall.reconciled:
            # Opening may index or reconcile every fact: the actor runs it in the background.
            return RecallOpening(lambda: indexes.open_character(port.storage, port.name,
                                                                embedder=port.env.embedder))
        return await query_memory(recall, query, time, clock=port.env.clock)

    async def lease_recall(self, port: CharacterPort, query: str | None, time: str | None, *,
                           trace: Callable[..., None] | None = None) -> Any:
        """The admission of a leased query, in the actor's turn: ``RecallOpening`` while the
        handle is not open, else a ``RecallLease`` on the handle, synced first (so the
        leased recall sees every write acknowledged before it and never writes the index
        itself); a failed sync is the contract's degraded answer, as in ``query_memory``."""
        from ._protocol import MemoryResults
        from ._recall import recall_failed_error_code

        indexes = self._indexes()
        recall = indexes.opened(port.storage, port.name)
        if recall is None or not recall.reconciled:
            return await self.query_memory(port, query, time)  # RecallOpening
        if recall.stale:
            started = port.env.clock.monotonic()
            try:
                await recall.sync()
            except Exception:  # the contract: degrade to an empty success, never leak the error
                elapsed_ms = round((port.env.clock.monotonic() - started) * 1000.0, 3)
                return MemoryResults((), query, 0, elapsed_ms, error_code=recall_failed_error_code)
        return indexes.lease(port.storage, recall, trace)

    async def drain_leases(self, port: CharacterPort) -> int:
        """Before the handle is released: the character's leased recalls end (see
        ``RecallLeases.drain``); returns how many were revoked."""
        return await self._indexes().leases_for(port.storage).drain(port.name)

    def memory_changed(self, port: CharacterPort) -> None:
        recall = self._indexes().opened(port.storage, port.name)
        if recall is not None:
            recall.mark_stale()

    def close_stores(self, port: CharacterPort) -> bool:
        return bool(self._indexes().release(port.storage, port.name))


def _apply_plan(connection: apsw.Connection, name: str, plan: Any) -> None:
    """A lifecycle plan's transitions and persona writes, each logging its funnel event.
    A transition the store refuses (the reflection moved meanwhile) is skipped."""
    from ._store import (
        NewPersonaEntry,
        add_persona_entry,
        archive_persona_entry,
        rewrite_persona_entry,
        transition_reflection,
    )

    for transition in plan.transitions:
        transition_reflection(connection, name, transition.reflection_id, transition.to_status, transition.at,
                              merged_into=transition.merged_into)
    for write in plan.persona_writes:
        if write.action == "add":
            add_persona_entry(connection, name, NewPersonaEntry(write.entry_id, write.text, write.section,
                                                                write.source), write.at)
        elif write.action == "rewrite":
            rewrite_persona_entry(connection, name, write.entry_id, write.text, write.at)
        else:
            archive_persona_entry(connection, name, write.entry_id, write.at)


def _rows_within(rows: Sequence[Any], characters_max: int) -> Sequence[Any]:
    """The leading rows whose texts fit in ``characters_max`` (at least one): what one
    extraction hands the model whole (a completion model keeps only the newest part)."""
    total = 0
    for index, row in enumerate(rows):
        total += len(row.content_text) + 1
        if total > characters_max and index > 0:
            return rows[:index]
    return rows


def _text_of(content: Any) -> str:
    return content if isinstance(content, str) else HistoryMessage("user", tuple(content)).text


def _uncached(recent: Sequence[Any], messages: Sequence[HistoryMessage]) -> Sequence[HistoryMessage]:
    """The messages ``/settle`` must still write: drop the longest prefix of ``messages``
    that is already the tail of recent history (what ``/cache`` wrote)."""
    stored = [(message.role, message.content if isinstance(message.content, str) else list(message.content))
              for message in recent]
    wanted = [(message.role, message.content if isinstance(message.content, str) else list(message.content))
              for message in messages]
    for overlap in range(min(len(stored), len(wanted)), 0, -1):
        if stored[-overlap:] == wanted[:overlap]:
            return messages[overlap:]
    return messages


def default_character_memory() -> StoreMemory:
    return StoreMemory()


def character_actor_kind(settings: CharacterSettings) -> ActorKind:
    """The character kind: ``("character", name)``."""
    return ActorKind(
        name=character_kind_name,
        factory=lambda context: CharacterActor(context, settings),
        mailbox_messages_max=character_mailbox_messages_max,
    )


__all__ = [
    "CharacterActor",
    "CharacterMemory",
    "CharacterPort",
    "CharacterSettings",
    "MemoryLoopQueued",
    "OutboxIdle",
    "RecallOpening",
    "RunMemoryLoop",
    "TaskFailure",
    "StoreMemory",
    "Claims",
    "Effects",
    "character_actor_kind",
    "character_mailbox_messages_max",
    "default_character_memory",
    "claims_state_kind",
    "compression_kind",
    "derived_task_kinds",
    "memory_loop_idle_seconds_max",
    "memory_loop_interval_seconds",
    "memory_loop_reminder_name",
    "outbox_batch_seconds",
    "outbox_task_name",
    "outbox_task_seconds_max",
    "outbox_tasks_per_run_max",
    "post_turn_known_facts_max",
    "recall_open_task_name",
    "recall_open_wait_seconds",
    "recall_opening_retry_after_seconds",
    "released_claim_tokens_max",
    "waiters_max",
]
