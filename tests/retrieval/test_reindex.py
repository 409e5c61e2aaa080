"""An index built by an older tokenizer is re-indexed by itself at open."""

import datetime

import apsw
import apsw.fts5

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter, _reindex
from troupe.retrieval._tokenizer import tokenizer_name, tokenizer_version

from .conftest import open_test_engine

moment = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)


def _version_one_tokenizer(connection, args):
    """What version 1 indexed: CJK bigrams plus each run's last character."""

    @apsw.fts5.StringTokenizer
    def factory(connection, args):
        def tokenize(text, reason, locale):
            import re

            for match in re.finditer(r"[\u4e00-\u9fff]+|\w+", text):
                start, end = match.span()
                token = match.group()
                if re.match(r"[\u4e00-\u9fff]", token):
                    for index in range(len(token) - 1):
                        yield start + index, start + index + 2, token[index : index + 2]
                    if len(token) == 1 or not reason & apsw.FTS5_TOKENIZE_QUERY:
                        yield end - 1, end, token[-1]
                else:
                    yield start, end, token.lower()

        return tokenize

    return factory(connection, args)


async def _build_with_version_one(data_dir) -> None:
    engine = await open_test_engine(data_dir)
    try:
        index = await MemoryIndex.open(engine)
        await index.add(
            [
                MemoryItem("cat", "用户养的橘猫叫小橘", "t", moment),
                MemoryItem("gone", "我的猫咪走丢了", "t", moment),
                MemoryItem("name", "用户的名字叫小明", "t", moment),
            ]
        )
        await index.delete(["gone"])
    finally:
        await engine.aclose()
    # Rewrite the text rows the way version 1 did, and forget the version, on a connection
    # whose tokenizer is version 1's (a tokenizer is per connection).
    (path,) = [
        found for found in data_dir.rglob("*")
        if found.is_file() and not found.name.endswith(("-wal", "-shm", "-journal"))
        and found.read_bytes()[:15] == b"SQLite format 3"
    ]
    connection = apsw.Connection(str(path))
    connection.register_fts5_tokenizer(tokenizer_name, _version_one_tokenizer)
    with connection:
        for (item_id,) in connection.execute(
            "SELECT id FROM retrieval_items WHERE deleted = 0"
        ).fetchall():
            connection.execute("DELETE FROM retrieval_text WHERE rowid = ?", (item_id,))
        connection.execute("DELETE FROM retrieval_meta")
        _reindex.reindex_batch(connection, 0, 100)
    connection.close()


async def test_old_index_is_reindexed_on_open_and_then_finds_one_character_words(tmp_path):
    data_dir = tmp_path / "data"
    await _build_with_version_one(data_dir)
    engine = await open_test_engine(data_dir)
    try:
        # Before the re-index (recorded version missing), the version-1 rows miss 猫.
        def version_one_hits(connection):
            return connection.execute(
                "SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH '\"猫\"'"
            ).fetchall()

        assert await engine.read(version_one_hits) == []
        assert await engine.read(_reindex.stored_tokenizer_version) is None
        index = await MemoryIndex.open(engine)
        assert await engine.read(_reindex.stored_tokenizer_version) == tokenizer_version
        result = await index.recall("用户的猫叫什么名字", recall_filter=RecallFilter("t"))
        assert "cat" in {hit.key for hit in result.hits}
        assert "gone" not in {hit.key for hit in result.hits}
        assert await _reindex.reindex_if_stale(engine) == 0  # current: nothing to do
    finally:
        await engine.aclose()


async def test_reindex_runs_in_bounded_batches_and_counts_live_items(engine, monkeypatch):
    index = await MemoryIndex.open(engine)
    await index.add([MemoryItem(f"k{n}", f"第{n}只猫", "t", moment) for n in range(7)])
    await index.delete(["k3"])
    batches = []
    original = _reindex.reindex_batch

    def counting(connection, after_id, limit):
        found = original(connection, after_id, limit)
        batches.append(found[1])
        return found

    monkeypatch.setattr(_reindex, "reindex_batch_items", 2)
    monkeypatch.setattr(_reindex, "reindex_batch", counting)
    await engine.write(lambda connection: _reindex.record_tokenizer_version(connection, 1))
    assert await _reindex.reindex_if_stale(engine) == 6
    assert batches == [2, 2, 2, 0]
    reopened = await MemoryIndex.open(engine)
    result = await reopened.recall("猫", recall_filter=RecallFilter("t"), limit=10)
    assert len(result.hits) == 6


async def test_reindex_leaves_the_text_index_merged(engine):
    """A rewritten index is optimized: one segment, as a fresh build would leave it after
    FTS5's merges, not the old segments' delete markers beside the new rows."""
    index = await MemoryIndex.open(engine)
    for batch in range(4):  # one segment per write transaction
        await index.add([MemoryItem(f"k{batch}-{n}", f"第{n}只猫", "t", moment) for n in range(5)])

    def segments(connection):
        # FTS5 data rowids are (segment id << 37) | (height << 31) | page: one first leaf page
        # (height 0, page 1) per segment.
        return connection.execute(
            "SELECT count(*) FROM retrieval_text_data WHERE id > 10 AND (id >> 37) > 0"
            " AND ((id >> 31) & 63) = 0 AND (id & 2147483647) = 1"
        ).fetchone()[0]

    assert await engine.read(segments) > 1
    await engine.write(lambda connection: _reindex.record_tokenizer_version(connection, 1))
    assert await _reindex.reindex_if_stale(engine) == 20
    assert await engine.read(segments) == 1
    result = await (await MemoryIndex.open(engine)).recall("猫", recall_filter=RecallFilter("t"), limit=30)
    assert len(result.hits) == 20
