"""Host media: uploads stored once by SHA-256, their authorisation records, and the clean-up.

Why objects and files are apart: every upload is a new object (its own id, its own host
understanding, its own upload entry), while identical bytes share one stored file
(``troupe.storage`` blobs, keyed by SHA-256), so a host that retries an upload costs a row,
not another ten megabytes.

Why an authorisation record: a media id alone grants nothing.  ``save_host_media`` writes the
object, its file and an ``admin_operations`` row (``media_uploaded``, object type ``media``,
``details_json.entry_id`` = the upload's entry) in ONE transaction; ``require_host_media``
(inside the message transaction) accepts a reference only when that record exists, the object
is not cleaned, and the token may reach the upload's entry.  Anything else (unknown, cleaned,
an internal object without the record, another scope's upload) answers the same 404.

Why a grace period and a sweep: upload and message are two requests, so a file is unreferenced
between them.  ``sweep_unreferenced_media`` cleans objects older than ``media_grace_seconds``
that no message references, and deletes a file only when no live object shares it; a file
referenced by any message is never deleted.  ``MediaStoreActor`` runs the sweep from a durable
reminder (``media_sweep_interval_seconds``), delivered by the runtime's supervised reminder
service: the schedule lives in storage and survives crashes and restarts.  The actor arms it on
activation when it is missing (the first upload activates it; with no upload there is nothing
to clean) and re-arms it after each sweep; a crash mid-sweep leaves the old row, which fires
again.

Uploads never call the model: images without host understanding are understood later, by the
learning work, which fills ``understanding_source``/``understanding_text``/``completed_at``/
``last_error`` on the object (``record_media_understanding``).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import apsw

from troupe.runtime import Actor, ActorKind
from troupe.storage import StorageError, blob_bytes_max, blob_put, reminders_for

media_kind_name = "host_media"
media_store_key = "store"
"""One actor owns every media write and the sweep: uploads are one storage transaction each,
and the single writer serialises them anyway."""

media_bytes_max = 10 * 1024 * 1024
"""Decoded file size (the contract's 10 MiB = 10,485,760 bytes; 413 over it)."""
understanding_text_bytes_max = 32_768
"""Host understanding in UTF-8 bytes (413 over it, never truncated)."""
media_grace_seconds = 86_400.0
"""An upload no message references is cleaned this long after it was stored (one day)."""
media_sweep_interval_seconds = 3_600.0
"""How often the maintenance reminder sweeps."""
media_sweep_objects_max = 500
"""Objects cleaned per sweep transaction (a sweep runs transactions until none is left)."""
media_mailbox_messages_max = 16
"""Queued uploads (each holds up to 10 MiB in memory): more is backpressure (503)."""
media_turn_timeout_seconds = 60.0

assert media_bytes_max <= blob_bytes_max
assert media_sweep_interval_seconds < media_grace_seconds
assert media_sweep_objects_max >= 1

media_tables_sql = """
    CREATE TABLE host_media (
        id TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL,
        content_type TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        kind TEXT NOT NULL,
        entry_id TEXT NOT NULL,
        source TEXT NOT NULL,
        uploaded_at REAL NOT NULL,
        understanding_source TEXT,
        understanding_text TEXT,
        completed_at REAL,
        last_error TEXT,
        cleaned_at REAL
    ) WITHOUT ROWID;
    CREATE INDEX host_media_by_sha256 ON host_media (sha256, cleaned_at);
    CREATE INDEX host_media_sweep ON host_media (cleaned_at, uploaded_at, id);
    CREATE TABLE IF NOT EXISTS admin_operations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        operation TEXT NOT NULL,
        object_type TEXT NOT NULL,
        object_id TEXT NOT NULL,
        source TEXT NOT NULL,
        details_json TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS admin_operations_by_object
        ON admin_operations (object_type, object_id, operation);
"""
"""Uploaded objects (a cleaned object keeps its row with ``cleaned_at``; its file may be gone)
and the operation log whose ``media_uploaded`` rows are the entries' authorisation records
(the contract names the table ``admin_operations``)."""

operation_media_uploaded = "media_uploaded"
object_type_media = "media"
sweep_reminder_name = "sweep"
understanding_source_host = "host"
understanding_source_model = "model"
"""Understood by the learning work's model (a content-safety refusal's text included)."""

media_types: dict[str, str] = {
    "image/png": "image",
    "image/jpeg": "image",
    "image/gif": "image",
    "image/webp": "image",
    "audio/mpeg": "audio",
    "audio/wav": "audio",
    "audio/ogg": "audio",
    "audio/flac": "audio",
    "video/mp4": "video",
    "video/webm": "video",
}
"""The contract's allow-list: MIME type -> kind.  Nothing else (no SVG, HTML, application/*)."""


def _mpeg_audio_frame(header: bytes) -> bool:
    # An MPEG audio frame starts with 11 set sync bits; version and layer must not be the
    # reserved values (which also keeps ADTS AAC, layer 00, out).
    return (
        len(header) >= 2 and header[0] == 0xFF and header[1] & 0xE0 == 0xE0
        and header[1] & 0x18 != 0x08 and header[1] & 0x06 != 0x00
    )


def _matches(content_type: str, data: bytes) -> bool:
    head = data[:64]
    if content_type == "image/png":
        return head.startswith(b"\x89PNG\r\n\x1a\n")
    if content_type == "image/jpeg":
        return head.startswith(b"\xff\xd8\xff")
    if content_type == "image/gif":
        return head.startswith((b"GIF87a", b"GIF89a"))
    if content_type == "image/webp":
        return head.startswith(b"RIFF") and head[8:12] == b"WEBP"
    if content_type == "audio/mpeg":
        return head.startswith(b"ID3") or _mpeg_audio_frame(head)
    if content_type == "audio/wav":
        return head.startswith(b"RIFF") and head[8:12] == b"WAVE"
    if content_type == "audio/ogg":
        return head.startswith(b"OggS")
    if content_type == "audio/flac":
        return head.startswith(b"fLaC")
    if content_type == "video/mp4":
        return head[4:8] == b"ftyp"
    if content_type == "video/webm":
        # EBML, and the DocType element (0x4282) says webm rather than another Matroska.
        return head.startswith(b"\x1a\x45\xdf\xa3") and b"\x42\x82" in head and b"webm" in head
    return False


def detect_media_type(data: bytes) -> str | None:
    """The allow-listed type whose file header ``data`` has, if any (for error messages)."""
    for content_type in media_types:
        if _matches(content_type, data):
            return content_type
    return None


def media_header_matches(content_type: str, data: bytes) -> bool:
    """Whether ``data`` starts with ``content_type``'s file header (allow-listed types only).
    A matching header does not promise the file decodes."""
    return content_type in media_types and _matches(content_type, data)


@dataclass(frozen=True)
class MediaObject:
    """One uploaded object as stored (times are wall seconds)."""

    id: str
    sha256: str
    content_type: str
    size_bytes: int
    kind: str
    entry_id: str
    source: str
    uploaded_at: float
    understanding_source: str | None
    understanding_text: str | None
    completed_at: float | None
    last_error: str | None
    cleaned_at: float | None = None

    def document(self) -> dict[str, Any]:
        """The contract's upload response."""
        return {
            "id": self.id,
            "sha256": self.sha256,
            "content_type": self.content_type,
            "size_bytes": self.size_bytes,
            "kind": self.kind,
            "understanding_source": self.understanding_source,
            "understanding_text": self.understanding_text,
            "completed_at": _iso(self.completed_at),
            "last_error": self.last_error,
        }


def _iso(wall_seconds: float | None) -> str | None:
    if wall_seconds is None:
        return None
    return datetime.datetime.fromtimestamp(wall_seconds, tz=datetime.UTC).isoformat(timespec="seconds")


_columns = (
    "id, sha256, content_type, size_bytes, kind, entry_id, source, uploaded_at, "
    "understanding_source, understanding_text, completed_at, last_error, cleaned_at"
)


def save_host_media(
    connection: apsw.Connection,
    *,
    media_id: str,
    entry_id: str,
    content_type: str,
    data: bytes,
    understanding_text: str | None,
    source: str,
    now: float,
) -> MediaObject:
    """Store one upload (write transaction): its file once by SHA-256, a new object, and the
    ``media_uploaded`` authorisation record.  Limits and header are checked by the caller;
    asserted here."""
    assert content_type in media_types and len(data) <= media_bytes_max
    assert media_header_matches(content_type, data)
    understood = understanding_text is not None and understanding_text.strip() != ""
    record = MediaObject(
        id=media_id,
        sha256=blob_put(connection, data),
        content_type=content_type,
        size_bytes=len(data),
        kind=media_types[content_type],
        entry_id=entry_id,
        source=source,
        uploaded_at=now,
        understanding_source=understanding_source_host if understood else None,
        understanding_text=understanding_text if understood else None,
        completed_at=now if understood else None,
        last_error=None,
    )
    connection.execute(
        f"INSERT INTO host_media ({_columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (record.id, record.sha256, record.content_type, record.size_bytes, record.kind,
         record.entry_id, record.source, record.uploaded_at, record.understanding_source,
         record.understanding_text, record.completed_at, record.last_error, None),
    )
    connection.execute(
        "INSERT INTO admin_operations (operation, object_type, object_id, source, details_json, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (operation_media_uploaded, object_type_media, media_id, source,
         json.dumps({"entry_id": entry_id}, ensure_ascii=False), now),
    )
    return record


