"""The character store: pure storage functions over an apsw connection, run inside
``engine.write`` / ``engine.read`` jobs by the character actor.

Why pure functions: the ``("character", name)`` actor owns the settle lock, the claims and the
decision *when* to write; this module says *what* a write is, so that one request is one job
(one transaction) whatever it touches: ``/cache`` appends recent history, writes raw rows and
registers its outbox task (``_outbox``) together; a fact, reflection or persona transition
appends its funnel event (``_funnel``) in the same job because the functions here do it
themselves.  Tests drive them against a real engine.

What is kept, per character (see ``_schema`` for the tables):
- recent history (the working window the prompt shows) and its compression metadata;
  ``append_recent`` keeps the newest ``recent_history_messages_max``; a compression folds
  the prefix it read into the metadata with ``fold_recent_prefix`` (by position, so messages
  appended while the model ran stay), and ``replace_recent`` swaps the whole window;
- raw time-indexed rows: every message with its timestamp (``/last_conversation_gap`` reads
  ``last_conversation_at``), the newest ``time_indexed_rows_per_character_max`` kept;
- facts (active, archived), reflections with their lifecycle, persona entries with
  corrections and an archive, surfacing cooldowns, the settings and persona JSON documents.

The recall index is not here: ``troupe.retrieval.MemoryIndex`` belongs to the memory slice.
This module gives it what it needs to follow the rows: every fact and reflection carries the
per-character ``memory_change_seq`` of its last change, ``memory_changes`` pages through what
changed after a position (upserts of recallable rows, removals of the rest), and
``iterate_memories`` walks everything recallable for a rebuild (``memory_changes`` says
``complete=False`` when the tombstones it would need were pruned).

Limits (named constants below, each enforced and tested at its boundary): a name is at most 64
characters; a message's content at most 100,000 characters (its text, or its JSON for a parts
list, as ``_protocol`` measures); 1,000 messages per append; 200 recent messages; 100,000 raw rows; 100,000 active facts
(beyond: the oldest are archived) and 100,000 archived facts (beyond: the oldest are deleted);
10,000 live reflections (beyond: the oldest archived) and 10,000 archived ones; 1,000 active
persona entries (``add_persona_entry`` refuses beyond) and 10,000 archived; 10,000 surfacing
records; documents of at most 1 MiB.  Our own misuse (a bad role, an over-long text that the
HTTP layer should have refused) raises ``ValueError`` and fails that job alone.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import apsw

from ._funnel import record_event
from ._protocol import history_message_characters_max, input_history_messages_max

character_name_characters_max = 64
"""A character name (URL-decoded) may be at most this many characters."""
message_roles = ("user", "assistant", "system")
message_content_characters_max = 100_000
"""A message's content: its text, or the compact JSON of its parts list, at most this long
(``_protocol`` refuses longer ones first; the store re-checks what it is handed)."""
messages_per_append_max = 1000
"""One append (one ``input_history``) may carry at most this many messages."""
recent_history_messages_max = 200
"""Recent history kept per character (the newest); ``/cache`` never compresses."""
recent_meta_bytes_max = 65_536
"""The compression metadata object's JSON, in UTF-8 bytes."""
time_indexed_rows_per_character_max = 100_000
"""Raw time-indexed rows kept per character (the oldest are pruned)."""
facts_per_character_max = 100_000
"""Active facts per character; adding beyond archives the oldest active ones."""
facts_archived_per_character_max = 100_000
"""Archived facts per character; archiving beyond deletes the oldest archived ones."""
facts_per_add_max = 10_000
"""One ``add_facts`` call (one extraction batch) adds at most this many facts."""
memory_text_characters_max = 4096
"""A fact's, reflection's or persona entry's text."""
entity_characters_max = 64
reflections_per_character_max = 10_000
"""Reflections not archived per character; adding beyond archives the oldest."""
reflections_archived_per_character_max = 10_000
persona_entries_per_character_max = 1000
"""Active persona entries per character; ``add_persona_entry`` refuses beyond."""
persona_entries_archived_per_character_max = 10_000
persona_corrections_per_character_max = 1000
"""Correction records kept per character (the oldest are pruned)."""
surfaced_records_per_character_max = 10_000
surfaced_ids_per_call_max = 100
"""``record_surfaced`` takes at most this many reflection ids at once."""
document_bytes_max = 1_048_576
"""The settings or persona JSON document of a character, in UTF-8 bytes."""
memory_tombstones_per_character_max = 10_000
"""Removal records kept for the recall index to follow (older ones force a rebuild)."""
memory_change_seqs_per_page = 256
"""``memory_changes`` returns at most this many change sequences per call."""
iterate_memories_limit_max = 10_000
assert facts_per_add_max <= facts_per_character_max
# Everything the protocol accepts, the store accepts (its JSON measure is the wider one).
assert message_content_characters_max >= history_message_characters_max
assert messages_per_append_max >= input_history_messages_max
assert recent_history_messages_max <= messages_per_append_max
assert surfaced_ids_per_call_max <= surfaced_records_per_character_max

fact_status_active = "active"
fact_status_archived = "archived"
fact_statuses = (fact_status_active, fact_status_archived)

reflection_status_pending = "pending"
reflection_status_confirmed = "confirmed"
reflection_status_promoted = "promoted"
reflection_status_merged = "merged"
reflection_status_denied = "denied"
reflection_status_archived = "archived"
reflection_statuses = (reflection_status_pending, reflection_status_confirmed,
                       reflection_status_promoted, reflection_status_merged,
                       reflection_status_denied, reflection_status_archived)
reflection_statuses_active = (reflection_status_pending, reflection_status_confirmed)
"""The reflections recall, ``/new_dialog`` and followup topics consider."""
_reflection_events = {
    reflection_status_confirmed: "reflections_confirmed",
    reflection_status_promoted: "reflections_promoted",
    reflection_status_merged: "reflections_merged",
    reflection_status_denied: "reflections_denied",
    reflection_status_archived: "reflections_archived",
}

persona_status_active = "active"
persona_status_archived = "archived"
correction_states = ("pending", "applied", "cancelled", "rejected")

memory_tier_fact = "fact"
memory_tier_reflection = "reflection"
memory_tier_fact_archive = "fact_archive"
memory_tiers = (memory_tier_fact, memory_tier_reflection, memory_tier_fact_archive)

document_kinds = ("settings", "persona")


# ---------------------------------------------------------------------------------- names


