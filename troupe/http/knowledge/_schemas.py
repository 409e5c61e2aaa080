"""Request models of the knowledge surface (pydantic) and their translation to actor requests.

Why pydantic here and the rules again in the actors: the contract answers every schema
failure 400 ``INVALID_REQUEST`` with a message naming the field (``field 'source_type' must be
one of: ...``), and the recovery endpoint must rebuild "the complete original request" through
the very model of its endpoint (§3.2c): the hash is taken over what the server rebuilt
(``to_request(...).canonical()``), never over the client's bytes and never a client hash.

Strictness: types are strict (``"3"`` is not an integer, ``1`` is not a boolean: ``approved``
must be a real boolean); unknown keys are ignored (FastAPI's default, which the contract's
clients were written against), so they never change a request's hash either.  Bodies are
parsed with ``NaN``/``Infinity`` refused: the store keeps strict JSON.

The store's own size limits (raw evidence, context, provenance, lifecycle data, titles) are
checked here, so an oversized part is a 400 with a message, not a failed write job.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from troupe.actors.knowledge import (
    BuildAgentContext,
    ExtractPreferences,
    ForgetMemory,
    PromoteContexts,
    Provenance,
    QueryMemory,
    RecordLifecycle,
    UpdateKnowledge,
    WriteMemory,
    agent_context_characters_default,
    agent_context_characters_max,
    agent_context_characters_min,
    agent_context_top_k_default,
    agent_context_top_k_max,
    agent_context_top_k_min,
    evidence_raw_bytes_max,
    evidence_side_bytes_max,
    freshness_seconds_default,
    idempotency_key_problem,
    knowledge_title_characters_max,
    lifecycle_data_bytes_max,
    preference_evidence_ids_max,
    promote_context_ids_max,
    query_top_k_default,
    query_top_k_max,
    query_top_k_min,
    recovery_reason_problem,
    scope_problem,
)

from ._errors import KnowledgeError, code_invalid_request

query_text_characters_max = 4_000
"""``/memory/query`` text and ``/agent/context`` query (the recall slice's limit)."""
identifier_characters_max = 256
"""session, run, turn, tool-call ids, tool names, knowledge/evidence/context ids."""
freshness_seconds_max = 10 * 365 * 86_400
forget_command_characters_max = 1_000
time_range_characters_max = 64
occurred_at_seconds_max = 253_402_300_799
"""9999-12-31T23:59:59Z: a Unix time beyond it is not a time."""

ModelT = TypeVar("ModelT", bound=BaseModel)

_config = ConfigDict(extra="ignore", strict=True)

Identifier = Annotated[str, Field(min_length=1, max_length=identifier_characters_max)]
UnixSeconds = Annotated[int, Field(ge=0, le=occurred_at_seconds_max)]


def _compact_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def _bounded(value: dict[str, Any] | None, bytes_max: int, what: str) -> dict[str, Any] | None:
    if value is not None and _compact_bytes(value) > bytes_max:
        raise ValueError(f"{what} is larger than {bytes_max} bytes")
    return value


def _checked_scope(value: str) -> str:
    problem = scope_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _checked_key(value: str | None) -> str | None:
    if value is not None:
        problem = idempotency_key_problem(value)
        if problem is not None:
            raise ValueError(problem)
    return value


def _blank(value: str | None) -> bool:
    return value is None or not value.strip()


class ProvenanceIn(BaseModel):
    model_config = _config

    session_id: Identifier | None = None
    run_id: Identifier | None = None
    turn_id: Identifier | None = None
    occurred_at: UnixSeconds | None = None
    tool_call_id: Identifier | None = None
    tool_name: Identifier | None = None
    approved: bool | None = None

    def missing(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if getattr(self, name) is None
                or (isinstance(getattr(self, name), str) and not getattr(self, name).strip())]

    def to_provenance(self) -> Provenance:
        return Provenance(**self.model_dump())


turn_provenance_fields = ("session_id", "run_id", "turn_id", "occurred_at")
tool_provenance_fields = (*turn_provenance_fields, "tool_call_id", "tool_name", "approved")


class MemoryWriteIn(BaseModel):
    """``POST /memory/write`` (§3.1)."""

    model_config = _config

    source_type: Literal["OCR", "TOOL_RESULT", "USER_BEHAVIOR", "MANUAL_CONFIG", "CONVERSATION"] = Field(
        description="来源类型")
    raw: dict[str, Any] = Field(description="原始结构化内容（CONVERSATION 仅含 user/assistant）")
    scope: str = Field(description="user:<name> 或 shared:<domain>")
    context: dict[str, Any] | None = Field(None, description="采集上下文（设备、触发事件）")
    provenance: ProvenanceIn | None = Field(None, description="Agent 来源（独立持久化）")
    idempotency_key: str | None = Field(None, description="1～128 位字母、数字、. _ : -")

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str) -> str:
        return _checked_scope(value)

    @field_validator("idempotency_key")
    @classmethod
    def check_key(cls, value: str | None) -> str | None:
        return _checked_key(value)

    @field_validator("raw")
    @classmethod
    def check_raw_size(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _bounded(value, evidence_raw_bytes_max, "raw")  # type: ignore[return-value]

    @field_validator("context")
    @classmethod
    def check_context_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _bounded(value, evidence_side_bytes_max, "context")

    @model_validator(mode="after")
    def check_source_rules(self) -> MemoryWriteIn:
        if self.source_type == "CONVERSATION":
            for name in ("user", "assistant"):
                value = self.raw.get(name)
                if not isinstance(value, str) or not value.strip():
                    raise ValueError(f"CONVERSATION needs a non-empty raw.{name}")
            extra = sorted(set(self.raw) - {"user", "assistant"})
            if extra:
                raise ValueError(f"CONVERSATION raw holds only user and assistant (found {extra[0]!r}); "
                                 "session and turn ids belong in provenance")
            self.require_agent(turn_provenance_fields)
        elif self.source_type == "TOOL_RESULT" and self.provenance is not None:
            self.require_agent(tool_provenance_fields)
        return self

    def require_agent(self, fields: tuple[str, ...]) -> None:
        if self.provenance is None:
            raise ValueError(f"{self.source_type} needs provenance with {', '.join(fields)}")
        missing = self.provenance.missing(fields)
        if missing:
            raise ValueError(f"{self.source_type} provenance needs {missing[0]}")
        if self.idempotency_key is None:
            raise ValueError(f"{self.source_type} needs an idempotency_key")

    def to_request(self) -> WriteMemory:
        return WriteMemory(source_type=self.source_type, raw=self.raw, scope=self.scope, context=self.context,
                           provenance=None if self.provenance is None else self.provenance.to_provenance(),
                           idempotency_key=self.idempotency_key)


class MemoryUpdateIn(BaseModel):
    """``POST /memory/update`` (§3.1a)."""

    model_config = _config

    knowledge_id: Identifier
    expected_version: int = Field(ge=1, description="召回时的 version")
    scope: str = Field(description="必须与目标条目完全一致")
    title: str | None = Field(None, min_length=1, max_length=knowledge_title_characters_max)
    body: dict[str, Any] | None = None
    provenance: ProvenanceIn | None = Field(None, description="Agent 调用时必填，approved 必须为 true")
    idempotency_key: str | None = None

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str) -> str:
        return _checked_scope(value)

    @field_validator("idempotency_key")
    @classmethod
    def check_key(cls, value: str | None) -> str | None:
        return _checked_key(value)

    @field_validator("body")
    @classmethod
    def check_body_size(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _bounded(value, evidence_raw_bytes_max, "body")

    @model_validator(mode="after")
    def check_rules(self) -> MemoryUpdateIn:
        if self.title is None and self.body is None:
            raise ValueError("title or body is required")
        if self.title is not None and not self.title.strip():
            raise ValueError("title must not be blank")
        if self.provenance is not None:
            missing = self.provenance.missing(tool_provenance_fields)
            if missing:
                raise ValueError(f"agent provenance needs {missing[0]}")
            if self.provenance.approved is not True:
                raise ValueError("agent updates need provenance.approved = true")
        return self

    def to_request(self) -> UpdateKnowledge:
        return UpdateKnowledge(knowledge_id=self.knowledge_id, expected_version=self.expected_version,
                               scope=self.scope, title=self.title, body=self.body,
                               provenance=None if self.provenance is None else self.provenance.to_provenance(),
                               idempotency_key=self.idempotency_key)


class ContextHintIn(BaseModel):
    model_config = _config

    time_range: str | None = Field(None, max_length=time_range_characters_max,
                                   description="today / last_month / 2026-04 ...")
    scope: str | None = None
    top_k: int = Field(query_top_k_default, ge=query_top_k_min, le=query_top_k_max)

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str | None) -> str | None:
        return None if value is None else _checked_scope(value)


