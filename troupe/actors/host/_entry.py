"""The entry actor ``("entry", entry_id)``: owner of one chat entry's messages.

Every write to an entry goes through its actor, one turn at a time, so a batch's dedupe
lookups, inserts and pending count see no interleaving writer for that entry.  A batch is one
storage write job: it creates the entry on its first message, then for each message either
returns the id already stored under its ``dedupe_key`` (never overwriting it) or inserts a new
row with ``learning_state = pending`` and the receive time from the Env clock.  Media
references are checked inside the same job; one refused reference rolls the whole batch back.
The reply is sent only after the commit: an acknowledged message is a durable message.

Domain rejections (unknown media, storage unavailable) are replies, not exceptions: an
exception in a turn is a crash and would restart the actor for the client's mistake.

Pace batching happens in the same transaction as the intake: once the entry has ``count``
pending messages they become a learning batch at once; otherwise the durable ``pace`` reminder
is (re)written, due at the earlier of the newest message's receive time + ``idle_seconds`` and
the oldest's + ``max_wait_seconds``, and when it fires the pending set becomes a batch.
``LearnNow`` (``POST /learn``) closes the pending set now.  Closing a batch writes its learner's
``claim`` reminder in that same transaction (``_batches.close_batch``), so a batch is never
closed without a learner being due to run it, across crashes and restarts.  Reminders written
inside a job are announced to the scheduler after the commit (``reminder_armed`` /
``reminders.arm``).

``media`` is the ``MediaResolver`` for ``media_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.auth import TokenGrant
from troupe.runtime import Actor, ActorContext, ActorKind
from troupe.storage import StorageError

from ._batches import (
    ClosedBatch,
    claim_reminder_name,
    clear_pace_reminder,
    close_batch,
    learner_kind_name,
    model_state,
    pace_reminder_name,
    pending_summary,
    set_pace_reminder,
    trigger_count,
    trigger_idle,
    trigger_learn,
    trigger_max_wait,
)
from ._media import MediaResolver, host_media
from ._pace import Pace, named_paces, pace_name_default
from ._schema import learning_state_pending, learning_states_unlearned

entry_kind_name = "entry"
messages_per_batch_max = 1000
"""The contract's array limit; the HTTP layer refuses more before asking."""

entry_mailbox_messages_max = 256
entry_turn_timeout_seconds = 60.0
"""A 1000-message batch is one transaction: generous, yet bounded."""

assert messages_per_batch_max >= 1


@dataclass(frozen=True)
class NewMessage:
    """One validated message as the HTTP layer hands it over (limits already checked)."""

    dedupe_key: str
    sender: str
    content: str
    occurred_at: str
    """ISO 8601 with its offset, as normalised by the HTTP layer."""
    occurred_at_seconds: float
    kind: str = "message"
    account_id: str | None = None
    quote_author: str | None = None
    quote_author_account_id: str | None = None
    quote_content: str | None = None
    scene_identity: str | None = None
    platform: str | None = None
    media_ids: tuple[str, ...] = ()
    entry_name: str | None = None
    entry_kind: str | None = None
    pace: Pace | None = None


@dataclass(frozen=True)
class AcceptMessages:
    """Store a batch atomically.  ``grant`` is the posting token: its name is the source."""

    messages: tuple[NewMessage, ...]
    grant: TokenGrant

    def __post_init__(self) -> None:
        assert 1 <= len(self.messages) <= messages_per_batch_max


@dataclass(frozen=True)
class MessagesAccepted:
    message_ids: tuple[int, ...]
    """In input order; a repeated dedupe key maps to the original id."""
    pending_count: int


@dataclass(frozen=True)
class MediaRefused:
    """Nothing was stored: these ``(message index, media position, media id)`` are not
    referenceable (404)."""

    refusals: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class StorageUnavailable:
    """Nothing was stored (or it is unknown whether the commit happened): retry (503)."""

    reason: str


@dataclass(frozen=True)
class LearnNow:
    """Close the entry's pending messages into a batch now (``POST /learn``)."""


