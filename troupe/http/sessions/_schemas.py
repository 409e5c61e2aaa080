"""Request models of the sessions surface (pydantic) and their translation to actor requests.

Unknown request keys are ignored (the contract's payload evolution rule), so every model uses
``extra="ignore"``.  A body that is not JSON is 400 ``invalid_json``; JSON that breaks a rule
is 400 ``validation_failed`` with ``detail.fields`` (``[{"field", "message"}]``, paths such as
``body.clientTools[3].name``).  What only the domain can judge (an unknown ``model`` or
``capabilitiesProfile`` alias, a client tool clashing with a built-in) is the actors' call
(400 ``create_failed``), so validation here stays on shape and limits.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from troupe.actors.sessions import (
    ClientToolDeclaration,
    CreateOptions,
    ImageBlock,
    InputBlock,
    PlatformPromptOptions,
    TextBlock,
    max_turns_limit,
    session_id_prefix,
)

from ._errors import SessionsError

client_tools_max = 32
"""Declared client tools per session."""
client_tool_name_pattern = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
client_tool_description_characters_max = 2048
client_tool_timeout_ms_min = 1000
client_tool_timeout_ms_max = 600_000
client_tool_timeout_ms_default = 120_000
prompt_characters_max = 1_000_000
"""A prompt is bounded by the body cap anyway; this keeps a single string sane."""
session_list_limit_min = 1

assert client_tool_timeout_ms_min <= client_tool_timeout_ms_default <= client_tool_timeout_ms_max

ModelT = TypeVar("ModelT", bound=BaseModel)

_model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class ClientToolIn(BaseModel):
    model_config = _model_config

    name: str = Field(pattern=client_tool_name_pattern, description="工具名（字母开头，字母数字下划线，至多 64）")
    description: str = Field(min_length=1, max_length=client_tool_description_characters_max)
    parameters: dict[str, Any] | None = None
    read_only: bool = Field(False, alias="readOnly")
    effects: list[str] | None = None
    timeout_ms: int = Field(client_tool_timeout_ms_default, alias="timeoutMs",
                            ge=client_tool_timeout_ms_min, le=client_tool_timeout_ms_max)


class ThinkingIn(BaseModel):
    model_config = _model_config

    budget: int | None = Field(None, ge=0)


class ResumeIn(BaseModel):
    model_config = _model_config

    session_id: str = Field(alias="sessionId", min_length=1, max_length=200)


class ForkIn(BaseModel):
    model_config = _model_config

    session_id: str = Field(alias="sessionId", min_length=1, max_length=200)
    checkpoint_id: str = Field(alias="checkpointId", min_length=1, max_length=200)


class EndUserIn(BaseModel):
    model_config = _model_config

    id: str = Field(min_length=1)


class PlatformIn(BaseModel):
    model_config = _model_config

    system: str | list[str] | None = None
    system_append: str | list[str] | None = Field(None, alias="systemAppend")
    strategy: Literal["fallback", "prepend"] = "fallback"


class CreateSessionIn(BaseModel):
    """``POST /v2/sessions``: create, or ``resume`` / ``fork`` (mutually exclusive)."""

    model_config = _model_config

    prompt: str | None = Field(None, max_length=prompt_characters_max)
    model: str | None = Field(None, min_length=1, max_length=200)
    tools: list[str] | None = None
    client_tools: Annotated[list[ClientToolIn], Field(max_length=client_tools_max)] | None = Field(None, alias="clientTools")
    capabilities_profile: str | None = Field(None, alias="capabilitiesProfile", min_length=1, max_length=200)
    thinking: ThinkingIn | None = None
    max_turns: int | None = Field(None, alias="maxTurns", ge=1, le=max_turns_limit)
    cwd: str | None = None
    resume: ResumeIn | None = None
    fork: ForkIn | None = None
    end_user: EndUserIn | None = Field(None, alias="endUser")
    platform: PlatformIn | None = None

    @model_validator(mode="before")
    @classmethod
    def _snake_max_turns(cls, data: Any) -> Any:
        # The issue spells it ``max_turns``; camelCase is the contract's habit: accept both.
        if isinstance(data, dict) and "max_turns" in data and "maxTurns" not in data:
            data = {**data, "maxTurns": data["max_turns"]}
        return data

    @model_validator(mode="after")
    def _resume_or_fork(self) -> CreateSessionIn:
        if self.resume is not None and self.fork is not None:
            raise ValueError("resume 与 fork 互斥")
        names = [tool.name for tool in self.client_tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("clientTools 内工具名重复")
        return self

    def session_options(self) -> CreateOptions:
        platform = PlatformPromptOptions()
        if self.platform is not None:
            platform = PlatformPromptOptions(
                system=_texts(self.platform.system),
                system_append=_texts(self.platform.system_append),
                strategy=self.platform.strategy,
            )
        return CreateOptions(
            model=self.model,
            tools=tuple(self.tools) if self.tools is not None else None,
            client_tools=tuple(
                ClientToolDeclaration(
                    name=tool.name, description=tool.description, parameters=tool.parameters,
                    read_only=tool.read_only,
                    effects=tuple(tool.effects) if tool.effects is not None else None,
                    timeout_ms=tool.timeout_ms,
                )
                for tool in self.client_tools or ()
            ),
            capabilities_profile=self.capabilities_profile or "mobile-default",
            thinking_budget=self.thinking.budget if self.thinking is not None else None,
            max_turns=self.max_turns,
            cwd=self.cwd,
            platform=platform,
        )


def _texts(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)


class TextBlockIn(BaseModel):
    model_config = _model_config

    t: Literal["text"]
    text: str


class ImageBlockIn(BaseModel):
    model_config = _model_config

    t: Literal["image"]
    mime: str = Field(pattern=r"^image/[A-Za-z0-9.+-]+$")
    data: str = Field(min_length=1)


class MessageIn(BaseModel):
    """``{prompt}`` or ``{blocks}``, exactly one."""

    model_config = _model_config

    prompt: str | None = Field(None, max_length=prompt_characters_max)
    blocks: Annotated[list[Annotated[TextBlockIn | ImageBlockIn, Field(discriminator="t")]], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> MessageIn:
        if (self.prompt is None) == (self.blocks is None):
            raise ValueError("prompt 与 blocks 必须且只能给出其一")
        return self

    def input_blocks(self) -> tuple[InputBlock, ...] | None:
        if self.blocks is None:
            return None
        return tuple(
            TextBlock(block.text) if isinstance(block, TextBlockIn) else ImageBlock(block.mime, block.data)
            for block in self.blocks
        )


class PermissionIn(BaseModel):
    model_config = _model_config

    digest: str = Field(min_length=1)
    verdict: Literal["allow", "deny"]


class QuestionsIn(BaseModel):
    model_config = _model_config

    answers: list[Any]


class ToolResultIn(BaseModel):
    """``{result, isError?}`` (``output`` or ``content`` are read when ``result`` is absent)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    result: Any = None
    output: Any = None
    content: Any = None
    is_error: bool = Field(False, alias="isError", strict=True)

    @model_validator(mode="after")
    def _some_result(self) -> ToolResultIn:
        if self.result is None and self.output is None and self.content is None:
            raise ValueError("需要 result（或 output / content）")
        return self

    def value(self) -> Any:
        for value in (self.result, self.output, self.content):
            if value is not None:
                return value
        raise AssertionError("validated")


