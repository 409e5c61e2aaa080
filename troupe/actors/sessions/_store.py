"""The session store: pure storage functions over an apsw connection, run inside
``engine.write`` / ``engine.read`` jobs by the session actor.

Why pure functions and no actor here: the ``("session", id)`` actor owns the session's state
and decides *when* to write; this module only says *what* a write is, so that each operation
is one job, hence one transaction, and the tests can drive them against a real engine.

The central write is ``commit_turn``: a finished turn's events, its history messages, the new
watermark, the seal flag, the status and (optionally) the usage snapshot go in ONE
transaction.  Nothing of a turn is durable before it (turn-granular commit): a crash mid-turn
loses that turn only, and the store never holds half a turn.  The usage snapshot may also be
written on its own afterwards (``record_usage``); a crash between the two leaves a snapshot
that lags the history, which ``usage_is_stale`` reports (``usage_snapshot_stale``).

Epochs: seq increases strictly per session across process lifetimes.  ``epoch_start`` is the
contract's rule for the first seq of a new epoch on resume: ``last_seq + 1`` when the previous
epoch was sealed (it ended at a clean turn end), else ``max(last_seq + 1, now_ms -
created_at_ms)``: the events a crashed epoch streamed but never committed had seqs above the
watermark, and milliseconds since creation outrun any seq a session can have emitted.

Damage is loud: a row or value that cannot be decoded, a history with a hole, an unknown
status: all raise ``StoreCorrupted`` (the HTTP layer answers 500 ``store_corrupted``); no
function returns a silently truncated history.  Our own misuse (a seq that does not increase,
a message that is not a JSON object) raises ``ValueError``: that job fails alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import apsw

from troupe.storage import StorageCorrupt

from ._frames import encode_json
from ._protocol import (
    ClientToolDeclaration,
    CreateOptions,
    PlatformPromptOptions,
    SessionHistory,
    SessionMeta,
)
from ._ring import ring_events_max_default

session_status_idle = "idle"
session_status_running = "running"
session_status_ended = "ended"
session_statuses = (session_status_idle, session_status_running, session_status_ended)

event_kind_kernel = "kernel"
"""A kernel event: framed ``id: <seq>`` + ``data:`` with no ``event:`` name."""
event_kind_control = "control"
"""A control event (``server.tool.request`` ...): framed with ``event: <type>`` too."""
event_kinds = (event_kind_kernel, event_kind_control)

session_log_events_max = 4096
"""Committed events kept per session (the newest); older ones are pruned at commit and
counted in ``events_dropped``.  L3 replay reads this log; history never depends on it."""
assert session_log_events_max >= ring_events_max_default  # the log can refill a full ring
sessions_list_limit_min = 1
sessions_list_limit_max = 200
"""``GET /v2/sessions?limit=`` bounds (the contract's 1–200)."""
history_page_messages_max = 1000
"""The largest ``limit`` of one history page."""
session_title_characters_max = 256
"""A stored title longer than this is refused (the caller shortens it)."""


class StoreCorrupted(StorageCorrupt):
    """A stored session row, event, message or checkpoint cannot be decoded or is
    inconsistent (for example a history with a hole).  Answered as 500 ``store_corrupted``."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id!r}: {reason}")
        self.session_id = session_id
        self.reason = reason


def encode_options(options: CreateOptions) -> dict[str, Any]:
    """``CreateOptions`` as the stored JSON object (camelCase, every field present)."""
    return {
        "model": options.model,
        "tools": None if options.tools is None else list(options.tools),
        "clientTools": [
            {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "readOnly": tool.read_only,
                "effects": None if tool.effects is None else list(tool.effects),
                "timeoutMs": tool.timeout_ms,
            }
            for tool in options.client_tools
        ],
        "capabilitiesProfile": options.capabilities_profile,
        "thinkingBudget": options.thinking_budget,
        "maxTurns": options.max_turns,
        "cwd": options.cwd,
        "platform": {
            "system": None if options.platform.system is None else list(options.platform.system),
            "systemAppend": (None if options.platform.system_append is None
                             else list(options.platform.system_append)),
            "strategy": options.platform.strategy,
        },
    }


def decode_options(value: Mapping[str, Any]) -> CreateOptions:
    """The inverse of ``encode_options``; raises ``KeyError``/``TypeError``/``ValueError`` on
    a bad shape (the store turns those into ``StoreCorrupted``)."""
    platform = value["platform"]
    if platform["strategy"] not in ("fallback", "prepend"):
        raise ValueError(f"unknown prompt strategy {platform['strategy']!r}")
    return CreateOptions(
        model=_optional(value["model"], str),
        tools=_optional_texts(value["tools"]),
        client_tools=tuple(
            ClientToolDeclaration(
                name=_required(tool["name"], str),
                description=_required(tool["description"], str),
                parameters=_optional(tool["parameters"], dict),
                read_only=_required(tool["readOnly"], bool),
                effects=_optional_texts(tool["effects"]),
                timeout_ms=_required(tool["timeoutMs"], int),
            )
            for tool in value["clientTools"]
        ),
        capabilities_profile=_required(value["capabilitiesProfile"], str),
        thinking_budget=_optional(value["thinkingBudget"], int),
        max_turns=_optional(value["maxTurns"], int),
        cwd=_optional(value["cwd"], str),
        platform=PlatformPromptOptions(
            system=_optional_texts(platform["system"]),
            system_append=_optional_texts(platform["systemAppend"]),
            strategy=platform["strategy"],
        ),
    )


def _required(value: Any, kind: type) -> Any:
    if not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}, found {type(value).__name__}")
    return value


def _optional(value: Any, kind: type) -> Any:
    return None if value is None else _required(value, kind)


def _optional_texts(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(_required(item, str) for item in _required(value, list))


@dataclass(frozen=True)
class UsageSnapshot:
    """Cumulative token usage of a session as of ``as_of_message_count`` history messages."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    as_of_message_count: int = 0

    def encode(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "asOfMessageCount": self.as_of_message_count,
        }

    @classmethod
    def decode(cls, value: Mapping[str, Any]) -> UsageSnapshot:
        fields = (value["inputTokens"], value["outputTokens"], value["cacheReadTokens"],
                  value["cacheWriteTokens"], value["asOfMessageCount"])
        if not all(isinstance(number, int) and number >= 0 for number in fields):
            raise ValueError("usage counts must be non-negative integers")
        return cls(*fields)


@dataclass(frozen=True)
class SessionRow:
    """One session as stored.  Times are integer milliseconds of the Env's wall clock.

    ``last_seq`` is the durable watermark (highest seq of a committed event);
    ``seq_sealed`` says the last epoch ended at a clean turn end; ``epoch_start_seq`` is the
    first seq of the current (or last) epoch; ``message_count`` the history length;
    ``events_dropped`` how many committed events the bounded log has pruned.
    """

    session_id: str
    end_user_id: str
    created_at_ms: int
    last_activity_at_ms: int
    status: str = session_status_idle
    title: str | None = None
    options: CreateOptions = field(default_factory=CreateOptions)
    last_seq: int = 0
    seq_sealed: bool = True
    epoch_start_seq: int = 1
    message_count: int = 0
    usage: UsageSnapshot | None = None
    events_dropped: int = 0
    forked_from: str | None = None

    def meta(self, *, live: bool, last_seq: int | None = None) -> SessionMeta:
        """The ``GET /v2/sessions/:id`` reply for this row (``last_seq`` overrides the stored
        watermark for a live session, whose ring may be ahead of the store)."""
        return SessionMeta(
            session_id=self.session_id, end_user_id=self.end_user_id, status=self.status,  # type: ignore[arg-type]
            live=live, last_seq=self.last_seq if last_seq is None else last_seq,
            created_at_ms=self.created_at_ms, last_activity_at_ms=self.last_activity_at_ms,
            title=self.title,
        )


@dataclass(frozen=True)
class StoredEvent:
    """One committed event: its seq, its frame kind and its exact compact JSON text."""

    seq: int
    kind: str
    data: str

    @classmethod
    def of(cls, event: Mapping[str, Any], kind: str = event_kind_kernel) -> StoredEvent:
        """From an event envelope dict (``seq`` read from it, JSON encoded compactly)."""
        return cls(seq=event["seq"], kind=kind, data=encode_json(event))

    def event(self) -> dict[str, Any]:
        """The envelope dict again (for ``_frames.event_frame``: same JSON, same bytes)."""
        return json.loads(self.data)


HistoryPage = SessionHistory
"""A page of history is the protocol's ``SessionHistory`` reply (``next_offset`` ``None`` on
the last page), read in one snapshot together with ``last_seq``."""


@dataclass(frozen=True)
class EventLog:
    """Committed events after a cursor, with what the log can no longer give:
    ``oldest_seq`` is the oldest retained seq (``None`` when the log is empty),
    ``events_dropped`` the session's cumulative pruned count."""

    events: tuple[StoredEvent, ...]
    oldest_seq: int | None
    last_seq: int
    events_dropped: int


# -- sessions ------------------------------------------------------------------------------

_session_columns = (
    "session_id, end_user_id, created_at_ms, last_activity_at_ms, status, title, options_json, "
    "last_seq, seq_sealed, epoch_start_seq, message_count, usage_json, events_dropped, forked_from"
)


def insert_session(connection: apsw.Connection, row: SessionRow) -> None:
    """Store a new session (its id must be new: a clash is our bug and raises)."""
    _check_row(row)
    connection.execute(
        f"INSERT INTO agent_sessions ({_session_columns}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (row.session_id, row.end_user_id, row.created_at_ms, row.last_activity_at_ms, row.status,
         row.title, encode_json(encode_options(row.options)), row.last_seq, int(row.seq_sealed),
         row.epoch_start_seq, row.message_count,
         None if row.usage is None else encode_json(row.usage.encode()),
         row.events_dropped, row.forked_from),
    )


