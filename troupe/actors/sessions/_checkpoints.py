"""Session checkpoints: snapshots of the governed history, restore in place, self-contained
export/import, and fork.

Why a checkpoint copies the history (rather than pointing at a position): a restore replaces
the history, and a compaction rewrites it, so a pointer would dangle; a checkpoint is the
messages' stored JSON texts, verbatim, in one CBOR blob with its SHA-256 (damage is detected,
never returned as a shorter history).

Why the export looks like this: the contract only says "self-contained bytes".  An export is
one canonical CBOR map ``{"format", "version", "sha256", "payload"}`` where ``payload`` is the
canonical CBOR bytes of ``{"checkpoint": <CheckpointMeta.encode()>, "messages": [<message
JSON text>, ...]}`` and ``sha256`` its hex digest.  Messages travel as their JSON texts so an
export → import round trip gives byte-identical history (CBOR maps would reorder keys).
``import_checkpoint`` checks format, version, digest, shape and that the blob belongs to this
session (``session_mismatch`` otherwise: a checkpoint's ``lastSeq`` is in its own session's seq
space; ``fork`` is the way to carry a history into another session).  A bad blob is an error
value (a ``SessionRefused``) and nothing is written.

Bounds: ``checkpoints_per_session_max`` per session (creating one more evicts the oldest
``auto`` checkpoint first, then the oldest ``manual``), ``checkpoint_import_bytes_max`` (the
contract's 32 MiB snapshot-import body cap).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, replace
from typing import Any

import apsw
import cbor2

from troupe.storage import CorruptRecord, cbor_decode, cbor_encode

from ._protocol import SessionRefused
from ._store import (
    SessionRow,
    StoreCorrupted,
    StoredEvent,
    commit_turn,
    insert_session,
    load_session,
    read_message_texts,
    replace_history,
    session_status_idle,
)

checkpoint_kind_manual = "manual"
checkpoint_kind_auto = "auto"
checkpoint_kinds = (checkpoint_kind_manual, checkpoint_kind_auto)

checkpoints_per_session_max = 64
"""Checkpoints kept per session; one more evicts the oldest (``auto`` before ``manual``)."""
checkpoint_name_characters_max = 256
checkpoint_import_bytes_max = 32 * 1024 * 1024
"""The contract's body cap for snapshot import (413 ``payload_too_large`` above it)."""
checkpoint_export_format = "troupe.sessions.checkpoint"
checkpoint_export_version = 1
fork_last_seq = 1
"""A fork starts at ``lastSeq: 1`` (the contract)."""


@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's metadata (``created_at_ms`` integer milliseconds of the Env's wall
    clock); ``encode()`` is the contract's camelCase ``CheckpointMeta``."""

    checkpoint_id: str
    session_id: str
    created_at_ms: int
    message_count: int
    last_seq: int
    kind: str = checkpoint_kind_manual
    name: str | None = None

    def encode(self) -> dict[str, Any]:
        """``{checkpointId, sessionId, createdAt, messageCount, lastSeq, kind, name?}``."""
        body: dict[str, Any] = {
            "checkpointId": self.checkpoint_id,
            "sessionId": self.session_id,
            "createdAt": self.created_at_ms,
            "messageCount": self.message_count,
            "lastSeq": self.last_seq,
            "kind": self.kind,
        }
        if self.name is not None:
            body["name"] = self.name
        return body


@dataclass(frozen=True)
class RestoreResult:
    """What a restore did: the history went from ``from_messages`` to ``to_messages``."""

    checkpoint_id: str
    from_messages: int
    to_messages: int

    def encode(self) -> dict[str, Any]:
        """``{status: 'restored', fromMessages, toMessages, checkpointId}``."""
        return {
            "status": "restored",
            "fromMessages": self.from_messages,
            "toMessages": self.to_messages,
            "checkpointId": self.checkpoint_id,
        }