def character_name_problem(name: str) -> str | None:
    """Why ``name`` (URL-decoded) is not a valid character name, or ``None`` when it is.

    Refused: empty, longer than ``character_name_characters_max``, control characters,
    ``/`` or ``\\`` (a name is a directory in the contract's layout), ``..``, and leading or
    trailing whitespace.
    """
    if not isinstance(name, str) or not name:
        return "character name is empty"
    if len(name) > character_name_characters_max:
        return f"character name is longer than {character_name_characters_max} characters"
    # Cc: C0/C1 controls (newline, NUL, DEL...); Zl/Zp: line and paragraph separators, which
    # break lines in logs and headers just like a newline.  Format characters (Cf) stay
    # allowed: emoji sequences need the zero-width joiner.
    if any(unicodedata.category(character) in ("Cc", "Zl", "Zp") for character in name):
        return "character name contains control characters"
    if "/" in name or "\\" in name:
        return "character name contains a path separator"
    if ".." in name:
        return "character name contains '..'"
    if name != name.strip():
        return "character name has leading or trailing spaces"
    return None


# -------------------------------------------------------------------------------- messages


class MessageLike(Protocol):
    """What the store needs of a message (``_protocol.HistoryMessage`` fits)."""

    @property
    def role(self) -> str: ...

    @property
    def content(self) -> str | Sequence[Any]: ...


@dataclass(frozen=True)
class RecentMessage:
    """One message of recent history.  ``content`` is the client's string or parts list;
    ``at`` the wall-clock seconds it was written."""

    role: str
    content: str | list
    at: float


@dataclass(frozen=True)
class TimeIndexedRow:
    """One raw message row; ``seq`` orders rows (cursors point at it)."""

    seq: int
    name: str
    role: str
    content: str | list
    content_text: str
    at: float


def message_content_size(content: Any) -> int:
    """The size ``message_content_characters_max`` bounds: the text's length, or the length
    of a parts list's compact JSON."""
    if isinstance(content, str):
        return len(content)
    return len(_encode(list(content)))


def message_problem(role: Any, content: Any) -> str | None:
    """Why a message cannot be stored, or ``None``."""
    if role not in message_roles:
        return f"role must be one of {', '.join(message_roles)}"
    if not isinstance(content, str | list | tuple):
        return "content must be a string or a list"
    if message_content_size(content) > message_content_characters_max:
        return f"content is longer than {message_content_characters_max} characters"
    return None


def content_text(content: str | Sequence[Any]) -> str:
    """The plain text of a content (parts: their ``text`` fields, or bare strings, joined by
    newlines; other parts are left out)."""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


def _checked_messages(messages: Sequence[MessageLike]) -> list[tuple[str, str | list]]:
    # Parts tuples (``HistoryMessage``) are stored as JSON arrays and read back as lists.
    if len(messages) > messages_per_append_max:
        raise ValueError(f"more than {messages_per_append_max} messages in one append")
    checked = []
    for message in messages:
        problem = message_problem(message.role, message.content)
        if problem is not None:
            raise ValueError(problem)
        content = message.content
        checked.append((message.role, content if isinstance(content, str) else list(content)))
    return checked


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -------------------------------------------------------------------------------- profiles


def ensure_character(connection: apsw.Connection, name: str, now: float) -> None:
    """Create the character's profile row if it has none (every writer calls this)."""
    connection.execute(
        "INSERT INTO character_profiles (name, created_at) VALUES (?, ?) "
        "ON CONFLICT (name) DO NOTHING",
        (name, now),
    )


def character_exists(connection: apsw.Connection, name: str) -> bool:
    """Whether anything was ever stored for ``name``."""
    row = connection.execute(
        "SELECT 1 FROM character_profiles WHERE name = ?", (name,)
    ).fetchone()
    return row is not None


def list_characters(connection: apsw.Connection) -> list[str]:
    return [name for (name,) in connection.execute(
        "SELECT name FROM character_profiles ORDER BY name")]


def _profile_value(connection: apsw.Connection, name: str, column: str) -> Any:
    row = connection.execute(
        f"SELECT {column} FROM character_profiles WHERE name = ?", (name,)
    ).fetchone()
    return None if row is None else row[0]


def read_document(connection: apsw.Connection, name: str, kind: str) -> dict[str, Any] | None:
    """The character's ``settings`` or ``persona`` JSON object, or ``None`` when unset."""
    if kind not in document_kinds:
        raise ValueError(f"unknown document kind {kind!r}")
    text = _profile_value(connection, name, f"{kind}_json")
    return None if text is None else json.loads(text)


def write_document(connection: apsw.Connection, name: str, kind: str,
                   value: Mapping[str, Any], now: float) -> None:
    """Replace the ``settings`` or ``persona`` document (at most ``document_bytes_max``)."""
    if kind not in document_kinds:
        raise ValueError(f"unknown document kind {kind!r}")
    text = _encode(dict(value))
    if len(text.encode()) > document_bytes_max:
        raise ValueError(f"{kind} document larger than {document_bytes_max} bytes")
    ensure_character(connection, name, now)
    connection.execute(
        f"UPDATE character_profiles SET {kind}_json = ? WHERE name = ?", (text, name)
    )


# -------------------------------------------------------------------------- recent history


def append_recent(connection: apsw.Connection, name: str, messages: Sequence[MessageLike],
                  now: float) -> int:
    """Append to recent history, keeping the newest ``recent_history_messages_max``; returns
    how many messages were appended (``len(messages)``)."""
    checked = _checked_messages(messages)
    ensure_character(connection, name, now)
    if not checked:
        return 0
    (top,) = connection.execute(
        "SELECT COALESCE(MAX(position), -1) FROM character_recent WHERE name = ?", (name,)
    ).fetchone()
    connection.executemany(
        "INSERT INTO character_recent (name, position, role, content_json, at) "
        "VALUES (?, ?, ?, ?, ?)",
        [(name, top + 1 + index, role, _encode(content), now)
         for index, (role, content) in enumerate(checked)],
    )
    (count,) = connection.execute(
        "UPDATE character_profiles SET recent_count = recent_count + ? WHERE name = ? "
        "RETURNING recent_count",
        (len(checked), name),
    ).fetchone()
    if count > recent_history_messages_max:
        excess = count - recent_history_messages_max
        connection.execute(
            "DELETE FROM character_recent WHERE name = ? AND position IN (SELECT position "
            "FROM character_recent WHERE name = ? ORDER BY position LIMIT ?)",
            (name, name, excess),
        )
        connection.execute(
            "UPDATE character_profiles SET recent_count = ? WHERE name = ?",
            (recent_history_messages_max, name),
        )
    return len(checked)


