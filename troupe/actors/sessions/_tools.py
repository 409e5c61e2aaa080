"""The built-in tools of the ``mobile-default`` profile, run on this host by the kernel.

- ``TodoWrite`` replaces the turn's plan and publishes ``plan.todo.updated``.
- ``AskUser`` asks the client questions through the question bridge and degrades to "decide
  and continue" when nobody answers (it never hangs a turn).
- ``WebFetch`` (GET a page) and ``Http`` (any method) run here, through ``env.http`` only, and
  always after a permission request.  They refuse loopback, private, link-local and other
  non-global targets: the host name is resolved and *every* address must be global, redirects
  are followed by hand and each hop is checked again, unless the operator sets
  ``ToolSettings.allow_private_targets``.  Responses are bounded in bytes
  (``fetch_response_bytes_max``) and time (``fetch_timeout_seconds``).  Nothing of the host's
  environment (credentials, proxies' secrets) is ever added to a request.  Limitation: httpx
  resolves the name again when it connects, so a DNS answer that changes between our check and
  the connect (rebinding) is not caught here; deployments that need that guarantee put an
  egress proxy that enforces the same rule in front (the contract asks for it anyway).
- ``WebSearch`` and the four media tools (``ImageGen``, ``VideoGen``, ``TextToSpeech``,
  ``SpeechToText``, named after the platform's capability flags ``imageGen``, ``videoGen``,
  ``textToSpeech``, ``speechToText``) call a provider when the operator configured one
  (``ToolSettings.providers``) and otherwise answer the structured tool error
  ``tool_not_configured``: never a fake result.

Name resolution goes through ``ToolSettings.resolver``, else the Env's (``env.extras
["resolver"]``: the simulator's network gives names deterministic addresses there, where a
real lookup would be I/O outside the seed), else trio's ``getaddrinfo``.  A tool's result is a ``ToolResult``;
failures the model should see are results with ``is_error`` and a ``code``, never exceptions.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urljoin, urlsplit

import httpx
import trio

from troupe.models import ToolSpec

from ._bridges import Bridges, Publish

fetch_response_bytes_max = 1024 * 1024
"""WebFetch / Http read at most this many bytes of a response body (the rest is cut)."""

fetch_request_bytes_max = 1024 * 1024
"""Http sends at most this many bytes of request body."""

fetch_timeout_seconds = 20.0
"""WebFetch / Http give up after this long in total, redirects included."""

fetch_redirects_max = 5

todos_max = 100
todo_content_chars_max = 2_000
questions_max = 8
question_options_max = 16
question_chars_max = 2_000

http_methods = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
todo_statuses = ("pending", "in_progress", "completed")

# Request headers a tool call may not set: the transport owns them.
_forbidden_request_headers = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer",
     "keep-alive", "proxy-authorization", "proxy-connection"}
)

Resolver = Callable[[str], Awaitable[list[str]]]
"""``await resolver(host)`` → the host's addresses as text (IPv4 or IPv6)."""


async def system_resolver(host: str) -> list[str]:
    entries = await trio.socket.getaddrinfo(host, None, type=trio.socket.SOCK_STREAM)
    return sorted({entry[4][0] for entry in entries})


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer.  ``output`` is JSON-able (text or an object); ``code`` names the
    failure when ``is_error``; ``artifact`` is a media product kept in the history."""

    output: Any
    is_error: bool = False
    code: str | None = None
    artifact: dict[str, Any] | None = None

    @classmethod
    def failure(cls, code: str, message: str, **detail: Any) -> ToolResult:
        return cls({"error": {"code": code, "message": message, **detail}}, True, code)

    def text(self) -> str:
        """What the model reads."""
        if isinstance(self.output, str):
            return self.output
        return json.dumps(self.output, ensure_ascii=False, separators=(",", ":"))


Provider = Callable[[Mapping[str, Any], "ToolContext"], Awaitable[ToolResult]]


@dataclass(frozen=True)
class ToolSettings:
    """The operator's configuration of the built-in tools (one per server)."""

    allow_private_targets: bool = False
    resolver: Resolver | None = None
    providers: Mapping[str, Provider] = field(default_factory=dict)
    response_bytes_max: int = fetch_response_bytes_max
    timeout_seconds: float = fetch_timeout_seconds

    def __post_init__(self) -> None:
        assert 0 < self.response_bytes_max <= 64 * fetch_response_bytes_max
        assert 0 < self.timeout_seconds <= 300


