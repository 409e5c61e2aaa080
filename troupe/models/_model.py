"""The Model port: text generation for learning, extraction, judgment and agent turns.

A narrow ``Protocol`` so that the embedded ``LocalModel``, the OpenAI-compatible provider and
the simulator's scripted fakes are interchangeable behind ``Env.model``.  It trades provider
features (logprobs, n > 1) for a surface every backend can honour: one request in, one
completion (or a stream of chunks) out.  Seeing images is an optional capability on top
(``ImageDescriber`` in ``_images.py``), because most backends cannot.

``CpuBoundModel`` is the other optional side: a model whose answer is pure computation in this
process (the ``LocalModel``) also offers ``complete_sync``, so a caller that completes often
(learning) can run it through the Env executor (a worker thread in production, inline in the
simulator) instead of spending event-loop time on it.  A remote model's time is I/O and has no
such method.
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


@runtime_checkable
class CpuBoundModel(Protocol):
    """A model whose completion is CPU work in this process, with no I/O.

    ``complete_sync(request)`` must equal what ``complete(request)`` returns, be a pure
    function of the request, and be safe to call from any thread (no shared mutable state):
    callers may run it in a worker thread.
    """

    def complete_sync(self, request: CompletionRequest) -> Completion: ...