def read_recent(connection: apsw.Connection, name: str,
                limit: int | None = None) -> list[RecentMessage]:
    """The newest ``limit`` recent messages (all when ``None``), oldest first."""
    count = recent_history_messages_max if limit is None else max(0, limit)
    rows = connection.execute(
        "SELECT role, content_json, at FROM character_recent WHERE name = ? "
        "ORDER BY position DESC LIMIT ?",
        (name, count),
    ).fetchall()
    return [RecentMessage(role, json.loads(content), at) for role, content, at in reversed(rows)]


def read_recent_positioned(connection: apsw.Connection, name: str) -> list[tuple[int, RecentMessage]]:
    """Recent history with each message's position, oldest first.  Positions only grow
    (``append_recent`` numbers after the highest), so a compression can name the prefix it
    read and fold exactly that prefix later (``fold_recent_prefix``)."""
    rows = connection.execute(
        "SELECT position, role, content_json, at FROM character_recent WHERE name = ? "
        "ORDER BY position DESC LIMIT ?",
        (name, recent_history_messages_max),
    ).fetchall()
    return [(position, RecentMessage(role, json.loads(content), at))
            for position, role, content, at in reversed(rows)]


def fold_recent_prefix(connection: apsw.Connection, name: str, through_position: int,
                       metadata: Mapping[str, Any], now: float) -> int:
    """After a compression: delete the recent messages up to ``through_position`` (the newest
    one the summary covers) and store the metadata, in one job.  Messages appended after the
    compression read the window have higher positions and stay: a ``/cache`` that lands while
    the model summarises must not lose its messages.  Returns the messages left."""
    meta_text = _encode(dict(metadata))
    if len(meta_text.encode()) > recent_meta_bytes_max:
        raise ValueError(f"recent metadata larger than {recent_meta_bytes_max} bytes")
    ensure_character(connection, name, now)
    connection.execute("DELETE FROM character_recent WHERE name = ? AND position <= ?", (name, through_position))
    (count,) = connection.execute("SELECT COUNT(*) FROM character_recent WHERE name = ?", (name,)).fetchone()
    connection.execute(
        "UPDATE character_profiles SET recent_count = ?, recent_meta_json = ? WHERE name = ?",
        (count, meta_text, name),
    )
    return count


def replace_recent(connection: apsw.Connection, name: str, messages: Sequence[MessageLike],
                   metadata: Mapping[str, Any], now: float) -> None:
    """Swap the whole recent window after a compression, with its metadata, in one job (a
    reader sees the old window or the new one, never a mix).  At most
    ``recent_history_messages_max`` messages."""
    checked = _checked_messages(messages)
    if len(checked) > recent_history_messages_max:
        raise ValueError(f"more than {recent_history_messages_max} recent messages")
    meta_text = _encode(dict(metadata))
    if len(meta_text.encode()) > recent_meta_bytes_max:
        raise ValueError(f"recent metadata larger than {recent_meta_bytes_max} bytes")
    ensure_character(connection, name, now)
    connection.execute("DELETE FROM character_recent WHERE name = ?", (name,))
    connection.executemany(
        "INSERT INTO character_recent (name, position, role, content_json, at) "
        "VALUES (?, ?, ?, ?, ?)",
        [(name, index, role, _encode(content), now)
         for index, (role, content) in enumerate(checked)],
    )
    connection.execute(
        "UPDATE character_profiles SET recent_count = ?, recent_meta_json = ? WHERE name = ?",
        (len(checked), meta_text, name),
    )


def read_recent_meta(connection: apsw.Connection, name: str) -> dict[str, Any]:
    """The compression metadata of the recent window (``{}`` before any compression)."""
    text = _profile_value(connection, name, "recent_meta_json")
    return {} if text is None else json.loads(text)


# -------------------------------------------------------------------------- raw time rows


def append_time_indexed(connection: apsw.Connection, name: str,
                        messages: Sequence[MessageLike], at: float) -> list[int]:
    """Write every message as a raw row stamped ``at``; returns their seqs.  Moves
    ``last_conversation_at`` forward to ``at`` (only forward: a clock step back keeps the
    later time).  Keeps the newest ``time_indexed_rows_per_character_max`` rows."""
    checked = _checked_messages(messages)
    ensure_character(connection, name, at)
    if not checked:
        return []
    seqs = []
    for role, content in checked:
        connection.execute(
            "INSERT INTO character_time_indexed (name, role, content_text, content_json, at) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, role, content_text(content), _encode(content), at),
        )
        seqs.append(connection.last_insert_rowid())
    (count,) = connection.execute(
        "UPDATE character_profiles SET time_indexed_count = time_indexed_count + ?, "
        "last_conversation_at = MAX(COALESCE(last_conversation_at, ?), ?) WHERE name = ? "
        "RETURNING time_indexed_count",
        (len(checked), at, at, name),
    ).fetchone()
    if count > time_indexed_rows_per_character_max:
        excess = count - time_indexed_rows_per_character_max
        connection.execute(
            "DELETE FROM character_time_indexed WHERE seq IN (SELECT seq FROM "
            "character_time_indexed WHERE name = ? ORDER BY seq LIMIT ?)",
            (name, excess),
        )
        connection.execute(
            "UPDATE character_profiles SET time_indexed_count = ? WHERE name = ?",
            (time_indexed_rows_per_character_max, name),
        )
    return seqs


def _time_row(row: tuple) -> TimeIndexedRow:
    seq, name, role, text, content, at = row
    return TimeIndexedRow(seq, name, role, json.loads(content), text, at)


def read_time_indexed(connection: apsw.Connection, name: str, after_seq: int = 0,
                      limit: int = 1000) -> list[TimeIndexedRow]:
    """Raw rows after ``after_seq`` in write order (a background loop's cursor page)."""
    return [_time_row(row) for row in connection.execute(
        "SELECT seq, name, role, content_text, content_json, at FROM character_time_indexed "
        "WHERE name = ? AND seq > ? ORDER BY seq LIMIT ?",
        (name, after_seq, limit),
    )]


def time_indexed_between(connection: apsw.Connection, name: str, start: float, end: float,
                         limit: int = 1000) -> list[TimeIndexedRow]:
    """Raw rows with ``start <= at <= end``, oldest first."""
    return [_time_row(row) for row in connection.execute(
        "SELECT seq, name, role, content_text, content_json, at FROM character_time_indexed "
        "WHERE name = ? AND at >= ? AND at <= ? ORDER BY at, seq LIMIT ?",
        (name, start, end, limit),
    )]


