"""Application prompts: how a session's system prompt is composed (the contract's
"在平台或宿主配置应用角色").

A mobile app never sends its system prompt in a turn's ``prompt``; the role comes from three
places, composed here once per turn start (a changed configuration reaches the *next* turn,
the running one keeps what it started with):

- the platform segment: the platform's configured application prompt (``platform_system``),
  or the platform default (``platform_default``) when none is configured;
- the SDK segments (``platform.system`` of the create request, code-managed business text):
  ``None`` when the client omitted it, ``()`` when it sent ``[]`` explicitly;
- the host's supplement (``platform.systemAppend``), always last.

Strategies: ``fallback`` (the default) lets explicit SDK segments, even ``[]``, *replace* the
platform segment, and uses the platform segment only when they are omitted; ``prepend`` keeps
the platform segment first and the SDK segments after it, even when they are ``[]``.

It composes text only: it grants nothing (tools and permissions are decided elsewhere).  The
summary answers ``GET …?include=applicationPrompt``: where the text came from and how it was
composed, never the text itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

PromptStrategy = Literal["fallback", "prepend"]

prompt_strategies: tuple[str, ...] = ("fallback", "prepend")

segment_separator = "\n\n"

system_prompt_chars_max = 200_000
"""A composed prompt longer than this is cut (a runaway configuration, not a conversation)."""


def compose_system_prompt(
    platform_default: str,
    platform_system: str | Sequence[str] | None,
    platform_system_append: str | Sequence[str] | None,
    strategy: PromptStrategy = "fallback",
    sdk_segments: Sequence[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The system prompt text and its text-free summary; see the module docstring."""
    assert strategy in prompt_strategies, strategy
    configured = _segments(platform_system)
    platform_segments = configured if platform_system is not None else _segments(platform_default)
    platform_source = "platform" if platform_system is not None else "default"
    if strategy == "fallback" and sdk_segments is not None:
        segments = list(sdk_segments)
        source = "sdk"
        platform_included = False
    else:
        segments = platform_segments + list(sdk_segments or ())
        source = platform_source
        platform_included = True
    appended = _segments(platform_system_append)
    segments += appended
    text = segment_separator.join(segment for segment in segments if segment.strip())
    summary: dict[str, Any] = {
        "source": source,
        "strategy": strategy,
        "platformSegment": platform_source if platform_included else "replaced",
        "sdkSegments": None if sdk_segments is None else len(sdk_segments),
        "appendSegments": len(appended),
    }
    return text[:system_prompt_chars_max], summary


def _segments(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(segment) for segment in value]


__all__ = [
    "PromptStrategy",
    "compose_system_prompt",
    "prompt_strategies",
    "segment_separator",
    "system_prompt_chars_max",
]
