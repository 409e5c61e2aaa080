"""The Model port over any OpenAI-compatible ``/chat/completions`` endpoint.

Most hosted and self-hosted LLM servers (OpenAI, vLLM, llama.cpp, Ollama, DeepSeek, Qwen's
DashScope compatible mode) speak this wire format, so one provider covers them.  What it trades
off: only the common subset is used (messages, ``tools``/``tool_calls``, ``max_tokens``,
``temperature``, ``response_format: json_object``, SSE streaming with ``include_usage``);
provider-specific extras are not reachable through the port.  Images go through
``describe_image`` (see ``_images.py``): one image as a base64 ``image_url`` data URI, under the
same retries, with a budget the caller passes; ``images=False`` (``TROUPE_MODEL_IMAGES=off``)
drops the capability for providers whose models cannot see.

Reliability is explicit: every attempt has ``request_timeout_seconds``; transient failures
(connection errors, timeouts, 408/409/429/5xx) are retried at most ``retries_max`` times with
jittered exponential backoff that honours ``Retry-After``; each call has a ``CallBudget`` of total
seconds and output tokens.  A stream is retried only until its response headers arrive; after
that a failure is raised, because the caller may already have seen partial output.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ._exceptions import (
    ModelBudgetExceeded,
    ModelConfigurationError,
    ModelResponseInvalid,
    ModelTimeout,
    ProviderError,
)
from ._images import (
    capability_describe_image,
    check_image,
    description_from_wire,
    image_description_tokens_max,
    image_request_body,
    refusal_of,
)
from ._messages import Completion, CompletionChunk, CompletionRequest, ToolCall, Usage
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

environment_base_url = "TROUPE_MODEL_BASE_URL"
environment_api_key = "TROUPE_MODEL_API_KEY"
environment_model_name = "TROUPE_MODEL_NAME"
environment_model_images = "TROUPE_MODEL_IMAGES"
"""``off`` (or ``0``, ``false``, ``no``) when the configured model cannot see images."""
# One SSE line longer than this is a broken server, not a long answer (answers come in deltas).
stream_line_chars_max = 1_048_576
stream_tool_calls_max = 128

_finish_reasons = {"stop", "length", "tool_calls", "content_filter"}


class OpenAIChatModel:
    """``Model`` backed by ``POST {base_url}/chat/completions``; ``base_url`` ends in ``/v1``."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        *,
        client: httpx.AsyncClient | None = None,
        request_timeout_seconds: float = 30.0,
        retries_max: int = 3,
        backoff: Backoff | None = None,
        budget: CallBudget | None = None,
        clock: MonotonicClock | None = None,
        random: JitterSource | None = None,
        images: bool = True,
    ) -> None:
        if not model:
            raise ModelConfigurationError("an OpenAI-compatible chat model needs a model name")
        self.name = model
        self.capabilities = frozenset(
            {"converse", "tool_calls", "json_object", "stream"}
            | ({capability_describe_image} if images else set())
        )
        self.policy = RetryPolicy(
            request_timeout_seconds=request_timeout_seconds,
            retries_max=retries_max,
            backoff=backoff or Backoff(),
            budget=budget or CallBudget(),
        )
        self._endpoint = OpenAIEndpoint(base_url, api_key, client, request_timeout_seconds)
        self._clock = clock or default_clock()
        self._jitter = random or default_jitter()

    @property
    def base_url(self) -> str:
        return self._endpoint.base_url

    async def aclose(self) -> None:
        await self._endpoint.aclose()

    def _body(self, request: CompletionRequest, *, stream: bool) -> dict[str, Any]:
        body = request.encode()
        body["model"] = self.name
        body["max_tokens"] = min(request.max_output_tokens, self.policy.budget.output_tokens_max)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def _check_usage(self, usage: Usage | None) -> None:
        tokens_max = self.policy.budget.output_tokens_max
        if usage is not None and usage.completion_tokens > tokens_max:
            raise ModelBudgetExceeded(
                f"the provider produced {usage.completion_tokens} output tokens; "
                f"the budget is {tokens_max}"
            )

    async def complete(self, request: CompletionRequest) -> Completion:
        body = self._body(request, stream=False)

        async def attempt() -> dict[str, Any]:
            return await self._endpoint.post_json("/chat/completions", body)

        decoded = await self.policy.run(attempt, clock=self._clock, jitter=self._jitter)
        completion = _completion_from_wire(decoded)
        self._check_usage(completion.usage)
        return completion

    async def describe_image(
        self, image_bytes: bytes, content_type: str, *, budget_seconds: float
    ) -> str:
        """A short description of one image, within ``budget_seconds`` (all attempts and
        retry sleeps, and never more than the model's own call budget).

        Raises ``ModelRefused`` for a content-safety refusal (a ``content_filter`` finish, a
        ``refusal`` message, or a 4xx whose error says so), never retried; other failures
        are retried like ``complete()`` and raised as the usual ``ModelError`` subclasses.
        """
        if capability_describe_image not in self.capabilities:
            raise ModelConfigurationError(f"model {self.name!r} is configured without images")
        check_image(image_bytes, content_type, budget_seconds)
        tokens_max = min(image_description_tokens_max, self.policy.budget.output_tokens_max)
        body = image_request_body(self.name, image_bytes, content_type, max_tokens=tokens_max)
        seconds = min(budget_seconds, self.policy.budget.total_seconds_max)
        deadline = self._clock.monotonic() + seconds

        async def attempt() -> dict[str, Any]:
            try:
                return await self._endpoint.post_json("/chat/completions", body)
            except ProviderError as error:
                refusal = refusal_of(error)
                if refusal is not None:
                    raise refusal from error
                raise

        decoded = await self.policy.run(
            attempt, clock=self._clock, jitter=self._jitter, deadline=deadline
        )
        description = description_from_wire(decoded)
        self._check_usage(_usage(decoded.get("usage")))
        return description

    async def stream(self, request: CompletionRequest) -> AsyncIterator[CompletionChunk]:
        """Yield text deltas as they arrive, then one final chunk with the assembled tool
        calls, ``finish_reason`` and ``usage``.

        No cancel scope is held across a ``yield`` (trio forbids it in async generators):
        each read is bounded on its own, against the idle timeout and the call's deadline.
        """
        body = self._body(request, stream=True)
        deadline = self._clock.monotonic() + self.policy.budget.total_seconds_max
        async with self._open_stream(body, deadline) as lines:
            assembly = _StreamAssembly()
            while True:
                line = await self._next_line(lines, deadline)
                if line is None:
                    break
                piece = assembly.feed(line)
                if piece is not None and piece.text_delta:
                    yield piece
                if assembly.done:
                    break
            final = assembly.final_chunk()
            self._check_usage(final.usage)
            yield final

    @asynccontextmanager
    async def _open_stream(
        self, body: dict[str, Any], deadline: float
    ) -> AsyncIterator[AsyncIterator[str]]:
        """Open the SSE response under the retry policy; retries end once it is open."""
        holder: dict[str, Any] = {}

        async def attempt() -> None:
            context = self._endpoint.open("/chat/completions", body)
            holder["response"] = await context.__aenter__()
            holder["context"] = context

        await self.policy.run(attempt, clock=self._clock, jitter=self._jitter, deadline=deadline)
        context = holder["context"]
        lines = holder["response"].aiter_lines()
        try:
            yield lines
        except BaseException as exc:
            if not await context.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            await context.__aexit__(None, None, None)

    async def _next_line(self, lines: AsyncIterator[str], deadline: float) -> str | None:
        remaining = deadline - self._clock.monotonic()
        idle_seconds = min(self.policy.request_timeout_seconds, remaining)
        if idle_seconds <= 0:
            raise ModelBudgetExceeded("call budget ran out while streaming")
        line: str | None = None
        with trio.move_on_after(idle_seconds):
            try:
                line = await lines.__anext__()
            except StopAsyncIteration:
                return None
            if len(line) > stream_line_chars_max:
                raise ModelResponseInvalid("an SSE line exceeds the line limit")
            return line
        if idle_seconds < self.policy.request_timeout_seconds:
            raise ModelBudgetExceeded("call budget ran out while streaming")
        raise ModelTimeout(f"the stream was silent for {idle_seconds}s")