def last_conversation_at(connection: apsw.Connection, name: str) -> float | None:
    """The wall time of the newest raw row (``None``: no conversation yet)."""
    return _profile_value(connection, name, "last_conversation_at")


# ------------------------------------------------------------------------- memory changes


def _next_change_seq(connection: apsw.Connection, name: str, now: float) -> int:
    ensure_character(connection, name, now)
    (seq,) = connection.execute(
        "UPDATE character_profiles SET memory_change_seq = memory_change_seq + 1 "
        "WHERE name = ? RETURNING memory_change_seq",
        (name,),
    ).fetchone()
    return seq


def _tombstone(connection: apsw.Connection, name: str, seq: int, ids: Sequence[str]) -> None:
    if not ids:
        return
    connection.executemany(
        "INSERT OR IGNORE INTO character_memory_tombstones (name, changed_seq, id) "
        "VALUES (?, ?, ?)",
        [(name, seq, memory_id) for memory_id in ids],
    )
    (count,) = connection.execute(
        "UPDATE character_profiles SET tombstones_count = tombstones_count + ? WHERE name = ? "
        "RETURNING tombstones_count",
        (len(ids), name),
    ).fetchone()
    if count <= memory_tombstones_per_character_max:
        return
    excess = count - memory_tombstones_per_character_max
    pruned = connection.execute(
        "SELECT changed_seq FROM character_memory_tombstones WHERE name = ? "
        "ORDER BY changed_seq, id LIMIT ?",
        (name, excess),
    ).fetchall()
    # Whole sequences go, so a reader never sees half of a removal batch.
    through = pruned[-1][0]
    deleted = connection.execute(
        "DELETE FROM character_memory_tombstones WHERE name = ? AND changed_seq <= ? "
        "RETURNING id",
        (name, through),
    ).fetchall()
    connection.execute(
        "UPDATE character_profiles SET tombstones_count = tombstones_count - ?, "
        "tombstones_pruned_seq = MAX(tombstones_pruned_seq, ?) WHERE name = ?",
        (len(deleted), through, name),
    )


def memory_version(connection: apsw.Connection, name: str) -> int:
    """The character's memory change sequence: it grows with every fact or reflection
    change, so an index that saw version V is current while this is still V."""
    value = _profile_value(connection, name, "memory_change_seq")
    return 0 if value is None else value


@dataclass(frozen=True)
class MemoryRecord:
    """A fact or reflection as recall sees it.  ``tier`` is ``fact`` (active fact),
    ``fact_archive`` or ``reflection`` (pending or confirmed).  Times are wall seconds."""

    id: str
    tier: str
    text: str
    entity: str
    created_at: float
    event_start_at: float | None
    event_end_at: float | None
    status: str
    changed_seq: int


@dataclass(frozen=True)
class MemoryChanges:
    """What changed in ``(after_seq, through_seq]``: ``upserts`` are recallable rows to
    (re)index, ``removals`` ids no longer recallable (deleted, or a reflection that left the
    active states).  ``complete`` is ``False`` when removals before ``through_seq`` were
    pruned: the caller must rebuild from ``iterate_memories``.  ``through_seq`` below
    ``memory_version`` means more pages follow."""

    upserts: list[MemoryRecord]
    removals: list[str]
    through_seq: int
    complete: bool


_fact_columns = ("id, text, entity, created_at, event_start_at, event_end_at, status, "
                 "changed_seq")
_reflection_columns = _fact_columns


def _fact_record(row: tuple) -> MemoryRecord:
    memory_id, text, entity, created_at, start, end, status, seq = row
    tier = memory_tier_fact if status == fact_status_active else memory_tier_fact_archive
    return MemoryRecord(memory_id, tier, text, entity, created_at, start, end, status, seq)


def _reflection_record(row: tuple) -> MemoryRecord:
    memory_id, text, entity, created_at, start, end, status, seq = row
    return MemoryRecord(memory_id, memory_tier_reflection, text, entity, created_at, start,
                        end, status, seq)


def memory_changes(connection: apsw.Connection, name: str, after_seq: int) -> MemoryChanges:
    """The next page of changes after ``after_seq`` (at most ``memory_change_seqs_per_page``
    sequences; one ``add_facts`` batch is one sequence)."""
    version = memory_version(connection, name)
    through = min(version, after_seq + memory_change_seqs_per_page)
    pruned = _profile_value(connection, name, "tombstones_pruned_seq") or 0
    complete = after_seq >= pruned
    upserts: list[MemoryRecord] = []
    removals: list[str] = []
    for row in connection.execute(
        f"SELECT {_fact_columns} FROM character_facts WHERE name = ? AND changed_seq > ? "
        "AND changed_seq <= ? ORDER BY changed_seq, id",
        (name, after_seq, through),
    ):
        upserts.append(_fact_record(row))
    for row in connection.execute(
        f"SELECT {_reflection_columns} FROM character_reflections WHERE name = ? "
        "AND changed_seq > ? AND changed_seq <= ? ORDER BY changed_seq, id",
        (name, after_seq, through),
    ):
        record = _reflection_record(row)
        if record.status in reflection_statuses_active:
            upserts.append(record)
        else:
            removals.append(record.id)
    removals.extend(memory_id for (memory_id,) in connection.execute(
        "SELECT id FROM character_memory_tombstones WHERE name = ? AND changed_seq > ? "
        "AND changed_seq <= ? ORDER BY changed_seq, id",
        (name, after_seq, through),
    ))
    return MemoryChanges(upserts, removals, through, complete)


def iterate_memories(connection: apsw.Connection, name: str, tier: str, after_id: str = "",
                     limit: int = 1000) -> list[MemoryRecord]:
    """Every recallable row of one ``tier`` with an id after ``after_id`` (id order), at most
    ``limit`` (≤ ``iterate_memories_limit_max``): the rebuild walk."""
    if tier not in memory_tiers:
        raise ValueError(f"unknown memory tier {tier!r}")
    limit = min(max(0, limit), iterate_memories_limit_max)
    if tier == memory_tier_reflection:
        return [_reflection_record(row) for row in connection.execute(
            f"SELECT {_reflection_columns} FROM character_reflections WHERE name = ? "
            "AND status IN ('pending', 'confirmed') AND id > ? ORDER BY id LIMIT ?",
            (name, after_id, limit),
        )]
    status = fact_status_active if tier == memory_tier_fact else fact_status_archived
    return [_fact_record(row) for row in connection.execute(
        f"SELECT {_fact_columns} FROM character_facts WHERE name = ? AND status = ? "
        "AND id > ? ORDER BY id LIMIT ?",
        (name, status, after_id, limit),
    )]


