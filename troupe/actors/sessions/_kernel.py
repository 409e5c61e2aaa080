"""The agent kernel: one turn of a session, from the user's input to ``turn.completed``.

A turn is a loop over the Model port: send the conversation and the tool table, stream the
answer out as ``msg.*`` events, run the tool calls it asks for (built-in tools here on the
host, client tools through the tool bridge, with a permission request first where the tool
has effects), feed the results back, and stop when the model answers without tool calls
(``end_turn``) or after ``max_turns`` model steps (``max_turns``).

Why it is a plain async function and not an actor: the session actor owns the state (ring,
subscribers, bridges, store); the kernel only needs narrow ports (``KernelPorts``) and returns
what to commit (``TurnOutcome``).  The actor runs it as a background task so the actor keeps
answering (bridge answers, interrupts, subscribes) while the turn awaits the model.

The event vocabulary is the one tansr clients already reduce (payload names follow the
``tansr-sdk`` conventions: camelCase, ``turnId`` in the envelope, ``reason`` on turn ends,
``recoverable`` on ``turn.error``):

- ``turn.started {input}``; ``turn.completed {reason, usage}`` with reason ``end_turn`` or
  ``max_turns``; ``turn.aborted {reason}``; ``turn.error {code, message, recoverable}``.
  A non-recoverable ``turn.error`` is the turn's last event (clients reduce it as a failed
  turn); a recoverable one says a model step failed transiently and is being retried.
- ``msg.block.start {messageId, index, kind}`` / ``msg.text.delta {messageId, index, text}`` /
  ``msg.thinking.delta {messageId, index, text}`` / ``msg.block.end {messageId, index}``.
- ``tool.proposed {callId, name, args, origin}``, ``tool.permission.decided {callId, name,
  verdict, reason, requestId?}``, ``tool.started {callId, name}``, ``tool.progress {callId,
  message}``, ``tool.output.delta {callId, text}``, ``tool.completed {callId, name, output,
  durationMs}``, ``tool.failed {callId, name, error: {code, message}, durationMs}``.
- ``cost.usage.updated {inputTokens, outputTokens, totalTokens, step}`` after every model
  step (cumulative for the turn); ``plan.todo.updated {todos}`` from TodoWrite.

Interrupt: the actor calls ``TurnHandle.interrupt(reason)``; that cancels the turn's own trio
cancel scope inside ``run_turn``, which then cancels the turn's pending bridge requests,
publishes ``turn.aborted {reason}`` and *returns* ``TurnOutcome(status="aborted")`` with the
messages so far (the user's input, finished assistant messages and tool results), which the
actor commits like any turn end.  Publishing is synchronous, so nothing here needs a shield.
A cancellation from *outside* the handle (the runtime discarding the instance: a crash, or a
passivation, which cancels an actor's tasks before ``on_passivate``) is not an interrupt:
``run_turn`` publishes nothing and lets ``trio.Cancelled`` propagate, but first leaves
``TurnHandle.cut_off``.  After a crash nobody calls it and the turn is lost.  A passivation
(LRU eviction, graceful drain) reaches the actor's drain, which calls
``cut_off("server_draining")``: the turn ends ``turn.aborted`` with the messages so far and is
committed like an interrupted one (before this, it ended ``turn.error internal_error`` with its
user input dropped from the history).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import trio

from troupe.models import (
    ChatMessage,
    Completion,
    CompletionRequest,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    ToolCall,
    ToolSpec,
    Usage,
    agent_model,
)
from troupe.models._messages import request_messages_max

from ._bridges import Bridges, Publish, ToolAnswer
from ._profiles import ToolTable
from ._tools import ToolContext, ToolResult, ToolSettings, builtin_tools, default_tool_settings

max_turns_default = 16
"""Model steps per turn when the session does not say (each step may call tools)."""

max_turns_limit = 100
"""The most model steps a turn takes, whatever the session asked for."""

tool_calls_per_step_max = 16
"""Tool calls of one model step beyond this fail with ``too_many_tool_calls``."""

tool_output_chars_max = 100_000
"""A tool result longer than this is cut before it goes to the model and the transcript."""

model_step_retries_max = 1
"""A transient model failure (unavailable, timeout) is retried this many times per step."""

model_retry_backoff_seconds = 0.5

assert 0 < max_turns_default <= max_turns_limit

TurnStatus = Literal["completed", "aborted", "error"]


@dataclass(frozen=True)
class TurnRequest:
    """Everything one turn needs, assembled by the session actor.

    ``prompt`` or ``blocks`` is the user's input (``blocks`` are ``{"t": "text", "text"}`` /
    ``{"t": "image", "mime", "data"}`` dicts as the client sent them).  ``history`` is the
    committed transcript, messages in the shape ``TurnOutcome.messages`` produces.  ``tools``
    is the session's tool table from ``_profiles.resolve_tool_table``.
    """

    session_id: str
    turn_id: str
    prompt: str | None = None
    blocks: tuple[Mapping[str, Any], ...] = ()
    history: tuple[Mapping[str, Any], ...] = ()
    tools: Any = None  # ToolTable (``_profiles``); None = no tools
    system_prompt: str = ""
    model_name: str | None = None
    temperature: float = 0.0
    max_output_tokens: int = 1024
    thinking_budget: int | None = None
    max_turns: int = max_turns_default
    tool_settings: Any = None  # ToolSettings (``_tools``); None = the defaults

    def __post_init__(self) -> None:
        assert self.prompt is not None or self.blocks, "a turn needs input"
        assert self.max_turns > 0, self.max_turns


class KernelPorts(Protocol):
    """What the session actor gives the kernel.

    ``publish(type, payload, turn_id) -> seq`` is synchronous (assigns the seq, appends to the
    ring, fans out); ``bridges`` is the session's ``Bridges``; ``model`` is the Model port
    (``env.model`` unless the session chose another one).
    """

    env: Any
    publish: Publish
    bridges: Bridges
    model: Any


@dataclass(frozen=True)
class TurnOutcome:
    """How the turn ended and what to commit with its events, in one storage write.

    ``status``: ``completed`` (reason ``end_turn`` or ``max_turns``), ``aborted`` (the reason
    given to ``interrupt``, e.g. ``aborted_by_user``) or ``error`` (``internal_error``,
    ``model_error``...).  ``messages`` are the new transcript messages (user input first).
    """

    status: TurnStatus
    reason: str
    messages: tuple[dict[str, Any], ...]
    usage: Usage = field(default_factory=Usage)


class TurnHandle:
    """The actor's grip on a running turn: ``interrupt(reason)`` aborts it (idempotent).

    ``cut_off`` is set when the turn was cancelled from outside (see the module docstring):
    calling it with a reason publishes ``turn.aborted`` and returns the aborted outcome."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.reason: str | None = None
        self.cut_off: Callable[[str], TurnOutcome] | None = None

    def interrupt(self, reason: str = "aborted_by_user") -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()

    @property
    def interrupted(self) -> bool:
        return self.reason is not None


