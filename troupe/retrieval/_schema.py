"""How recall plugs into the storage engine: its migrations and per-connection setup.

Why it exists: ``troupe.storage`` runs every component's numbered migrations at start-up and
calls each ``connection_setup`` function on every connection it opens; recall needs its
tables created once and its FTS5 tokenizer registered on every connection (a tokenizer is
per connection, and a connection without it cannot read or write the text index).

Every surface that recalls (host, character) declares the SAME ``Migration`` objects
(``retrieval_migration``; ``retrieval_migrations()`` lists them): the server de-duplicates
the surfaces' migrations by value, and two different objects for ``("retrieval", 1)`` would
be a duplicate migration number.  Each step is a function rather than its SQL because the
writer connection may not have the tokenizer registered yet when migrations run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import apsw

from troupe.storage import Migration

from ._reindex import meta_table_sql
from ._store import schema_sql
from ._tokenizer import register_tokenizer

migration_component = "retrieval"

# (number, name, sql): append, never edit a shipped one.
migration_steps: tuple[tuple[int, str, str], ...] = (
    (1, "items, text index, vectors", schema_sql),
    # The tokenizer version lives here; no row means "built before versions" (``_reindex``).
    (2, "retrieval meta (tokenizer version)", meta_table_sql),
)

connection_setup = (register_tokenizer,)


def _tokenized_step(sql: str) -> Callable[[apsw.Connection], None]:
    def step(connection: apsw.Connection) -> None:
        register_tokenizer(connection)
        connection.execute(sql)

    return step


retrieval_migration_steps: tuple[Migration, ...] = tuple(
    Migration(component=migration_component, number=number, name=name, sql=_tokenized_step(sql))
    for number, name, sql in migration_steps
)
"""The steps as ``troupe.storage.Migration`` objects, created once (see the module
docstring: every surface must hand the engine these very objects)."""

retrieval_migration = retrieval_migration_steps[0]
"""The first step (the tables); what the host component's list names."""


def retrieval_migrations() -> list[Migration]:
    """Every retrieval migration, in order (the objects of ``retrieval_migration_steps``)."""
    return list(retrieval_migration_steps)


def apply_schema(connection: Any) -> None:
    """Creates the tables on a bare connection (tests, tools); the engine uses migrations."""
    for _, _, sql in migration_steps:
        connection.execute(sql)
