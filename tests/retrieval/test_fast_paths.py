"""The fast paths of recall agree with the slow definitions they replace.

Time windows are filtered in memory (not by a SQL range scan), exact vector search runs on
usearch's brute force over the f16 mirror, inserts are batched and the tokenizer memoises: each
test checks one of them against a brute-force reference, never against a clock.
"""

import datetime
import random

import apsw
import apsw.fts5
import numpy
import pytest
from pyroaring import BitMap

from troupe.retrieval import DuplicateItem, MemoryIndex, MemoryItem, RecallFilter, _store
from troupe.retrieval._filters import FacetBitmaps
from troupe.retrieval._time_window import seconds_from_datetime
from troupe.retrieval._tokenizer import _mixed_tokenizer, document_tokens
from troupe.retrieval._vector_index import VectorIndex

base = datetime.datetime(2026, 1, 1)


def random_items(count: int, seed: int) -> list[MemoryItem]:
    generator = random.Random(seed)
    items = []
    for number in range(count):
        created = base + datetime.timedelta(hours=generator.randrange(24 * 90))
        event_start = event_end = None
        if generator.random() < 0.3:
            event_start = created - datetime.timedelta(days=generator.randrange(30))
            event_end = event_start + datetime.timedelta(hours=generator.randrange(200))
        items.append(
            MemoryItem(
                key=f"k{number}",
                text=f"note {number} about topic{number % 7}",
                tenant=f"t{number % 2}",
                scope=f"s{number % 3}",
                created_at=created,
                event_start=event_start,
                event_end=event_end,
            )
        )
    return items


def interval(entry: MemoryItem) -> tuple[float, float]:
    start = seconds_from_datetime(entry.event_start or entry.created_at)
    end = seconds_from_datetime(entry.event_end) if entry.event_end is not None else start
    return start, max(start, end)


async def test_time_windows_match_a_brute_force_overlap_and_distance(engine):
    items = random_items(300, 3)
    index = await MemoryIndex.open(engine)
    ids = await index.add(items)
    by_id = dict(zip(ids, items, strict=True))
    windows = [("2026-02", None), ("2026-01-10/2026-01-20", None), ("2026-03-05T14", None)]
    for time, _ in windows:
        result = await index.recall("topic3", time=time, recall_filter=RecallFilter("t1"))
        window = result.time_window
        assert window is not None
        for hit in result.hits:
            entry = next(e for e in by_id.values() if e.key == hit.key)
            start, end = interval(entry)
            assert (
                entry.tenant == "t1" and start < window.end_seconds and end >= window.start_seconds
            )
        # Time only: overlapping first, then nearest edge, ties to the later item.
        result = await index.recall(time=time, recall_filter=RecallFilter("t0"), limit=25)
        expected = sorted(
            (
                (
                    max(
                        0.0,
                        interval(e)[0] - window.end_seconds,
                        window.start_seconds - interval(e)[1],
                    ),
                    -interval(e)[0],
                    -item_id,
                    e.key,
                )
                for item_id, e in by_id.items()
                if e.tenant == "t0"
            )
        )[:25]
        assert [hit.key for hit in result.hits] == [row[3] for row in expected]


async def test_reopened_index_loads_times_and_facets(engine):
    items = random_items(50, 5)
    first = await MemoryIndex.open(engine)
    await first.add(items)
    reopened = await MemoryIndex.open(engine)
    for recall_index in (first, reopened):
        result = await recall_index.recall(time="2026-02", recall_filter=RecallFilter("t0"))
        assert result.hits
    a = await first.recall(time="2026-02", recall_filter=RecallFilter("t0"), limit=50)
    b = await reopened.recall(time="2026-02", recall_filter=RecallFilter("t0"), limit=50)
    assert [hit.key for hit in a.hits] == [hit.key for hit in b.hits]


def test_in_window_ignores_ids_without_times():
    bitmaps = FacetBitmaps()
    bitmaps.set_times(numpy.array([2, 5]), numpy.array([10.0, 20.0]), numpy.array([15.0, 20.0]))
    assert bitmaps.in_window(BitMap([1, 2, 5, 5000]), 12.0, 30.0) == BitMap([2, 5])
    assert bitmaps.nearest_in_time(BitMap([1, 2, 5, 5000]), 30.0, 40.0, 10) == [
        (5, 10.0),
        (2, 15.0),
    ]


def test_batched_insert_names_the_duplicate_and_writes_nothing(connection):
    def row(key: str) -> _store.ItemRow:
        return _store.ItemRow(key, "t", "", "", "", frozenset(), key, "", "", 1.0, None, None)

    assert _store.insert_items(connection, [row("a"), row("b")]) == [1, 2]
    for batch, duplicate in (([row("c"), row("a")], "a"), ([row("d"), row("d")], "d")):
        connection.execute("SAVEPOINT job")
        with pytest.raises(DuplicateItem) as raised:
            _store.insert_items(connection, batch)
        connection.execute("ROLLBACK TO job; RELEASE job")
        assert raised.value.args[0] == duplicate
    assert [key for (key,) in connection.execute("SELECT key FROM retrieval_items")] == ["a", "b"]


def test_memoised_tokenizer_gives_the_string_tokenizers_byte_offsets():
    @apsw.fts5.StringTokenizer
    def reference(connection, args):
        def tokenize(text, reason, locale):
            yield from document_tokens(text, query=bool(reason & apsw.FTS5_TOKENIZE_QUERY))

        return tokenize

    slow, fast = reference(None, []), _mixed_tokenizer(None, [])
    texts = [
        "Caroline's café: naïve ﬁne ÉCOLE",
        "我最喜欢吃寿司，昨晚一起看星星 and ramen",
        "Ｈｅｌｌｏ ｶﾀｶﾅ ㍿ 星",
        "Monday 8 May 2023 afternoon 2023年5月8日 星期一 下午",
        "",
        "x" * 500 + " 星星" * 100,
    ]
    for text in texts:
        for reason in (apsw.FTS5_TOKENIZE_DOCUMENT, apsw.FTS5_TOKENIZE_QUERY):
            for _ in range(2):  # the second call is served from the memo
                assert list(fast(text.encode(), reason, None)) == list(
                    slow(text.encode(), reason, None)
                )


def test_exact_search_on_the_mirror_matches_brute_force():
    generator = numpy.random.default_rng(11)
    vectors = VectorIndex(32, "test")
    matrix = generator.normal(size=(3000, 32)).astype(numpy.float32)
    matrix /= numpy.linalg.norm(matrix, axis=1, keepdims=True)
    vectors.upsert(numpy.arange(1, 3001), matrix)
    allowed = BitMap(range(1, 3001, 2))  # half: cheaper exact than a large graph fetch
    query = generator.normal(size=32)
    found = vectors.search(query, 20, allowed=allowed)
    mirror = matrix.astype(numpy.float16).astype(numpy.float32)
    similarity = mirror @ (query / numpy.linalg.norm(query))
    ranked = sorted(allowed, key=lambda item_id: -similarity[item_id - 1])[:20]
    assert [item_id for item_id, _ in found][:10] == ranked[:10]
    assert {item_id for item_id, _ in found} <= set(allowed)
