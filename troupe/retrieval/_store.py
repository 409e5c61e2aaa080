"""The SQL half of recall: plain synchronous functions over one ``apsw.Connection``.

Why it exists: SQLite is the source of truth for every memory — its text, facets, times,
tombstones and vectors — and everything in memory (bitmaps, the usearch graph) is a cache
rebuilt from these tables.  Keeping the SQL in sync functions over a connection lets the
storage engine run them inside its transactions (``engine.write(fn)`` / ``engine.read(fn)``)
and lets tests run them on a bare connection.

Trade-offs: the FTS5 table is contentless (``content=''``, ``contentless_delete=1``): the text
lives once, in ``retrieval_items``, and the index cannot return it, so hits are joined back by
id.  Deleting an item blanks its text and context and removes its index rows and vector, but
keeps a tombstone row so that its id is never reused and a stale vector file cannot bring it
back.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import apsw
import numpy
from pyroaring import BitMap

from ._exceptions import DuplicateItem
from ._tokenizer import fts5_tokenize_spec

# bm25() column weights for (text, context, when): the message itself counts most; the
# conversation around it and its date in words help find it but must not outrank it.
text_column_weights_default = (1.0, 0.5, 0.5)
text_search_rows_max = 200_000
text_single_scan_candidates_max = 50_000
# A bounded search (``text_search``'s ``scored_rows``) reads at most this many times
# ``scored_rows`` of the newest matches before ranking, however selective its bitmap: a
# narrow time window then ranks fewer allowed matches rather than every match there is.
text_scored_window_growth_max = 4
# Ids per ``fetch_items`` statement (SQLite allows 32766 bound parameters; recall fetches at
# most ``recall_limit_max``).
fetch_items_per_statement_max = 500

schema_sql = f"""
CREATE TABLE retrieval_items(
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    scope TEXT NOT NULL,
    kind TEXT NOT NULL,
    speaker TEXT NOT NULL,
    visibility TEXT NOT NULL,
    text TEXT NOT NULL,
    context TEXT NOT NULL,
    created_at REAL NOT NULL,
    event_start REAL,
    event_end REAL,
    time_start REAL NOT NULL,
    time_end REAL NOT NULL,
    forgotten INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX retrieval_items_tenant_time ON retrieval_items(tenant, time_start);
CREATE VIRTUAL TABLE retrieval_text USING fts5(
    text, context, time_words, facets,
    content='', contentless_delete=1,
    tokenize='{fts5_tokenize_spec}'
);
CREATE TABLE retrieval_vectors(
    item_id INTEGER PRIMARY KEY REFERENCES retrieval_items(id),
    fingerprint TEXT NOT NULL,
    sequence INTEGER NOT NULL UNIQUE,
    vector BLOB NOT NULL
) STRICT;
"""

# Visibility is stored as the entry names joined by this separator ('' = every entry).
visibility_separator = "\x1f"


@dataclass(frozen=True)
class ItemRow:
    """One ``retrieval_items`` row, as the facade writes and reads it."""

    key: str
    tenant: str
    scope: str
    kind: str
    speaker: str
    visibility: frozenset[str]
    text: str
    context: str
    time_words: str
    created_at: float
    event_start: float | None
    event_end: float | None
    id: int | None = None
    forgotten: bool = False
    deleted: bool = False

    @property
    def time_start(self) -> float:
        return self.event_start if self.event_start is not None else self.created_at

    @property
    def time_end(self) -> float:
        if self.event_end is not None:
            return max(self.event_end, self.time_start)
        return self.time_start


def facet_token(facet: int, value: str) -> str:
    """A digits-only token naming one facet value inside the ``facets`` column.

    Digits only, so that neither the tokenizer nor porter can alter it; a hash, so that any
    tenant or scope string fits.  A collision could only widen the text pre-filter: the
    bitmaps are applied afterwards and stay the authority.
    """
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=7).digest()
    return f"{facet}{int.from_bytes(digest, 'big'):017d}"


def tenant_token(tenant: str) -> str:
    return facet_token(1, tenant)


def scope_token(tenant: str, scope: str) -> str:
    return facet_token(2, tenant + visibility_separator + scope)


def kind_token(tenant: str, kind: str) -> str:
    return facet_token(3, tenant + visibility_separator + kind)


def row_facet_tokens(row: ItemRow) -> str:
    return " ".join(
        (
            tenant_token(row.tenant),
            scope_token(row.tenant, row.scope),
            kind_token(row.tenant, row.kind),
        )
    )


def facet_match_expression(
    tenant: str, scopes: Iterable[str] | None, kinds: Iterable[str] | None
) -> str:
    """The FTS5 expression that admits a tenant (and any of the scopes, any of the kinds).

    Scope and kind tokens already name their tenant, so the tenant's own token (whose
    posting list is the longest: every item of the tenant) is only used when neither is
    given; FTS5 then intersects the query with a few short posting lists.
    """
    parts = []
    if scopes is None and kinds is None:
        parts.append(f'"{tenant_token(tenant)}"')
    if scopes is not None:
        parts.append("(" + " OR ".join(f'"{scope_token(tenant, s)}"' for s in sorted(scopes)) + ")")
    if kinds is not None:
        parts.append("(" + " OR ".join(f'"{kind_token(tenant, k)}"' for k in sorted(kinds)) + ")")
    return "{facets} : (" + " AND ".join(parts) + ")"


def insert_items(connection: apsw.Connection, rows: Sequence[ItemRow]) -> list[int]:
    """Inserts items and their text index rows; returns the new ids in order.

    Two ``executemany`` calls (one per table) instead of two statements per row: a bulk
    build spends its time in the tokenizer, not in statement dispatch.  On a duplicate key
    the caller's savepoint rolls the whole batch back.
    """
    if not rows:
        return []
    ids: list[int] = []
    try:
        # RETURNING yields each id as its row is written, so on a constraint error the
        # failing row is the one after the last id received.
        for (item_id,) in connection.executemany(
            "INSERT INTO retrieval_items(key, tenant, scope, kind, speaker, visibility, text,"
            " context, created_at, event_start, event_end, time_start, time_end)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) RETURNING id",
            [
                (
                    row.key,
                    row.tenant,
                    row.scope,
                    row.kind,
                    row.speaker,
                    visibility_separator.join(sorted(row.visibility)),
                    row.text,
                    row.context,
                    row.created_at,
                    row.event_start,
                    row.event_end,
                    row.time_start,
                    row.time_end,
                )
                for row in rows
            ],
        ):
            ids.append(item_id)
    except apsw.ConstraintError as exc:
        raise DuplicateItem(rows[min(len(ids), len(rows) - 1)].key) from exc
    assert len(ids) == len(rows)
    connection.executemany(
        "INSERT INTO retrieval_text(rowid, text, context, time_words, facets) VALUES (?,?,?,?,?)",
        [
            (item_id, row.text, row.context, row.time_words, row_facet_tokens(row))
            for item_id, row in zip(ids, rows, strict=True)
        ],
    )
    return ids


def ids_for_keys(connection: apsw.Connection, keys: Iterable[str]) -> dict[str, int]:
    found = {}
    for key in keys:
        for (item_id,) in connection.execute(
            "SELECT id FROM retrieval_items WHERE key = ? AND deleted = 0", (key,)
        ):
            found[key] = item_id
    return found


def delete_items(connection: apsw.Connection, keys: Iterable[str]) -> list[int]:
    """Tombstones items: text blanked, index rows and vectors removed, id never reused."""
    ids = list(ids_for_keys(connection, keys).values())
    for item_id in ids:
        connection.execute("DELETE FROM retrieval_text WHERE rowid = ?", (item_id,))
        connection.execute("DELETE FROM retrieval_vectors WHERE item_id = ?", (item_id,))
        connection.execute(
            "UPDATE retrieval_items SET deleted = 1, text = '', context = '' WHERE id = ?",
            (item_id,),
        )
    return ids


def set_forgotten(connection: apsw.Connection, keys: Iterable[str], forgotten: bool) -> list[int]:
    ids = list(ids_for_keys(connection, keys).values())
    for item_id in ids:
        connection.execute(
            "UPDATE retrieval_items SET forgotten = ? WHERE id = ?", (int(forgotten), item_id)
        )
    return ids


def facet_rows(
    connection: apsw.Connection,
) -> Iterator[tuple[int, str, str, str, str, str, int, int, float, float, int]]:
    """``(id, tenant, scope, kind, speaker, visibility, forgotten, deleted, time_start,
    time_end, has_context)`` of every item."""
    yield from connection.execute(
        "SELECT id, tenant, scope, kind, speaker, visibility, forgotten, deleted, time_start,"
        " time_end, context != '' FROM retrieval_items"
    )


def _rowid_range(lowest: int | None, highest: int | None) -> tuple[str, tuple[int, ...]]:
    """The SQL (and its arguments) that bounds a MATCH query's rowids; FTS5 seeks its
    posting lists to the bounds, so rows outside are never read, let alone scored."""
    clause = ""
    arguments: tuple[int, ...] = ()
    if lowest is not None:
        clause, arguments = " AND rowid >= ?", (lowest,)
    if highest is not None:
        clause, arguments = clause + " AND rowid <= ?", (*arguments, highest)
    return clause, arguments


def _allowed_span(allowed: BitMap | None) -> tuple[int | None, int | None]:
    """The lowest and highest allowed id: no match outside can be a hit (exact, and free)."""
    if allowed is None or len(allowed) == 0:
        return None, None
    return allowed.min(), allowed.max()


def newest_match_bound(
    connection: apsw.Connection, match_expression: str, rows: int, highest: int | None = None
) -> int | None:
    """The id of the ``rows``-th newest (highest id) match at or below ``highest``, or
    ``None`` when fewer match.

    Read in rowid order without scoring: FTS5 merges the posting lists in C and stops there,
    a small fraction of what ranking every match with ``bm25()`` costs."""
    assert rows > 0
    clause, arguments = _rowid_range(None, highest)
    found = connection.execute(
        f"SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH ?{clause}"
        " ORDER BY rowid DESC LIMIT 1 OFFSET ?",
        (match_expression, *arguments, rows - 1),
    ).fetchone()
    return None if found is None else int(found[0])


def _over_fetch_rows(allowed: BitMap | None, depth: int, candidates: int) -> tuple[int, float]:
    """``(rows to read for depth allowed hits, the bitmap's selectivity among candidates)``."""
    if allowed is None:
        return depth, 1.0
    selectivity = max(len(allowed) / max(candidates, len(allowed), 1), 1e-6)
    return min(text_search_rows_max, int(depth / selectivity * 1.5) + depth), selectivity


def _scored_window(scored_rows: int | None, selectivity: float) -> int | None:
    """How many of the newest matches a bounded search ranks first (``None``: all): enough
    to hold about ``scored_rows`` allowed ones, but no more than
    ``text_scored_window_growth_max`` times that (see ``text_search``)."""
    if scored_rows is None:
        return None
    window = min(int(scored_rows / selectivity), scored_rows * text_scored_window_growth_max)
    return min(text_search_rows_max, window)


def _bounded_low(span_low: int | None, window_low: int | None) -> int | None:
    if span_low is None:
        return window_low
    return span_low if window_low is None else max(span_low, window_low)


def _ranked_ids(row: tuple | None) -> list[int]:
    """The ids of a ``group_concat`` row (``None`` or ``(None,)`` when nothing matched)."""
    if row is None or row[0] is None:
        return []
    return [int(item_id) for item_id in row[0].split(",")]


def text_search(
    connection: apsw.Connection,
    match_expression: str,
    *,
    allowed: BitMap | None,
    depth: int,
    column_weights: tuple[float, float, float] = text_column_weights_default,
    facet_expression: str | None = None,
    candidates: int = 0,
    scored_rows: int | None = None,
) -> list[int]:
    """Ids of the best ``depth`` bm25 matches that are in ``allowed`` (all when ``None``).

    ``facet_expression`` (see ``facet_match_expression``) lets FTS5 intersect the query with
    the tenant/scope/kind postings in C; ``candidates`` is how many items it admits.  What it
    cannot express (visibility, tombstones, time) is filtered here by the bitmap, so this
    over-fetches: the first fetch is sized by how selective the bitmap is among the
    candidates, and grows eightfold until ``depth`` allowed hits are found or matches run out.
    Matches outside the allowed ids' span are never read (a rowid range: exact).

    ``scored_rows`` (``None``: every match is ranked) bounds the search to the newest matches:
    enough of them to hold about that many allowed ones (at most
    ``text_scored_window_growth_max`` times that many matches), found in rowid order and then
    ranked by ``bm25()`` — whose document frequencies still count the whole table, so each
    ranked match scores exactly as in an unbounded search.  The window grows eightfold while
    it yields fewer than ``depth`` allowed hits.
    """
    assert depth > 0
    if allowed is not None and len(allowed) == 0:
        return []
    limit, selectivity = _over_fetch_rows(allowed, depth, candidates)
    window = _scored_window(scored_rows, selectivity)
    span_low, span_high = _allowed_span(allowed)
    if facet_expression is not None:
        match_expression = f"({match_expression}) AND {facet_expression}"
    # The ranked ids come back as ONE row (``_ranked_ids``): a row step per id would leave
    # and retake the interpreter lock once per id.  (An ordered aggregate: SQLite 3.44 or
    # later, which the pinned apsw bundles.)
    sql = (
        "SELECT group_concat(rowid, ',' ORDER BY score, rowid) FROM ("
        "SELECT rowid, bm25(retrieval_text, ?, ?, ?, 0.0) AS score FROM retrieval_text"
        " WHERE retrieval_text MATCH ?{bounds}"
        " ORDER BY score, rowid LIMIT ?)"  # ties: the lower id
    )
    lowest = None if window is None else newest_match_bound(connection, match_expression, window, span_high)
    while True:
        clause, bounds = _rowid_range(_bounded_low(span_low, lowest), span_high)
        rows = _ranked_ids(connection.execute(
            sql.format(bounds=clause), (*column_weights, match_expression, *bounds, limit)
        ).fetchone())
        hits = rows if allowed is None else [item_id for item_id in rows if item_id in allowed]
        if len(hits) >= depth:
            return hits[:depth]
        if len(rows) == limit and limit < text_search_rows_max:
            limit = min(text_search_rows_max, limit * 8)
            continue
        if lowest is None or window is None or window >= text_search_rows_max:
            return hits[:depth]
        window = min(text_search_rows_max, window * 8)
        lowest = newest_match_bound(connection, match_expression, window, span_high)


def text_search_lists(
    connection: apsw.Connection,
    match_expression: str,
    *,
    allowed: BitMap,
    depth: int,
    column_weights: Sequence[tuple[float, float, float]],
    facet_expression: str | None,
    candidates: int,
    scored_rows: int | None = None,
) -> list[list[int]]:
    """One ranked id list per entry of ``column_weights``, like ``text_search`` for each
    (``scored_rows`` too).

    When the facet filter admits few items (``candidates`` at most
    ``text_single_scan_candidates_max``) and there are several weightings, the matches are
    read once, with every weighting's bm25 computed in the same scan, and ranked here: one
    walk of the posting lists instead of one per list.  Otherwise each list is its own
    ``ORDER BY ... LIMIT`` query, which keeps the rows crossing into Python bounded on huge
    candidate sets.  ``facet_expression`` None: no facet pre-filter (it would admit every
    item).
    """
    if candidates > text_single_scan_candidates_max or len(column_weights) == 1:
        return [
            text_search(
                connection,
                match_expression,
                allowed=allowed,
                depth=depth,
                column_weights=weights,
                facet_expression=facet_expression,
                candidates=candidates,
                scored_rows=scored_rows,
            )
            for weights in column_weights
        ]
    if len(allowed) == 0:
        return [[] for _ in column_weights]
    scores = ", ".join(
        f"bm25(retrieval_text, {float(a)}, {float(b)}, {float(c)}, 0.0)"
        for a, b, c in column_weights
    )
    if facet_expression is not None:
        match_expression = f"({match_expression}) AND {facet_expression}"
    _, selectivity = _over_fetch_rows(allowed, depth, candidates)
    window = _scored_window(scored_rows, selectivity)
    span_low, span_high = _allowed_span(allowed)
    lowest = None if window is None else newest_match_bound(connection, match_expression, window, span_high)
    sql = f"SELECT rowid, {scores} FROM retrieval_text WHERE retrieval_text MATCH ?"
    while True:
        clause, bounds = _rowid_range(_bounded_low(span_low, lowest), span_high)
        rows = [
            row for row in connection.execute(sql + clause, (match_expression, *bounds)) if row[0] in allowed
        ]
        if lowest is None or window is None or len(rows) >= depth or window >= text_search_rows_max:
            break
        window = min(text_search_rows_max, window * 8)
        lowest = newest_match_bound(connection, match_expression, window, span_high)
    ranked = []
    for position in range(1, len(column_weights) + 1):
        # bm25() is "lower is better"; ties go to the lower id for determinism.
        best = heapq.nsmallest(depth, rows, key=lambda row: (row[position], row[0]))
        ranked.append([row[0] for row in best])
    return ranked


def newest_matches(
    connection: apsw.Connection,
    match_expression: str,
    *,
    allowed: BitMap,
    depth: int,
    facet_expression: str | None,
    candidates: int,
) -> list[int]:
    """Ids of the ``depth`` newest (highest id) matches in ``allowed``, unscored: for a query
    whose terms bm25 weighs all alike (see ``MemoryIndex``'s common terms).  Over-fetches by
    the bitmap's selectivity like ``text_search``."""
    assert depth > 0
    if len(allowed) == 0:
        return []
    selectivity = len(allowed) / max(candidates, len(allowed), 1)
    limit = min(text_search_rows_max, int(depth / max(selectivity, 1e-6) * 1.5) + depth)
    if facet_expression is not None:
        match_expression = f"({match_expression}) AND {facet_expression}"
    clause, bounds = _rowid_range(*_allowed_span(allowed))
    sql = (
        "SELECT group_concat(rowid, ',' ORDER BY rowid DESC) FROM (SELECT rowid FROM retrieval_text"
        f" WHERE retrieval_text MATCH ?{clause} ORDER BY rowid DESC LIMIT ?)"
    )
    while True:
        rows = _ranked_ids(connection.execute(sql, (match_expression, *bounds, limit)).fetchone())
        hits = [item_id for item_id in rows if item_id in allowed]
        if len(hits) >= depth or len(rows) < limit or limit >= text_search_rows_max:
            return hits[:depth]
        limit = min(text_search_rows_max, limit * 8)


def matching_items(connection: apsw.Connection, match_expression: str, *, cap: int) -> int:
    """How many items match ``match_expression``, counting no further than ``cap`` (the
    caller only needs to know whether a term is common; the count stops early if so)."""
    assert cap > 0
    (count,) = connection.execute(
        "SELECT count(*) FROM (SELECT 1 FROM retrieval_text WHERE retrieval_text MATCH ? LIMIT ?)",
        (match_expression, cap),
    ).fetchone()
    return int(count)


def fetch_items(connection: apsw.Connection, ids: Sequence[int]) -> dict[int, ItemRow]:
    """The rows of ``ids`` (those that exist), by id.  One statement per
    ``fetch_items_per_statement_max`` ids: every statement and every row step leaves the
    interpreter lock and must win it back, which under a busy event loop costs a wait each
    (a recall's ten hits were ten statements and twenty steps)."""
    found: dict[int, ItemRow] = {}
    unique = list(dict.fromkeys(ids))
    for first in range(0, len(unique), fetch_items_per_statement_max):
        batch = unique[first : first + fetch_items_per_statement_max]
        placeholders = ",".join("?" * len(batch))
        for row in connection.execute(
            "SELECT id, key, tenant, scope, kind, visibility, text, context, created_at,"
            " event_start, event_end, forgotten, deleted, speaker FROM retrieval_items"
            f" WHERE id IN ({placeholders})",
            batch,
        ):
            found[row[0]] = ItemRow(
                id=row[0],
                key=row[1],
                tenant=row[2],
                scope=row[3],
                kind=row[4],
                visibility=frozenset(filter(None, row[5].split(visibility_separator))),
                text=row[6],
                context=row[7],
                time_words="",
                created_at=row[8],
                event_start=row[9],
                event_end=row[10],
                forgotten=bool(row[11]),
                deleted=bool(row[12]),
                speaker=row[13],
            )
    return found


def store_vectors(
    connection: apsw.Connection, ids: Sequence[int], vectors: numpy.ndarray, fingerprint: str
) -> int:
    """Stores (or replaces) vectors; returns the sequence number of the last one written.

    Every write takes a fresh, increasing sequence number: the vector file records the
    highest one it holds, and catching up means reading everything above it.
    """
    assert len(ids) == len(vectors)
    (sequence,) = connection.execute(
        "SELECT COALESCE(MAX(sequence), 0) FROM retrieval_vectors"
    ).fetchone()
    live = {
        item_id
        for (item_id,) in connection.execute(
            "SELECT id FROM retrieval_items WHERE deleted = 0 AND id IN"
            " (SELECT value FROM json_each(?))",
            (json.dumps([int(item_id) for item_id in ids]),),
        )
    }
    matrix = numpy.asarray(vectors, dtype=numpy.float32)
    written = []
    for item_id, vector in zip(ids, matrix, strict=True):
        if int(item_id) not in live:
            continue  # deleted while it was being embedded: never store it
        sequence += 1
        written.append((int(item_id), fingerprint, sequence, vector.tobytes()))
    if written:
        connection.executemany(
            "INSERT OR REPLACE INTO retrieval_vectors(item_id, fingerprint, sequence, vector)"
            " VALUES (?,?,?,?)",
            written,
        )
    return sequence


def vectors_after(
    connection: apsw.Connection, fingerprint: str, sequence: int, *, limit: int
) -> Iterator[tuple[int, int, bytes]]:
    """``(item_id, sequence, vector bytes)`` of this fingerprint written after ``sequence``."""
    yield from connection.execute(
        "SELECT item_id, sequence, vector FROM retrieval_vectors"
        " WHERE sequence > ? AND fingerprint = ? ORDER BY sequence LIMIT ?",
        (sequence, fingerprint, limit),
    )


def vector_summary(connection: apsw.Connection, fingerprint: str) -> tuple[int, int]:
    """``(count, highest sequence)`` of the stored vectors of this fingerprint."""
    count, highest = connection.execute(
        "SELECT COUNT(*), COALESCE(MAX(sequence), 0) FROM retrieval_vectors WHERE fingerprint = ?",
        (fingerprint,),
    ).fetchone()
    return count, highest


def items_without_vectors(
    connection: apsw.Connection, fingerprint: str, limit: int
) -> list[tuple[int, str, str, str]]:
    """Live items with no vector of this fingerprint: ``(id, text, context, speaker)``,
    oldest first."""
    return list(
        connection.execute(
            "SELECT i.id, i.text, i.context, i.speaker FROM retrieval_items i"
            " LEFT JOIN retrieval_vectors v ON v.item_id = i.id AND v.fingerprint = ?"
            " WHERE i.deleted = 0 AND v.item_id IS NULL ORDER BY i.id LIMIT ?",
            (fingerprint, limit),
        )
    )