def model_from_environment(environ: Mapping[str, str], **options: Any) -> OpenAIChatModel | None:
    """An ``OpenAIChatModel`` configured from ``TROUPE_MODEL_BASE_URL``, ``TROUPE_MODEL_API_KEY``,
    ``TROUPE_MODEL_NAME`` and ``TROUPE_MODEL_IMAGES``; ``None`` when no base URL is set (callers then use
    ``LocalModel``).  A base URL without a model name is a configuration error."""
    base_url = environ.get(environment_base_url, "").strip()
    if not base_url:
        return None
    model = environ.get(environment_model_name, "").strip()
    if not model:
        raise ModelConfigurationError(
            f"{environment_base_url} is set but {environment_model_name} is not"
        )
    api_key = environ.get(environment_api_key, "").strip() or None
    images = environ.get(environment_model_images, "").strip().lower()
    if images:
        options.setdefault("images", images not in ("off", "0", "false", "no"))
    return OpenAIChatModel(base_url, api_key, model, **options)


def _completion_from_wire(decoded: Mapping[str, Any]) -> Completion:
    try:
        choice = decoded["choices"][0]
        message = choice["message"]
        tool_calls = tuple(
            _tool_call(
                call.get("id", ""), call["function"]["name"], call["function"].get("arguments")
            )
            for call in message.get("tool_calls") or ()
        )
        text = message.get("content") or ""
        finish_reason = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelResponseInvalid(f"unexpected chat completion shape: {exc!r}") from exc
    return Completion(
        text=text,
        tool_calls=tool_calls,
        finish_reason=_finish_reason(finish_reason, tool_calls),
        usage=_usage(decoded.get("usage")) or Usage(),
    )


