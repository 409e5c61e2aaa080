"""Numbered, idempotent schema migrations, per component, recorded in ``schema_migrations``.

Why per component: storage, retrieval and later packages each own tables and evolve them on
their own schedule, yet share one database file and one engine.  A migration is identified by
``(component, number)``; the engine applies the missing ones at open, each in its own
transaction, core first and then the components in the order the caller lists them.
Trade-off: there are no down-migrations; a mistake is fixed by the next number.  A recorded
migration whose name differs from the code's is refused (``MigrationError``) rather than
guessed at, because it means the file was written by different code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import apsw

from ._exceptions import MigrationError


@dataclass(frozen=True)
class Migration:
    """One schema step: ``sql`` (one or more statements) or a function of the connection."""

    component: str
    number: int
    name: str
    sql: str | Callable[[apsw.Connection], None]


bootstrap_sql = """
    CREATE TABLE IF NOT EXISTS schema_migrations (
        component TEXT NOT NULL,
        number INTEGER NOT NULL,
        name TEXT NOT NULL,
        applied_at REAL NOT NULL,
        PRIMARY KEY (component, number)
    )
"""
# A rowid table on purpose: rowid order is the order migrations were applied in.


def ordered_migrations(migrations: Sequence[Migration]) -> list[Migration]:
    """Group by component in first-seen order, numbers ascending within a component.

    Duplicate ``(component, number)`` pairs are a programming error of the caller.
    """
    components: dict[str, list[Migration]] = {}
    for migration in migrations:
        components.setdefault(migration.component, []).append(migration)
    ordered: list[Migration] = []
    for component, items in components.items():
        numbers = [item.number for item in items]
        if len(set(numbers)) != len(numbers):
            raise MigrationError(f"component {component!r} has duplicate migration numbers")
        ordered.extend(sorted(items, key=lambda item: item.number))
    return ordered


def apply_migrations(
    connection: apsw.Connection, migrations: Sequence[Migration], wall: Callable[[], float]
) -> list[tuple[str, int]]:
    """Apply the missing migrations in order; return the ``(component, number)`` applied."""
    connection.execute(bootstrap_sql)
    recorded: dict[tuple[str, int], str] = {
        (component, number): name
        for component, number, name in connection.execute(
            "SELECT component, number, name FROM schema_migrations"
        )
    }
    applied: list[tuple[str, int]] = []
    for migration in ordered_migrations(migrations):
        identity = (migration.component, migration.number)
        if identity in recorded:
            if recorded[identity] != migration.name:
                raise MigrationError(
                    f"migration {identity} is recorded as {recorded[identity]!r} "
                    f"but the code calls it {migration.name!r}"
                )
            continue
        _apply_one(connection, migration, wall())
        applied.append(identity)
    return applied


def _apply_one(connection: apsw.Connection, migration: Migration, applied_at: float) -> None:
    connection.execute("BEGIN IMMEDIATE")
    try:
        if callable(migration.sql):
            migration.sql(connection)
        else:
            connection.execute(migration.sql)
        connection.execute(
            "INSERT INTO schema_migrations (component, number, name, applied_at) "
            "VALUES (?, ?, ?, ?)",
            (migration.component, migration.number, migration.name, applied_at),
        )
        connection.execute("COMMIT")
    except BaseException as exc:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise MigrationError(
            f"migration {migration.component}/{migration.number} ({migration.name}) failed: {exc}"
        ) from exc


