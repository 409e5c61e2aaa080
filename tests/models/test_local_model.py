"""LocalModel: deterministic, offline, and only claiming what it does."""

from __future__ import annotations

import contextlib
import json

import trio

from troupe.models import (
    ChatMessage,
    CompletionRequest,
    CpuBoundModel,
    Fact,
    LocalModel,
    Model,
    ToolSpec,
    extract_facts,
    summarise,
    unsupported_reply,
    user_request,
)

conversation = (
    "我喜欢吃寿司。明天我打算去上海出差。你喜欢什么？我住在杭州。"
    "I really love hiking in the mountains. I'm going to visit Paris next May. "
    "The weather was nice. Do you like tea? I live in Berlin. My favorite color is green."
)


def test_it_is_a_model_with_declared_capabilities():
    model = LocalModel()
    assert isinstance(model, Model)
    assert model.name == "local"
    assert model.capabilities == {"extract_facts", "summarise", "json_object", "stream"}
    assert "converse" not in model.capabilities and "tool_calls" not in model.capabilities


def test_extracts_stated_preferences_plans_and_personal_facts():
    assert extract_facts(conversation) == [
        Fact("preference", "我喜欢吃寿司。"),
        Fact("plan", "明天我打算去上海出差。"),
        Fact("personal", "我住在杭州。"),
        Fact("preference", "I really love hiking in the mountains."),
        Fact("plan", "I'm going to visit Paris next May."),
        Fact("personal", "I live in Berlin."),
        Fact("preference", "My favorite color is green."),
    ]


def test_questions_and_plain_statements_are_not_facts():
    assert extract_facts("你喜欢什么？Do you like tea? The sky is blue. 今天天气不错。") == []
    assert extract_facts("") == []


def test_summary_is_extractive_central_and_in_order():
    text = (
        "Caroline went to the LGBTQ support group. The weather was bad. "
        "The support group was inspiring for Caroline. Melanie painted a sunrise. "
        "Caroline wants to study counseling after the support group."
    )
    summary = summarise(text, 2)
    assert summary == (
        "Caroline went to the LGBTQ support group. The support group was inspiring for Caroline."
    )
    assert "weather" not in summarise(text, 3) and "Melanie" not in summarise(text, 3)
    assert summarise("一句话。", 3) == "一句话。"
    assert summarise("我们去公园。公园里有很多人。我们在公园野餐。天气很热。", 2) == (
        "我们去公园。我们在公园野餐。"
    )


async def test_json_mode_is_always_a_valid_minimal_object():
    model = LocalModel()
    completion = await model.complete(user_request(conversation, response_format="json"))
    answer = json.loads(completion.text)
    assert set(answer) == {"facts", "summary"}
    assert answer["facts"][0] == {"kind": "preference", "text": "我喜欢吃寿司。"}
    assert completion.finish_reason == "stop"
    tight = await model.complete(
        user_request(conversation, response_format="json", max_output_tokens=40)
    )
    assert set(json.loads(tight.text)) == {"facts", "summary"}
    assert tight.finish_reason == "length"
    assert tight.usage.completion_tokens <= 40


async def test_text_tasks_follow_the_instruction_keywords():
    model = LocalModel()
    facts = await model.complete(user_request(conversation, system="Extract the user's facts."))
    assert facts.text.splitlines()[:2] == ["- 我喜欢吃寿司。", "- 明天我打算去上海出差。"]
    summary = await model.complete(user_request(conversation, system="请总结这段对话"))
    assert summary.text == model.summarise(conversation)
    chat = await model.complete(user_request("How are you today?"))
    assert chat.text == unsupported_reply
    assert chat.finish_reason == "stop"


async def test_never_pretends_to_call_tools():
    model = LocalModel()
    request = CompletionRequest(
        messages=[ChatMessage("user", "What's the weather in Paris? Call the tool.")],
        tools=[ToolSpec("weather", "weather for a city")],
    )
    completion = await model.complete(request)
    assert completion.tool_calls == ()
    assert completion.finish_reason == "stop"


async def test_is_deterministic_and_truncates_honestly():
    model = LocalModel()
    request = user_request(conversation, system="summarise", max_output_tokens=5)
    first = await model.complete(request)
    second = await model.complete(request)
    assert first == second
    assert first.finish_reason == "length"
    assert first.usage.completion_tokens == 5


async def test_stream_joins_to_the_completion():
    model = LocalModel()
    request = user_request(conversation, system="extract facts")
    async with contextlib.aclosing(model.stream(request)) as chunks:
        received = [chunk async for chunk in chunks]
    completion = await model.complete(request)
    assert "".join(chunk.text_delta for chunk in received) == completion.text
    assert received[-1].finish_reason == "stop"
    assert received[-1].usage == completion.usage
    assert len(received) > 2


async def test_complete_sync_is_the_same_answer_from_any_thread():
    model = LocalModel()
    assert isinstance(model, CpuBoundModel)
    requests = [user_request(conversation, system="extract facts"), user_request(conversation, system="summarise"),
                CompletionRequest((ChatMessage("user", conversation),), response_format="json")]
    for request in requests:
        expected = await model.complete(request)
        assert model.complete_sync(request) == expected
        assert await trio.to_thread.run_sync(model.complete_sync, request) == expected
