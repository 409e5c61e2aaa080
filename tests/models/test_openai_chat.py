"""OpenAIChatModel against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket

import pytest
import trio

from tests.models.openai_compatible_server import ScriptedReply, open_openai_compatible_server
from troupe.models import (
    Backoff,
    CallBudget,
    ChatMessage,
    CompletionRequest,
    ModelBudgetExceeded,
    ModelConfigurationError,
    ModelTimeout,
    ModelUnavailable,
    OpenAIChatModel,
    ProviderError,
    ToolCall,
    ToolSpec,
    model_from_environment,
    user_request,
)

fast_backoff = Backoff(initial_seconds=0.01, delay_seconds_max=0.05)
weather_tool = ToolSpec(
    "weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


class RecordingJitter:
    def __init__(self, value: float = 0.5) -> None:
        self.value = value
        self.calls = 0

    def random(self) -> float:
        self.calls += 1
        return self.value


@pytest.fixture
async def server():
    async with open_openai_compatible_server(api_key="sk-test") as running:
        yield running


def chat_model(server, **options) -> OpenAIChatModel:
    options.setdefault("backoff", fast_backoff)
    options.setdefault("random", RecordingJitter())
    return OpenAIChatModel(server.base_url, "sk-test", "test-model", **options)


async def collect(model: OpenAIChatModel, request: CompletionRequest):
    async with contextlib.aclosing(model.stream(request)) as chunks:
        return [chunk async for chunk in chunks]


async def test_plain_completion_sends_the_wire_format(server):
    model = chat_model(server)
    completion = await model.complete(user_request("你好 world", system="be brief"))
    assert completion.text == "echo: 你好 world"
    assert completion.finish_reason == "stop"
    assert completion.tool_calls == ()
    assert completion.usage.prompt_tokens == 4
    assert completion.usage.completion_tokens == 3
    [recorded] = server.requests
    assert recorded.path == "/v1/chat/completions"
    assert recorded.headers["authorization"] == "Bearer sk-test"
    assert recorded.body["model"] == "test-model"
    assert recorded.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "你好 world"},
    ]
    assert "stream" not in recorded.body and "tools" not in recorded.body
    await model.aclose()


async def test_json_mode_is_requested(server):
    model = chat_model(server)
    completion = await model.complete(user_request("facts please", response_format="json"))
    assert completion.text == '{"echo": true}'
    assert server.requests[0].body["response_format"] == {"type": "json_object"}


async def test_tool_calls_round_trip(server):
    model = chat_model(server)
    server.reply_next(ScriptedReply(tool_calls=[("weather", {"city": "北京"})]))
    completion = await model.complete(user_request("weather?", tools=[weather_tool]))
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls == (ToolCall("call_0", "weather", {"city": "北京"}),)
    assert server.requests[0].body["tools"] == [weather_tool.encode()]

    follow_up = CompletionRequest(
        messages=[
            ChatMessage("user", "weather?"),
            ChatMessage("assistant", "", tool_calls=completion.tool_calls),
            ChatMessage("tool", '{"sky": "clear"}', tool_call_id="call_0"),
        ],
        tools=[weather_tool],
    )
    await model.complete(follow_up)
    sent = server.requests[1].body["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "\\u5317\\u4eac"}',
    }
    assert sent[2] == {"role": "tool", "content": '{"sky": "clear"}', "tool_call_id": "call_0"}


async def test_stream_yields_deltas_then_a_final_chunk(server):
    model = chat_model(server)
    chunks = await collect(model, user_request("a longer sentence to stream"))
    assert "".join(chunk.text_delta for chunk in chunks) == "echo: a longer sentence to stream"
    assert len(chunks) > 3
    assert all(chunk.finish_reason is None for chunk in chunks[:-1])
    assert chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert server.requests[0].body["stream"] is True
    assert server.requests[0].body["stream_options"] == {"include_usage": True}


async def test_stream_assembles_tool_call_deltas(server):
    model = chat_model(server)
    server.reply_next(
        ScriptedReply(
            text="checking",
            tool_calls=[("weather", {"city": "上海"}), ("weather", {"city": "Paris"})],
        )
    )
    chunks = await collect(model, user_request("two cities", tools=[weather_tool]))
    final = chunks[-1]
    assert final.finish_reason == "tool_calls"
    assert final.tool_calls == (
        ToolCall("call_0", "weather", {"city": "上海"}),
        ToolCall("call_1", "weather", {"city": "Paris"}),
    )
    assert "".join(chunk.text_delta for chunk in chunks) == "checking"


async def test_abandoned_stream_closes_cleanly(server):
    model = chat_model(server)
    async with contextlib.aclosing(model.stream(user_request("x " * 50))) as chunks:
        async for _ in chunks:
            break
    assert (await model.complete(user_request("still works"))).text == "echo: still works"


async def test_retries_5xx_with_backoff_then_succeeds(server):
    jitter = RecordingJitter()
    model = chat_model(server, random=jitter, retries_max=3)
    server.fail_next(2, status=503)
    completion = await model.complete(user_request("eventually"))
    assert completion.text == "echo: eventually"
    assert len(server.requests) == 3
    assert jitter.calls == 2


async def test_honours_retry_after_on_429(server):
    model = chat_model(server, retries_max=1)
    server.fail_next(1, status=429, retry_after="0.3")
    started = trio.current_time()
    await model.complete(user_request("rate limited"))
    assert trio.current_time() - started >= 0.3
    assert len(server.requests) == 2


async def test_retries_run_out_with_the_last_provider_error(server):
    model = chat_model(server, retries_max=2)
    server.fail_next(5, status=500)
    with pytest.raises(ProviderError) as caught:
        await model.complete(user_request("never"))
    assert caught.value.status == 500 and caught.value.retryable
    assert "injected failure" in caught.value.body
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_no_retry_on_client_errors(server, status):
    model = chat_model(server, retries_max=3)
    server.fail_next(1, status=status)
    with pytest.raises(ProviderError) as caught:
        await model.complete(user_request("bad"))
    assert caught.value.status == status and not caught.value.retryable
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [408, 409])
async def test_retry_on_408_and_409(server, status):
    model = chat_model(server, retries_max=1)
    server.fail_next(1, status=status)
    assert (await model.complete(user_request("again"))).text == "echo: again"
    assert len(server.requests) == 2


async def test_wrong_key_is_a_provider_error_without_retry(server):
    model = OpenAIChatModel(server.base_url, "sk-wrong", "test-model", backoff=fast_backoff)
    with pytest.raises(ProviderError) as caught:
        await model.complete(user_request("let me in"))
    assert caught.value.status == 401
    assert len(server.requests) == 1


async def test_hung_attempts_time_out_and_are_retried(server):
    model = chat_model(server, request_timeout_seconds=0.2, retries_max=1)
    server.hang_next(2)
    with pytest.raises(ModelTimeout):
        await model.complete(user_request("hello?"))
    assert len(server.requests) == 2


async def test_one_hang_then_success(server):
    model = chat_model(server, request_timeout_seconds=0.2, retries_max=1)
    server.hang_next(1)
    assert (await model.complete(user_request("late"))).text == "echo: late"


async def test_budget_bounds_the_whole_call(server):
    budget = CallBudget(total_seconds_max=0.4)
    model = chat_model(server, request_timeout_seconds=0.25, retries_max=5, budget=budget)
    server.hang_next(10)
    started = trio.current_time()
    with pytest.raises(ModelBudgetExceeded):
        await model.complete(user_request("slow"))
    assert trio.current_time() - started < 1.0
    assert len(server.requests) == 2


async def test_retry_after_beyond_the_budget_fails_at_once(server):
    model = chat_model(server, retries_max=3, budget=CallBudget(total_seconds_max=2.0))
    server.fail_next(1, status=429, retry_after="30")
    started = trio.current_time()
    with pytest.raises(ModelBudgetExceeded) as caught:
        await model.complete(user_request("later"))
    assert trio.current_time() - started < 0.5
    assert isinstance(caught.value.__cause__, ProviderError)


async def test_output_tokens_are_capped_and_checked(server):
    model = chat_model(server, budget=CallBudget(output_tokens_max=16))
    request = user_request("long answer please", max_output_tokens=1_000)
    await model.complete(request)
    assert server.requests[0].body["max_tokens"] == 16
    server.reply_next(ScriptedReply(text="too long", completion_tokens=40))
    with pytest.raises(ModelBudgetExceeded):
        await model.complete(request)
    server.reply_next(ScriptedReply(text="too long", completion_tokens=40))
    with pytest.raises(ModelBudgetExceeded):
        await collect(model, request)


async def test_connection_refused_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChatModel(
        f"http://127.0.0.1:{port}/v1", None, "m", backoff=fast_backoff, retries_max=1
    )
    with pytest.raises(ModelUnavailable) as caught:
        await model.complete(user_request("anyone?"))
    assert caught.value.__cause__ is not None
    await model.aclose()


async def test_stream_is_retried_until_it_opens(server):
    model = chat_model(server, retries_max=2)
    server.fail_next(1, status=502)
    chunks = await collect(model, user_request("retry me"))
    assert "".join(chunk.text_delta for chunk in chunks) == "echo: retry me"
    assert len(server.requests) == 2


async def test_stream_silent_mid_way_times_out(server):
    model = chat_model(server, request_timeout_seconds=0.3)
    server.reply_next(ScriptedReply(text="partial answer here", stream_hang_after_events=2))
    received: list[str] = []
    with pytest.raises(ModelTimeout):
        async with contextlib.aclosing(model.stream(user_request("go"))) as chunks:
            async for chunk in chunks:
                received.append(chunk.text_delta)
    assert received == ["part"]
    assert len(server.requests) == 1


async def test_stream_error_event_is_a_provider_error(server):
    model = chat_model(server)
    server.reply_next(ScriptedReply(text="doomed answer", stream_error=True))
    with pytest.raises(ProviderError) as caught:
        await collect(model, user_request("go"))
    assert "the model crashed" in caught.value.body


def test_backoff_is_exponential_capped_and_jittered():
    backoff = Backoff(initial_seconds=1.0, multiplier=2.0, delay_seconds_max=5.0, jitter_ratio=0.5)
    assert backoff.delay_seconds(0, 0.0) == 1.0
    assert backoff.delay_seconds(1, 0.0) == 2.0
    assert backoff.delay_seconds(2, 0.0) == 4.0
    assert backoff.delay_seconds(3, 0.0) == 5.0
    assert backoff.delay_seconds(1, 1.0) == 1.0
    assert backoff.delay_seconds(1, 0.5) == 1.5
    assert backoff.delay_seconds(9, 0.0, retry_after_seconds=2.5) == 2.5
    assert backoff.delay_seconds(0, 0.0, retry_after_seconds=1e9) == backoff.retry_after_seconds_max


def test_model_from_environment():
    assert model_from_environment({}) is None
    with pytest.raises(ModelConfigurationError):
        model_from_environment({"TROUPE_MODEL_BASE_URL": "http://127.0.0.1:9/v1"})
    model = model_from_environment(
        {
            "TROUPE_MODEL_BASE_URL": "http://127.0.0.1:9/v1/",
            "TROUPE_MODEL_API_KEY": "sk-x",
            "TROUPE_MODEL_NAME": "qwen-plus",
        },
        retries_max=1,
    )
    assert model is not None
    assert model.name == "qwen-plus"
    assert model.base_url == "http://127.0.0.1:9/v1"
    assert model.policy.retries_max == 1


async def test_swapped_transport_runs_in_virtual_time(autojump_clock):
    """What the simulator does: an injected transport, trio's mock clock, a seeded jitter."""
    import httpx

    attempt_times: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempt_times.append(trio.current_time())
        if len(attempt_times) < 3:
            return httpx.Response(503, text="busy")
        return httpx.Response(
            200,
            json={
                "choices": [
                    {"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            },
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel(
            "http://model.invalid/v1",
            None,
            "m",
            client=client,
            random=RecordingJitter(0.0),
            backoff=Backoff(initial_seconds=1.0, multiplier=2.0),
        )
        completion = await model.complete(user_request("hi"))
    assert completion.text == "ok"
    gaps = [
        later - earlier for earlier, later in zip(attempt_times, attempt_times[1:], strict=False)
    ]
    assert gaps == [1.0, 2.0]
