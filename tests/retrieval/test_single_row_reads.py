"""The recall read's few-statement forms give what the row-by-row forms gave.

A recall's storage read runs in a worker thread, and every SQLite statement and every row step
there leaves the interpreter lock and must win it back: under a busy event loop each costs a
wait.  So the ranked text lists come back as one ``group_concat`` row, the hits are fetched
in one ``IN (...)`` statement, and the graph's allowed-key test is a bitmap difference.  Each
test checks one of them against the plain form it replaced, never against a clock.
"""

import numpy
from pyroaring import BitMap

from troupe.retrieval import _store
from troupe.retrieval._vector_index import VectorIndex, _allowed_matches

words = ["alpha", "beta", "gamma", "delta", "epsilon"]


def fill(connection, count: int) -> list[int]:
    rows = [
        _store.ItemRow(
            f"k{number}", "t", "", "", "", frozenset(),
            " ".join(words[(number * step) % len(words)] for step in range(1, 1 + number % 4)) or "alpha",
            "", "", float(number), None, None,
        )
        for number in range(count)
    ]
    return _store.insert_items(connection, rows)


def test_fetch_items_reads_every_asked_row_at_and_over_the_statement_size(connection):
    ids = fill(connection, _store.fetch_items_per_statement_max + 20)
    for asked in (
        ids[: _store.fetch_items_per_statement_max],
        ids[: _store.fetch_items_per_statement_max + 1],
        [ids[3], ids[3], 10**6, ids[0]],  # a duplicate and a missing id
        [],
    ):
        found = _store.fetch_items(connection, asked)
        expected = {}
        for item_id in asked:
            for (key,) in connection.execute("SELECT key FROM retrieval_items WHERE id = ?", (item_id,)):
                expected[item_id] = key
        assert {item_id: row.key for item_id, row in found.items()} == expected
        assert all(found[item_id].id == item_id for item_id in found)


def test_ranked_ids_in_one_row_keep_the_bm25_order_and_its_ties(connection):
    ids = fill(connection, 300)
    weights = (1.0, 0.15, 0.5)
    for expression in ('"alpha"', '"beta" OR "gamma"', '"nothing"'):
        plain = [
            item_id
            for (item_id,) in connection.execute(
                "SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH ?"
                " ORDER BY bm25(retrieval_text, ?, ?, ?, 0.0), rowid LIMIT ?",
                (expression, *weights, 1000),
            )
        ]
        for depth in (1, 50, 1000):
            found = _store.text_search(
                connection, expression, allowed=BitMap(ids), depth=depth, column_weights=weights
            )
            assert found == plain[:depth]
        newest = _store.newest_matches(
            connection, expression, allowed=BitMap(ids), depth=40, facet_expression=None, candidates=len(ids)
        )
        assert newest == sorted(plain, reverse=True)[:40]


def test_allowed_matches_keep_the_graph_order():
    keys = numpy.array([9, 4, 7, 1, 12], dtype=numpy.uint64)
    distances = numpy.array([0.1, 0.2, 0.25, 0.3, 0.5], dtype=numpy.float32)
    for allowed in (BitMap(range(20)), BitMap([4, 1, 12]), BitMap(), BitMap([100])):
        expected = [
            (int(key), float(distance)) for key, distance in zip(keys, distances, strict=True) if int(key) in allowed
        ]
        found = _allowed_matches(keys, distances, allowed)
        assert found == expected
        assert all(type(key) is int and type(distance) is float for key, distance in found)
    assert _allowed_matches(keys[:0], distances[:0], BitMap([1])) == []


def test_filtered_graph_search_returns_only_allowed_ids_nearest_first():
    generator = numpy.random.default_rng(5)
    vectors = VectorIndex(16, "test")
    matrix = generator.normal(size=(6000, 16)).astype(numpy.float32)
    matrix /= numpy.linalg.norm(matrix, axis=1, keepdims=True)
    vectors.upsert(numpy.arange(1, 6001), matrix)
    query = generator.normal(size=16)
    everything = vectors.search(query, 30, allowed=BitMap(range(1, 6001)))
    assert everything == vectors.search(query, 30, allowed=None)
    most = BitMap(range(1, 6001)) - BitMap(range(1, 6001, 10))  # 90%: the graph, filtered
    found = vectors.search(query, 30, allowed=most)
    assert len(found) == 30 and all(item_id in most for item_id, _ in found)
    assert [distance for _, distance in found] == sorted(distance for _, distance in found)