@dataclass(frozen=True)
class LearnAccepted:
    pending_count: int
    """The entry's pending + batched messages after closing (as for messages)."""
    paused: bool
    """The model is paused: the batch waits and is learned once it is back."""
    reason: str | None


@dataclass(frozen=True)
class PaceOutcome:
    """What a pace evaluation wrote: a closed batch, or the ``pace`` reminder's due time."""

    closed: ClosedBatch | None = None
    pace_due: float | None = None


@dataclass(frozen=True)
class EntryRecord:
    entry_id: str
    name: str | None
    kind: str | None
    pace: Pace
    created_at: float
    created_by: str


class _Refused(Exception):
    """Raised inside the write job to roll it back; never leaves the actor."""

    def __init__(self, refusals: list[tuple[int, int, str]]) -> None:
        super().__init__("media refused")
        self.refusals = refusals


class EntryActor(Actor):
    """See the module docstring."""

    def __init__(self, context: ActorContext, *, media: MediaResolver = host_media) -> None:
        super().__init__(context)
        self.media = media
        self.entry: EntryRecord | None = None

    async def on_activate(self) -> None:
        entry_id = self.context.key
        self.entry = await self.context.storage.read(lambda connection: load_entry(connection, entry_id))

    async def receive(self, message: Any) -> Any:
        if isinstance(message, AcceptMessages):
            return await self._accept(message)
        if isinstance(message, LearnNow):
            return await self._learn_now()
        raise AssertionError(f"entry actor got an unknown message {type(message).__name__}")

    async def on_reminder(self, name: str, payload: Any) -> None:
        if name != pace_reminder_name or self.entry is None:
            return
        kind, entry_id, pace = self.context.kind, self.context.key, self.entry.pace
        now = self.context.env.clock.wall()
        fired_due = payload.get("due") if isinstance(payload, dict) else None
        outcome = await self.context.storage.write(
            lambda connection: apply_pace(connection, kind, entry_id, pace, now, fired_due=fired_due)
        )
        self._announce(outcome, now)

    async def _learn_now(self) -> Any:
        kind, entry_id = self.context.kind, self.context.key
        now = self.context.env.clock.wall()

        def job(connection: apsw.Connection) -> tuple[LearnAccepted, ClosedBatch | None]:
            closed = close_batch(connection, entry_id, trigger_learn, now)
            if closed is not None:
                clear_pace_reminder(connection, kind, entry_id)
            state = model_state(connection)
            paused = bool(state.get("paused"))
            reason = state.get("reason") if paused else None
            return LearnAccepted(pending_count(connection, entry_id), paused, reason), closed

        try:
            accepted, closed = await self.context.storage.write(job)
        except StorageError as exc:
            return StorageUnavailable(type(exc).__name__)
        self._announce(PaceOutcome(closed), now)
        return accepted

    def _announce(self, outcome: PaceOutcome, now: float) -> None:
        """Tell the scheduler about the reminders a committed job wrote."""
        if outcome.closed is not None:
            self.context.trace("batch_closed", batch=outcome.closed.batch_id, count=outcome.closed.message_count)
            self.context.system.reminders.arm(learner_kind_name, outcome.closed.learner_key, claim_reminder_name, now)
        if outcome.pace_due is not None:
            self.context.reminder_armed(pace_reminder_name, outcome.pace_due)

    async def _accept(self, command: AcceptMessages) -> Any:
        entry_id = self.context.key
        received_at = self.context.env.clock.wall()
        media = self.media

        kind = self.context.kind
        known_entry = self.entry

        def job(connection: apsw.Connection) -> tuple[MessagesAccepted, EntryRecord, PaceOutcome]:
            accepted, entry = accept_messages(connection, entry_id, command, received_at, media, entry=known_entry)
            outcome = apply_pace(connection, kind, entry_id, entry.pace, received_at)
            if outcome.closed is not None:
                accepted = MessagesAccepted(accepted.message_ids, pending_count(connection, entry_id))
            return accepted, entry, outcome

        try:
            accepted, entry, outcome = await self.context.storage.write(job)
        except _Refused as refused:
            return MediaRefused(tuple(refused.refusals))
        except StorageError as exc:
            return StorageUnavailable(type(exc).__name__)
        self.entry = entry
        self._announce(outcome, received_at)
        self.context.trace("messages_accepted", count=len(accepted.message_ids))
        return accepted


