"""A small OpenAI-compatible server for tests: real HTTP on 127.0.0.1, an ephemeral port.

It is a raw ASGI app served by ``hypercorn.trio.serve`` inside the test's own nursery, so the
provider code is exercised over a real socket (connection handling, SSE framing, timeouts)
without a network.  It implements ``POST /v1/chat/completions`` (plain, tool calls, streaming,
and image input: a user message whose content holds an ``image_url`` data URI) and
``POST /v1/embeddings``, and can be scripted: fail the next N requests with a status (and a
``Retry-After`` or a body), delay or hang the next N, send the next reply as tool calls, hang a
stream mid-way, report more usage than was asked for, refuse (``content_filter`` finish or a
``refusal`` message, or a 400 content-filter error with ``fail_next(..., body=content_filter_body)``).

Usage::

    async with open_openai_compatible_server() as server:
        model = OpenAIChatModel(server.base_url, "key", "test-model")
        server.fail_next(2, status=503)
        ...
        server.requests  # what arrived, in order

Replies are deterministic: a chat reply echoes the last user message (``"echo: <text>"``); an
image request is answered with ``image_description(content_type, data)``; an embedding is derived from the SHA-256 of the input text (not normalised, on purpose).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

hang_seconds_default = 3_600.0
content_filter_body = json.dumps({
    "error": {
        "message": "The response was filtered due to the prompt triggering content management policy.",
        "type": "invalid_request_error",
        "code": "content_filter",
    }
})
"""What Azure OpenAI answers (HTTP 400) when its content filter refuses the input."""


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Fault:
    status: int | None = None
    retry_after: str | None = None
    hang_seconds: float | None = None
    body: str = '{"error": {"message": "injected failure", "type": "server_error"}}'


@dataclass
class ScriptedReply:
    text: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    finish_reason: str | None = None
    completion_tokens: int | None = None
    # Streaming only: stop sending (but keep the connection open) after this many events.
    stream_hang_after_events: int | None = None
    # Streaming only: send an error event after the first content event.
    stream_error: bool = False
    # Non-streaming only: the message's ``refusal`` field (OpenAI's explicit refusal).
    refusal: str | None = None


class OpenAICompatibleServer:
    def __init__(self, *, api_key: str | None = None, embedding_dimensions: int = 8) -> None:
        self.api_key = api_key
        self.embedding_dimensions = embedding_dimensions
        self.requests: list[RecordedRequest] = []
        self.base_url = ""
        self._faults: deque[Fault] = deque()
        self._replies: deque[ScriptedReply] = deque()

    # Scripting -----------------------------------------------------------------------------

    def fail_next(
        self, count: int, *, status: int = 500, retry_after: str | None = None, body: str | None = None
    ) -> None:
        options = {"body": body} if body is not None else {}
        self._faults.extend(
            Fault(status=status, retry_after=retry_after, **options) for _ in range(count)
        )

    def hang_next(self, count: int, *, seconds: float = hang_seconds_default) -> None:
        """Delay the next ``count`` answers by ``seconds`` (a hang, by default an hour)."""
        self._faults.extend(Fault(hang_seconds=seconds) for _ in range(count))

    def reply_next(self, reply: ScriptedReply) -> None:
        self._replies.append(reply)

    def paths(self) -> list[str]:
        return [request.path for request in self.requests]

    def images(self) -> list[tuple[str, bytes]]:
        """``(content_type, bytes)`` of every image that arrived, in order."""
        return [image for request in self.requests for image in _images_in(request.body)]

    # ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        assert scope["type"] == "http"
        body = await _read_body(receive)
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        try:
            decoded = json.loads(body or b"{}")
        except ValueError:
            await _send_json(send, 400, {"error": {"message": "body is not JSON"}})
            return
        self.requests.append(RecordedRequest(scope["path"], headers, decoded))
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            await _send_json(send, 401, {"error": {"message": "bad key"}})
            return
        if self._faults:
            fault = self._faults.popleft()
            if fault.hang_seconds is not None:
                await trio.sleep(fault.hang_seconds)  # then answer normally: a slow server
            else:
                await self._send_fault(send, fault)
                return
        if scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
            await self._chat(send, decoded)
        elif scope["method"] == "POST" and scope["path"] == "/v1/embeddings":
            await _send_json(send, 200, self._embeddings(decoded))
        else:
            await _send_json(send, 404, {"error": {"message": "not found"}})

    async def _send_fault(self, send: Any, fault: Fault) -> None:
        headers = [(b"retry-after", fault.retry_after.encode())] if fault.retry_after else []
        await _send_raw(send, fault.status or 500, fault.body.encode(), headers)

    # Chat ----------------------------------------------------------------------------------

    def _reply_for(self, body: dict[str, Any]) -> ScriptedReply:
        if self._replies:
            return self._replies.popleft()
        images = _images_in(body)
        if images:
            return ScriptedReply(text=image_description(*images[0]))
        if body.get("response_format", {}).get("type") == "json_object":
            return ScriptedReply(text='{"echo": true}')
        last_user = next(
            (m.get("content", "") for m in reversed(body["messages"]) if m["role"] == "user"), ""
        )
        return ScriptedReply(text=f"echo: {last_user}")

    async def _chat(self, send: Any, body: dict[str, Any]) -> None:
        reply = self._reply_for(body)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        text = reply.text or ""
        completion_tokens = (
            reply.completion_tokens
            if reply.completion_tokens is not None
            else len(text.split()) + len(reply.tool_calls)
        )
        finish_reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if body.get("stream"):
            await self._chat_stream(send, body, reply, finish_reason, usage)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.refusal is not None:
            message["refusal"] = reply.refusal
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{index}",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
                for index, (name, arguments) in enumerate(reply.tool_calls)
            ]
        await _send_json(
            send,
            200,
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                "usage": usage,
            },
        )

    async def _chat_stream(
        self,
        send: Any,
        body: dict[str, Any],
        reply: ScriptedReply,
        finish_reason: str,
        usage: dict[str, int],
    ) -> None:
        events = list(_stream_events(body, reply, finish_reason, usage))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
        for number, event in enumerate(events):
            if (
                reply.stream_hang_after_events is not None
                and number >= reply.stream_hang_after_events
            ):
                await trio.sleep(hang_seconds_default)
            frame = event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {frame}\n\n".encode(),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # Embeddings ----------------------------------------------------------------------------

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body["input"]
        if isinstance(inputs, str):
            inputs = [inputs]
        dimensions = int(body.get("dimensions") or self.embedding_dimensions)
        data = [
            {"object": "embedding", "index": index, "embedding": _vector(text, dimensions)}
            for index, text in enumerate(inputs)
        ]
        data.reverse()  # real servers may answer out of order; clients must sort by index
        return {
            "object": "list",
            "model": body.get("model"),
            "data": data,
            "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
        }


def _stream_events(
    body: dict[str, Any], reply: ScriptedReply, finish_reason: str, usage: dict[str, int]
) -> Iterator[Any]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "model": body.get("model"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    text = reply.text or ""
    pieces = [text[start : start + 4] for start in range(0, len(text), 4)]
    for number, piece in enumerate(pieces):
        yield chunk({"content": piece})
        if number == 0 and reply.stream_error:
            yield {"error": {"message": "the model crashed", "type": "server_error"}}
    for index, (name, arguments) in enumerate(reply.tool_calls):
        encoded = json.dumps(arguments)
        half = len(encoded) // 2
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": f"call_{index}",
                        "type": "function",
                        "function": {"name": name, "arguments": encoded[:half]},
                    }
                ]
            }
        )
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": encoded[half:]}}]})
    yield chunk({}, finish_reason)
    if body.get("stream_options", {}).get("include_usage"):
        yield {
            "id": "chatcmpl-test",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": usage,
        }
    yield "[DONE]"


def image_description(content_type: str, data: bytes) -> str:
    """The server's deterministic answer to an image request."""
    return f"一张 {content_type} 图片，{len(data)} 字节，指纹 {hashlib.sha256(data).hexdigest()[:8]}"


