import troupe.storage


def test_every_exported_name_resolves():
    for name in troupe.storage.__all__:
        assert getattr(troupe.storage, name) is not None, name


def test_the_names_other_packages_code_against_are_exported():
    expected = {
        "Engine", "Migration", "StorageError", "StorageCrashed", "StorageClosed", "DiskFull",
        "FaultPlan", "FaultyVFS", "InlineExecutor", "StorageOverloaded", "journal_append",
        "journal_load", "journal_snapshot", "blob_put", "blob_get", "reminder_set",
        "reminder_delete", "reminders_due", "reminders_for", "reminder_get", "reminder_attempt", "state_put",
        "state_get", "state_delete", "open_engine",
    }
    assert expected <= set(troupe.storage.__all__)


def test_exception_hierarchy():
    from troupe.storage import (
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
    for error in (StorageClosed, StorageCrashed, StorageOverloaded, StorageIOError,
                  StorageCorrupt, BatchAborted, MigrationError):
        assert issubclass(error, StorageError)
    assert issubclass(DiskFull, StorageIOError)
    assert issubclass(CorruptRecord, StorageCorrupt)