def load_media(connection: apsw.Connection, media_id: str) -> MediaObject | None:
    """The stored object (cleaned ones included), or None."""
    row = connection.execute(f"SELECT {_columns} FROM host_media WHERE id = ?", (media_id,)).fetchone()
    return None if row is None else MediaObject(*row)


def require_host_media(connection: apsw.Connection, media_id: str) -> str | None:
    """The upload entry of a referenceable host upload, else None (unknown, cleaned, or
    without its ``media_uploaded`` authorisation record).  The caller checks the scope."""
    row = connection.execute(
        "SELECT json_extract(o.details_json, '$.entry_id') FROM host_media AS m "
        "JOIN admin_operations AS o ON o.object_type = ? AND o.object_id = m.id AND o.operation = ? "
        "WHERE m.id = ? AND m.cleaned_at IS NULL",
        (object_type_media, operation_media_uploaded, media_id),
    ).fetchone()
    if row is None or not isinstance(row[0], str):
        return None
    return row[0]


def record_media_understanding(
    connection: apsw.Connection, media_id: str, *, text: str | None, error: str | None, now: float
) -> bool:
    """Write back what the learning work made of an image (write transaction): ``text`` (the
    model's description, or the refusal text) completes the object; ``text=None`` records only
    ``error`` so that a later batch tries again.  An understanding already stored (the host's,
    or another learner's) is never overwritten; returns whether the row changed."""
    assert text is None or len(text.encode("utf-8", "surrogatepass")) <= understanding_text_bytes_max
    if text is not None:
        connection.execute(
            "UPDATE host_media SET understanding_source = ?, understanding_text = ?, completed_at = ?, "
            "last_error = ? WHERE id = ? AND understanding_text IS NULL",
            (understanding_source_model, text, now, error, media_id),
        )
    else:
        connection.execute(
            "UPDATE host_media SET last_error = ? WHERE id = ? AND understanding_text IS NULL",
            (error, media_id),
        )
    return connection.changes() > 0