async def run_turn(
    request: TurnRequest, ports: KernelPorts, handle: TurnHandle | None = None
) -> TurnOutcome:
    """Run one turn; see the module docstring for the events and the interrupt protocol."""
    handle = handle or TurnHandle()
    turn = _Turn(request, ports)
    turn.start()
    outcome: TurnOutcome | None = None
    try:
        with handle.scope:
            outcome = await turn.loop()
    except trio.Cancelled:
        # Cut off from outside: publish nothing now (a crash must leave no trace), but let the
        # actor end the turn as aborted if its instance lives on to passivate.
        handle.cut_off = turn.abort
        raise
    except _TurnFailed as failure:
        return turn.fail(failure.code, failure.message)
    except Exception as exc:  # a bug of ours or a tool's: the turn fails, the session lives
        return turn.fail("internal_error", f"{type(exc).__name__}: {exc}")
    if outcome is None:
        return turn.abort(handle.reason or "aborted_by_user")
    return outcome


class _TurnFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Turn:
    """The state of one running turn: the transcript so far, usage, open blocks and calls."""

    def __init__(self, request: TurnRequest, ports: KernelPorts) -> None:
        self.request = request
        self.ports = ports
        self.env = ports.env
        self.turn_id = request.turn_id
        self.model = agent_model(ports.model)
        self.table: ToolTable | None = request.tools
        self.settings: ToolSettings = request.tool_settings or default_tool_settings
        self.messages: list[dict[str, Any]] = []
        self.chat: list[ChatMessage] = []
        self.input_tokens = 0
        self.output_tokens = 0
        self.thinking_tokens = 0
        self.open_calls: dict[str, str] = {}
        self.results: list[dict[str, Any]] = []
        """Tool messages of the current step, in the order the calls finished."""

    # -- events -----------------------------------------------------------------------------

    def publish(self, type: str, payload: dict[str, Any]) -> int:
        return self.ports.publish(type, payload, self.turn_id)

    def now_ms(self) -> int:
        return int(self.env.clock.wall() * 1000)

    def usage(self) -> Usage:
        return Usage(self.input_tokens, self.output_tokens)

    def usage_payload(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.input_tokens + self.output_tokens,
        }

    # -- start and ends ---------------------------------------------------------------------

    def start(self) -> None:
        request = self.request
        user: dict[str, Any] = {"role": "user", "turnId": self.turn_id, "ts": self.now_ms(),
                                "text": input_text(request.prompt, request.blocks)}
        shown: dict[str, Any] = {}
        if request.prompt is not None:
            shown["prompt"] = request.prompt
        if request.blocks:
            user["blocks"] = [dict(block) for block in request.blocks]
            shown["blocks"] = [_block_summary(block) for block in request.blocks]
        self.messages.append(user)
        self.publish("turn.started", {"input": shown})
        system = [ChatMessage("system", request.system_prompt)] if request.system_prompt else []
        history = chat_messages(request.history)
        room = request_messages_max - len(system) - 1
        self.chat = [*system, *_trim(history, room), ChatMessage("user", user["text"])]

    def finish(self, reason: str) -> TurnOutcome:
        self.close_inputs()
        self.publish("turn.completed", {"reason": reason, "usage": self.usage_payload()})
        return TurnOutcome("completed", reason, tuple(self.messages), self.usage())

    def abort(self, reason: str) -> TurnOutcome:
        self.close_inputs()
        self.ports.bridges.cancel_all(reason, turn_id=self.turn_id)
        self._fail_open_calls("cancelled", "the turn was interrupted")
        self.publish("turn.aborted", {"reason": reason, "usage": self.usage_payload()})
        return TurnOutcome("aborted", reason, tuple(self.messages), self.usage())

    def fail(self, code: str, message: str) -> TurnOutcome:
        self.close_inputs()
        self.ports.bridges.cancel_all(code, turn_id=self.turn_id)
        self._fail_open_calls("cancelled", "the turn failed")
        self.publish("turn.error", {"code": code, "message": message, "recoverable": False,
                                    "reason": code, "usage": self.usage_payload()})
        return TurnOutcome("error", code, tuple(self.messages), self.usage())

    def _fail_open_calls(self, code: str, message: str) -> None:
        """Ends the calls still running and keeps every result of the cut step, so the
        transcript pairs each call of the last assistant message with a result."""
        for call_id, name in list(self.open_calls.items()):
            self._settle_call(call_id, name, ToolResult.failure(code, message), 0)
        self.messages.extend(self.results)
        self.results = []

    # -- the loop ---------------------------------------------------------------------------

    async def loop(self) -> TurnOutcome:
        specs = self.table.specs() if self.table is not None else ()
        # A larger request is clamped (the HTTP layer should refuse it with validation_failed).
        for step in range(min(self.request.max_turns, max_turns_limit)):
            if step > 0:
                self.take_inputs()
            completion = await self.model_step(step, specs)
            calls = tuple(ToolCall(self.env.ids.new_id("call_"), call.name, call.arguments)
                          for call in completion.tool_calls)
            assistant: dict[str, Any] = {"role": "assistant", "turnId": self.turn_id,
                                         "ts": self.now_ms(), "text": completion.text}
            if calls:
                assistant["toolCalls"] = [
                    {"id": call.id, "name": call.name, "args": dict(call.arguments)}
                    for call in calls
                ]
            self.messages.append(assistant)
            self.chat.append(ChatMessage("assistant", completion.text, calls))
            if not calls:
                # Strict inputs that arrived during this step need an answer in this turn.
                if self.take_inputs(close_if_empty=True):
                    continue
                return self.finish("end_turn")
            await self.run_calls(calls)
        return self.finish("max_turns")

    def close_inputs(self) -> None:
        """The turn ends: an input posted from now on is late (refused), never half-taken."""
        inbox = getattr(self.ports, "inputs", None)
        if inbox is not None:
            inbox.close()

    def take_inputs(self, *, close_if_empty: bool = False) -> bool:
        """Strict inputs accepted into this turn (``_inputs.TurnInbox``) join the conversation
        as user messages carrying their ``inputId``; True when any did.  ``close_if_empty``
        ends admission when none waits, with no await before the turn ends."""
        inbox = getattr(self.ports, "inputs", None)
        if inbox is None:
            return False
        taken = inbox.take(close_if_empty=close_if_empty)
        for item in taken:
            self.messages.append({"role": "user", "turnId": self.turn_id, "ts": self.now_ms(),
                                  "text": item.text, "inputId": item.input_id})
            self.chat.append(ChatMessage("user", item.text))
        return bool(taken)

    async def model_step(self, step: int, specs: tuple[ToolSpec, ...]) -> Completion:
        request = CompletionRequest(
            messages=tuple(self.chat), tools=specs,
            max_output_tokens=self.request.max_output_tokens,
            temperature=self.request.temperature,
        )
        attempt = 0
        while True:
            try:
                completion = await self.stream_step(request)
                break
            except (ModelUnavailable, ModelTimeout) as exc:
                if attempt >= model_step_retries_max:
                    raise _TurnFailed("model_unavailable", str(exc)) from exc
                attempt += 1
                self.publish("turn.error", {"code": "model_unavailable", "message": str(exc),
                                            "recoverable": True, "step": step})
                await trio.sleep(model_retry_backoff_seconds * attempt)
            except ModelError as exc:
                raise _TurnFailed("model_error", str(exc)) from exc
        self.input_tokens += completion.usage.prompt_tokens
        self.output_tokens += completion.usage.completion_tokens
        self.publish("cost.usage.updated", {**self.usage_payload(), "step": step + 1})
        return completion

    async def stream_step(self, request: CompletionRequest) -> Completion:
        """Stream one model answer out as ``msg.*`` events; blocks are always closed."""
        blocks = _Blocks(self, self.env.ids.new_id("msg_"))
        text: list[str] = []
        calls: tuple[ToolCall, ...] = ()
        usage: Usage | None = None
        finish_reason = "stop"
        budget = self.request.thinking_budget
        try:
            async with contextlib.aclosing(self.model.stream(request)) as chunks:
                async for chunk in chunks:
                    thinking = getattr(chunk, "thinking_delta", "")
                    if thinking and (budget is None or self.thinking_tokens < budget):
                        self.thinking_tokens += thinking_tokens(thinking)
                        blocks.delta("thinking", "msg.thinking.delta", thinking)
                    if chunk.text_delta:
                        text.append(chunk.text_delta)
                        blocks.delta("text", "msg.text.delta", chunk.text_delta)
                    if chunk.finish_reason is not None:
                        calls = chunk.tool_calls
                        usage = chunk.usage
                        finish_reason = chunk.finish_reason
        finally:
            blocks.close()
        full = "".join(text)
        if usage is None:
            usage = Usage(0, thinking_tokens(full))
        return Completion(full, calls, finish_reason, usage)  # type: ignore[arg-type]

    # -- tools ------------------------------------------------------------------------------

    async def run_calls(self, calls: tuple[ToolCall, ...]) -> None:
        for call in calls:
            origin = self._origin(call.name)
            self.publish("tool.proposed", {"callId": call.id, "name": call.name,
                                           "args": dict(call.arguments), "origin": origin})
            self.open_calls[call.id] = call.name
        runnable = calls[:tool_calls_per_step_max]
        for call in calls[tool_calls_per_step_max:]:
            self._settle_call(call.id, call.name, ToolResult.failure(
                "too_many_tool_calls", f"at most {tool_calls_per_step_max} calls per step"), 0)
        if len(runnable) == 1:
            await self.run_call(runnable[0])
        else:
            async with trio.open_nursery() as nursery:
                for call in runnable:
                    nursery.start_soon(self.run_call, call)
        # Tool messages follow the assistant message in call order, whatever finished first.
        results = {message["callId"]: message for message in self.results}
        for call in calls:
            message = results[call.id]
            self.messages.append(message)
            self.chat.append(ChatMessage("tool", message["output"], tool_call_id=call.id))
        self.results = []

    def _origin(self, name: str) -> str:
        if self.table is not None and name in self.table.builtin:
            return "builtin"
        if self.table is not None and self.table.client_tool(name) is not None:
            return "client"
        return "unknown"

    async def run_call(self, call: ToolCall) -> None:
        started = self.env.clock.monotonic()
        result = await self._call_result(call)
        duration_ms = int((self.env.clock.monotonic() - started) * 1000)
        self._settle_call(call.id, call.name, result, duration_ms)

    async def _call_result(self, call: ToolCall) -> ToolResult:
        origin = self._origin(call.name)
        if origin == "unknown":
            return ToolResult.failure("unknown_tool", f"no tool named {call.name} in this session")
        arguments = dict(call.arguments)
        if origin == "client":
            declaration = self.table.client_tool(call.name)  # type: ignore[union-attr]
            self.publish("tool.started", {"callId": call.id, "name": call.name})
            answer = await self.ports.bridges.request_tool(
                turn_id=self.turn_id, call_id=call.id, name=call.name, arguments=arguments,
                timeout_seconds=declaration.timeout_ms / 1000,
            )
            return _client_result(answer)
        tool = builtin_tools[call.name]
        if tool.needs_permission:
            decision = await self.ports.bridges.request_permission(
                turn_id=self.turn_id, call_id=call.id, name=call.name, arguments=arguments,
                summary=tool.summary(arguments),
                attribution={"origin": "builtin", "tool": call.name},
            )
            decided: dict[str, Any] = {"callId": call.id, "name": call.name,
                                       "verdict": decision.verdict, "reason": decision.reason}
            if decision.request_id is not None:
                decided["requestId"] = decision.request_id
            self.publish("tool.permission.decided", decided)
            if decision.verdict != "allow":
                return ToolResult.failure("permission_denied", f"permission {decision.reason}: deny")
        self.publish("tool.started", {"callId": call.id, "name": call.name})
        context = ToolContext(self.env, self.request.session_id, self.turn_id, call.id,
                              self.ports.publish, self.ports.bridges, self.settings)
        try:
            return await tool.run(arguments, context)
        except Exception as exc:  # a tool's bug fails the call, not the turn
            return ToolResult.failure("tool_crashed", f"{type(exc).__name__}: {exc}")

    def _settle_call(self, call_id: str, name: str, result: ToolResult, duration_ms: int) -> None:
        if self.open_calls.pop(call_id, None) is None:
            return
        text = result.text()
        if len(text) > tool_output_chars_max:
            text = text[:tool_output_chars_max]
            output: Any = text
        else:
            output = result.output
        if result.is_error:
            error = result.output.get("error") if isinstance(result.output, Mapping) else None
            if not isinstance(error, Mapping):
                error = {"code": result.code or "tool_error", "message": text}
            self.publish("tool.failed", {"callId": call_id, "name": name, "error": dict(error),
                                         "durationMs": duration_ms})
        else:
            completed: dict[str, Any] = {"callId": call_id, "name": name, "output": output,
                                         "durationMs": duration_ms}
            if result.artifact is not None:
                completed["artifact"] = result.artifact
            self.publish("tool.completed", completed)
        message: dict[str, Any] = {"role": "tool", "turnId": self.turn_id, "ts": self.now_ms(),
                                   "callId": call_id, "name": name, "output": text,
                                   "isError": result.is_error}
        if result.code is not None:
            message["code"] = result.code
        if result.artifact is not None:
            message["artifact"] = result.artifact
        self.results.append(message)