def create_checkpoint(connection: apsw.Connection, session_id: str, *, checkpoint_id: str,
                      created_at_ms: int, kind: str = checkpoint_kind_manual,
                      name: str | None = None) -> CheckpointMeta:
    """Snapshot the current history.  Raises ``LookupError`` when the session is absent,
    ``StoreCorrupted`` when its history is damaged (no checkpoint of a damaged history)."""
    if kind not in checkpoint_kinds:
        raise ValueError(f"unknown checkpoint kind {kind!r}")
    if name is not None and len(name) > checkpoint_name_characters_max:
        raise ValueError(f"checkpoint name longer than {checkpoint_name_characters_max} characters")
    row = _require_session(connection, session_id)
    texts = read_message_texts(connection, session_id, 0, row.message_count, total=row.message_count)
    meta = CheckpointMeta(checkpoint_id=checkpoint_id, session_id=session_id,
                          created_at_ms=created_at_ms, message_count=len(texts),
                          last_seq=row.last_seq, kind=kind, name=name)
    _evict_for_one_more(connection, session_id)
    _insert_checkpoint(connection, meta, texts)
    return meta


def list_checkpoints(connection: apsw.Connection, session_id: str) -> list[CheckpointMeta]:
    """The session's checkpoints, oldest first."""
    return [
        _decode_meta(found)
        for found in connection.execute(
            f"SELECT {_meta_columns} FROM agent_session_checkpoints WHERE session_id = ? "
            "ORDER BY sequence",
            (session_id,),
        )
    ]


def load_checkpoint(connection: apsw.Connection, session_id: str,
                    checkpoint_id: str) -> CheckpointMeta | None:
    """One checkpoint's metadata, or ``None`` (``checkpoint_not_found``)."""
    found = connection.execute(
        f"SELECT {_meta_columns} FROM agent_session_checkpoints "
        "WHERE session_id = ? AND checkpoint_id = ?",
        (session_id, checkpoint_id),
    ).fetchone()
    return None if found is None else _decode_meta(found)


def load_checkpoint_history(connection: apsw.Connection, session_id: str,
                            checkpoint_id: str) -> tuple[str, ...] | None:
    """A checkpoint's messages as their stored JSON texts, or ``None`` when absent.
    Raises ``StoreCorrupted`` when the blob is damaged."""
    found = connection.execute(
        "SELECT message_count, history, history_sha256 FROM agent_session_checkpoints "
        "WHERE session_id = ? AND checkpoint_id = ?",
        (session_id, checkpoint_id),
    ).fetchone()
    if found is None:
        return None
    message_count, history, digest = found
    if not isinstance(history, bytes) or hashlib.sha256(history).hexdigest() != digest:
        raise StoreCorrupted(session_id, f"checkpoint {checkpoint_id!r} history fails its digest")
    try:
        texts = cbor_decode(history)
    except CorruptRecord as exc:
        raise StoreCorrupted(session_id, f"checkpoint {checkpoint_id!r} history is not CBOR") from exc
    if not _is_message_texts(texts) or len(texts) != message_count:
        raise StoreCorrupted(session_id, f"checkpoint {checkpoint_id!r} history has a bad shape")
    return tuple(texts)


def delete_checkpoint(connection: apsw.Connection, session_id: str, checkpoint_id: str) -> bool:
    """Delete one checkpoint; ``False`` when there was none."""
    connection.execute(
        "DELETE FROM agent_session_checkpoints WHERE session_id = ? AND checkpoint_id = ?",
        (session_id, checkpoint_id),
    )
    return connection.changes() == 1


def restore_checkpoint(connection: apsw.Connection, session_id: str,
                       checkpoint_id: str) -> RestoreResult | None:
    """Replace the session's history in place with the checkpoint's; ``None`` when the
    checkpoint is absent.  The watermark is untouched: seq keeps increasing."""
    meta = load_checkpoint(connection, session_id, checkpoint_id)
    if meta is None:
        return None
    texts = load_checkpoint_history(connection, session_id, checkpoint_id)
    assert texts is not None
    previous = replace_history(connection, session_id, texts)
    return RestoreResult(checkpoint_id=checkpoint_id, from_messages=previous, to_messages=len(texts))


def export_checkpoint(connection: apsw.Connection, session_id: str,
                      checkpoint_id: str) -> bytes | None:
    """The self-contained export bytes of one checkpoint, or ``None`` when absent."""
    meta = load_checkpoint(connection, session_id, checkpoint_id)
    if meta is None:
        return None
    texts = load_checkpoint_history(connection, session_id, checkpoint_id)
    assert texts is not None
    payload = cbor_encode({"checkpoint": meta.encode(), "messages": list(texts)})
    return cbor_encode({
        "format": checkpoint_export_format,
        "version": checkpoint_export_version,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": payload,
    })