default_tool_settings = ToolSettings()


@dataclass
class ToolContext:
    """What a running tool may touch: the Env, the publisher, the session's bridges."""

    env: Any
    session_id: str
    turn_id: str
    call_id: str
    publish: Publish
    bridges: Bridges
    settings: ToolSettings = default_tool_settings

    def progress(self, message: str) -> None:
        self.publish("tool.progress", {"callId": self.call_id, "message": message}, self.turn_id)

    def output_delta(self, text: str) -> None:
        self.publish("tool.output.delta", {"callId": self.call_id, "text": text}, self.turn_id)


class BuiltinTool(Protocol):
    name: str
    description: str
    parameters: Mapping[str, Any]
    needs_permission: bool

    def spec(self) -> ToolSpec: ...

    def summary(self, arguments: Mapping[str, Any]) -> str: ...

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult: ...


class _Tool:
    name = ""
    description = ""
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}}
    needs_permission = False

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def summary(self, arguments: Mapping[str, Any]) -> str:
        return self.name

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# TodoWrite and AskUser
# ---------------------------------------------------------------------------------------------


class TodoWrite(_Tool):
    name = "TodoWrite"
    description = "Replace the current task plan (a todo list shown to the user)."
    parameters = {
        "type": "object",
        "properties": {
            "todos": {
                "type": "array",
                "maxItems": todos_max,
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string"},
                        "status": {"enum": list(todo_statuses)},
                        "activeForm": {"type": "string"},
                    },
                    "required": ["content", "status"],
                },
            }
        },
        "required": ["todos"],
    }

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        todos = arguments.get("todos")
        if not isinstance(todos, list) or len(todos) > todos_max:
            return ToolResult.failure("invalid_arguments", f"todos must be a list of at most {todos_max}")
        plan: list[dict[str, Any]] = []
        for index, todo in enumerate(todos):
            if not isinstance(todo, Mapping):
                return ToolResult.failure("invalid_arguments", f"todos[{index}] must be an object")
            content, status = todo.get("content"), todo.get("status", "pending")
            if not isinstance(content, str) or not 0 < len(content) <= todo_content_chars_max:
                return ToolResult.failure("invalid_arguments", f"todos[{index}].content")
            if status not in todo_statuses:
                return ToolResult.failure("invalid_arguments", f"todos[{index}].status")
            item: dict[str, Any] = {"id": str(todo.get("id") or index + 1), "content": content,
                                    "status": status}
            if isinstance(todo.get("activeForm"), str):
                item["activeForm"] = todo["activeForm"][:todo_content_chars_max]
            plan.append(item)
        context.publish("plan.todo.updated", {"todos": plan}, context.turn_id)
        done = sum(1 for item in plan if item["status"] == "completed")
        return ToolResult(f"Todo list updated: {len(plan)} items, {done} completed.")


class AskUser(_Tool):
    name = "AskUser"
    description = "Ask the user one or more questions and wait for the answers."
    parameters = {
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "maxItems": questions_max,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "header": {"type": "string"},
                        "options": {"type": "array", "items": {"type": "object"}},
                        "multiSelect": {"type": "boolean"},
                    },
                    "required": ["question"],
                },
            }
        },
        "required": ["questions"],
    }

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        questions = arguments.get("questions")
        if not isinstance(questions, list) or not 0 < len(questions) <= questions_max:
            return ToolResult.failure("invalid_arguments", f"questions: 1 to {questions_max}")
        cleaned = []
        for index, question in enumerate(questions):
            if not isinstance(question, Mapping) or not isinstance(question.get("question"), str):
                return ToolResult.failure("invalid_arguments", f"questions[{index}].question")
            options = question.get("options") or []
            if not isinstance(options, list) or len(options) > question_options_max:
                return ToolResult.failure("invalid_arguments", f"questions[{index}].options")
            item = {"id": str(question.get("id") or f"q{index + 1}"),
                    "question": question["question"][:question_chars_max]}
            for key in ("header", "multiSelect"):
                if key in question:
                    item[key] = question[key]
            if options:
                item["options"] = options
            cleaned.append(item)
        answer = await context.bridges.ask_questions(turn_id=context.turn_id, questions=cleaned)
        if answer.status == "answered":
            return ToolResult({"answers": list(answer.answers)})
        if answer.status == "degraded":
            return ToolResult({
                "answered": False,
                "reason": answer.why,
                "instruction": "The user did not answer. Decide on your own and continue.",
            })
        if answer.status == "refused":
            return ToolResult.failure("too_many_pending", "too many pending requests")
        return ToolResult.failure("cancelled", "the question was cancelled")


