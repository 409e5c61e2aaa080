"""OpenAIEmbedder against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import numpy
import pytest

from tests.models.openai_compatible_server import open_openai_compatible_server
from troupe.models import (
    Backoff,
    ModelConfigurationError,
    ModelResponseInvalid,
    OpenAIEmbedder,
    ProviderError,
)
from troupe.models._embedder import Embedder

fast_backoff = Backoff(initial_seconds=0.01, delay_seconds_max=0.05)


@pytest.fixture
async def server():
    async with open_openai_compatible_server(embedding_dimensions=8) as running:
        yield running


def embedder(server, **options) -> OpenAIEmbedder:
    options.setdefault("backoff", fast_backoff)
    return OpenAIEmbedder(server.base_url, "sk", "test-embedding", 8, **options)


async def test_rows_are_normalised_float32_in_input_order(server):
    port = embedder(server)
    assert isinstance(port, Embedder)
    assert port.ready()
    texts = ["我喜欢寿司", "I like sushi", "明天去公园"]
    rows = await port.embed(texts, purpose="document")
    assert rows.dtype == numpy.float32 and rows.shape == (3, 8)
    numpy.testing.assert_allclose(numpy.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    # The server answers in reverse order; rows must follow the inputs, not the answer.
    single = await port.embed(["I like sushi"], purpose="document")
    numpy.testing.assert_allclose(rows[1], single[0], rtol=1e-6)
    assert server.requests[0].body == {
        "model": "test-embedding",
        "input": texts,
        "encoding_format": "float",
    }


async def test_batches_prefixes_and_dimensions(server):
    port = embedder(
        server,
        batch_texts_max=2,
        query_prefix="query: ",
        document_prefix="passage: ",
        send_dimensions=True,
    )
    rows = await port.embed(["a", "b", "c", "d", "e"], purpose="query")
    assert rows.shape == (5, 8)
    assert [request.body["input"] for request in server.requests] == [
        ["query: a", "query: b"],
        ["query: c", "query: d"],
        ["query: e"],
    ]
    assert server.requests[0].body["dimensions"] == 8
    await port.embed(["x"], purpose="document")
    assert server.requests[-1].body["input"] == ["passage: x"]


async def test_empty_input_makes_no_request(server):
    rows = await embedder(server).embed([], purpose="query")
    assert rows.shape == (0, 8)
    assert server.requests == []


async def test_width_mismatch_is_invalid(server):
    server.embedding_dimensions = 4
    with pytest.raises(ModelResponseInvalid):
        await embedder(server).embed(["a"], purpose="query")


async def test_transient_failures_are_retried(server):
    server.fail_next(2, status=500)
    rows = await embedder(server, retries_max=2).embed(["a"], purpose="query")
    assert rows.shape == (1, 8)
    assert len(server.requests) == 3
    server.fail_next(1, status=400)
    with pytest.raises(ProviderError):
        await embedder(server, retries_max=2).embed(["a"], purpose="query")


def test_fingerprint_and_configuration():
    port = OpenAIEmbedder("http://127.0.0.1:9/v1", None, "bge-m3", 1024)
    assert port.fingerprint == "openai:bge-m3:1024"
    assert port.name == "openai" and port.dimensions == 1024
    with pytest.raises(ModelConfigurationError):
        OpenAIEmbedder("http://127.0.0.1:9/v1", None, "", 8)
    with pytest.raises(ModelConfigurationError):
        OpenAIEmbedder("http://127.0.0.1:9/v1", None, "m", 0)
    with pytest.raises(ModelConfigurationError):
        OpenAIEmbedder("", None, "m", 8)


async def test_budget_spans_all_batches(server):
    from troupe.models import CallBudget, ModelBudgetExceeded

    port = embedder(
        server,
        batch_texts_max=1,
        request_timeout_seconds=5.0,
        retries_max=0,
        budget=CallBudget(total_seconds_max=1.0),
    )
    # Wide margins: a loaded machine must not turn the first slow answer into a timeout.
    server.hang_next(1, seconds=0.6)
    server.hang_next(1, seconds=0.6)
    with pytest.raises(ModelBudgetExceeded):
        await port.embed(["a", "b", "c"], purpose="document")
    assert len(server.requests) == 2