class MemoryQueryIn(BaseModel):
    """``POST /memory/query`` (§3.2)."""

    model_config = _config

    text: str = Field(min_length=1, max_length=query_text_characters_max)
    context_hint: ContextHintIn | None = None

    @field_validator("text")
    @classmethod
    def check_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text must not be blank")
        return value

    def to_request(self) -> QueryMemory:
        hint = self.context_hint or ContextHintIn()
        return QueryMemory(text=self.text, scope=hint.scope, time_range=hint.time_range, top_k=hint.top_k)


class AgentContextIn(BaseModel):
    """``POST /agent/context`` (§3.2a)."""

    model_config = _config

    query: str = Field("", max_length=query_text_characters_max)
    scope: str
    session_id: Identifier
    turn_id: Identifier
    top_k: int = Field(agent_context_top_k_default, ge=agent_context_top_k_min, le=agent_context_top_k_max)
    max_chars: int = Field(agent_context_characters_default, ge=agent_context_characters_min,
                           le=agent_context_characters_max)
    freshness_seconds: int = Field(freshness_seconds_default, ge=0, le=freshness_seconds_max,
                                   description="只决定 fresh|stale 标签，不放宽任何过滤")

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str) -> str:
        return _checked_scope(value)

    @model_validator(mode="after")
    def check_ids(self) -> AgentContextIn:
        if _blank(self.session_id) or _blank(self.turn_id):
            raise ValueError("session_id and turn_id must not be blank")
        return self

    def to_request(self) -> BuildAgentContext:
        return BuildAgentContext(query=self.query, scope=self.scope, session_id=self.session_id,
                                 turn_id=self.turn_id, top_k=self.top_k, max_chars=self.max_chars,
                                 freshness_seconds=self.freshness_seconds)