class CheckpointIn(BaseModel):
    """``{name?}`` (``label`` is read when ``name`` is absent)."""

    model_config = _model_config

    name: str | None = Field(None, min_length=1, max_length=200)

    @model_validator(mode="before")
    @classmethod
    def _label_as_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "name" not in data and "label" in data:
            data = {**data, "name": data["label"]}
        return data


class CwdIn(BaseModel):
    model_config = _model_config

    cwd: str = Field(min_length=1, max_length=4096)


session_id_characters_max = 200
"""A path session id longer than this names no session (404 without asking an actor)."""


def session_key(session_id: str) -> str:
    """The actor key of a path's session id; ids never issued (no ``s_`` prefix, too long)
    are 404 ``session_not_found`` without activating an actor."""
    if not session_id.startswith(session_id_prefix) or len(session_id) > session_id_characters_max:
        raise SessionsError("session_not_found")
    return session_id


def parse_json(data: bytes, *, empty_as: Any = None) -> Any:
    """The body as JSON, or 400 ``invalid_json``; an empty body is ``empty_as`` when given."""
    if not data.strip() and empty_as is not None:
        return empty_as
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SessionsError("invalid_json", detail={"reason": str(exc)[:200]}) from None


def validate(model: type[ModelT], document: Any) -> ModelT:
    """``model`` from ``document``, or 400 ``validation_failed`` with the field paths."""
    if not isinstance(document, dict):
        raise SessionsError("validation_failed", detail={"fields": [{"field": "body", "message": "正文须为 JSON 对象"}]})
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        fields = [
            {"field": ".".join(["body", *(str(part) for part in error["loc"])]), "message": error["msg"]}
            for error in exc.errors(include_url=False)
        ]
        raise SessionsError("validation_failed", detail={"fields": fields}) from None


__all__ = [
    "CheckpointIn",
    "ClientToolIn",
    "CreateSessionIn",
    "CwdIn",
    "MessageIn",
    "PermissionIn",
    "QuestionsIn",
    "ToolResultIn",
    "client_tool_description_characters_max",
    "client_tool_name_pattern",
    "client_tool_timeout_ms_default",
    "client_tool_timeout_ms_max",
    "client_tool_timeout_ms_min",
    "client_tools_max",
    "parse_json",
    "prompt_characters_max",
    "session_id_characters_max",
    "session_key",
    "session_list_limit_min",
    "validate",
]