# ------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class NewFact:
    """A fact to add; ``id`` comes from ``env.ids.new_id("fact_")``."""

    id: str
    text: str
    entity: str = "master"
    event_start_at: float | None = None
    event_end_at: float | None = None
    embedding_fingerprint: str | None = None


@dataclass(frozen=True)
class Fact:
    id: str
    name: str
    text: str
    entity: str
    created_at: float
    event_start_at: float | None
    event_end_at: float | None
    status: str
    archived_at: float | None
    embedding_fingerprint: str | None
    changed_seq: int


_fact_row_columns = ("id, name, text, entity, created_at, event_start_at, event_end_at, "
                     "status, archived_at, embedding_fingerprint, changed_seq")


def _check_text(text: Any, entity: Any) -> None:
    if not isinstance(text, str) or not text or len(text) > memory_text_characters_max:
        raise ValueError(f"memory text must be 1..{memory_text_characters_max} characters")
    if not isinstance(entity, str) or not entity or len(entity) > entity_characters_max:
        raise ValueError(f"entity must be 1..{entity_characters_max} characters")


def add_facts(connection: apsw.Connection, name: str, facts: Sequence[NewFact],
              now: float) -> list[Fact]:
    """Add active facts (one change sequence, one ``facts_added`` event of their number).
    Beyond ``facts_per_character_max`` active facts the oldest are archived."""
    if len(facts) > facts_per_add_max:
        raise ValueError(f"more than {facts_per_add_max} facts in one add")
    for fact in facts:
        _check_text(fact.text, fact.entity)
    if not facts:
        return []
    seq = _next_change_seq(connection, name, now)
    connection.executemany(
        "INSERT INTO character_facts (id, name, text, entity, created_at, event_start_at, "
        "event_end_at, status, embedding_fingerprint, changed_seq) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 'active', ?, ?)",
        [(fact.id, name, fact.text, fact.entity, now, fact.event_start_at, fact.event_end_at,
          fact.embedding_fingerprint, seq) for fact in facts],
    )
    (count,) = connection.execute(
        "UPDATE character_profiles SET facts_active_count = facts_active_count + ? "
        "WHERE name = ? RETURNING facts_active_count",
        (len(facts), name),
    ).fetchone()
    record_event(connection, name, "facts_added", now, amount=len(facts))
    if count > facts_per_character_max:
        oldest = [memory_id for (memory_id,) in connection.execute(
            "SELECT id FROM character_facts WHERE name = ? AND status = 'active' "
            "ORDER BY created_at, id LIMIT ?",
            (name, count - facts_per_character_max),
        )]
        _archive_facts(connection, name, oldest, now, seq)
    return [fact for fact in (get_fact(connection, name, new.id) for new in facts)
            if fact is not None]


def get_fact(connection: apsw.Connection, name: str, fact_id: str) -> Fact | None:
    row = connection.execute(
        f"SELECT {_fact_row_columns} FROM character_facts WHERE id = ? AND name = ?",
        (fact_id, name),
    ).fetchone()
    return None if row is None else Fact(*row)


def list_facts(connection: apsw.Connection, name: str, status: str = fact_status_active,
               limit: int = 1000, offset: int = 0) -> list[Fact]:
    """Facts of one status, newest first."""
    if status not in fact_statuses:
        raise ValueError(f"unknown fact status {status!r}")
    return [Fact(*row) for row in connection.execute(
        f"SELECT {_fact_row_columns} FROM character_facts WHERE name = ? AND status = ? "
        "ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
        (name, status, limit, offset),
    )]


def list_fact_texts(connection: apsw.Connection, name: str, status: str = fact_status_active,
                    limit: int = 1000) -> list[str]:
    """The texts of ``list_facts`` (same order and bound) without building ``Fact`` rows:
    what deduplicating new facts needs."""
    if status not in fact_statuses:
        raise ValueError(f"unknown fact status {status!r}")
    return [text for (text,) in connection.execute(
        "SELECT text FROM character_facts WHERE name = ? AND status = ? "
        "ORDER BY created_at DESC, id DESC LIMIT ?",
        (name, status, limit),
    )]


def fact_count(connection: apsw.Connection, name: str, status: str = fact_status_active) -> int:
    if status not in fact_statuses:
        raise ValueError(f"unknown fact status {status!r}")
    value = _profile_value(connection, name, f"facts_{status}_count")
    return 0 if value is None else value


def archive_facts(connection: apsw.Connection, name: str, fact_ids: Iterable[str],
                  now: float) -> int:
    """Move active facts to the archive; returns how many moved (unknown or already
    archived ids are skipped).  Beyond ``facts_archived_per_character_max`` archived facts the
    oldest archived are deleted."""
    ids = list(dict.fromkeys(fact_ids))
    if not ids:
        return 0
    seq = _next_change_seq(connection, name, now)
    return _archive_facts(connection, name, ids, now, seq)


def _archive_facts(connection: apsw.Connection, name: str, ids: Sequence[str], now: float,
                   seq: int) -> int:
    moved = 0
    for fact_id in ids:
        changed = connection.execute(
            "UPDATE character_facts SET status = 'archived', archived_at = ?, changed_seq = ? "
            "WHERE id = ? AND name = ? AND status = 'active' RETURNING id",
            (now, seq, fact_id, name),
        ).fetchall()
        moved += len(changed)
    if not moved:
        return 0
    (archived,) = connection.execute(
        "UPDATE character_profiles SET facts_active_count = facts_active_count - ?, "
        "facts_archived_count = facts_archived_count + ? WHERE name = ? "
        "RETURNING facts_archived_count",
        (moved, moved, name),
    ).fetchone()
    if archived > facts_archived_per_character_max:
        excess = archived - facts_archived_per_character_max
        deleted = [memory_id for (memory_id,) in connection.execute(
            "DELETE FROM character_facts WHERE id IN (SELECT id FROM character_facts "
            "WHERE name = ? AND status = 'archived' ORDER BY archived_at, created_at, id "
            "LIMIT ?) RETURNING id",
            (name, excess),
        )]
        connection.execute(
            "UPDATE character_profiles SET facts_archived_count = facts_archived_count - ? "
            "WHERE name = ?",
            (len(deleted), name),
        )
        _tombstone(connection, name, seq, deleted)
    return moved


