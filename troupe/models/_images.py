"""Image input for the Model port: ``describe_image`` as an optional capability.

Why an optional capability and not image parts in ``ChatMessage``: the only caller that needs
to see images is learning, and it needs them as text (a short description that goes into the
learning material).  Most models behind the port cannot see at all: the ``LocalModel`` is
rule-based, and many OpenAI-compatible servers host text-only models that reject image parts.
So a model that can describe images implements ``ImageDescriber`` and lists
``"describe_image"`` in its ``capabilities``; a caller asks ``describes_images(model)`` and uses
its own fallback text otherwise, instead of sending images to a model that will fail on them.

What one call trades off: one image, one description, one budget.  ``budget_seconds`` bounds
the whole call (every attempt and retry sleep), so a caller that shares one budget across many
images (learning: 120 s per batch) passes what is left of it.  An explicit content-safety
refusal raises ``ModelRefused`` (final: the caller shows its refusal text and never retries
the image another way); any other failure raises the usual ``ModelError`` subclasses.

The wire helpers here build and read OpenAI's chat-completions form of an image request: a
user message whose content is a text part and an ``image_url`` part holding a base64
``data:`` URI (no URL is ever fetched by the provider on our behalf).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ._exceptions import ModelRefused, ModelResponseInvalid, ProviderError

image_content_types = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""What a describer accepts: the image types every vision-capable provider we know takes."""
image_bytes_max = 10 * 1024 * 1024
"""One image's size before base64 (the host contract's 10 MiB upload limit)."""
image_description_tokens_max = 512
"""A description is a few sentences; more is the model rambling at our cost."""
image_description_characters_max = 8_000
"""Longer descriptions are cut: they go into a learning prompt next to many messages."""
image_description_prompt = (
    "请用简洁的中文描述这张图片的内容（一到三句），包括图中可以读出的文字。"
    "只描述看到的内容，不要推测或评价。"
)
capability_describe_image = "describe_image"

_refusal_markers = (
    "content_filter",
    "content_policy_violation",
    "responsibleaipolicyviolation",
    "data_inspection_failed",
    "inappropriate content",
)
"""How OpenAI-compatible providers spell a content-safety refusal in an error body (OpenAI and
Azure OpenAI: ``content_filter`` / ``content_policy_violation`` /
``ResponsibleAIPolicyViolation``; DashScope's compatible mode: ``data_inspection_failed``)."""


@runtime_checkable
class ImageDescriber(Protocol):
    """A model that can say, in text, what an image shows."""

    async def describe_image(
        self, image_bytes: bytes, content_type: str, *, budget_seconds: float
    ) -> str: ...


def describes_images(model: Any) -> bool:
    """Whether ``model`` can describe images: it says so in ``capabilities`` and has the
    method (a capability listed without the method, or the reverse, is not enough)."""
    capabilities = getattr(model, "capabilities", ())
    return capability_describe_image in capabilities and isinstance(model, ImageDescriber)


def check_image(image_bytes: bytes, content_type: str, budget_seconds: float) -> None:
    """The caller's side of the contract; a violation is the caller's bug."""
    assert content_type in image_content_types, content_type
    assert 0 < len(image_bytes) <= image_bytes_max, len(image_bytes)
    assert budget_seconds > 0, budget_seconds


def image_data_uri(image_bytes: bytes, content_type: str) -> str:
    return f"data:{content_type};base64,{base64.b64encode(image_bytes).decode('ascii')}"


def image_request_body(
    model_name: str, image_bytes: bytes, content_type: str, *, max_tokens: int
) -> dict[str, Any]:
    """One chat completion asking for a description of one image."""
    return {
        "model": model_name,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": image_description_prompt},
                    {
                        "type": "image_url",
                        "image_url": {"url": image_data_uri(image_bytes, content_type)},
                    },
                ],
            }
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }


def description_from_wire(decoded: Mapping[str, Any]) -> str:
    """The description in a chat-completions answer; ``ModelRefused`` when the answer is a
    content-safety refusal (``finish_reason: content_filter`` or a ``refusal`` message)."""
    try:
        choice = decoded["choices"][0]
        message = choice.get("message") or {}
        finish_reason = choice.get("finish_reason")
        refusal = message.get("refusal")
        content = message.get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise ModelResponseInvalid(f"unexpected chat completion shape: {exc!r}") from exc
    if finish_reason == "content_filter":
        raise ModelRefused("the provider's content filter stopped the description")
    if isinstance(refusal, str) and refusal.strip():
        raise ModelRefused(f"the model refused: {refusal.strip()[:200]}")
    if not isinstance(content, str) or not content.strip():
        raise ModelResponseInvalid("the image description is empty")
    return content.strip()[:image_description_characters_max]


def refusal_of(error: ProviderError) -> ModelRefused | None:
    """A ``ModelRefused`` when a 4xx error body is a content-safety refusal, else None."""
    if not 400 <= error.status <= 499:
        return None
    body = error.body.lower()
    try:
        decoded = json.loads(error.body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        fields = decoded["error"]
        body = " ".join(str(fields.get(name, "")) for name in ("code", "type", "message")).lower()
        body += " " + json.dumps(fields.get("innererror", "")).lower()
    if any(marker in body for marker in _refusal_markers):
        return ModelRefused(f"the provider refused the image (HTTP {error.status})")
    return None
