"""The embedded model's agent mode: scripted, deterministic agent turns driven by the prompt.

Why it exists: the sessions surface runs agent turns through the Model port, and tests, the
simulator and the bench must exercise every path of a turn (tool calls, permission requests,
questions, client tools, interruption, failure, ``max_turns``) without a network and with the
same events for the same input.  ``LocalAgentModel`` wraps the ``LocalModel`` and reads
*directives* from the last user message; a request without directives gets the wrapped
model's answer unchanged (the existing behaviour: it does not converse).

What it trades off: it follows a script, it does not think.  Each answer is a pure function of
the request: the step it is at is the number of assistant messages after the last user
message, so the kernel's loop (answer, run tools, ask again) walks the script one step at a
time with no state kept here.

Directives, one per line of the user message (other lines are ignored while any directive is
present; JSON stays on its line):

- ``/tool NAME {json}``: call tool ``NAME`` with these arguments (one step).  ``/client NAME
  {json}`` and ``/permission NAME {json}`` are the same call, spelled for the reader: whether
  a call goes to a client or needs a permission is the kernel's decision, by tool.
- ``/tools [{"name": ..., "args": {...}}, ...]``: several calls in one step.
- ``/todo {json}``: ``TodoWrite`` (a bare list means ``{"todos": list}``).
- ``/ask {json}``: ``AskUser`` (a bare list means ``{"questions": list}``).
- ``/loop NAME {json}``: call ``NAME`` at every step, forever (for ``max_turns``).
- ``/fail [unavailable|timeout] [message]``: this step raises ``ModelError`` (or the transient
  ``ModelUnavailable`` / ``ModelTimeout``, which the kernel retries once).
- ``/say TEXT``: the final answer's text (several lines join with newlines); without it the
  final answer is ``Done after N tool calls.``.
- ``/think TEXT``: thinking text streamed before the first step's answer.
- ``/slow N``: every step waits N seconds (trio time) before answering; with the mock clock
  in the simulator this costs nothing and gives interrupts a window.

Tool call ids are ``call_<step>_<index>``; the kernel gives each call its own session-unique id.
Usage is estimated like the ``LocalModel`` (one token per CJK character, word or mark).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio

from ._exceptions import ModelError, ModelTimeout, ModelUnavailable
from ._local_model import LocalModel, _pieces, estimate_tokens
from ._messages import Completion, CompletionChunk, CompletionRequest, ToolCall, Usage

slow_seconds_max = 3_600.0
"""``/slow N`` is capped: a script must not park a turn for longer than this per step."""

_directive = re.compile(r"^/(tool|client|permission|tools|todo|ask|loop|fail|say|think|slow)\b[ \t]*(.*)$")


@dataclass(frozen=True)
class AgentChunk(CompletionChunk):
    """A stream chunk that may carry thinking text (the kernel reads ``thinking_delta``)."""

    thinking_delta: str = ""


@dataclass(frozen=True)
class _Step:
    calls: tuple[ToolCall, ...] = ()
    fail: tuple[str, str] | None = None  # (kind, message)


@dataclass(frozen=True)
class Script:
    steps: tuple[_Step, ...] = ()
    loop: tuple[str, dict[str, Any]] | None = None
    say: str | None = None
    think: str = ""
    slow_seconds: float = 0.0
    errors: tuple[str, ...] = field(default_factory=tuple)


def parse_script(text: str) -> Script | None:
    """The directives of ``text``, or None when it has none."""
    steps: list[_Step] = []
    says: list[str] = []
    thinks: list[str] = []
    errors: list[str] = []
    loop = None
    slow = 0.0
    found = False
    for line in text.splitlines():
        match = _directive.match(line.strip())
        if match is None:
            continue
        found = True
        keyword, rest = match.group(1), match.group(2).strip()
        try:
            if keyword in ("tool", "client", "permission", "loop"):
                name, _, arguments = rest.partition(" ")
                parsed = _json_object(arguments)
                if keyword == "loop":
                    loop = (name, parsed)
                else:
                    steps.append(_Step((ToolCall("", name, parsed),)))
            elif keyword == "tools":
                calls = json.loads(rest)
                steps.append(_Step(tuple(ToolCall("", str(call["name"]), dict(call.get("args") or {}))
                                         for call in calls)))
            elif keyword == "todo":
                steps.append(_Step((ToolCall("", "TodoWrite", _wrapped(rest, "todos")),)))
            elif keyword == "ask":
                steps.append(_Step((ToolCall("", "AskUser", _wrapped(rest, "questions")),)))
            elif keyword == "fail":
                kind, _, message = rest.partition(" ")
                if kind not in ("unavailable", "timeout"):
                    kind, message = "error", rest
                steps.append(_Step(fail=(kind, message or "scripted failure")))
            elif keyword == "say":
                says.append(rest)
            elif keyword == "think":
                thinks.append(rest)
            elif keyword == "slow":
                slow = min(max(float(rest), 0.0), slow_seconds_max)
        except (ValueError, TypeError, KeyError) as exc:
            errors.append(f"/{keyword}: {exc}")
    if not found:
        return None
    return Script(tuple(steps), loop, "\n".join(says) if says else None, "\n".join(thinks),
                  slow, tuple(errors))


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text) if text.strip() else {}
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    return value


def _wrapped(text: str, key: str) -> dict[str, Any]:
    value = json.loads(text)
    return {key: value} if isinstance(value, list) else dict(value)


class LocalAgentModel:
    """The ``Model`` the kernel uses when the configured model is the ``LocalModel``."""

    def __init__(self, inner: LocalModel | None = None) -> None:
        self._inner = inner or LocalModel()
        self.name = self._inner.name
        self.capabilities = frozenset(self._inner.capabilities | {"tools", "agent_script"})

    async def complete(self, request: CompletionRequest) -> Completion:
        script = _script_of(request)
        if script is None:
            return await self._inner.complete(request)
        if script.slow_seconds:
            await trio.sleep(script.slow_seconds)
        await trio.lowlevel.checkpoint()
        return _answer(request, script)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[CompletionChunk]:
        script = _script_of(request)
        if script is None:
            async for chunk in self._inner.stream(request):
                yield chunk
            return
        if script.slow_seconds:
            await trio.sleep(script.slow_seconds)
        step = _step_index(request)
        if step == 0 and script.think:
            for piece in _pieces(script.think):
                await trio.lowlevel.checkpoint()
                yield AgentChunk(thinking_delta=piece)
        completion = _answer(request, script)
        for piece in _pieces(completion.text):
            await trio.lowlevel.checkpoint()
            yield CompletionChunk(text_delta=piece)
        await trio.lowlevel.checkpoint()
        yield CompletionChunk(tool_calls=completion.tool_calls,
                              finish_reason=completion.finish_reason, usage=completion.usage)


def _script_of(request: CompletionRequest) -> Script | None:
    for message in reversed(request.messages):
        if message.role == "user":
            return parse_script(message.content)
    return None


def _step_index(request: CompletionRequest) -> int:
    step = 0
    for message in reversed(request.messages):
        if message.role == "user":
            return step
        if message.role == "assistant":
            step += 1
    return step


def _answer(request: CompletionRequest, script: Script) -> Completion:
    step = _step_index(request)
    prompt_tokens = sum(estimate_tokens(message.content) for message in request.messages)
    if script.errors and step == 0:
        raise ModelError("local agent: bad directive: " + "; ".join(script.errors))
    calls: tuple[ToolCall, ...] = ()
    if step < len(script.steps):
        current = script.steps[step]
        if current.fail is not None:
            kind, message = current.fail
            exception = {"unavailable": ModelUnavailable, "timeout": ModelTimeout}.get(kind, ModelError)
            raise exception(f"local agent: {message}")
        calls = current.calls
    elif script.loop is not None:
        calls = (ToolCall("", script.loop[0], script.loop[1]),)
    if calls:
        calls = tuple(ToolCall(f"call_{step}_{index}", call.name, call.arguments)
                      for index, call in enumerate(calls))
        tokens = sum(estimate_tokens(json.dumps(dict(call.arguments))) + 1 for call in calls)
        return Completion("", calls, "tool_calls", Usage(prompt_tokens, tokens))
    text = script.say if script.say is not None else f"Done after {_tool_results(request)} tool calls."
    return Completion(text, (), "stop", Usage(prompt_tokens, estimate_tokens(text)))


def _tool_results(request: CompletionRequest) -> int:
    count = 0
    for message in reversed(request.messages):
        if message.role == "user":
            break
        count += message.role == "tool"
    return count


def agent_model(model: Any) -> Any:
    """The model a kernel should drive: ``LocalModel`` gains its agent mode, others as they are."""
    if isinstance(model, LocalModel):
        return LocalAgentModel(model)
    return model


__all__ = ["AgentChunk", "LocalAgentModel", "Script", "agent_model", "parse_script"]