def import_checkpoint(connection: apsw.Connection, session_id: str, data: bytes, *,
                      checkpoint_id: str, created_at_ms: int) -> CheckpointMeta | SessionRefused:
    """Store an exported checkpoint under a new ``checkpoint_id`` (kind, name, message count
    and ``lastSeq`` kept from the export).  Raises ``LookupError`` when the session is
    absent; a bad blob is a ``SessionRefused`` and nothing is written."""
    _require_session(connection, session_id)
    decoded = decode_export(data)
    if isinstance(decoded, SessionRefused):
        return decoded
    original, texts = decoded
    if original.session_id != session_id:
        return SessionRefused("session_mismatch", "the checkpoint belongs to another session")
    meta = replace(original, checkpoint_id=checkpoint_id, created_at_ms=created_at_ms)
    _evict_for_one_more(connection, session_id)
    _insert_checkpoint(connection, meta, texts)
    return meta


def decode_export(data: bytes) -> tuple[CheckpointMeta, tuple[str, ...]] | SessionRefused:
    """Validate export bytes (size, format, version, digest, shape) without writing."""
    if len(data) > checkpoint_import_bytes_max:
        return SessionRefused("payload_too_large", "the checkpoint export is too large")
    outer = _strict_cbor(data)
    if not isinstance(outer, dict) or set(outer) != {"format", "version", "sha256", "payload"}:
        return _rejected("the bytes are not a checkpoint export")
    if outer["format"] != checkpoint_export_format:
        return _rejected("the bytes are not a checkpoint export")
    if outer["version"] != checkpoint_export_version:
        return _rejected(f"unsupported checkpoint export version {outer['version']!r}")
    payload = outer["payload"]
    if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != outer["sha256"]:
        return _rejected("the checkpoint export fails its digest")
    inner = _strict_cbor(payload)
    if not isinstance(inner, dict) or set(inner) != {"checkpoint", "messages"}:
        return _rejected("the checkpoint export has a bad shape")
    meta = _meta_from_export(inner["checkpoint"])
    texts = inner["messages"]
    if meta is None or not _is_message_texts(texts) or len(texts) != meta.message_count:
        return _rejected("the checkpoint export has a bad shape")
    return meta, tuple(texts)


def fork_from_checkpoint(connection: apsw.Connection, source_session_id: str, checkpoint_id: str,
                         new_session: SessionRow, *,
                         events: tuple[StoredEvent, ...] = ()) -> SessionRow | None:
    """Create ``new_session`` with the checkpoint's history, ``lastSeq`` 1 (sealed) and
    ``forked_from`` the source session; ``events`` (e.g. ``session.created`` at seq 1) go to
    its log.  ``None`` when the checkpoint is absent (``checkpoint_not_found``)."""
    texts = load_checkpoint_history(connection, source_session_id, checkpoint_id)
    if texts is None:
        return None
    row = replace(new_session, status=session_status_idle, last_seq=0, seq_sealed=True,
                  epoch_start_seq=1, message_count=0, usage=None, events_dropped=0,
                  forked_from=source_session_id)
    insert_session(connection, row)
    replace_history(connection, row.session_id, texts)
    return commit_turn(connection, row.session_id, events=events, messages=(),
                       last_seq=fork_last_seq, sealed=True, status=session_status_idle,
                       usage=None, last_activity_at_ms=row.last_activity_at_ms)


# -- internals -----------------------------------------------------------------------------

_meta_columns = "checkpoint_id, session_id, created_at_ms, message_count, last_seq, kind, name"


def _require_session(connection: apsw.Connection, session_id: str) -> SessionRow:
    row = load_session(connection, session_id)
    if row is None:
        raise LookupError(session_id)
    return row


