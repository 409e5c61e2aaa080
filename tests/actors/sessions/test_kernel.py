"""The agent kernel driven by the LocalModel's agent mode: every path, exact event sequences."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from troupe.actors.sessions._kernel import (
    TurnHandle,
    TurnRequest,
    chat_messages,
    run_turn,
)
from troupe.actors.sessions._profiles import resolve_tool_table
from troupe.actors.sessions._protocol import ClientToolDeclaration, SessionRefused
from troupe.actors.sessions._tools import ToolSettings
from troupe.models import unsupported_reply
from troupe.sim._sim_env import sim_env

from .kernel_helpers import RecordingPorts

public_address = "93.184.216.34"


@pytest.fixture
def env(tmp_path):
    return sim_env(1, str(tmp_path))


def table(*client: ClientToolDeclaration, tools=None):
    resolved = resolve_tool_table(tools=tools, client_tools=client)
    assert not isinstance(resolved, SessionRefused), resolved
    return resolved


def request(prompt: str, **options) -> TurnRequest:
    options.setdefault("tools", table())
    return TurnRequest(session_id="s_1", turn_id="t_1", prompt=prompt, **options)


async def resolve_public(host: str) -> list[str]:
    return [public_address]


async def test_text_turn_without_directives(env):
    ports = RecordingPorts(env)
    outcome = await run_turn(request("hello"), ports)
    assert outcome.status == "completed" and outcome.reason == "end_turn"
    types = ports.types()
    assert types[0] == "turn.started" and types[1] == "msg.block.start"
    assert types[-3:] == ["msg.block.end", "cost.usage.updated", "turn.completed"]
    assert set(types[2:-3]) == {"msg.text.delta"}
    text = "".join(payload["text"] for payload in ports.payloads("msg.text.delta"))
    assert text == unsupported_reply
    assert [message["role"] for message in outcome.messages] == ["user", "assistant"]
    assert outcome.messages[1]["text"] == unsupported_reply
    assert ports.payloads("turn.completed")[0]["reason"] == "end_turn"
    assert set(ports.turn_ids) == {"t_1"}
    assert outcome.usage.completion_tokens > 0


async def test_say_and_think(env):
    ports = RecordingPorts(env)
    outcome = await run_turn(request("/think 想一想。\n/say 好的。"), ports)
    assert ports.types() == [
        "turn.started",
        "msg.block.start", "msg.thinking.delta", "msg.block.end",
        "msg.block.start", "msg.text.delta", "msg.block.end",
        "cost.usage.updated", "turn.completed",
    ]
    starts = ports.payloads("msg.block.start")
    assert [start["kind"] for start in starts] == ["thinking", "text"]
    assert [start["index"] for start in starts] == [0, 1]
    assert outcome.messages[-1]["text"] == "好的。"


async def test_thinking_budget_zero_suppresses_thinking(env):
    ports = RecordingPorts(env)
    await run_turn(request("/think 想一想。\n/say ok", thinking_budget=0), ports)
    assert "msg.thinking.delta" not in ports.types()


async def test_todo_tool_call(env):
    ports = RecordingPorts(env)
    todos = [{"content": "买菜", "status": "in_progress"}, {"content": "做饭", "status": "pending"}]
    outcome = await run_turn(request(f"/todo {json.dumps(todos)}\n/say 计划好了"), ports)
    assert ports.types() == [
        "turn.started",
        "cost.usage.updated",
        "tool.proposed", "tool.started", "plan.todo.updated", "tool.completed",
        "msg.block.start", "msg.text.delta", "msg.block.end",
        "cost.usage.updated", "turn.completed",
    ]
    proposed = ports.payloads("tool.proposed")[0]
    assert proposed["name"] == "TodoWrite" and proposed["origin"] == "builtin"
    assert proposed["args"] == {"todos": todos}
    plan = ports.payloads("plan.todo.updated")[0]["todos"]
    assert [item["content"] for item in plan] == ["买菜", "做饭"]
    completed = ports.payloads("tool.completed")[0]
    assert completed["callId"] == proposed["callId"]
    assert [message["role"] for message in outcome.messages] == ["user", "assistant", "tool", "assistant"]
    assert outcome.messages[1]["toolCalls"][0]["id"] == proposed["callId"]
    assert outcome.messages[2]["callId"] == proposed["callId"]
    usage = ports.payloads("cost.usage.updated")
    assert [entry["step"] for entry in usage] == [1, 2]
    assert usage[1]["totalTokens"] >= usage[0]["totalTokens"]


def http_settings(env, handler):
    env.extras["network"].route("api.example.test", handler)
    return ToolSettings(resolver=resolve_public)


async def test_permission_allowed_then_http_runs(env):
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"ok": True})

    ports = RecordingPorts(env)
    prompt = '/permission Http {"method": "POST", "url": "https://api.example.test/x?k=secret", "body": "hi"}'
    settings = http_settings(env, handler)
    async with trio.open_nursery() as nursery:
        outcomes = []

        async def turn():
            outcomes.append(await run_turn(request(prompt, tool_settings=settings), ports))

        nursery.start_soon(turn)
        asked = await ports.wait_for("server.permission.request")
        assert "args" not in asked and "secret" not in json.dumps(asked)
        assert asked["summary"] == "POST https://api.example.test/x"
        assert asked["ttlMs"] == 120_000 and asked["expiresAt"] == asked["ts"] + 120_000
        assert ports.bridges.answer_permission(asked["requestId"], asked["digest"], "allow").request_id
    outcome = outcomes[0]
    assert outcome.status == "completed"
    assert ports.types() == [
        "turn.started", "cost.usage.updated",
        "tool.proposed", "server.permission.request", "server.permission.closed",
        "tool.permission.decided", "tool.started", "tool.progress", "tool.completed",
        "msg.block.start", "msg.text.delta", "msg.block.end", "cost.usage.updated",
        "turn.completed",
    ]
    decided = ports.payloads("tool.permission.decided")[0]
    assert decided["verdict"] == "allow" and decided["reason"] == "answered"
    output = ports.payloads("tool.completed")[0]["output"]
    assert output["status"] == 200 and json.loads(output["body"]) == {"ok": True}


async def test_permission_denied(env):
    ports = RecordingPorts(env)
    prompt = '/permission WebFetch {"url": "https://api.example.test/"}'
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_turn, request(prompt), ports)
        asked = await ports.wait_for("server.permission.request")
        mismatch = ports.bridges.answer_permission(asked["requestId"], "0" * 64, "allow")
        assert isinstance(mismatch, SessionRefused) and mismatch.code == "digest_mismatch"
        ports.bridges.answer_permission(asked["requestId"], asked["digest"], "deny")
    assert ports.types()[2:8] == [
        "tool.proposed", "server.permission.request", "server.permission.closed",
        "tool.permission.decided", "tool.failed", "msg.block.start",
    ]
    assert ports.payloads("tool.failed")[0]["error"]["code"] == "permission_denied"
    assert ports.payloads("turn.completed")[0]["reason"] == "end_turn"


async def test_permission_times_out_deny_and_continue(env, autojump_clock):
    ports = RecordingPorts(env)
    started = trio.current_time()
    outcome = await run_turn(request('/permission WebFetch {"url": "https://a.example/"}'), ports)
    assert trio.current_time() - started == pytest.approx(120.0)
    closed = ports.payloads("server.permission.closed")[0]
    assert closed["outcome"] == "expired" and closed["verdict"] == "deny"
    decided = ports.payloads("tool.permission.decided")[0]
    assert (decided["verdict"], decided["reason"]) == ("deny", "expired")
    assert outcome.status == "completed"


async def test_question_answered(env):
    ports = RecordingPorts(env)
    prompt = '/ask [{"question": "咖啡还是茶？", "options": [{"label": "咖啡"}, {"label": "茶"}]}]'
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_turn, request(prompt), ports)
        asked = await ports.wait_for("server.question.request")
        assert asked["questions"][0]["question"] == "咖啡还是茶？"
        ports.bridges.answer_question(asked["requestId"], [{"questionId": "q1", "selected": ["茶"]}])
    assert ports.types()[2:7] == [
        "tool.proposed", "tool.started", "server.question.request", "server.question.closed",
        "tool.completed",
    ]
    assert ports.payloads("tool.completed")[0]["output"] == {
        "answers": [{"questionId": "q1", "selected": ["茶"]}]
    }


async def test_question_degrades_without_subscriber(env, autojump_clock):
    ports = RecordingPorts(env, subscribed=False)
    started = trio.current_time()
    outcome = await run_turn(request('/ask [{"question": "?"}]'), ports)
    waited = trio.current_time() - started
    assert 60.0 <= waited <= 62.0
    assert ports.payloads("server.question.closed")[0]["why"] == "unattended"
    output = ports.payloads("tool.completed")[0]["output"]
    assert output["answered"] is False and "Decide" in output["instruction"]
    assert outcome.status == "completed"


def echo_tool(timeout_ms: int = 120_000) -> ClientToolDeclaration:
    return ClientToolDeclaration(name="echo", description="echo on the device", timeout_ms=timeout_ms)


async def test_client_tool_answered(env):
    ports = RecordingPorts(env)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_turn, request('/client echo {"x": 1}', tools=table(echo_tool())), ports)
        asked = await ports.wait_for("server.tool.request")
        assert asked["name"] == "echo" and asked["args"] == {"x": 1}
        assert asked["ttlMs"] == 120_000 and asked["deadlineAt"] == asked["ts"] + 120_000
        assert ports.bridges.answer_tool(asked["callId"], {"echo": 1}).request_id == asked["callId"]
        duplicate = ports.bridges.answer_tool(asked["callId"], {"echo": 2})
        assert duplicate.code == "request_already_answered" and duplicate.status == 409
    assert ports.types()[2:6] == ["tool.proposed", "tool.started", "server.tool.request", "tool.completed"]
    assert ports.payloads("tool.proposed")[0]["origin"] == "client"
    assert ports.payloads("tool.completed")[0]["output"] == {"echo": 1}


async def test_client_tool_times_out(env, autojump_clock):
    ports = RecordingPorts(env)
    outcome = await run_turn(request("/client echo {}", tools=table(echo_tool(1_000))), ports)
    failed = ports.payloads("tool.failed")[0]
    assert failed["error"]["code"] == "timeout" and failed["durationMs"] == 1000
    late = ports.bridges.answer_tool(failed["callId"], {})
    assert late.code == "request_cancelled" and late.status == 410
    assert outcome.status == "completed"


async def test_interrupt_cancels_client_tool(env):
    ports = RecordingPorts(env)
    handle = TurnHandle()
    outcomes = []

    async def turn():
        outcomes.append(await run_turn(request("/client echo {}", tools=table(echo_tool())), ports, handle))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn)
        asked = await ports.wait_for("server.tool.request")
        handle.interrupt("aborted_by_user")
        handle.interrupt("ignored_second_reason")
    outcome = outcomes[0]
    assert (outcome.status, outcome.reason) == ("aborted", "aborted_by_user")
    assert ports.types()[-3:] == ["server.tool.cancel", "tool.failed", "turn.aborted"]
    assert ports.payloads("server.tool.cancel")[0]["callId"] == asked["callId"]
    assert ports.payloads("turn.aborted")[0]["reason"] == "aborted_by_user"
    assert [message["role"] for message in outcome.messages] == ["user", "assistant", "tool"]
    late = ports.bridges.answer_tool(asked["callId"], {})
    assert late.code == "request_cancelled"
    assert ports.bridges.answer_tool("call_never", {}).code == "request_not_found"


async def test_interrupt_while_model_is_slow(env, autojump_clock):
    ports = RecordingPorts(env)
    handle = TurnHandle()
    outcomes = []

    async def turn():
        outcomes.append(await run_turn(request("/slow 30\n/say done"), ports, handle))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn)
        await trio.sleep(10)
        handle.interrupt()
    assert ports.types() == ["turn.started", "turn.aborted"]
    assert outcomes[0].status == "aborted" and len(outcomes[0].messages) == 1


async def test_interrupt_before_start_aborts_at_once(env):
    ports = RecordingPorts(env)
    handle = TurnHandle()
    handle.interrupt("server_draining")
    outcome = await run_turn(request("/say hi"), ports, handle)
    assert (outcome.status, outcome.reason) == ("aborted", "server_draining")
    assert ports.types() == ["turn.started", "turn.aborted"]


async def test_outer_cancellation_propagates_without_events(env, autojump_clock):
    ports = RecordingPorts(env)
    with trio.move_on_after(5):
        await run_turn(request("/slow 30\n/say done"), ports)
        pytest.fail("the turn should have been cancelled")
    assert ports.types() == ["turn.started"]


async def test_outer_cancellation_leaves_cut_off_for_a_passivation(env, autojump_clock):
    # A passivation cancels the task first; the actor's drain then ends the turn as aborted.
    ports = RecordingPorts(env)
    handle = TurnHandle()
    with trio.move_on_after(5):
        await run_turn(request("/slow 30\n/say done"), ports, handle)
    assert ports.types() == ["turn.started"] and handle.cut_off is not None
    outcome = handle.cut_off("server_draining")
    assert (outcome.status, outcome.reason) == ("aborted", "server_draining")
    assert [message["role"] for message in outcome.messages] == ["user"]
    assert ports.types() == ["turn.started", "turn.aborted"]


async def test_model_failure_is_a_terminal_turn_error(env):
    ports = RecordingPorts(env)
    outcome = await run_turn(request("/fail broken on purpose"), ports)
    assert ports.types() == ["turn.started", "turn.error"]
    error = ports.payloads("turn.error")[0]
    assert error["recoverable"] is False and error["code"] == "model_error"
    assert (outcome.status, outcome.reason) == ("error", "model_error")


async def test_transient_failure_is_retried_once(env, autojump_clock):
    ports = RecordingPorts(env)
    outcome = await run_turn(request("/fail unavailable"), ports)
    errors = ports.payloads("turn.error")
    assert [error["recoverable"] for error in errors] == [True, False]
    assert outcome.reason == "model_unavailable"


async def test_max_turns(env):
    ports = RecordingPorts(env)
    outcome = await run_turn(
        request('/loop TodoWrite {"todos": []}', max_turns=3), ports
    )
    assert (outcome.status, outcome.reason) == ("completed", "max_turns")
    assert ports.payloads("turn.completed")[0]["reason"] == "max_turns"
    assert len(ports.payloads("tool.completed")) == 3
    assert [message["role"] for message in outcome.messages].count("assistant") == 3


async def test_unknown_and_narrowed_tools_fail_the_call_only(env):
    ports = RecordingPorts(env)
    outcome = await run_turn(request('/tool Http {"url": "https://x.test"}', tools=table(tools=["TodoWrite"])), ports)
    failed = ports.payloads("tool.failed")[0]
    assert failed["error"]["code"] == "unknown_tool"
    assert ports.payloads("tool.proposed")[0]["origin"] == "unknown"
    assert outcome.status == "completed"


async def test_parallel_calls_keep_call_order_in_transcript(env):
    ports = RecordingPorts(env)
    calls = [{"name": "TodoWrite", "args": {"todos": []}}, {"name": "WebSearch", "args": {"query": "q"}}]
    outcome = await run_turn(request(f"/tools {json.dumps(calls)}"), ports)
    tool_messages = [message for message in outcome.messages if message["role"] == "tool"]
    assert [message["name"] for message in tool_messages] == ["TodoWrite", "WebSearch"]
    assert tool_messages[1]["isError"] is True and tool_messages[1]["code"] == "tool_not_configured"


async def test_history_feeds_the_model_and_pairs_are_repaired(env):
    ports = RecordingPorts(env)
    first = await run_turn(request("/todo []"), ports)
    broken = [*first.messages[:2]]  # the assistant's call without its tool result
    chat = chat_messages(broken + [{"role": "tool", "callId": "stray", "output": "x"}])
    assert [message.role for message in chat] == ["user", "assistant", "tool"]
    assert chat[2].tool_call_id == first.messages[1]["toolCalls"][0]["id"]
    second = await run_turn(TurnRequest(session_id="s_1", turn_id="t_2", prompt="/say again",
                                        history=first.messages, tools=table()), ports)
    assert second.messages[-1]["text"] == "again"


async def test_image_blocks(env):
    ports = RecordingPorts(env)
    blocks = ({"t": "text", "text": "看图"}, {"t": "image", "mime": "image/png", "data": "aGVsbG8="})
    outcome = await run_turn(TurnRequest(session_id="s_1", turn_id="t_1", blocks=blocks), ports)
    started = ports.payloads("turn.started")[0]["input"]
    assert started["blocks"][1] == {"t": "image", "mime": "image/png", "bytes": 6}
    assert outcome.messages[0]["blocks"][1]["data"] == "aGVsbG8="
    assert outcome.messages[0]["text"] == "看图\n[image image/png]"


async def test_same_input_same_events(tmp_path):
    async def once(directory):
        env = sim_env(7, str(directory))
        ports = RecordingPorts(env)
        await run_turn(request('/todo [{"content": "a", "status": "pending"}]\n/say ok'), ports)
        return ports.events

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert await once(tmp_path / "a") == await once(tmp_path / "b")


class BrokenModel:
    name = "broken"

    def stream(self, request):
        raise RuntimeError("a bug")

    async def complete(self, request):
        raise RuntimeError("a bug")


async def test_a_bug_fails_the_turn_not_the_caller(env):
    ports = RecordingPorts(env, model=BrokenModel())
    outcome = await run_turn(request("hi"), ports)
    assert (outcome.status, outcome.reason) == ("error", "internal_error")
    error = ports.payloads("turn.error")[0]
    assert error["recoverable"] is False and "RuntimeError" in error["message"]


def test_package_exports_the_kernel_slice():
    import troupe.actors.sessions as sessions

    for name in ("run_turn", "TurnRequest", "TurnHandle", "Bridges", "resolve_tool_table",
                 "compose_system_prompt", "ToolSettings", "builtin_tool_names"):
        assert name in sessions.__all__
    assert sessions.__all__ == sorted(sessions.__all__)


async def test_max_turns_is_clamped_to_the_limit(env):
    from troupe.actors.sessions._kernel import max_turns_limit

    ports = RecordingPorts(env)
    outcome = await run_turn(request('/loop TodoWrite {"todos": []}', max_turns=max_turns_limit + 1), ports)
    assert outcome.reason == "max_turns"
    assert len(ports.payloads("tool.completed")) == max_turns_limit