class _Blocks:
    """Content blocks of one assistant message: a block opens at its first delta and closes
    when the kind changes or the stream ends."""

    def __init__(self, turn: _Turn, message_id: str) -> None:
        self.turn = turn
        self.message_id = message_id
        self.index = -1
        self.kind: str | None = None

    def delta(self, kind: str, event: str, text: str) -> None:
        if kind != self.kind:
            self.close()
            self.index += 1
            self.kind = kind
            self.turn.publish("msg.block.start", {"messageId": self.message_id,
                                                  "index": self.index, "kind": kind})
        self.turn.publish(event, {"messageId": self.message_id, "index": self.index,
                                  "text": text})

    def close(self) -> None:
        if self.kind is not None:
            self.turn.publish("msg.block.end", {"messageId": self.message_id,
                                                "index": self.index})
            self.kind = None


def _client_result(answer: ToolAnswer) -> ToolResult:
    if answer.status == "answered":
        return ToolResult(answer.result, is_error=answer.is_error,
                          code="client_error" if answer.is_error else None)
    if answer.status == "timeout":
        return ToolResult.failure("timeout", "the client did not answer before the deadline")
    if answer.status == "refused":
        return ToolResult.failure("too_many_pending", "too many pending requests")
    return ToolResult.failure("cancelled", "the request was cancelled")


