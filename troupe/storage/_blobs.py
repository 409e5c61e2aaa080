"""Content-addressed blobs: media stored once, named by the SHA-256 of its bytes.

Why: the same image or file is often attached many times (retries, re-sent messages);
addressing by hash dedupes it for free and makes references self-verifying.  Trade-off: no
reference counting, so a blob is never deleted automatically; a later sweep can remove blobs
no row references.  Blobs live inside SQLite (one backup, one transaction) rather than as loose
files; that suits media up to a few megabytes (``blob_bytes_max``).
"""

from __future__ import annotations

import hashlib

import apsw

from ._exceptions import StorageCorrupt

blob_bytes_max = 64 * 1024 * 1024


def blob_put(connection: apsw.Connection, data: bytes) -> str:
    """Store ``data`` once; return its SHA-256 as lowercase hex."""
    data = bytes(data)
    if len(data) > blob_bytes_max:
        raise ValueError(f"blob of {len(data)} bytes exceeds blob_bytes_max={blob_bytes_max}")
    digest = hashlib.sha256(data).hexdigest()
    connection.execute(
        "INSERT OR IGNORE INTO blobs (sha256, size, data) VALUES (?, ?, ?)",
        (digest, len(data), data),
    )
    return digest


def blob_get(connection: apsw.Connection, sha256: str) -> bytes | None:
    """The bytes stored under ``sha256``, or ``None``; verified against the hash."""
    row = connection.execute("SELECT data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if row is None:
        return None
    data = bytes(row[0])
    if hashlib.sha256(data).hexdigest() != sha256:
        raise StorageCorrupt(f"blob {sha256} does not match its hash")
    return data