def _tool_call(call_id: str, name: str, arguments: Any) -> ToolCall:
    if isinstance(arguments, dict):
        return ToolCall(call_id, name, arguments)
    try:
        decoded = json.loads(arguments or "{}")
    except ValueError as exc:
        raise ModelResponseInvalid(f"tool call {name!r} has arguments that are not JSON") from exc
    if not isinstance(decoded, dict):
        raise ModelResponseInvalid(f"tool call {name!r} has arguments that are not an object")
    return ToolCall(call_id, name, decoded)


def _finish_reason(value: Any, tool_calls: tuple[ToolCall, ...]) -> Any:
    if value in _finish_reasons:
        return value
    # Some servers say "function_call" or nothing at all; what happened is what we report.
    return "tool_calls" if tool_calls else "stop"


def _usage(value: Any) -> Usage | None:
    if not isinstance(value, dict):
        return None
    try:
        return Usage(int(value.get("prompt_tokens") or 0), int(value.get("completion_tokens") or 0))
    except (TypeError, ValueError) as exc:
        raise ModelResponseInvalid("usage is not made of integers") from exc


@dataclass
class _ToolCallParts:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _StreamAssembly:
    """Folds SSE ``data:`` lines into text deltas and, at the end, whole tool calls."""

    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Usage | None = None
    done: bool = False

    def feed(self, line: str) -> CompletionChunk | None:
        if not line.startswith("data:"):
            return None  # comments, ids, event names and the blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return None
        try:
            event = json.loads(data)
        except ValueError as exc:
            raise ModelResponseInvalid("an SSE data line is not JSON") from exc
        if not isinstance(event, dict):
            raise ModelResponseInvalid("an SSE event is not a JSON object")
        if "error" in event:
            # The HTTP status was already 200; the error travels inside the stream.
            raise ProviderError(200, json.dumps(event["error"]))
        self.usage = _usage(event.get("usage")) or self.usage
        text_pieces: list[str] = []
        for choice in event.get("choices") or ():
            self._feed_choice(choice, text_pieces)
        return CompletionChunk(text_delta="".join(text_pieces))

    def _feed_choice(self, choice: Any, text_pieces: list[str]) -> None:
        if not isinstance(choice, dict):
            raise ModelResponseInvalid("a stream choice is not an object")
        delta = choice.get("delta") or {}
        if delta.get("content"):
            text_pieces.append(delta["content"])
        for part in delta.get("tool_calls") or ():
            self._feed_tool_call(part)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def _feed_tool_call(self, part: Any) -> None:
        try:
            index = int(part.get("index", 0))
            function = part.get("function") or {}
        except (AttributeError, TypeError, ValueError) as exc:
            raise ModelResponseInvalid("a tool-call delta has no usable index") from exc
        if index not in self.tool_calls and len(self.tool_calls) >= stream_tool_calls_max:
            raise ModelResponseInvalid("too many tool calls in one stream")
        parts = self.tool_calls.setdefault(index, _ToolCallParts())
        parts.call_id = parts.call_id or part.get("id") or ""
        parts.name = parts.name or function.get("name") or ""
        if function.get("arguments"):
            parts.arguments.append(function["arguments"])

    def final_chunk(self) -> CompletionChunk:
        calls = tuple(
            _tool_call(parts.call_id, parts.name, "".join(parts.arguments))
            for _, parts in sorted(self.tool_calls.items())
        )
        return CompletionChunk(
            tool_calls=calls,
            finish_reason=_finish_reason(self.finish_reason, calls),
            usage=self.usage,
        )
