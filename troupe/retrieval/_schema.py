"""How recall plugs into the storage engine: its migrations and per-connection setup.

Why it exists: ``troupe.storage`` runs every component's numbered migrations at start-up and
calls each ``connection_setup`` function on every connection it opens; recall needs its
tables created once and its FTS5 tokenizer registered on every connection (a tokenizer is
per connection, and a connection without it cannot read or write the text index).
"""

from __future__ import annotations

from typing import Any

from ._store import schema_sql
from ._tokenizer import register_tokenizer

migration_component = "retrieval"

# (number, name, sql): append, never edit a shipped one.
migration_steps: tuple[tuple[int, str, str], ...] = ((1, "items, text index, vectors", schema_sql),)

connection_setup = (register_tokenizer,)


def retrieval_migrations() -> list[Any]:
    """The steps as ``troupe.storage.Migration`` objects (imported late: storage is optional
    for code that only uses the SQL layer on a bare connection)."""
    from troupe.storage import Migration

    return [
        Migration(component=migration_component, number=number, name=name, sql=sql)
        for number, name, sql in migration_steps
    ]


def apply_schema(connection: Any) -> None:
    """Creates the tables on a bare connection (tests, tools); the engine uses migrations."""
    for _, _, sql in migration_steps:
        connection.execute(sql)