# ------------------------------------------------------------------------------ reflections


@dataclass(frozen=True)
class NewReflection:
    """A synthesised reflection; ``id`` from ``env.ids.new_id("reflection_")``."""

    id: str
    text: str
    entity: str = "master"
    source_fact_ids: tuple[str, ...] = ()
    event_start_at: float | None = None
    event_end_at: float | None = None


@dataclass(frozen=True)
class Reflection:
    id: str
    name: str
    text: str
    entity: str
    status: str
    created_at: float
    updated_at: float
    confirmed_at: float | None
    promoted_at: float | None
    archived_at: float | None
    event_start_at: float | None
    event_end_at: float | None
    source_fact_ids: tuple[str, ...]
    merged_into: str | None
    changed_seq: int


_reflection_row_columns = (
    "id, name, text, entity, status, created_at, updated_at, confirmed_at, promoted_at, "
    "archived_at, event_start_at, event_end_at, source_fact_ids_json, merged_into, changed_seq"
)


def _reflection(row: tuple) -> Reflection:
    values = list(row)
    values[12] = tuple(json.loads(values[12]))
    return Reflection(*values)


def add_reflection(connection: apsw.Connection, name: str, reflection: NewReflection,
                   now: float) -> Reflection:
    """Add a ``pending`` reflection (event ``reflections_synthesized``).  Beyond
    ``reflections_per_character_max`` live reflections the oldest are archived."""
    _check_text(reflection.text, reflection.entity)
    seq = _next_change_seq(connection, name, now)
    connection.execute(
        "INSERT INTO character_reflections (id, name, text, entity, status, created_at, "
        "updated_at, event_start_at, event_end_at, source_fact_ids_json, changed_seq) "
        "VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
        (reflection.id, name, reflection.text, reflection.entity, now, now,
         reflection.event_start_at, reflection.event_end_at,
         _encode(list(reflection.source_fact_ids)), seq),
    )
    record_event(connection, name, "reflections_synthesized", now, reflection.id)
    (live,) = connection.execute(
        "SELECT COUNT(*) FROM character_reflections WHERE name = ? AND status != 'archived'",
        (name,),
    ).fetchone()
    if live > reflections_per_character_max:
        for (oldest,) in connection.execute(
            "SELECT id FROM character_reflections WHERE name = ? AND status != 'archived' "
            "ORDER BY created_at, id LIMIT ?",
            (name, live - reflections_per_character_max),
        ).fetchall():
            transition_reflection(connection, name, oldest, reflection_status_archived, now)
    result = get_reflection(connection, name, reflection.id)
    assert result is not None
    return result


def get_reflection(connection: apsw.Connection, name: str,
                   reflection_id: str) -> Reflection | None:
    row = connection.execute(
        f"SELECT {_reflection_row_columns} FROM character_reflections WHERE id = ? AND name = ?",
        (reflection_id, name),
    ).fetchone()
    return None if row is None else _reflection(row)


def list_reflections(connection: apsw.Connection, name: str,
                     statuses: Iterable[str] = reflection_statuses_active,
                     limit: int = 1000) -> list[Reflection]:
    """Reflections in ``statuses``, oldest first."""
    wanted = list(statuses)
    if not set(wanted) <= set(reflection_statuses):
        raise ValueError("unknown reflection status")
    marks = ", ".join("?" for _ in wanted)
    return [_reflection(row) for row in connection.execute(
        f"SELECT {_reflection_row_columns} FROM character_reflections WHERE name = ? "
        f"AND status IN ({marks}) ORDER BY created_at, id LIMIT ?",
        (name, *wanted, limit),
    )]


def reflection_transition_problem(current: str, target: str) -> str | None:
    """Why ``current → target`` is not a lifecycle step, or ``None``.  Nothing returns to
    ``pending``, nothing leaves ``archived``, and a step to the same state is no step."""
    if target not in reflection_statuses:
        return f"unknown reflection status {target!r}"
    if current == reflection_status_archived:
        return "the reflection is archived"
    if target == reflection_status_pending:
        return "a reflection never returns to pending"
    if current == target:
        return f"the reflection is already {target}"
    return None


def transition_reflection(connection: apsw.Connection, name: str, reflection_id: str,
                          status: str, now: float,
                          merged_into: str | None = None) -> Reflection | str:
    """Move a reflection to ``status``, stamping its time and appending its funnel event
    (``reflections_confirmed`` ...).  A refused step or unknown id is a reply: the problem
    text.  Archived reflections beyond ``reflections_archived_per_character_max`` are
    deleted (oldest first)."""
    current = get_reflection(connection, name, reflection_id)
    if current is None:
        return "unknown reflection"
    problem = reflection_transition_problem(current.status, status)
    if problem is not None:
        return problem
    seq = _next_change_seq(connection, name, now)
    stamp = {reflection_status_confirmed: "confirmed_at",
             reflection_status_promoted: "promoted_at",
             reflection_status_archived: "archived_at"}.get(status)
    stamp_sql = f", {stamp} = :now" if stamp else ""
    connection.execute(
        "UPDATE character_reflections SET status = :status, updated_at = :now, "
        f"changed_seq = :seq, merged_into = COALESCE(:merged, merged_into){stamp_sql} "
        "WHERE id = :id",
        {"status": status, "now": now, "seq": seq, "merged": merged_into, "id": reflection_id},
    )
    record_event(connection, name, _reflection_events[status], now, reflection_id)
    if status == reflection_status_archived:
        _prune_archived_reflections(connection, name, seq)
    result = get_reflection(connection, name, reflection_id)
    assert result is not None
    return result


def _prune_archived_reflections(connection: apsw.Connection, name: str, seq: int) -> None:
    (archived,) = connection.execute(
        "SELECT COUNT(*) FROM character_reflections WHERE name = ? AND status = 'archived'",
        (name,),
    ).fetchone()
    if archived <= reflections_archived_per_character_max:
        return
    deleted = [memory_id for (memory_id,) in connection.execute(
        "DELETE FROM character_reflections WHERE id IN (SELECT id FROM character_reflections "
        "WHERE name = ? AND status = 'archived' ORDER BY archived_at, created_at, id LIMIT ?) "
        "RETURNING id",
        (name, archived - reflections_archived_per_character_max),
    )]
    _tombstone(connection, name, seq, deleted)


