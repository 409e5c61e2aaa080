"""Request parsing for the character surface: bodies, query parameters, funnel windows, times.

Why hand-written checks rather than pydantic models here: the contract's request shapes are
small and loose (every body is optional except the history routes', ``input_history`` is JSON
inside JSON, booleans arrive as query strings), and each problem must come back as FastAPI's
``{"detail": ...}`` 400 with a sentence saying what was wrong.  The pydantic models below are
for the OpenAPI document, so that the published schemas and these checks describe the same
fields.

Choices where the contract leaves room: a history body that is not a JSON object with a
string ``input_history`` is a 400 (the request's shape is wrong); a string that is not a valid
message array is the contract's failure body, 200 ``{"status": "error", "message"}``, and
nothing is written.  Times are UTC: a funnel ``since``/``until`` without an offset is read as
UTC, and every time in a response is a naive UTC ISO string to the second
(``2026-05-01T00:00:00``), the contract's format.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from pydantic import BaseModel, Field

from troupe.actors.character import (
    claim_token_characters_max,
    claim_tokens_per_character_max,
    reason_characters_max,
    reflection_ids_max,
    reload_names_max,
)

from ._errors import CharacterError, detail_document

funnel_window_seconds_default = 7 * 24 * 3600.0
"""``since`` defaults to this long before ``until`` (the contract: the last seven days)."""

query_characters_max = 2_000
"""``/query_memory`` ``query`` and ``time`` at most this long (a tool call, not a document)."""

claim_generation_max = 2**63 - 1
"""``derived_task_claim_generation`` and published generations fit in SQLite's integer."""

true_words = frozenset({"true", "1", "yes", "on"})
false_words = frozenset({"false", "0", "no", "off"})
"""Query booleans, as FastAPI (pydantic) reads them."""

assert funnel_window_seconds_default > 0


def bad_request(detail: str) -> CharacterError:
    return CharacterError(400, detail_document(400, detail))


# --------------------------------------------------------------------------------- bodies


def parse_body(data: bytes, *, required: bool) -> dict[str, Any]:
    """The body as a JSON object; an empty body is ``{}`` unless ``required``."""
    if not data.strip():
        if required:
            raise bad_request("request body is required: a JSON object")
        return {}
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise bad_request("request body is not valid JSON") from exc
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object")
    return value


def history_text(body: dict[str, Any]) -> str:
    """``input_history`` (still the JSON string; ``parse_input_history`` reads it)."""
    text = body.get("input_history")
    if not isinstance(text, str):
        raise bad_request("input_history is required: a JSON string holding a message array")
    return text


def optional_text(body: dict[str, Any], key: str, characters_max: int) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    if len(value) > characters_max:
        raise bad_request(f"{key} is longer than {characters_max} characters")
    return value


def reason_of(body: dict[str, Any]) -> str | None:
    return optional_text(body, "reason", reason_characters_max)


