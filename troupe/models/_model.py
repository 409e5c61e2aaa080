"""The Model port: text generation for learning, extraction, judgment and agent turns.

A narrow ``Protocol`` so that the embedded ``LocalModel``, the OpenAI-compatible provider and
the simulator's scripted fakes are interchangeable behind ``Env.model``.  It trades provider
features (logprobs, n > 1) for a surface every backend can honour: one request in, one
completion (or a stream of chunks) out.  Seeing images is an optional capability on top
(``ImageDescriber`` in ``_images.py``), because most backends cannot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from ._messages import Completion, CompletionChunk, CompletionRequest


@runtime_checkable
class Model(Protocol):
    """Generates text (and tool calls) for a conversation.

    ``stream()`` yields text pieces as they arrive and ends with a chunk carrying
    ``finish_reason``; consume it inside ``contextlib.aclosing`` so an abandoned stream releases
    its connection at once.
    """

    name: str

    async def complete(self, request: CompletionRequest) -> Completion: ...

    def stream(self, request: CompletionRequest) -> AsyncIterator[CompletionChunk]: ...
