"""The character's global state as hosts report it: ``("host_state", "global")``.

Why one actor: the state is shared by every host (the contract: the character's global state
is visible to all hosts), and its rules are read-modify-write (the same activity keeps its
start time; a PATCH merges details one key at a time, ``null`` deleting one).  One actor turn
per report means no two reports interleave; each turn is one storage transaction that writes
the current state and appends to the report history before the reply, so an acknowledged
report is durable.  The actor keeps nothing in memory: storage is the state.

Shapes (wall seconds in storage, aware UTC ISO text in documents):
- ``started_at`` with ``start_time_basis``: ``host`` when the host gave ``started_at``,
  ``first_report`` when it is the time the activity was first reported;
- ``details``: ``{key: {"value": ..., "updated_at": ...}}``, each key with its own update time;
- ``updated_at``: the last report of any kind (a PATCH ``{}`` heartbeat included), which is
  what ``possibly_stale`` measures (``state_stale_seconds``);
- ``duration_seconds``: whole seconds since ``started_at`` (never negative).

Reads (``GET /state``, and ``prepare`` through ``current_state``) go to storage directly: a
reply is only sent after its commit, so committed storage is the truth.  ``entry_id`` is shown
only to tokens whose scope includes it (``null`` otherwise).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

import apsw

from troupe.runtime import Actor, ActorKind
from troupe.storage import StorageError

state_kind_name = "host_state"
state_key = "global"

state_stale_seconds = 1_800.0
"""A state not reported for this long (no PUT, PATCH or heartbeat) is ``possibly_stale``."""
state_details_max = 100
"""Detail keys one state may hold (a request that would exceed it is refused, 400)."""
state_detail_key_characters_max = 200
state_reports_max = 10_000
"""Report-history rows kept (the oldest are dropped in the same transaction)."""
state_mailbox_messages_max = 64

assert state_stale_seconds > 0 and state_details_max >= 1 and state_reports_max >= 1

basis_first_report = "first_report"
basis_host = "host"

state_tables_sql = """
    CREATE TABLE host_state_current (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        activity TEXT NOT NULL,
        mood TEXT,
        entry_id TEXT,
        started_at REAL NOT NULL,
        start_time_basis TEXT NOT NULL,
        first_reported_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        source TEXT NOT NULL,
        details_json TEXT NOT NULL
    );
    CREATE TABLE host_state_reports (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        operation TEXT NOT NULL,
        activity TEXT,
        entry_id TEXT,
        source TEXT NOT NULL,
        body_json TEXT NOT NULL,
        reported_at REAL NOT NULL
    );