def reset_confirmed_at(connection: apsw.Connection, now: float,
                       name: str | None = None) -> int:
    """The strong-memory ON → OFF migration: every ``confirmed`` reflection (of ``name``, or
    of every character) restarts its confirmation clock at ``now``, so auto-promotion waits
    its normal period again.  Returns how many rows changed (0 when run twice at one
    moment)."""
    if name is None:
        rows = connection.execute(
            "UPDATE character_reflections SET confirmed_at = ?, updated_at = ? "
            "WHERE status = 'confirmed' AND confirmed_at IS NOT ? RETURNING id",
            (now, now, now),
        ).fetchall()
    else:
        rows = connection.execute(
            "UPDATE character_reflections SET confirmed_at = ?, updated_at = ? "
            "WHERE name = ? AND status = 'confirmed' AND confirmed_at IS NOT ? RETURNING id",
            (now, now, name, now),
        ).fetchall()
    return len(rows)


# ------------------------------------------------------------------------- surfacing


def record_surfaced(connection: apsw.Connection, name: str, reflection_ids: Sequence[str],
                    now: float) -> int:
    """Record that proactive chat showed these reflections at ``now`` (refreshes their
    cooldown).  An empty list is a no-op; returns how many ids were recorded.  At most
    ``surfaced_ids_per_call_max`` ids; records beyond ``surfaced_records_per_character_max``
    are pruned, least recently surfaced first."""
    ids = list(dict.fromkeys(reflection_ids))
    if not ids:
        return 0
    if len(ids) > surfaced_ids_per_call_max:
        raise ValueError(f"more than {surfaced_ids_per_call_max} surfaced ids")
    if any(not isinstance(memory_id, str) or not memory_id
           or len(memory_id) > entity_characters_max * 2 for memory_id in ids):
        raise ValueError("bad reflection id")
    ensure_character(connection, name, now)
    connection.executemany(
        "INSERT INTO character_surfaced (name, reflection_id, surfaced_at, times) "
        "VALUES (?, ?, ?, 1) ON CONFLICT (name, reflection_id) DO UPDATE SET "
        "surfaced_at = excluded.surfaced_at, times = times + 1",
        [(name, memory_id, now) for memory_id in ids],
    )
    (count,) = connection.execute(
        "SELECT COUNT(*) FROM character_surfaced WHERE name = ?", (name,)
    ).fetchone()
    if count > surfaced_records_per_character_max:
        connection.execute(
            "DELETE FROM character_surfaced WHERE name = ? AND reflection_id IN (SELECT "
            "reflection_id FROM character_surfaced WHERE name = ? "
            "ORDER BY surfaced_at, reflection_id LIMIT ?)",
            (name, name, count - surfaced_records_per_character_max),
        )
    return len(ids)


def surfaced_times(connection: apsw.Connection, name: str) -> dict[str, float]:
    """Reflection id → the last time it was surfaced (for the cooldown)."""
    return {memory_id: at for memory_id, at in connection.execute(
        "SELECT reflection_id, surfaced_at FROM character_surfaced WHERE name = ?", (name,))}


# --------------------------------------------------------------------------------- persona


@dataclass(frozen=True)
class NewPersonaEntry:
    """A persona entry to add; ``id`` from ``env.ids.new_id("persona_")``; ``source`` says
    where it came from (``manual``, or the id of the reflection promoted into it)."""

    id: str
    text: str
    section: str = "general"
    source: str = "manual"


@dataclass(frozen=True)
class PersonaEntry:
    id: str
    name: str
    section: str
    text: str
    source: str
    status: str
    revision: int
    created_at: float
    updated_at: float
    archived_at: float | None


_persona_columns = ("id, name, section, text, source, status, revision, created_at, "
                    "updated_at, archived_at")


def add_persona_entry(connection: apsw.Connection, name: str, entry: NewPersonaEntry,
                      now: float) -> PersonaEntry | None:
    """Add an active entry (event ``persona_entries_added``); ``None`` when the character
    already has ``persona_entries_per_character_max`` active entries."""
    _check_text(entry.text, entry.section)
    if len(entry.source) > memory_text_characters_max:
        raise ValueError("persona source too long")
    ensure_character(connection, name, now)
    (active,) = connection.execute(
        "SELECT COUNT(*) FROM character_persona_entries WHERE name = ? AND status = 'active'",
        (name,),
    ).fetchone()
    if active >= persona_entries_per_character_max:
        return None
    connection.execute(
        "INSERT INTO character_persona_entries (id, name, section, text, source, status, "
        "revision, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'active', 1, ?, ?)",
        (entry.id, name, entry.section, entry.text, entry.source, now, now),
    )
    record_event(connection, name, "persona_entries_added", now, entry.id)
    return get_persona_entry(connection, name, entry.id)


def get_persona_entry(connection: apsw.Connection, name: str,
                      entry_id: str) -> PersonaEntry | None:
    row = connection.execute(
        f"SELECT {_persona_columns} FROM character_persona_entries WHERE id = ? AND name = ?",
        (entry_id, name),
    ).fetchone()
    return None if row is None else PersonaEntry(*row)


def list_persona_entries(connection: apsw.Connection, name: str,
                         status: str = persona_status_active,
                         limit: int = persona_entries_per_character_max) -> list[PersonaEntry]:
    """Entries of one status, oldest first."""
    return [PersonaEntry(*row) for row in connection.execute(
        f"SELECT {_persona_columns} FROM character_persona_entries WHERE name = ? "
        "AND status = ? ORDER BY created_at, id LIMIT ?",
        (name, status, limit),
    )]


def rewrite_persona_entry(connection: apsw.Connection, name: str, entry_id: str, text: str,
                          now: float) -> PersonaEntry | None:
    """Replace an active entry's text (revision + 1, event ``persona_entries_rewritten``);
    ``None`` when there is no such active entry."""
    _check_text(text, "persona")
    changed = connection.execute(
        "UPDATE character_persona_entries SET text = ?, revision = revision + 1, updated_at = ? "
        "WHERE id = ? AND name = ? AND status = 'active' RETURNING id",
        (text, now, entry_id, name),
    ).fetchall()
    if not changed:
        return None
    record_event(connection, name, "persona_entries_rewritten", now, entry_id)
    return get_persona_entry(connection, name, entry_id)