@dataclass(frozen=True)
class SweepResult:
    objects_cleaned: int
    files_deleted: int


def sweep_unreferenced_media(
    connection: apsw.Connection, now: float, *, objects_max: int = media_sweep_objects_max
) -> SweepResult:
    """One sweep transaction: clean up to ``objects_max`` objects stored before
    ``now - media_grace_seconds`` that no message references, then delete the files no live
    object shares.  A file referenced by a message keeps its object live, so it stays."""
    rows = connection.execute(
        "SELECT id, sha256 FROM host_media AS m WHERE m.cleaned_at IS NULL AND m.uploaded_at <= ? "
        "AND NOT EXISTS (SELECT 1 FROM host_message_media AS r WHERE r.media_id = m.id) "
        "ORDER BY m.uploaded_at, m.id LIMIT ?",
        (now - media_grace_seconds, objects_max),
    ).fetchall()
    digests = sorted({sha256 for _, sha256 in rows})
    for media_id, _ in rows:
        connection.execute("UPDATE host_media SET cleaned_at = ? WHERE id = ?", (now, media_id))
    files_deleted = 0
    for sha256 in digests:
        live = connection.execute(
            "SELECT 1 FROM host_media WHERE sha256 = ? AND cleaned_at IS NULL LIMIT 1", (sha256,)
        ).fetchone()
        if live is None:
            connection.execute("DELETE FROM blobs WHERE sha256 = ?", (sha256,))
            files_deleted += connection.changes()
    return SweepResult(len(rows), files_deleted)


# -- the actor --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveMedia:
    """Store one validated upload; ``source`` is the token's name.  ``data`` is left out of
    the repr (the runtime fingerprints a crashed message by its repr): ``sha256`` and the
    size name the file instead."""

    entry_id: str
    content_type: str
    data: bytes = field(repr=False)
    understanding_text: str | None
    source: str
    sha256: str
    size_bytes: int

    @classmethod
    def of(cls, entry_id: str, content_type: str, data: bytes, understanding_text: str | None,
           source: str) -> SaveMedia:
        return cls(entry_id, content_type, data, understanding_text, source, media_sha256(data), len(data))


