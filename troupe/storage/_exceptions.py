"""Typed errors of the storage engine: what callers may catch, and nothing SQLite-specific.

The engine wraps apsw's errors at its boundary (``raise ... from exc``) so that callers never
depend on apsw's exception classes for the engine's own health.  Errors raised by a caller's
own job function (a constraint violation, a ``ValueError``) pass through unchanged: they are
the caller's, not the engine's.  The exception is I/O trouble met inside a job (``IOError``,
``FullError``, ``CorruptError``), which describes the disk and is wrapped like the rest.

Hierarchy::

    StorageError                    anything the storage engine raises on its own account
    ├── StorageClosed               the engine was closed (aclose) before or during the call
    ├── StorageCrashed              the engine was crashed (simulator); the job's fate is unknown
    │                               to the caller, but it was never acknowledged
    ├── StorageOverloaded           the write queue is full; carries ``retry_after_seconds``
    ├── StorageIOError              SQLite reported an I/O error; the batch was rolled back
    │   └── DiskFull                SQLITE_FULL: no space left
    ├── StorageCorrupt              the file or a stored record is not what we wrote
    │   └── CorruptRecord           a CBOR payload failed strict decoding
    ├── BatchAborted                the shared transaction ended under this job because another
    │                               job in the same group commit hit an I/O error
    └── MigrationError              a migration failed or conflicts with the recorded history
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error the storage engine raises itself."""


class StorageClosed(StorageError):
    """The engine is closed; no new jobs are accepted."""


class StorageCrashed(StorageError):
    """The engine was crashed (``Engine.crash``); the job was not acknowledged."""


class StorageOverloaded(StorageError):
    """The write queue is full.  Back off for ``retry_after_seconds`` and retry."""

    def __init__(self, message: str, *, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class StorageIOError(StorageError):
    """SQLite reported an I/O error (SQLITE_IOERR); the transaction was rolled back."""


class DiskFull(StorageIOError):
    """SQLite reported SQLITE_FULL; the transaction was rolled back."""


class StorageCorrupt(StorageError):
    """The database file, or a record in it, is damaged."""


class CorruptRecord(StorageCorrupt):
    """A stored CBOR value failed strict decoding (bad bytes or trailing bytes)."""


class BatchAborted(StorageError):
    """The group-commit transaction was rolled back because of another job's I/O failure."""


class MigrationError(StorageError):
    """A migration failed, or the recorded migration history conflicts with the code."""
