"""Re-indexing the text index by itself when the tokenizer changed.

Why it exists: what FTS5 holds for a text is whatever the tokenizer emitted when the text was
written; a new tokenizer (one-character words, folded traditional characters, numbers as
digits) changes nothing for items already stored, and queries tokenized the new way would miss
them.  ``retrieval_meta`` records the ``tokenizer_version`` the index was built with; when
``MemoryIndex`` opens a store whose version differs (or was never recorded: a store from
before versions), every live item's text row is deleted and written again from
``retrieval_items`` — the text, context and facets are there, the time words are derived from
the item's time — in batches of ``reindex_batch_items``, one write transaction each.  The
version is recorded after the last batch, so a crash midway re-indexes again from the start at
the next open (rewriting a row is idempotent).  After the last batch the text index is
optimized (``optimize_text_index``): a rewritten index is otherwise fragmented, and every query
pays for it.

Trade-offs: this runs at open, before the index serves its first recall (measured: about
30 s per 100k items on the shared cores); a background re-index would serve recalls from
a half-old index, where queries tokenized the new way miss the old rows.  The same open
reads the items that may pair names across scripts into the alias table (``_aliases``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import apsw

from . import _store
from ._aliases import AliasTable, alias_markers
from ._time_window import datetime_from_seconds
from ._time_words import time_words
from ._tokenizer import tokenizer_version

reindex_batch_items = 5000
alias_scan_batch_items = 20_000
meta_table_sql = """
CREATE TABLE IF NOT EXISTS retrieval_meta(
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
"""
tokenizer_version_name = "tokenizer_version"

Result = TypeVar("Result")


class Database(Protocol):
    async def write(self, function: Callable[[apsw.Connection], Result]) -> Result: ...

    async def read(self, function: Callable[[apsw.Connection], Result]) -> Result: ...


def stored_tokenizer_version(connection: apsw.Connection) -> int | None:
    """The version the text index was built with; ``None`` when never recorded."""
    connection.execute(meta_table_sql)
    for (value,) in connection.execute(
        "SELECT value FROM retrieval_meta WHERE name = ?", (tokenizer_version_name,)
    ):
        return int(value)
    return None


def record_tokenizer_version(connection: apsw.Connection, version: int = tokenizer_version) -> None:
    connection.execute(meta_table_sql)
    connection.execute(
        "INSERT OR REPLACE INTO retrieval_meta(name, value) VALUES (?, ?)",
        (tokenizer_version_name, str(version)),
    )


def reindex_batch(connection: apsw.Connection, after_id: int, limit: int) -> tuple[int, int]:
    """Rewrites the text rows of up to ``limit`` live items with ids above ``after_id``;
    returns the highest id rewritten (``after_id`` when none was left) and how many."""
    rows = list(
        connection.execute(
            "SELECT id, tenant, scope, kind, text, context, created_at, event_start"
            " FROM retrieval_items WHERE id > ? AND deleted = 0 ORDER BY id LIMIT ?",
            (after_id, limit),
        )
    )
    if not rows:
        return after_id, 0
    connection.executemany(
        "DELETE FROM retrieval_text WHERE rowid = ?", [(row[0],) for row in rows]
    )
    connection.executemany(
        "INSERT INTO retrieval_text(rowid, text, context, time_words, facets) VALUES (?,?,?,?,?)",
        [
            (
                item_id,
                text,
                context,
                time_words(datetime_from_seconds(event_start if event_start is not None else created_at)),
                " ".join(
                    (
                        _store.tenant_token(tenant),
                        _store.scope_token(tenant, scope),
                        _store.kind_token(tenant, kind),
                    )
                ),
            )
            for item_id, tenant, scope, kind, text, context, created_at, event_start in rows
        ],
    )
    return rows[-1][0], len(rows)


async def reindex_if_stale(database: Database) -> int:
    """Re-indexes every live item when the stored tokenizer version is not this one's;
    returns how many items were re-indexed (0 when the index was current)."""
    stored = await database.write(stored_tokenizer_version)
    if stored == tokenizer_version:
        return 0
    rewritten = 0
    after_id = 0
    while True:
        last_id, count = await database.write(
            lambda connection, after=after_id: reindex_batch(connection, after, reindex_batch_items)
        )
        if count == 0:
            break
        rewritten += count
        after_id = last_id
    await database.write(optimize_text_index)
    await database.write(record_tokenizer_version)
    return rewritten


def optimize_text_index(connection: apsw.Connection) -> None:
    """Merges the text index's segments into one.  Rewriting every row leaves each term's
    postings spread over the old segments (as delete markers) and the new ones until FTS5's
    automerge catches up, which it may never do on a store that is mostly read: measured on
    a host store of 100k items, every query then cost 30-60 % more CPU, English ones too.
    One ``optimize`` (about 1 s at 100k items) brings it back to a freshly built index."""
    connection.execute("INSERT INTO retrieval_text(retrieval_text) VALUES ('optimize')")


def _alias_rows(connection: apsw.Connection, after_id: int, limit: int) -> list[tuple[Any, ...]]:
    condition = " OR ".join("instr(text, ?) > 0" for _ in alias_markers)
    return list(
        connection.execute(
            f"SELECT id, tenant, text FROM retrieval_items WHERE id > ? AND deleted = 0"
            f" AND ({condition}) ORDER BY id LIMIT ?",
            (after_id, *alias_markers, limit),
        )
    )


async def load_aliases(database: Database) -> AliasTable:
    """The alias table of every live item that may pair names (see ``_aliases``)."""
    table = AliasTable()
    after_id = 0
    while True:
        rows = await database.read(
            lambda connection, after=after_id: _alias_rows(connection, after, alias_scan_batch_items)
        )
        if not rows:
            return table
        table.observe_all((tenant, text) for _, tenant, text in rows)
        after_id = rows[-1][0]


async def open_text_index(database: Database) -> AliasTable:
    """What ``MemoryIndex.open`` runs first: re-index if the tokenizer changed, then read the
    tenants' aliases."""
    await reindex_if_stale(database)
    return await load_aliases(database)