"""
"""The current state (at most one row) and the report history (PUT, PATCH, DELETE)."""


@dataclass(frozen=True)
class HostState:
    activity: str
    mood: str | None
    entry_id: str | None
    started_at: float
    start_time_basis: str
    first_reported_at: float
    updated_at: float
    source: str
    details: dict[str, tuple[Any, float]] = field(default_factory=dict)
    """key -> (value, updated_at)."""


@dataclass(frozen=True)
class PutState:
    """Start or replace the activity (``started_at`` None: keep it if the activity is the same,
    else now)."""

    activity: str
    details: dict[str, Any]
    mood: str | None
    entry_id: str | None
    started_at: float | None
    source: str


@dataclass(frozen=True)
class PatchState:
    """Merge details (``None`` deletes a key) and, when ``mood_given``, set the mood.  Nothing
    given is a heartbeat."""

    details: dict[str, Any]
    mood_given: bool
    mood: str | None
    source: str


@dataclass(frozen=True)
class EndState:
    entry_id: str | None
    source: str


@dataclass(frozen=True)
class StateReply:
    """The state after the turn (None: idle)."""

    state: HostState | None


@dataclass(frozen=True)
class StateRefused:
    """Nothing changed: the merged details would exceed ``state_details_max``."""

    detail_count: int


@dataclass(frozen=True)
class StateUnavailable:
    reason: str


class _TooManyDetails(Exception):
    def __init__(self, count: int) -> None:
        super().__init__(f"{count} details")
        self.count = count


def load_state(connection: apsw.Connection) -> HostState | None:
    row = connection.execute(
        "SELECT activity, mood, entry_id, started_at, start_time_basis, first_reported_at, "
        "updated_at, source, details_json FROM host_state_current WHERE singleton = 1"
    ).fetchone()
    if row is None:
        return None
    *fields, details_json = row
    details = {key: (value, float(updated_at)) for key, (value, updated_at) in json.loads(details_json).items()}
    return HostState(*fields, details=details)


def _store(connection: apsw.Connection, state: HostState) -> None:
    if len(state.details) > state_details_max:
        raise _TooManyDetails(len(state.details))
    details_json = json.dumps(
        {key: [value, updated_at] for key, (value, updated_at) in state.details.items()},
        ensure_ascii=False, separators=(",", ":"),
    )
    connection.execute(
        "INSERT OR REPLACE INTO host_state_current (singleton, activity, mood, entry_id, started_at, "
        "start_time_basis, first_reported_at, updated_at, source, details_json) "
        "VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (state.activity, state.mood, state.entry_id, state.started_at, state.start_time_basis,
         state.first_reported_at, state.updated_at, state.source, details_json),
    )


def _record(connection: apsw.Connection, operation: str, activity: str | None, entry_id: str | None,
            source: str, body: dict[str, Any], now: float) -> None:
    connection.execute(
        "INSERT INTO host_state_reports (operation, activity, entry_id, source, body_json, reported_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (operation, activity, entry_id, source, json.dumps(body, ensure_ascii=False), now),
    )
    report_id = connection.last_insert_rowid()
    connection.execute("DELETE FROM host_state_reports WHERE id <= ?", (report_id - state_reports_max,))


def put_state(connection: apsw.Connection, command: PutState, now: float) -> HostState:
    current = load_state(connection)
    same = current is not None and current.activity == command.activity
    if command.started_at is not None:
        started_at, basis = command.started_at, basis_host
    elif same:
        assert current is not None
        started_at, basis = current.started_at, current.start_time_basis
    else:
        started_at, basis = now, basis_first_report
    state = HostState(
        activity=command.activity,
        mood=command.mood,
        entry_id=command.entry_id,
        started_at=started_at,
        start_time_basis=basis,
        first_reported_at=current.first_reported_at if same and current is not None else now,
        updated_at=now,
        source=command.source,
        details={key: (value, now) for key, value in command.details.items() if value is not None},
    )
    _store(connection, state)
    body = {"details": command.details, "mood": command.mood, "started_at": command.started_at}
    _record(connection, "put", command.activity, command.entry_id, command.source, body, now)
    return state


def patch_state(connection: apsw.Connection, command: PatchState, now: float) -> HostState | None:
    current = load_state(connection)
    if current is None:
        return None  # idle: a heartbeat or a patch has nothing to update
    details = dict(current.details)
    for key, value in command.details.items():
        if value is None:
            details.pop(key, None)
        else:
            details[key] = (value, now)
    mood = command.mood if command.mood_given else current.mood
    state = HostState(
        activity=current.activity, mood=mood, entry_id=current.entry_id,
        started_at=current.started_at, start_time_basis=current.start_time_basis,
        first_reported_at=current.first_reported_at, updated_at=now, source=command.source,
        details=details,
    )
    _store(connection, state)
    if command.details or command.mood_given:
        body: dict[str, Any] = {"details": command.details}
        if command.mood_given:
            body["mood"] = command.mood
        _record(connection, "patch", current.activity, current.entry_id, command.source, body, now)
    return state


def end_state(connection: apsw.Connection, command: EndState, now: float) -> None:
    current = load_state(connection)
    if current is None:
        return
    connection.execute("DELETE FROM host_state_current WHERE singleton = 1")
    _record(connection, "delete", current.activity, command.entry_id, command.source, {}, now)


def _iso(wall_seconds: float) -> str:
    return datetime.datetime.fromtimestamp(wall_seconds, tz=datetime.UTC).isoformat(timespec="seconds")


def state_document(state: HostState | None, *, now: float, allows: Any = None) -> dict[str, Any]:
    """The contract's state object (``{}`` when idle).  ``allows(entry_id)`` is the reading
    token's scope; an entry it does not include is shown as ``null``."""
    if state is None:
        return {}
    entry_id = state.entry_id
    if entry_id is not None and allows is not None and not allows(entry_id):
        entry_id = None
    return {
        "activity": state.activity,
        "details": {key: {"value": value, "updated_at": _iso(updated_at)}
                    for key, (value, updated_at) in state.details.items()},
        "mood": state.mood,
        "entry_id": entry_id,
        "started_at": _iso(state.started_at),
        "start_time_basis": state.start_time_basis,
        "updated_at": _iso(state.updated_at),
        "duration_seconds": max(0, int(now - state.started_at)),
        "possibly_stale": now - state.updated_at > state_stale_seconds,
    }


async def current_state(database: Any, *, now: float, allows: Any = None) -> dict[str, Any]:
    """The state document as ``GET /state`` returns it, read from committed storage
    (``database`` is the ``troupe.storage.Engine``; ``now`` the Env wall clock; ``allows`` the
    token scope's ``allows``, to hide an entry outside it).  ``{}`` when idle."""
    state = await database.read(load_state)
    return state_document(state, now=now, allows=allows)


class HostStateActor(Actor):
    """See the module docstring."""

    async def receive(self, message: Any) -> Any:
        now = self.context.env.clock.wall()
        if isinstance(message, PutState):
            job: Any = lambda connection: put_state(connection, message, now)  # noqa: E731
        elif isinstance(message, PatchState):
            job = lambda connection: patch_state(connection, message, now)  # noqa: E731
        elif isinstance(message, EndState):
            job = lambda connection: end_state(connection, message, now)  # noqa: E731
        else:
            raise AssertionError(f"state actor got an unknown message {type(message).__name__}")
        try:
            state = await self.context.storage.write(job)
        except _TooManyDetails as refused:
            return StateRefused(refused.count)
        except StorageError as exc:
            return StateUnavailable(type(exc).__name__)
        self.context.trace("state_reported", operation=type(message).__name__)
        return StateReply(state)


def state_actor_kind() -> ActorKind:
    return ActorKind(state_kind_name, HostStateActor, mailbox_messages_max=state_mailbox_messages_max)


__all__ = [
    "EndState",
    "HostState",
    "HostStateActor",
    "PatchState",
    "PutState",
    "StateRefused",
    "StateReply",
    "StateUnavailable",
    "basis_first_report",
    "basis_host",
    "current_state",
    "load_state",
    "state_actor_kind",
    "state_detail_key_characters_max",
    "state_details_max",
    "state_document",
    "state_key",
    "state_kind_name",
    "state_reports_max",
    "state_stale_seconds",
    "state_tables_sql",
]