class LifecycleIn(BaseModel):
    """``POST /agent/lifecycle`` (§3.2b)."""

    model_config = _config

    event: Literal["TURN_START", "TURN_END", "PRE_COMPRESS", "SESSION_SWITCH", "SESSION_END", "DELEGATION"]
    scope: str
    session_id: Identifier
    run_id: Identifier | None = None
    turn_id: Identifier | None = None
    occurred_at: UnixSeconds
    idempotency_key: str
    data: dict[str, Any] = Field(description="非空对象")

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str) -> str:
        return _checked_scope(value)

    @field_validator("idempotency_key")
    @classmethod
    def check_key(cls, value: str | None) -> str | None:
        return _checked_key(value)

    @field_validator("data")
    @classmethod
    def check_data(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            raise ValueError("data must be a non-empty object")
        return _bounded(value, lifecycle_data_bytes_max, "data")  # type: ignore[return-value]

    @model_validator(mode="after")
    def check_turn(self) -> LifecycleIn:
        if self.event in ("TURN_START", "TURN_END") and _blank(self.turn_id):
            raise ValueError(f"{self.event} needs turn_id")
        if _blank(self.session_id):
            raise ValueError("session_id must not be blank")
        return self

    def to_request(self) -> RecordLifecycle:
        return RecordLifecycle(event=self.event, scope=self.scope, session_id=self.session_id,
                               idempotency_key=self.idempotency_key, occurred_at=self.occurred_at,
                               data=self.data, run_id=self.run_id, turn_id=self.turn_id)


class RecoverIn(BaseModel):
    """``POST /agent/idempotency/recover`` (§3.2c); ``original_request`` is rebuilt through
    the model of ``operation``'s endpoint."""

    model_config = _config

    operation: Literal["MEMORY_WRITE", "MEMORY_UPDATE", "LIFECYCLE"]
    original_request: dict[str, Any] = Field(description="完整且未修改的原请求")
    confirm_duplicate_risk: bool = Field(description="必须为 true")
    reason: str = Field(description="去除首尾空白后 3～256 字符")

    @field_validator("confirm_duplicate_risk")
    @classmethod
    def check_confirmed(cls, value: bool) -> bool:
        if value is not True:
            raise ValueError("confirm_duplicate_risk must be true")
        return value

    @field_validator("reason")
    @classmethod
    def check_reason(cls, value: str) -> str:
        problem = recovery_reason_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value.strip()


recovery_models: dict[str, type[MemoryWriteIn] | type[MemoryUpdateIn] | type[LifecycleIn]] = {
    "MEMORY_WRITE": MemoryWriteIn,
    "MEMORY_UPDATE": MemoryUpdateIn,
    "LIFECYCLE": LifecycleIn,
}


class PreferenceExtractIn(BaseModel):
    """``POST /preference/extract`` (§3.5)."""

    model_config = _config

    evidence_ids: list[Identifier] = Field(min_length=1, max_length=preference_evidence_ids_max)

    def to_request(self) -> ExtractPreferences:
        return ExtractPreferences(evidence_ids=tuple(dict.fromkeys(self.evidence_ids)))


class ForgetIn(BaseModel):
    """``POST /forget`` (§3.8)."""

    model_config = _config

    command: str = Field(min_length=1, max_length=forget_command_characters_max)
    confirm: bool = False
    scope: str | None = Field(None, description="可选：只在该作用域内遗忘")
    confirmation_token: Identifier | None = Field(None, description="confirm=false 时返回的令牌（可选）")

    @field_validator("command")
    @classmethod
    def check_command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("command must not be blank")
        return value

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str | None) -> str | None:
        return None if value is None else _checked_scope(value)

    def to_request(self) -> ForgetMemory:
        return ForgetMemory(command=self.command, confirm=self.confirm, scope=self.scope,
                            confirmation_token=self.confirmation_token)