def load_entry(connection: apsw.Connection, entry_id: str) -> EntryRecord | None:
    row = connection.execute(
        "SELECT name, kind, pace_name, pace_count, pace_idle_seconds, pace_max_wait_seconds, "
        "created_at, created_by FROM host_entries WHERE entry_id = ?",
        (entry_id,),
    ).fetchone()
    if row is None:
        return None
    name, kind, pace_name, count, idle_seconds, max_wait_seconds, created_at, created_by = row
    pace = Pace(count, idle_seconds, max_wait_seconds, pace_name)
    return EntryRecord(entry_id, name, kind, pace, created_at, created_by)


def _first(messages: Sequence[NewMessage], field: str) -> Any:
    """The first message's value of ``field`` that was given (creation settings)."""
    for message in messages:
        value = getattr(message, field)
        if value is not None:
            return value
    return None


def _create_entry(
    connection: apsw.Connection, entry_id: str, command: AcceptMessages, received_at: float
) -> EntryRecord:
    messages = command.messages
    pace = _first(messages, "pace") or named_paces[pace_name_default]
    record = EntryRecord(
        entry_id, _first(messages, "entry_name"), _first(messages, "entry_kind"), pace,
        received_at, command.grant.name,
    )
    connection.execute(
        "INSERT INTO host_entries (entry_id, name, kind, pace_name, pace_count, pace_idle_seconds, "
        "pace_max_wait_seconds, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (entry_id, record.name, record.kind, pace.name, pace.count, pace.idle_seconds,
         pace.max_wait_seconds, received_at, record.created_by),
    )
    return record