def reflection_ids_of(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("reflection_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise bad_request("reflection_ids must be an array of non-empty strings")
    if len(value) > reflection_ids_max:
        raise bad_request(f"reflection_ids holds more than {reflection_ids_max} ids")
    return tuple(dict.fromkeys(value))


def _is_generation(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= claim_generation_max


def reload_request(body: dict[str, Any], name_problem: Any) -> tuple[tuple[str, ...], tuple[int, ...], dict[str, tuple[str, ...]]]:
    """``(resume_names, resume_generations, release_claims)`` from a ``/reload`` body;
    ``name_problem(name) -> str | None`` checks every character name."""
    names = body.get("resume_derived_task_names") or []
    generations = body.get("resume_derived_task_generations") or []
    claims = body.get("release_derived_task_claims") or {}
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise bad_request("resume_derived_task_names must be an array of character names")
    if not isinstance(generations, list) or not all(_is_generation(value) for value in generations):
        raise bad_request("resume_derived_task_generations must be an array of non-negative integers")
    if len(names) != len(generations):
        raise bad_request("resume_derived_task_names and resume_derived_task_generations must have the same length")
    if not isinstance(claims, dict):
        raise bad_request("release_derived_task_claims must be an object: {character name: [token, ...]}")
    if len(names) > reload_names_max or len(claims) > reload_names_max:
        raise bad_request(f"a reload names at most {reload_names_max} characters")
    for name in (*names, *claims):
        problem = name_problem(name)
        if problem is not None:
            raise bad_request(f"invalid character name {name!r}: {problem}")
    release: dict[str, tuple[str, ...]] = {}
    for name, tokens in claims.items():
        if not isinstance(tokens, list) or not all(_is_token(token) for token in tokens):
            raise bad_request(f"release_derived_task_claims[{name!r}] must be an array of non-empty tokens "
                              f"of at most {claim_token_characters_max} characters")
        if len(tokens) > claim_tokens_per_character_max:
            raise bad_request(f"release_derived_task_claims[{name!r}] holds more than "
                              f"{claim_tokens_per_character_max} tokens")
        release[name] = tuple(dict.fromkeys(tokens))
    return tuple(names), tuple(generations), release


def _is_token(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= claim_token_characters_max and value.strip() == value


# ----------------------------------------------------------------------- query parameters


def claim_parameters(arguments: Any) -> tuple[str, int, bool]:
    """``(token, generation, hold_admission)`` of ``/release_character``; 400 when the token
    or the generation is missing or malformed."""
    token = arguments.get("derived_task_claim_token")
    if token is None or not _is_token(token):
        raise bad_request("derived_task_claim_token is required: a non-empty string of at most "
                          f"{claim_token_characters_max} characters")
    generation_text = arguments.get("derived_task_claim_generation")
    try:
        generation = int(generation_text) if generation_text is not None else None
    except ValueError:
        generation = None
    if generation is None or not _is_generation(generation):
        raise bad_request("derived_task_claim_generation is required: a non-negative integer")
    hold_text = arguments.get("hold_derived_task_admission")
    if hold_text is None or hold_text == "":
        return token, generation, False
    word = hold_text.strip().lower()
    if word not in true_words | false_words:
        raise bad_request("hold_derived_task_admission must be a boolean")
    return token, generation, word in true_words


def parse_time(text: str, what: str) -> float:
    """An ISO 8601 time as wall seconds; naive times are UTC."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise bad_request(f"{what} is not an ISO 8601 time") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def funnel_window(arguments: Any, now_seconds: float) -> tuple[float, float]:
    """``(since, until)`` with the contract's defaults; 400 when one is not a time or when
    ``since > until``."""
    since_text, until_text = arguments.get("since"), arguments.get("until")
    until = parse_time(until_text, "until") if until_text else now_seconds
    since = parse_time(since_text, "since") if since_text else until - funnel_window_seconds_default
    if since > until:
        raise bad_request("since must not be later than until")
    return since, until


def format_time(seconds: float | None) -> str | None:
    """Wall seconds -> ``2026-05-01T00:00:00`` (naive UTC, to the second)."""
    if seconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.replace(tzinfo=None, microsecond=0).isoformat()


# ------------------------------------------------------------------- OpenAPI body models


class HistoryIn(BaseModel):
    input_history: str = Field(description="JSON 序列化的消息数组：[{\"role\":\"user\"|\"assistant\"|\"system\",\"content\":...}]")


class QueryMemoryIn(BaseModel):
    query: str | None = Field(None, max_length=query_characters_max, description="语义查询文本")
    time: str | None = Field(None, max_length=query_characters_max,
                             description="时间 token（小时 2026-05-01T14、日、月、年）或以 / 或 .. 分隔的闭区间")


class ReloadIn(BaseModel):
    resume_derived_task_names: list[str] = Field(default_factory=list, max_length=reload_names_max)
    resume_derived_task_generations: list[int] = Field(default_factory=list, max_length=reload_names_max)
    release_derived_task_claims: dict[str, list[str]] = Field(default_factory=dict)


class ReasonIn(BaseModel):
    reason: str | None = Field(None, max_length=reason_characters_max)


class RecordSurfacedIn(BaseModel):
    reflection_ids: list[str] = Field(default_factory=list, max_length=reflection_ids_max)


__all__ = [
    "HistoryIn",
    "QueryMemoryIn",
    "ReasonIn",
    "RecordSurfacedIn",
    "ReloadIn",
    "bad_request",
    "claim_generation_max",
    "claim_parameters",
    "format_time",
    "funnel_window",
    "funnel_window_seconds_default",
    "history_text",
    "optional_text",
    "parse_body",
    "parse_time",
    "query_characters_max",
    "reason_of",
    "reflection_ids_of",
    "reload_request",
]