# ---------------------------------------------------------------------------------------------
# WebFetch and Http
# ---------------------------------------------------------------------------------------------


class TargetRefused(Exception):
    """The URL may not be fetched from this host (scheme, name or address)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def address_is_public(address: str) -> bool:
    """True only for global unicast addresses (IPv4-mapped IPv6 judged as its IPv4)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


resolver_extra = "resolver"
"""The ``Env.extras`` key of a ``Resolver`` that replaces the system's name lookup."""


async def check_target(url: str, settings: ToolSettings, *, env: Any = None) -> None:
    """Raise ``TargetRefused`` unless ``url`` is http(s) and every address of its host is
    public (or the operator allowed private targets)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("invalid_url", "only absolute http and https URLs")
    if parts.username or parts.password:
        raise TargetRefused("invalid_url", "credentials in URLs are not sent")
    if settings.allow_private_targets:
        return
    host = parts.hostname
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        extras = getattr(env, "extras", None) or {}
        resolver = settings.resolver or extras.get(resolver_extra) or system_resolver
        try:
            addresses = await resolver(host)
        except OSError as exc:
            raise TargetRefused("unresolvable", f"cannot resolve {host}") from exc
    if not addresses:
        raise TargetRefused("unresolvable", f"{host} resolves to nothing")
    refused = [address for address in addresses if not address_is_public(address)]
    if refused:
        raise TargetRefused(
            "private_target", f"{host} resolves to a non-public address ({refused[0]})"
        )


def _target_summary(method: str, url: str) -> str:
    """Method and URL without query or fragment (they may hold secrets; the digest covers
    the full arguments)."""
    parts = urlsplit(url)
    return f"{method} {parts.scheme}://{parts.netloc}{parts.path or '/'}"


async def fetch(
    context: ToolContext,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
) -> ToolResult:
    """One bounded request through ``env.http``, checking the target of every hop."""
    settings = context.settings
    http = context.env.http
    if http is None:
        return ToolResult.failure("tool_not_configured", "outbound HTTP is not configured")
    result: ToolResult | None = None
    with trio.move_on_after(settings.timeout_seconds):
        result = await _fetch_hops(context, http, method, url, headers, body)
    if result is None:
        return ToolResult.failure("timeout", f"no answer within {settings.timeout_seconds:g} s")
    return result


async def _fetch_hops(context, http, method, url, headers, body) -> ToolResult:
    settings = context.settings
    for _hop in range(fetch_redirects_max + 1):
        try:
            await check_target(url, settings, env=context.env)
        except TargetRefused as refusal:
            return ToolResult.failure(refusal.code, str(refusal), url=url)
        context.progress(f"{method} {_target_summary(method, url).split(' ', 1)[1]}")
        try:
            request = http.build_request(method, url, headers=dict(headers or {}), content=body)
            response = await http.send(request, stream=True, follow_redirects=False)
        except httpx.HTTPError as exc:
            return ToolResult.failure("fetch_failed", f"{type(exc).__name__}: {exc}", url=url)
        try:
            location = response.headers.get("location")
            if response.status_code in (301, 302, 303, 307, 308) and location:
                url = urljoin(url, location)
                if response.status_code == 303 or (
                    response.status_code in (301, 302) and method == "POST"
                ):
                    method, body = "GET", None
                continue
            data, truncated = await _read_bounded(response, settings.response_bytes_max)
        except httpx.HTTPError as exc:
            return ToolResult.failure("fetch_failed", f"{type(exc).__name__}: {exc}", url=url)
        finally:
            await response.aclose()
        return _response_result(response, url, data, truncated)
    return ToolResult.failure("too_many_redirects", f"more than {fetch_redirects_max} redirects")


async def _read_bounded(response: httpx.Response, bytes_max: int) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        room = bytes_max - size
        if len(chunk) > room:
            chunks.append(chunk[:room])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def _response_result(response: httpx.Response, url: str, data: bytes, truncated: bool) -> ToolResult:
    content_type = response.headers.get("content-type", "")
    textual = not content_type or any(
        marker in content_type for marker in ("text/", "json", "xml", "javascript", "html")
    )
    text = data.decode(response.encoding or "utf-8", errors="replace") if textual else (
        f"[{len(data)} bytes of {content_type}]"
    )
    output = {"status": response.status_code, "url": url, "contentType": content_type,
              "body": text, "truncated": truncated}
    return ToolResult(output, is_error=response.status_code >= 400,
                      code=f"http_{response.status_code}" if response.status_code >= 400 else None)


class WebFetch(_Tool):
    name = "WebFetch"
    description = "Fetch a public web page (GET) and return its text."
    parameters = {
        "type": "object",
        "properties": {"url": {"type": "string"}, "prompt": {"type": "string"}},
        "required": ["url"],
    }
    needs_permission = True

    def summary(self, arguments: Mapping[str, Any]) -> str:
        return _target_summary("GET", str(arguments.get("url", "")))

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        url = arguments.get("url")
        if not isinstance(url, str):
            return ToolResult.failure("invalid_arguments", "url must be a string")
        return await fetch(context, "GET", url)


class Http(_Tool):
    name = "Http"
    description = "Send an HTTP request to a public URL and return the response."
    parameters = {
        "type": "object",
        "properties": {
            "method": {"enum": list(http_methods)},
            "url": {"type": "string"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string"},
        },
        "required": ["url"],
    }
    needs_permission = True

    def summary(self, arguments: Mapping[str, Any]) -> str:
        method = str(arguments.get("method") or "GET").upper()
        return _target_summary(method, str(arguments.get("url", "")))

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        url = arguments.get("url")
        method = str(arguments.get("method") or "GET").upper()
        headers = arguments.get("headers") or {}
        body = arguments.get("body")
        if not isinstance(url, str) or method not in http_methods:
            return ToolResult.failure("invalid_arguments", "url and a known method are required")
        if not isinstance(headers, Mapping) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in headers.items()
        ):
            return ToolResult.failure("invalid_arguments", "headers must map strings to strings")
        headers = {key: value for key, value in headers.items()
                   if key.lower() not in _forbidden_request_headers}
        encoded = None
        if body is not None:
            if not isinstance(body, str):
                body = json.dumps(body, ensure_ascii=False)
            encoded = body.encode("utf-8")
            if len(encoded) > fetch_request_bytes_max:
                return ToolResult.failure("payload_too_large",
                                          f"body over {fetch_request_bytes_max} bytes")
        return await fetch(context, method, url, headers=headers, body=encoded)


# ---------------------------------------------------------------------------------------------
# Provider tools: WebSearch and media
# ---------------------------------------------------------------------------------------------


class _ProviderTool(_Tool):
    def __init__(self, name: str, description: str, parameters: Mapping[str, Any]) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters

    async def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        provider = context.settings.providers.get(self.name)
        if provider is None:
            return ToolResult.failure(
                "tool_not_configured", f"{self.name} has no provider on this server",
                tool=self.name,
            )
        return await provider(arguments, context)


def _object(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {key: {"type": kind} for key, kind in properties.items()},
        "required": [next(iter(properties))],
    }


builtin_tools: Mapping[str, BuiltinTool] = {
    tool.name: tool
    for tool in (
        TodoWrite(),
        AskUser(),
        WebFetch(),
        Http(),
        _ProviderTool("WebSearch", "Search the web.", _object(query="string")),
        _ProviderTool("ImageGen", "Generate an image from a description.",
                      _object(prompt="string", size="string")),
        _ProviderTool("VideoGen", "Generate a short video from a description.",
                      _object(prompt="string", durationSeconds="number")),
        _ProviderTool("TextToSpeech", "Speak a text aloud (speech synthesis).",
                      _object(text="string", voice="string")),
        _ProviderTool("SpeechToText", "Transcribe speech audio (base64) to text.",
                      _object(audio="string", language="string")),
    )
}
"""Every built-in tool by name, in the ``mobile-default`` profile's order."""

builtin_tool_names: tuple[str, ...] = tuple(builtin_tools)

__all__ = [
    "BuiltinTool",
    "Provider",
    "Resolver",
    "TargetRefused",
    "ToolContext",
    "ToolResult",
    "ToolSettings",
    "address_is_public",
    "builtin_tool_names",
    "builtin_tools",
    "check_target",
    "default_tool_settings",
    "fetch_redirects_max",
    "fetch_response_bytes_max",
    "fetch_timeout_seconds",
    "questions_max",
    "resolver_extra",
    "system_resolver",
    "todos_max",
]