_insert_message_sql = (
    "INSERT INTO host_messages (entry_id, dedupe_key, kind, sender, account_id, content, "
    "occurred_at, occurred_at_seconds, received_at, quote_author, quote_author_account_id, "
    "quote_content, scene_identity, platform, source, learning_state) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


dedupe_lookup_keys_max = 500
"""Dedupe keys looked up per statement (well under SQLite's bound-parameter limit)."""


def stored_message_ids(connection: apsw.Connection, entry_id: str, dedupe_keys: Sequence[str]) -> dict[str, int]:
    """The ids already stored in ``entry_id`` under any of ``dedupe_keys``.

    One statement per ``dedupe_lookup_keys_max`` keys rather than one per message: a batch
    usually has no retries, and every statement costs the writer thread a trip through the
    interpreter lock while the event loop is busy serving requests."""
    found: dict[str, int] = {}
    unique_keys = list(dict.fromkeys(dedupe_keys))
    for start in range(0, len(unique_keys), dedupe_lookup_keys_max):
        chunk = unique_keys[start:start + dedupe_lookup_keys_max]
        marks = ", ".join("?" for _ in chunk)
        found.update(connection.execute(
            f"SELECT dedupe_key, id FROM host_messages WHERE entry_id = ? AND dedupe_key IN ({marks})",
            (entry_id, *chunk),
        ))
    return found


def accept_messages(
    connection: apsw.Connection,
    entry_id: str,
    command: AcceptMessages,
    received_at: float,
    media: MediaResolver = host_media,
    *,
    entry: EntryRecord | None = None,
) -> tuple[MessagesAccepted, EntryRecord]:
    """The write job: all of the batch or (raising) none of it.

    ``entry``: the entry as its actor already knows it from a committed job (the actor is the
    entry's only writer, so the row cannot have changed since); None reads it (or creates it)."""
    entry = entry or load_entry(connection, entry_id) or _create_entry(connection, entry_id, command, received_at)
    source = command.grant.name
    # Earlier messages of this same batch join the stored ones as they are inserted, so a
    # key repeated inside one batch maps to its first message, as a retry would.
    known_ids = stored_message_ids(connection, entry_id, [message.dedupe_key for message in command.messages])
    message_ids: list[int] = []
    refusals: list[tuple[int, int, str]] = []
    for index, message in enumerate(command.messages):
        existing = known_ids.get(message.dedupe_key)
        if existing is not None:
            # A retry: the original stands (its media references are not re-checked).
            message_ids.append(existing)
            continue
        if message.media_ids:
            positions = media.refused_positions(connection, command.grant, entry_id, message.media_ids)
            if positions:
                refusals.extend((index, position, message.media_ids[position]) for position in positions)
                continue
        connection.execute(_insert_message_sql, (
            entry_id, message.dedupe_key, message.kind, message.sender, message.account_id,
            message.content, message.occurred_at, message.occurred_at_seconds, received_at,
            message.quote_author, message.quote_author_account_id, message.quote_content,
            message.scene_identity, message.platform, source, learning_state_pending,
        ))
        message_id = connection.last_insert_rowid()
        message_ids.append(message_id)
        known_ids[message.dedupe_key] = message_id
        for position, media_id in enumerate(message.media_ids):
            connection.execute(
                "INSERT INTO host_message_media (message_id, position, media_id) VALUES (?, ?, ?)",
                (message_id, position, media_id),
            )
    if refusals:
        raise _Refused(refusals)
    return MessagesAccepted(tuple(message_ids), pending_count(connection, entry_id)), entry


def apply_pace(
    connection: apsw.Connection,
    entry_kind: str,
    entry_id: str,
    pace: Pace,
    now: float,
    *,
    fired_due: float | None = None,
) -> PaceOutcome:
    """Close the pending messages into a batch if the pace says so, else (re)write the
    ``pace`` reminder.  ``fired_due`` is the due time of the ``pace`` reminder being handled:
    the pending set it was computed for is due even if the wall clock reads a little earlier."""
    summary = pending_summary(connection, entry_id)
    if summary.count == 0:
        clear_pace_reminder(connection, entry_kind, entry_id)
        return PaceOutcome()
    assert summary.oldest_received_at is not None and summary.newest_received_at is not None
    idle_due = summary.newest_received_at + pace.idle_seconds
    wait_due = summary.oldest_received_at + pace.max_wait_seconds
    due = min(idle_due, wait_due)
    if summary.count >= pace.count:
        trigger = trigger_count
    elif due <= now or (fired_due is not None and due <= fired_due):
        trigger = trigger_max_wait if wait_due <= idle_due else trigger_idle
    else:
        set_pace_reminder(connection, entry_kind, entry_id, due)
        return PaceOutcome(pace_due=due)
    clear_pace_reminder(connection, entry_kind, entry_id)
    return PaceOutcome(close_batch(connection, entry_id, trigger, now))


def pending_count(connection: apsw.Connection, entry_id: str) -> int:
    """Messages of ``entry_id`` not yet learned (pending or in a batch)."""
    placeholders = ", ".join("?" for _ in learning_states_unlearned)
    row = connection.execute(
        f"SELECT count(*) FROM host_messages WHERE entry_id = ? AND learning_state IN ({placeholders})",
        (entry_id, *learning_states_unlearned),
    ).fetchone()
    return int(row[0])


def entry_actor_kind(*, media: MediaResolver = host_media) -> ActorKind:
    """The ``entry`` kind, with the media resolver its actors check references with."""
    return ActorKind(
        entry_kind_name,
        lambda context: EntryActor(context, media=media),
        mailbox_messages_max=entry_mailbox_messages_max,
        turn_timeout_seconds=entry_turn_timeout_seconds,
    )


__all__ = [
    "AcceptMessages",
    "EntryActor",
    "EntryRecord",
    "LearnAccepted",
    "LearnNow",
    "MediaRefused",
    "MessagesAccepted",
    "NewMessage",
    "PaceOutcome",
    "StorageUnavailable",
    "accept_messages",
    "apply_pace",
    "entry_actor_kind",
    "entry_kind_name",
    "load_entry",
    "messages_per_batch_max",
    "pending_count",
]