def _images_in(body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The images of a chat request: ``image_url`` parts holding base64 ``data:`` URIs."""
    found = []
    for message in body.get("messages") or ():
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") != "image_url":
                continue
            head, _, payload = part["image_url"]["url"].partition(",")
            assert head.startswith("data:") and head.endswith(";base64"), head
            found.append((head[5:-7], base64.b64decode(payload, validate=True)))
    return found


def _vector(text: str, dimensions: int) -> list[float]:
    digest = b""
    counter = 0
    while len(digest) < dimensions:
        digest += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    return [float(byte) - 127.5 for byte in digest[:dimensions]]


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Any) -> bytes:
    pieces = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        pieces.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(pieces)


async def _send_raw(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")] + headers,
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_json(send: Any, status: int, payload: dict[str, Any]) -> None:
    await _send_raw(send, status, json.dumps(payload, ensure_ascii=False).encode(), [])


@asynccontextmanager
async def open_openai_compatible_server(
    **options: Any,
) -> AsyncIterator[OpenAICompatibleServer]:
    """Serve a fresh ``OpenAICompatibleServer`` on 127.0.0.1:<ephemeral> until the block exits."""
    server = OpenAICompatibleServer(**options)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, server, config))
        server.base_url = binds[0] + "/v1"
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