def load_session(connection: apsw.Connection, session_id: str) -> SessionRow | None:
    """The stored session, or ``None`` when there is none.  Raises ``StoreCorrupted``."""
    found = connection.execute(
        f"SELECT {_session_columns} FROM agent_sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    return None if found is None else _decode_row(found)


def list_sessions(connection: apsw.Connection, end_user_id: str, limit: int,
                  offset: int = 0) -> tuple[list[SessionRow], int]:
    """One page of an end user's sessions, newest activity first, and their total count."""
    if not sessions_list_limit_min <= limit <= sessions_list_limit_max:
        raise ValueError(f"limit must be in {sessions_list_limit_min}..{sessions_list_limit_max}")
    if offset < 0:
        raise ValueError("offset must not be negative")
    total = connection.execute(
        "SELECT count(*) FROM agent_sessions WHERE end_user_id = ?", (end_user_id,)
    ).fetchone()[0]
    rows = [
        _decode_row(found)
        for found in connection.execute(
            f"SELECT {_session_columns} FROM agent_sessions WHERE end_user_id = ? "
            "ORDER BY last_activity_at_ms DESC, session_id DESC LIMIT ? OFFSET ?",
            (end_user_id, limit, offset),
        )
    ]
    return rows, total


def mark_status(connection: apsw.Connection, session_id: str, status: str, *,
                last_activity_at_ms: int | None = None) -> bool:
    """Set the status (and the activity time when given); ``False`` when no such session."""
    if status not in session_statuses:
        raise ValueError(f"unknown status {status!r}")
    connection.execute(
        "UPDATE agent_sessions SET status = ?, "
        "last_activity_at_ms = coalesce(?, last_activity_at_ms) WHERE session_id = ?",
        (status, last_activity_at_ms, session_id),
    )
    return connection.changes() == 1


def set_title(connection: apsw.Connection, session_id: str, title: str | None) -> bool:
    """Set or clear the title; ``False`` when no such session."""
    if title is not None and len(title) > session_title_characters_max:
        raise ValueError(f"title longer than {session_title_characters_max} characters")
    connection.execute("UPDATE agent_sessions SET title = ? WHERE session_id = ?", (title, session_id))
    return connection.changes() == 1


def set_cwd(connection: apsw.Connection, session_id: str, cwd: str | None) -> str | None:
    """Store a new working directory in the options; returns the previous one.
    Raises ``LookupError`` when there is no such session (the actor checks first)."""
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    options = replace(row.options, cwd=cwd)
    connection.execute(
        "UPDATE agent_sessions SET options_json = ? WHERE session_id = ?",
        (encode_json(encode_options(options)), session_id),
    )
    return row.options.cwd


def record_usage(connection: apsw.Connection, session_id: str, usage: UsageSnapshot) -> bool:
    """Store the usage snapshot on its own (after a turn's commit); ``False`` when absent."""
    connection.execute(
        "UPDATE agent_sessions SET usage_json = ? WHERE session_id = ?",
        (encode_json(usage.encode()), session_id),
    )
    return connection.changes() == 1


# -- turns and epochs ----------------------------------------------------------------------

def commit_turn(connection: apsw.Connection, session_id: str, *,
                events: Sequence[StoredEvent], messages: Sequence[Mapping[str, Any]],
                last_seq: int, sealed: bool, status: str, usage: UsageSnapshot | None,
                last_activity_at_ms: int) -> SessionRow:
    """Commit a finished turn in the caller's one transaction: append ``events`` to the log
    (pruning it to ``session_log_events_max``), append ``messages`` to the history, move the
    watermark to ``last_seq``, set the seal flag, the status, the usage snapshot (unchanged
    when ``None``) and the activity time.  Returns the updated row.

    ``events`` must have strictly increasing seqs above the stored watermark and not above
    ``last_seq``; ``last_seq`` must not go backwards (``ValueError`` otherwise).  Raises
    ``LookupError`` when the session does not exist.
    """
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    if status not in session_statuses:
        raise ValueError(f"unknown status {status!r}")
    if last_seq < row.last_seq:
        raise ValueError(f"watermark would go back from {row.last_seq} to {last_seq}")
    _check_events(events, after_seq=row.last_seq, last_seq=last_seq)
    encoded = [_encode_message(message) for message in messages]
    connection.executemany(
        "INSERT INTO agent_session_events (session_id, seq, kind, data) VALUES (?,?,?,?)",
        [(session_id, event.seq, event.kind, event.data) for event in events],
    )
    connection.executemany(
        "INSERT INTO agent_session_messages (session_id, position, message_json) VALUES (?,?,?)",
        [(session_id, row.message_count + index, text) for index, text in enumerate(encoded)],
    )
    dropped = _prune_events(connection, session_id)
    updated = replace(
        row, last_seq=last_seq, seq_sealed=sealed, status=status,
        message_count=row.message_count + len(encoded),
        usage=row.usage if usage is None else usage,
        events_dropped=row.events_dropped + dropped,
        last_activity_at_ms=last_activity_at_ms,
    )
    connection.execute(
        "UPDATE agent_sessions SET last_seq = ?, seq_sealed = ?, status = ?, message_count = ?, "
        "usage_json = ?, events_dropped = ?, last_activity_at_ms = ? WHERE session_id = ?",
        (updated.last_seq, int(updated.seq_sealed), updated.status, updated.message_count,
         None if updated.usage is None else encode_json(updated.usage.encode()),
         updated.events_dropped, updated.last_activity_at_ms, session_id),
    )
    return updated


def epoch_start(row: SessionRow, now_ms: int) -> int:
    """The first seq of a new epoch for ``row`` (the contract's resume rule)."""
    if row.seq_sealed:
        return row.last_seq + 1
    return max(row.last_seq + 1, now_ms - row.created_at_ms)


def begin_epoch(connection: apsw.Connection, session_id: str, start_seq: int) -> bool:
    """Record that a new epoch starts at ``start_seq`` and is not sealed until a turn end
    commits with ``sealed=True``; ``False`` when no such session."""
    connection.execute(
        "UPDATE agent_sessions SET epoch_start_seq = ?, seq_sealed = 0 "
        "WHERE session_id = ? AND last_seq < ?",
        (start_seq, session_id, start_seq),
    )
    if connection.changes() == 1:
        return True
    if load_session(connection, session_id) is None:
        return False
    raise ValueError(f"epoch start {start_seq} is not above the watermark")


def seal_epoch(connection: apsw.Connection, session_id: str) -> bool:
    """Mark the current epoch sealed without a turn (a clean close); ``False`` when absent."""
    connection.execute("UPDATE agent_sessions SET seq_sealed = 1 WHERE session_id = ?", (session_id,))
    return connection.changes() == 1


def usage_is_stale(row: SessionRow) -> int | None:
    """How many history messages were committed after the usage snapshot (``None`` when the
    snapshot is current, or when there is no history and no snapshot)."""
    as_of = 0 if row.usage is None else row.usage.as_of_message_count
    lag = row.message_count - as_of
    return lag if lag > 0 else None


# -- the event log and the history ---------------------------------------------------------

def read_events(connection: apsw.Connection, session_id: str, *, after_seq: int = -1,
                limit: int = session_log_events_max) -> EventLog:
    """Committed events with ``seq > after_seq`` (oldest first, at most ``limit``).
    Raises ``LookupError`` when the session does not exist, ``StoreCorrupted`` on damage."""
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    oldest = connection.execute(
        "SELECT min(seq) FROM agent_session_events WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    events = tuple(
        _decode_event(session_id, seq, kind, data)
        for seq, kind, data in connection.execute(
            "SELECT seq, kind, data FROM agent_session_events WHERE session_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (session_id, after_seq, limit),
        )
    )
    return EventLog(events=events, oldest_seq=oldest, last_seq=row.last_seq,
                    events_dropped=row.events_dropped)


def read_history(connection: apsw.Connection, session_id: str, offset: int = 0,
                 limit: int | None = None) -> SessionHistory:
    """A page of the history (all of it from ``offset`` when ``limit`` is ``None``) with the
    watermark of the same snapshot.  Raises ``LookupError`` when the session does not exist,
    ``StoreCorrupted`` when a message cannot be decoded or the history has a hole."""
    if offset < 0:
        raise ValueError("offset must not be negative")
    if limit is not None and not 1 <= limit <= history_page_messages_max:
        raise ValueError(f"limit must be in 1..{history_page_messages_max}")
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    wanted = row.message_count - offset if limit is None else min(limit, row.message_count - offset)
    wanted = max(wanted, 0)
    messages = read_messages(connection, session_id, offset, wanted, total=row.message_count)
    end = offset + len(messages)
    return SessionHistory(
        session_id=session_id, last_seq=row.last_seq, messages=messages, total=row.message_count, offset=offset,
        next_offset=end if end < row.message_count else None,
    )


def read_messages(connection: apsw.Connection, session_id: str, offset: int, count: int, *,
                  total: int) -> tuple[dict[str, Any], ...]:
    """Exactly ``count`` messages from ``offset`` of a history of ``total`` messages, or
    ``StoreCorrupted``: a missing or extra position is damage."""
    texts = read_message_texts(connection, session_id, offset, count, total=total)
    return tuple(_decode_message(session_id, offset + index, text) for index, text in enumerate(texts))


def read_message_texts(connection: apsw.Connection, session_id: str, offset: int, count: int, *,
                       total: int) -> tuple[str, ...]:
    """Like ``read_messages`` but the stored JSON texts (checkpoints copy them verbatim)."""
    expected = max(min(count, total - offset), 0)
    found = connection.execute(
        "SELECT position, message_json FROM agent_session_messages WHERE session_id = ? "
        "AND position >= ? ORDER BY position LIMIT ?",
        (session_id, offset, expected),
    ).fetchall()
    texts = []
    for index, (position, text) in enumerate(found):
        if position != offset + index:
            raise StoreCorrupted(session_id, f"history is missing message {offset + index}")
        if not isinstance(text, str):
            raise StoreCorrupted(session_id, f"history message {position} is not text")
        texts.append(text)
    if len(texts) != expected:
        raise StoreCorrupted(session_id, f"history ends at {offset + len(texts)}, expected {total}")
    last = connection.execute(
        "SELECT max(position) FROM agent_session_messages WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    if last is not None and last >= total:
        raise StoreCorrupted(session_id, f"history has a message at {last} beyond its {total}")
    return tuple(texts)


def replace_history(connection: apsw.Connection, session_id: str,
                    message_texts: Sequence[str]) -> int:
    """Replace the whole history with ``message_texts`` (already-encoded messages, kept
    verbatim); returns the previous message count.  Raises ``LookupError`` when absent."""
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    connection.execute("DELETE FROM agent_session_messages WHERE session_id = ?", (session_id,))
    connection.executemany(
        "INSERT INTO agent_session_messages (session_id, position, message_json) VALUES (?,?,?)",
        [(session_id, position, text) for position, text in enumerate(message_texts)],
    )
    usage = row.usage
    if usage is not None and usage.as_of_message_count > len(message_texts):
        usage = replace(usage, as_of_message_count=len(message_texts))
    connection.execute(
        "UPDATE agent_sessions SET message_count = ?, usage_json = ? WHERE session_id = ?",
        (len(message_texts), None if usage is None else encode_json(usage.encode()), session_id),
    )
    return row.message_count


def encode_message(message: Mapping[str, Any]) -> str:
    """A history message's stored JSON text (``ValueError`` unless it is a JSON object with a
    text ``role``)."""
    return _encode_message(message)


# -- internals -----------------------------------------------------------------------------

def _check_row(row: SessionRow) -> None:
    if row.status not in session_statuses:
        raise ValueError(f"unknown status {row.status!r}")
    if row.title is not None and len(row.title) > session_title_characters_max:
        raise ValueError(f"title longer than {session_title_characters_max} characters")
    if row.last_seq < 0 or row.message_count < 0:
        raise ValueError("negative watermark or message count")


def _check_events(events: Sequence[StoredEvent], *, after_seq: int, last_seq: int) -> None:
    previous = after_seq
    for event in events:
        if event.kind not in event_kinds:
            raise ValueError(f"unknown event kind {event.kind!r}")
        if not previous < event.seq <= last_seq:
            raise ValueError(f"event seq {event.seq} not in ({previous}, {last_seq}]")
        previous = event.seq


def _prune_events(connection: apsw.Connection, session_id: str) -> int:
    # The newest ``session_log_events_max`` rows stay; the boundary is the seq just past them.
    boundary = connection.execute(
        "SELECT seq FROM agent_session_events WHERE session_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?",
        (session_id, session_log_events_max),
    ).fetchone()
    if boundary is None:
        return 0
    connection.execute(
        "DELETE FROM agent_session_events WHERE session_id = ? AND seq <= ?", (session_id, boundary[0])
    )
    return connection.changes()


def _encode_message(message: Mapping[str, Any]) -> str:
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise ValueError("a history message is a JSON object with a text 'role'")
    try:
        return encode_json(dict(message))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"history message is not JSON: {exc}") from exc


def _decode_message(session_id: str, position: int, text: str) -> dict[str, Any]:
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise StoreCorrupted(session_id, f"history message {position} is not JSON") from exc
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise StoreCorrupted(session_id, f"history message {position} is not a message")
    return message


def _decode_event(session_id: str, seq: int, kind: str, data: Any) -> StoredEvent:
    if kind not in event_kinds or not isinstance(data, str):
        raise StoreCorrupted(session_id, f"event {seq} has a bad kind or data")
    try:
        event = json.loads(data)
    except ValueError as exc:
        raise StoreCorrupted(session_id, f"event {seq} is not JSON") from exc
    if not isinstance(event, dict) or event.get("seq") != seq:
        raise StoreCorrupted(session_id, f"event {seq} does not carry its seq")
    return StoredEvent(seq=seq, kind=kind, data=data)


def _decode_row(found: Sequence[Any]) -> SessionRow:
    (session_id, end_user_id, created_at_ms, last_activity_at_ms, status, title, options_json,
     last_seq, seq_sealed, epoch_start_seq, message_count, usage_json, events_dropped,
     forked_from) = found
    try:
        if status not in session_statuses:
            raise ValueError(f"unknown status {status!r}")
        integers = (created_at_ms, last_activity_at_ms, last_seq, epoch_start_seq, message_count,
                    events_dropped)
        if not all(isinstance(number, int) for number in integers) or seq_sealed not in (0, 1):
            raise ValueError("a numeric column has a bad value")
        if not isinstance(end_user_id, str) or not (title is None or isinstance(title, str)):
            raise ValueError("a text column has a bad value")
        options = decode_options(json.loads(options_json))
        usage = None if usage_json is None else UsageSnapshot.decode(json.loads(usage_json))
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreCorrupted(str(session_id), f"session row cannot be decoded: {exc}") from exc
    return SessionRow(
        session_id=session_id, end_user_id=end_user_id, created_at_ms=created_at_ms,
        last_activity_at_ms=last_activity_at_ms, status=status, title=title, options=options,
        last_seq=last_seq, seq_sealed=bool(seq_sealed), epoch_start_seq=epoch_start_seq,
        message_count=message_count, usage=usage, events_dropped=events_dropped,
        forked_from=forked_from,
    )


__all__ = [
    "EventLog",
    "HistoryPage",
    "SessionRow",
    "StoreCorrupted",
    "StoredEvent",
    "UsageSnapshot",
    "begin_epoch",
    "commit_turn",
    "decode_options",
    "encode_message",
    "encode_options",
    "epoch_start",
    "event_kind_control",
    "event_kind_kernel",
    "event_kinds",
    "history_page_messages_max",
    "insert_session",
    "list_sessions",
    "load_session",
    "mark_status",
    "read_events",
    "read_history",
    "read_message_texts",
    "read_messages",
    "record_usage",
    "replace_history",
    "seal_epoch",
    "session_log_events_max",
    "session_status_ended",
    "session_status_idle",
    "session_status_running",
    "session_statuses",
    "session_title_characters_max",
    "sessions_list_limit_max",
    "sessions_list_limit_min",
    "set_cwd",
    "set_title",
    "usage_is_stale",
]