def archive_persona_entry(connection: apsw.Connection, name: str, entry_id: str,
                          now: float) -> bool:
    """Archive an active entry (event ``persona_entries_archived``); ``False`` when there is
    no such active entry.  Archived entries beyond the bound are deleted, oldest first."""
    changed = connection.execute(
        "UPDATE character_persona_entries SET status = 'archived', archived_at = ?, "
        "updated_at = ? WHERE id = ? AND name = ? AND status = 'active' RETURNING id",
        (now, now, entry_id, name),
    ).fetchall()
    if not changed:
        return False
    record_event(connection, name, "persona_entries_archived", now, entry_id)
    (archived,) = connection.execute(
        "SELECT COUNT(*) FROM character_persona_entries WHERE name = ? AND status = 'archived'",
        (name,),
    ).fetchone()
    if archived > persona_entries_archived_per_character_max:
        connection.execute(
            "DELETE FROM character_persona_entries WHERE id IN (SELECT id FROM "
            "character_persona_entries WHERE name = ? AND status = 'archived' "
            "ORDER BY archived_at, created_at, id LIMIT ?)",
            (name, archived - persona_entries_archived_per_character_max),
        )
    return True


@dataclass(frozen=True)
class PersonaCorrection:
    """A proposed correction of the persona (``entry_id`` ``None``: a new entry), with the
    outbox task that works on it.  ``state``: pending | applied | cancelled | rejected."""

    id: str
    name: str
    entry_id: str | None
    proposed_text: str
    state: str
    task_id: str | None
    created_at: float
    updated_at: float


_correction_columns = ("id, name, entry_id, proposed_text, state, task_id, created_at, "
                       "updated_at")


def record_correction(connection: apsw.Connection, name: str, correction_id: str,
                      entry_id: str | None, proposed_text: str, task_id: str | None,
                      now: float) -> PersonaCorrection:
    """Record a ``pending`` correction (the oldest records beyond the bound are pruned)."""
    _check_text(proposed_text, "persona")
    ensure_character(connection, name, now)
    connection.execute(
        "INSERT INTO character_persona_corrections (id, name, entry_id, proposed_text, state, "
        "task_id, created_at, updated_at) VALUES (?, ?, ?, ?, 'pending', ?, ?, ?)",
        (correction_id, name, entry_id, proposed_text, task_id, now, now),
    )
    (count,) = connection.execute(
        "SELECT COUNT(*) FROM character_persona_corrections WHERE name = ?", (name,)
    ).fetchone()
    if count > persona_corrections_per_character_max:
        connection.execute(
            "DELETE FROM character_persona_corrections WHERE id IN (SELECT id FROM "
            "character_persona_corrections WHERE name = ? ORDER BY created_at, id LIMIT ?)",
            (name, count - persona_corrections_per_character_max),
        )
    result = get_correction(connection, correction_id)
    assert result is not None
    return result


def get_correction(connection: apsw.Connection, correction_id: str) -> PersonaCorrection | None:
    row = connection.execute(
        f"SELECT {_correction_columns} FROM character_persona_corrections WHERE id = ?",
        (correction_id,),
    ).fetchone()
    return None if row is None else PersonaCorrection(*row)


def list_corrections(connection: apsw.Connection, name: str,
                     states: Iterable[str] = correction_states) -> list[PersonaCorrection]:
    wanted = set(states)
    return [correction for correction in (PersonaCorrection(*row) for row in connection.execute(
        f"SELECT {_correction_columns} FROM character_persona_corrections WHERE name = ? "
        "ORDER BY created_at, id",
        (name,),
    )) if correction.state in wanted]


def set_correction_state(connection: apsw.Connection, correction_id: str, state: str,
                         now: float) -> bool:
    """Finish a ``pending`` correction (``applied``, ``cancelled``, ``rejected``);
    ``False`` when it is not pending (so a cancelled one is never applied)."""
    if state not in correction_states or state == "pending":
        raise ValueError(f"bad correction state {state!r}")
    changed = connection.execute(
        "UPDATE character_persona_corrections SET state = ?, updated_at = ? "
        "WHERE id = ? AND state = 'pending' RETURNING id",
        (state, now, correction_id),
    ).fetchall()
    return bool(changed)


__all__ = [
    "Fact",
    "MemoryChanges",
    "MemoryRecord",
    "MessageLike",
    "NewFact",
    "NewPersonaEntry",
    "NewReflection",
    "PersonaCorrection",
    "PersonaEntry",
    "RecentMessage",
    "Reflection",
    "TimeIndexedRow",
    "add_facts",
    "add_persona_entry",
    "add_reflection",
    "append_recent",
    "append_time_indexed",
    "archive_facts",
    "archive_persona_entry",
    "character_exists",
    "character_name_characters_max",
    "character_name_problem",
    "content_text",
    "correction_states",
    "document_bytes_max",
    "document_kinds",
    "ensure_character",
    "entity_characters_max",
    "fact_count",
    "fact_status_active",
    "fact_status_archived",
    "fact_statuses",
    "facts_archived_per_character_max",
    "facts_per_add_max",
    "facts_per_character_max",
    "fold_recent_prefix",
    "get_correction",
    "get_fact",
    "get_persona_entry",
    "get_reflection",
    "iterate_memories",
    "iterate_memories_limit_max",
    "last_conversation_at",
    "list_characters",
    "list_corrections",
    "list_fact_texts",
    "list_facts",
    "list_persona_entries",
    "list_reflections",
    "memory_change_seqs_per_page",
    "memory_changes",
    "memory_text_characters_max",
    "memory_tier_fact",
    "memory_tier_fact_archive",
    "memory_tier_reflection",
    "memory_tiers",
    "memory_tombstones_per_character_max",
    "memory_version",
    "message_content_characters_max",
    "message_content_size",
    "message_problem",
    "message_roles",
    "messages_per_append_max",
    "persona_corrections_per_character_max",
    "persona_entries_archived_per_character_max",
    "persona_entries_per_character_max",
    "persona_status_active",
    "persona_status_archived",
    "read_document",
    "read_recent",
    "read_recent_meta",
    "read_recent_positioned",
    "read_time_indexed",
    "recent_history_messages_max",
    "recent_meta_bytes_max",
    "record_correction",
    "record_surfaced",
    "reflection_status_archived",
    "reflection_status_confirmed",
    "reflection_status_denied",
    "reflection_status_merged",
    "reflection_status_pending",
    "reflection_status_promoted",
    "reflection_statuses",
    "reflection_statuses_active",
    "reflection_transition_problem",
    "reflections_archived_per_character_max",
    "reflections_per_character_max",
    "replace_recent",
    "reset_confirmed_at",
    "rewrite_persona_entry",
    "set_correction_state",
    "surfaced_ids_per_call_max",
    "surfaced_records_per_character_max",
    "surfaced_times",
    "time_indexed_between",
    "time_indexed_rows_per_character_max",
    "transition_reflection",
    "write_document",
]
