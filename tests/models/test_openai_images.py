"""describe_image: OpenAIChatModel's image input against a real OpenAI-compatible server on
127.0.0.1 (wire form, retries, the caller's budget, every shape of content-safety refusal),
and the LocalModel honestly without it."""

from __future__ import annotations

import base64

import pytest
import trio

from tests.models.openai_compatible_server import (
    ScriptedReply,
    content_filter_body,
    image_description,
    open_openai_compatible_server,
)
from troupe.models import (
    Backoff,
    ImageDescriber,
    LocalModel,
    ModelBudgetExceeded,
    ModelConfigurationError,
    ModelRefused,
    ModelResponseInvalid,
    OpenAIChatModel,
    ProviderError,
    describes_images,
    image_description_prompt,
    model_from_environment,
)

png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
fast_backoff = Backoff(initial_seconds=0.01, delay_seconds_max=0.05)


class HalfJitter:
    def random(self) -> float:
        return 0.5


@pytest.fixture
async def server():
    async with open_openai_compatible_server(api_key="sk-test") as running:
        yield running


def vision_model(server, **options) -> OpenAIChatModel:
    options.setdefault("backoff", fast_backoff)
    options.setdefault("random", HalfJitter())
    return OpenAIChatModel(server.base_url, "sk-test", "vision-model", **options)


async def test_an_image_goes_as_a_base64_data_uri_and_the_description_comes_back(server):
    model = vision_model(server)
    assert describes_images(model) and isinstance(model, ImageDescriber)
    description = await model.describe_image(png, "image/png", budget_seconds=10.0)
    assert description == image_description("image/png", png)
    [recorded] = server.requests
    assert recorded.path == "/v1/chat/completions"
    assert recorded.body["model"] == "vision-model"
    assert recorded.body["max_tokens"] <= 512 and "stream" not in recorded.body
    [message] = recorded.body["messages"]
    assert message["role"] == "user"
    assert message["content"] == [
        {"type": "text", "text": image_description_prompt},
        {"type": "image_url",
         "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
    ]
    assert server.images() == [("image/png", png)]


async def test_transient_failures_are_retried_within_the_budget(server):
    model = vision_model(server)
    server.fail_next(2, status=503)
    assert await model.describe_image(png, "image/png", budget_seconds=10.0)
    assert len(server.requests) == 3


async def test_the_callers_budget_bounds_every_attempt(server):
    model = vision_model(server, request_timeout_seconds=30.0)
    server.hang_next(1)
    with trio.fail_after(5):
        with pytest.raises(ModelBudgetExceeded):
            await model.describe_image(png, "image/png", budget_seconds=0.3)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "script",
    ["finish", "refusal", "http"],
)
async def test_content_safety_refusals_are_model_refused_and_never_retried(server, script):
    model = vision_model(server)
    if script == "finish":
        server.reply_next(ScriptedReply(text="", finish_reason="content_filter"))
    elif script == "refusal":
        server.reply_next(ScriptedReply(text=None, refusal="I can't help with that image."))
    else:
        server.fail_next(1, status=400, body=content_filter_body)
    with pytest.raises(ModelRefused):
        await model.describe_image(png, "image/png", budget_seconds=10.0)
    assert len(server.requests) == 1


async def test_other_client_errors_stay_provider_errors(server):
    model = vision_model(server)
    server.fail_next(1, status=400, body='{"error": {"message": "image input is not supported"}}')
    with pytest.raises(ProviderError) as caught:
        await model.describe_image(png, "image/png", budget_seconds=10.0)
    assert not isinstance(caught.value, ModelRefused) and caught.value.status == 400


async def test_an_empty_description_is_invalid(server):
    model = vision_model(server)
    server.reply_next(ScriptedReply(text="   "))
    with pytest.raises(ModelResponseInvalid):
        await model.describe_image(png, "image/png", budget_seconds=10.0)


async def test_images_can_be_switched_off_for_text_only_models():
    model = OpenAIChatModel("http://127.0.0.1:9/v1", None, "text-only", images=False)
    assert not describes_images(model)
    with pytest.raises(ModelConfigurationError):
        await model.describe_image(png, "image/png", budget_seconds=1.0)
    environ = {"TROUPE_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "TROUPE_MODEL_NAME": "m"}
    assert describes_images(model_from_environment(environ))
    assert not describes_images(model_from_environment({**environ, "TROUPE_MODEL_IMAGES": "off"}))


def test_the_local_model_cannot_see():
    model = LocalModel()
    assert not describes_images(model)
    assert not hasattr(model, "describe_image")