@dataclass(frozen=True)
class MediaSaved:
    media: MediaObject


@dataclass(frozen=True)
class MediaUnavailable:
    """Nothing was stored (or it is unknown whether the commit happened): retry (503)."""

    reason: str


@dataclass(frozen=True)
class SweepMedia:
    """Run the clean-up now (the reminder does this; tests and operators may too)."""


class MediaStoreActor(Actor):
    """``(host_media, store)``: saves uploads and sweeps on its durable reminder."""

    async def on_activate(self) -> None:
        await self._ensure_reminder()

    async def receive(self, message: Any) -> Any:
        if isinstance(message, SaveMedia):
            return await self._save(message)
        if isinstance(message, SweepMedia):
            return await self._sweep()
        raise AssertionError(f"media actor got an unknown message {type(message).__name__}")

    async def on_reminder(self, name: str, payload: Any) -> None:
        del payload
        assert name == sweep_reminder_name
        await self._sweep()
        await self.context.set_reminder(sweep_reminder_name, self.context.env.clock.wall() + media_sweep_interval_seconds)

    async def _save(self, command: SaveMedia) -> MediaSaved | MediaUnavailable:
        env = self.context.env
        now = env.clock.wall()
        media_id = env.ids.new_id("media_")

        def job(connection: apsw.Connection) -> MediaObject:
            return save_host_media(
                connection, media_id=media_id, entry_id=command.entry_id,
                content_type=command.content_type, data=command.data,
                understanding_text=command.understanding_text, source=command.source, now=now,
            )

        try:
            media = await self.context.storage.write(job)
        except StorageError as exc:
            return MediaUnavailable(type(exc).__name__)
        self.context.trace("media_saved", media_id=media.id, size_bytes=media.size_bytes)
        return MediaSaved(media)

    async def _sweep(self) -> SweepResult:
        now = self.context.env.clock.wall()
        cleaned = deleted = 0
        while True:
            result = await self.context.storage.write(lambda connection: sweep_unreferenced_media(connection, now))
            cleaned += result.objects_cleaned
            deleted += result.files_deleted
            if result.objects_cleaned < media_sweep_objects_max:
                break
        self.context.trace("media_swept", objects=cleaned, files=deleted)
        return SweepResult(cleaned, deleted)

    async def _ensure_reminder(self) -> bool:
        kind, key = self.context.kind, self.context.key
        try:
            existing = await self.context.storage.read(lambda connection: reminders_for(connection, kind, key))
        except StorageError:
            # Uploads must not fail for the schedule's sake: the next activation tries again.
            return False
        if any(reminder.name == sweep_reminder_name for reminder in existing):
            return False
        try:
            await self.context.set_reminder(sweep_reminder_name, self.context.env.clock.wall() + media_sweep_interval_seconds)
        except StorageError:
            return False
        return True


def media_actor_kind() -> ActorKind:
    return ActorKind(
        media_kind_name,
        MediaStoreActor,
        mailbox_messages_max=media_mailbox_messages_max,
        turn_timeout_seconds=media_turn_timeout_seconds,
    )


def media_ids_refused(
    connection: apsw.Connection, allows: Any, media_ids: Sequence[str]
) -> list[int]:
    """Positions of ``media_ids`` that are not referenceable by a token whose scope answers
    ``allows(entry_id)``."""
    refused = []
    for position, media_id in enumerate(media_ids):
        upload_entry = require_host_media(connection, media_id)
        if upload_entry is None or not allows(upload_entry):
            refused.append(position)
    return refused


def media_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = [
    "MediaObject",
    "MediaSaved",
    "MediaStoreActor",
    "MediaUnavailable",
    "SaveMedia",
    "SweepMedia",
    "SweepResult",
    "detect_media_type",
    "load_media",
    "media_actor_kind",
    "media_bytes_max",
    "media_grace_seconds",
    "media_header_matches",
    "media_ids_refused",
    "media_kind_name",
    "media_sha256",
    "media_store_key",
    "media_sweep_interval_seconds",
    "media_tables_sql",
    "media_types",
    "record_media_understanding",
    "require_host_media",
    "save_host_media",
    "sweep_unreferenced_media",
    "understanding_source_host",
    "understanding_source_model",
    "understanding_text_bytes_max",
]