class PromoteIn(BaseModel):
    """``POST /memory/flow/promote`` (§3.10)."""

    model_config = _config

    source: Literal["SHORT_TERM", "MID_TERM"]
    context_ids: list[Identifier] = Field(min_length=1, max_length=promote_context_ids_max)
    scope: str

    @field_validator("scope")
    @classmethod
    def check_scope(cls, value: str) -> str:
        return _checked_scope(value)

    def to_request(self) -> PromoteContexts:
        return PromoteContexts(source=self.source, context_ids=tuple(self.context_ids), scope=self.scope)


# -- parsing -----------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def parse_json_body(data: bytes) -> Any:
    """The body as strict JSON (400 ``INVALID_REQUEST`` otherwise)."""
    if not data.strip():
        raise KnowledgeError(code_invalid_request, "the request body is required (a JSON object)")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise KnowledgeError(code_invalid_request, "the request body is not valid JSON") from exc


def validation_message(error: ValidationError) -> str:
    """``field 'a.b[2]': <what is wrong>`` for the first problem pydantic found."""
    first = error.errors(include_url=False, include_input=False)[0]
    path = ""
    for part in first.get("loc", ()):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    if first.get("type") == "literal_error" and path:
        expected = first.get("ctx", {}).get("expected", "")
        return f"field '{path}' must be one of: {expected.replace(chr(39), '')}"
    return f"field '{path}': {message}" if path else message


def validated(model: type[ModelT], document: Any, *, code: str = code_invalid_request) -> ModelT:
    """``document`` through ``model``; a failure is 400 ``code`` with the first problem."""
    if not isinstance(document, dict):
        raise KnowledgeError(code, "the request body must be a JSON object")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise KnowledgeError(code, validation_message(exc)) from exc


__all__ = [
    "AgentContextIn",
    "ContextHintIn",
    "ForgetIn",
    "LifecycleIn",
    "MemoryQueryIn",
    "MemoryUpdateIn",
    "MemoryWriteIn",
    "PreferenceExtractIn",
    "PromoteIn",
    "ProvenanceIn",
    "RecoverIn",
    "forget_command_characters_max",
    "freshness_seconds_max",
    "identifier_characters_max",
    "parse_json_body",
    "query_text_characters_max",
    "recovery_models",
    "validated",
    "validation_message",
]