def _insert_checkpoint(connection: apsw.Connection, meta: CheckpointMeta, texts: tuple[str, ...]) -> None:
    history = cbor_encode(list(texts))
    connection.execute(
        "INSERT INTO agent_session_checkpoints (session_id, checkpoint_id, created_at_ms, kind, "
        "name, message_count, last_seq, history, history_sha256) VALUES (?,?,?,?,?,?,?,?,?)",
        (meta.session_id, meta.checkpoint_id, meta.created_at_ms, meta.kind, meta.name,
         meta.message_count, meta.last_seq, history, hashlib.sha256(history).hexdigest()),
    )


def _evict_for_one_more(connection: apsw.Connection, session_id: str) -> None:
    # Make room for one more: oldest auto checkpoints go first, then the oldest manual ones.
    count = connection.execute(
        "SELECT count(*) FROM agent_session_checkpoints WHERE session_id = ?", (session_id,)
    ).fetchone()[0]
    excess = count - checkpoints_per_session_max + 1
    if excess <= 0:
        return
    connection.execute(
        "DELETE FROM agent_session_checkpoints WHERE sequence IN (SELECT sequence FROM "
        "agent_session_checkpoints WHERE session_id = ? ORDER BY kind = ?, sequence LIMIT ?)",
        (session_id, checkpoint_kind_manual, excess),
    )


def _decode_meta(found: tuple[Any, ...]) -> CheckpointMeta:
    checkpoint_id, session_id, created_at_ms, message_count, last_seq, kind, name = found
    if (kind not in checkpoint_kinds or not isinstance(created_at_ms, int)
            or not isinstance(message_count, int) or not isinstance(last_seq, int)):
        raise StoreCorrupted(str(session_id), f"checkpoint {checkpoint_id!r} row cannot be decoded")
    if not (name is None or isinstance(name, str)):
        raise StoreCorrupted(str(session_id), f"checkpoint {checkpoint_id!r} row cannot be decoded")
    return CheckpointMeta(checkpoint_id=checkpoint_id, session_id=session_id,
                            created_at_ms=created_at_ms, message_count=message_count,
                            last_seq=last_seq, kind=kind, name=name)


def _meta_from_export(value: Any) -> CheckpointMeta | None:
    if not isinstance(value, dict):
        return None
    required = {"checkpointId": str, "sessionId": str, "createdAt": int, "messageCount": int,
                "lastSeq": int, "kind": str}
    if any(not isinstance(value.get(key), kind) or isinstance(value.get(key), bool)
           for key, kind in required.items()):
        return None
    name = value.get("name")
    if value["kind"] not in checkpoint_kinds or not (name is None or isinstance(name, str)):
        return None
    if name is not None and len(name) > checkpoint_name_characters_max:
        return None
    if set(value) - {*required, "name"}:
        return None
    if value["messageCount"] < 0 or value["lastSeq"] < 0:
        return None
    return CheckpointMeta(checkpoint_id=value["checkpointId"], session_id=value["sessionId"],
                            created_at_ms=value["createdAt"], message_count=value["messageCount"],
                            last_seq=value["lastSeq"], kind=value["kind"], name=name)


def _is_message_texts(texts: Any) -> bool:
    if not isinstance(texts, list):
        return False
    for text in texts:
        if not isinstance(text, str):
            return False
        try:
            message = json.loads(text)
        except ValueError:
            return False
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return False
    return True


def _strict_cbor(data: bytes) -> Any:
    # Strict: exactly one item spanning all the bytes (cbor2.loads ignores trailing bytes).
    stream = io.BytesIO(data)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except (cbor2.CBORDecodeError, ValueError, EOFError, TypeError, RecursionError):
        return None
    return value if stream.tell() == len(data) else None


def _rejected(message: str) -> SessionRefused:
    return SessionRefused("validation_failed", message)


__all__ = [
    "CheckpointMeta",
    "RestoreResult",
    "checkpoint_export_format",
    "checkpoint_export_version",
    "checkpoint_import_bytes_max",
    "checkpoint_kind_auto",
    "checkpoint_kind_manual",
    "checkpoint_kinds",
    "checkpoint_name_characters_max",
    "checkpoints_per_session_max",
    "create_checkpoint",
    "decode_export",
    "delete_checkpoint",
    "export_checkpoint",
    "fork_from_checkpoint",
    "fork_last_seq",
    "import_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_checkpoint_history",
    "restore_checkpoint",
]