_token_pattern = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|\w+|[^\w\s]")


def thinking_tokens(text: str) -> int:
    """An estimate (one token per CJK character, word or mark), for budgets and usage."""
    return len(_token_pattern.findall(text))


def input_text(prompt: str | None, blocks: Sequence[Mapping[str, Any]]) -> str:
    """The user's input as text for the model: images become a placeholder with their type."""
    if prompt is not None:
        return prompt
    parts = []
    for block in blocks:
        if block.get("t") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("t") == "image":
            parts.append(f"[image {block.get('mime', '')}]")
    return "\n".join(parts)


def _block_summary(block: Mapping[str, Any]) -> dict[str, Any]:
    if block.get("t") == "image":
        data = block.get("data") or ""
        return {"t": "image", "mime": block.get("mime"), "bytes": len(data) * 3 // 4}
    return dict(block)


def chat_messages(history: Sequence[Mapping[str, Any]]) -> list[ChatMessage]:
    """The stored transcript as Model-port ``ChatMessage``s, with broken tool pairs repaired:
    a tool result without its call is dropped; a call without its result (a turn cut by a
    crash or a compaction) gets a placeholder result, because providers refuse unpaired
    calls."""
    chat: list[ChatMessage] = []
    expected: list[str] = []

    def close_calls() -> None:
        for call_id in expected:
            chat.append(ChatMessage("tool", "[no result: the turn ended first]",
                                    tool_call_id=call_id))
        expected.clear()

    for message in history:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("callId")
            if call_id in expected:
                expected.remove(call_id)
                chat.append(ChatMessage("tool", str(message.get("output", "")),
                                        tool_call_id=call_id))
            continue
        close_calls()
        if role == "user":
            chat.append(ChatMessage("user", str(message.get("text")
                                                or input_text(None, message.get("blocks") or ()))))
        elif role == "assistant":
            calls = tuple(ToolCall(str(call["id"]), str(call["name"]), dict(call.get("args") or {}))
                          for call in message.get("toolCalls") or ())
            chat.append(ChatMessage("assistant", str(message.get("text", "")), calls))
            expected.extend(call.id for call in calls)
        elif role == "system":
            chat.append(ChatMessage("system", str(message.get("text", ""))))
    close_calls()
    return chat


def _trim(history: list[ChatMessage], room: int) -> list[ChatMessage]:
    """The newest ``room`` messages, starting at a user message so no tool result is cut
    from its call."""
    if len(history) <= room:
        return history
    kept = history[len(history) - room:]
    while kept and kept[0].role != "user":
        kept = kept[1:]
    return kept


__all__ = [
    "KernelPorts",
    "chat_messages",
    "input_text",
    "TurnHandle",
    "TurnOutcome",
    "TurnRequest",
    "max_turns_default",
    "max_turns_limit",
    "run_turn",
]
