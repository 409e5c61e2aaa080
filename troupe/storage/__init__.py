"""troupe.storage: the one storage engine everything durable goes through.

See ``docs/storage.md`` for the design; each ``_module`` says why it exists.
"""

from ._blobs import blob_bytes_max, blob_get, blob_put
from ._codec import decode as cbor_decode
from ._codec import encode as cbor_encode
from ._engine import (
    Engine,
    EngineStatistics,
    open_engine,
    readers_max_limit,
    storage_planted_bugs,
    synchronous_default,
    synchronous_modes,
    write_batch_jobs_max,
    write_queue_jobs_max,
)
from ._exceptions import (
    BatchAborted,
    CorruptRecord,
    DiskFull,
    MigrationError,
    StorageClosed,
    StorageCorrupt,
    StorageCrashed,
    StorageError,
    StorageIOError,
    StorageOverloaded,
)
from ._executor import InlineExecutor
from ._faults import FaultPlan, FaultyVFS, power_loss_modes
from ._journal import JournalState, journal_append, journal_last_seq, journal_load, journal_snapshot
from ._migrations import Migration
from ._reminders import (
    Reminder,
    reminder_attempt,
    reminder_delete,
    reminder_get,
    reminder_set,
    reminders_due,
    reminders_for,
)
from ._state import state_delete, state_get, state_put

__all__ = [
    "BatchAborted",
    "CorruptRecord",
    "DiskFull",
    "Engine",
    "EngineStatistics",
    "FaultPlan",
    "FaultyVFS",
    "InlineExecutor",
    "JournalState",
    "Migration",
    "MigrationError",
    "Reminder",
    "StorageClosed",
    "StorageCorrupt",
    "StorageCrashed",
    "StorageError",
    "StorageIOError",
    "StorageOverloaded",
    "blob_bytes_max",
    "blob_get",
    "blob_put",
    "cbor_decode",
    "cbor_encode",
    "journal_append",
    "journal_last_seq",
    "journal_load",
    "journal_snapshot",
    "open_engine",
    "power_loss_modes",
    "readers_max_limit",
    "reminder_attempt",
    "reminder_delete",
    "reminder_set",
    "reminders_due",
    "reminder_get",
    "reminders_for",
    "state_delete",
    "state_get",
    "state_put",
    "storage_planted_bugs",
    "synchronous_default",
    "synchronous_modes",
    "write_batch_jobs_max",
    "write_queue_jobs_max",
]
