"""``compact`` in isolation: only covered upserts every peer holds leave the log, at most
``items_max`` items per job (a cursor carries on), tombstones stay, and the item digest of
``/sync/state`` is the same before and after."""

from __future__ import annotations

import apsw

from troupe.actors.knowledge.sync import (
    Operation,
    compact,
    covered_total,
    item_sync_state,
    kind_tombstone,
    kind_upsert,
    operations_missing_documents,
    store_operation,
    version_vector,
)
from troupe.actors.knowledge.sync._domain import domain_members_sql
from troupe.actors.knowledge.sync._schema import (
    sync_covered_sql,
    sync_known_vectors_sql,
    sync_tables_sql,
)

origin = "dev_a"


def _connection() -> apsw.Connection:
    connection = apsw.Connection(":memory:")
    connection.execute("CREATE TABLE knowledge_items (id TEXT, scope TEXT, updated_at REAL);"
                       "CREATE TABLE knowledge_forgotten (id TEXT, kind TEXT, scope TEXT, forgotten_at REAL);")
    for sql in (sync_tables_sql, sync_known_vectors_sql, domain_members_sql, sync_covered_sql):
        connection.execute(sql)
    return connection


def _history(connection: apsw.Connection, items: int, edits: int) -> int:
    """``edits`` upserts in a row of each of ``items`` items, each seeing the one before."""
    counter = 0
    for item in range(items):
        for edit in range(edits):
            counter += 1
            clock = {origin: counter}
            operation = Operation(origin, counter, f"knw_{item}", "shared:home", edit + 1, kind_upsert, clock,
                                  {"title": "t", "body": {"edit": edit}}, 1.0)
            store_operation(connection, operation, 1.0)
    return counter


def test_only_covered_upserts_every_peer_holds_leave_the_log():
    connection = _connection()
    held = _history(connection, 3, 3)
    before = [item_sync_state(connection, f"knw_{item}").operation_digest for item in range(3)]
    assert compact(connection, [{origin: held}, {origin: held - 2}]) == 5  # one peer lacks the last item's 2nd edit
    assert compact(connection, [{origin: held}, {origin: held}]) == 1
    assert covered_total(connection) == 6
    assert compact(connection, [{origin: held}]) == 0
    assert [item_sync_state(connection, f"knw_{item}").operation_digest for item in range(3)] == before
    assert version_vector(connection) == {origin: held}
    documents, _ = operations_missing_documents(connection, {}, operations_max=100, bytes_max=10**6)
    assert [b'"covered":true' in document for document in documents] == [True, True, False] * 3


def test_a_job_examines_at_most_items_max_items_and_tombstones_stay():
    connection = _connection()
    held = _history(connection, 3, 2)
    assert compact(connection, [], items_max=2) == 2
    assert compact(connection, [], items_max=2) == 1  # the cursor went on to the third item
    tombstone = Operation(origin, held + 1, "knw_0", "shared:home", 9, kind_tombstone, {origin: held + 1}, None, 2.0)
    store_operation(connection, tombstone, 2.0)
    assert compact(connection, [], items_max=3) == 1  # the upsert the tombstone covers
    kinds = [row[0] for row in connection.execute(
        "SELECT json_extract(document, '$.kind') FROM sync_ops WHERE knowledge_id = 'knw_0'")]
    assert kinds == ["tombstone"]
