"""The values that cross the Model port: requests, completions, stream chunks.

They are frozen dataclasses rather than pydantic models: they are built in hot paths (every
agent turn, every extraction) and never validated from untrusted input directly; the HTTP
surfaces validate with pydantic and then build these.  Sequences are stored as tuples so a
request can be shared between tasks and retried without anyone mutating it underneath.

The shapes follow OpenAI's chat-completions wire format closely (roles, ``tool_calls`` with an
id, a name and JSON arguments) because that is what every provider we talk to speaks; each type
has one ``encode()`` that produces that wire form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ResponseFormat = Literal["text", "json"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]

# A request larger than this is our bug (a runaway prompt builder), not a provider's problem.
request_messages_max = 10_000
output_tokens_default = 1_024


@dataclass(frozen=True)
class ToolCall:
    """A call the model asks the caller to make; ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(dict(self.arguments))},
        }


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation.

    ``tool_calls`` is set on assistant messages that called tools; ``tool_call_id`` on the
    ``tool`` message that carries a call's result.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        assert self.role in ("system", "user", "assistant", "tool"), self.role
        assert self.role == "tool" or self.tool_call_id is None, (
            "tool_call_id on a non-tool message"
        )

    def encode(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            wire["tool_calls"] = [call.encode() for call in self.tool_calls]
        if self.tool_call_id is not None:
            wire["tool_call_id"] = self.tool_call_id
        return wire


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def encode(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class CompletionRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int = output_tokens_default
    temperature: float = 0.0
    response_format: ResponseFormat = "text"

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))
        assert 0 < len(self.messages) <= request_messages_max, len(self.messages)
        assert self.max_output_tokens > 0, self.max_output_tokens
        assert self.response_format in ("text", "json"), self.response_format

    def encode(self) -> dict[str, Any]:
        """The chat-completions body, without ``model`` and ``stream`` (the provider adds them)."""
        wire: dict[str, Any] = {
            "messages": [message.encode() for message in self.messages],
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
        }
        if self.tools:
            wire["tools"] = [tool.encode() for tool in self.tools]
        if self.response_format == "json":
            wire["response_format"] = {"type": "json_object"}
        return wire


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def encode(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True)
class Completion:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    def encode(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "tool_calls": [call.encode() for call in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": self.usage.encode(),
        }


@dataclass(frozen=True)
class CompletionChunk:
    """One piece of a streamed completion.

    Text arrives as ``text_delta`` pieces.  Tool calls are assembled by the provider from the
    wire's partial deltas and delivered whole, on the last chunk, together with
    ``finish_reason`` and (when the provider reports it) ``usage``.
    """

    text_delta: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))

    def encode(self) -> dict[str, Any]:
        return {
            "text_delta": self.text_delta,
            "tool_calls": [call.encode() for call in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": None if self.usage is None else self.usage.encode(),
        }


def user_request(text: str, *, system: str | None = None, **options: Any) -> CompletionRequest:
    """A one-turn request: an optional system message and one user message."""
    messages: Sequence[ChatMessage] = ([ChatMessage("system", system)] if system else []) + [
        ChatMessage("user", text)
    ]
    return CompletionRequest(messages=tuple(messages), **options)
