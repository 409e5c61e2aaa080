"""Routes of prepare, memory search and feedback, with their request models.

Why one module for three routes: they share the recall record (a ``recall_id`` from prepare or
search is what feedback names), the memory shape and the source redaction, all of which live
in ``troupe.actors.host`` (``_prepare``, ``_recall``, ``_feedback``).  This module only
validates (strict pydantic: no silent coercion, ``people_limit: true`` is a 400), checks
the optional search ``entry_id`` against the token's scope (403, after its id rules: 400),
and maps domain refusals to the contract's statuses.

``text`` in prepare: omitted (or null) builds a query from the entry's latest messages; ``""``
asks for no query text.  Unknown fields are ignored, as everywhere on this surface.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.host import host_memory_indexes
from troupe.actors.host._feedback import FeedbackRefused, apply_feedback, feedback_memory_ids_max
from troupe.actors.host._prepare import (
    PrepareQuery,
    goal_limit_default,
    goal_limit_max,
    judge_budget_seconds_default,
    known_memory_ids_max,
    memory_limit_default,
    memory_limit_max,
    participant_names_max,
    participants_max,
    people_limit_default,
    people_limit_max,
    prepare_entry,
    recent_limit_default,
    recent_limit_max,
    token_budget_default,
    token_budget_max,
)
from troupe.actors.host._recall import (
    SearchQuery,
    recall_id_prefix,
    search_limit_default,
    search_limit_max,
    search_memories,
)
from troupe.auth import entry_id_problem
from troupe.storage import StorageError

from ._errors import (
    FieldProblem,
    HostError,
    code_entry_forbidden,
    code_invalid_request,
    code_unavailable,
    retry_after_seconds_unknown,
)
from ._gate import admission_of
from ._routes import api_prefix
from ._schemas import _chinese, _path, parse_aware_time

label_characters_max = 200
"""participants, participant_names keys and values, people, kinds, stances."""
filter_values_max = 100
query_text_characters_max = 4000
recall_id_characters_max = 200

refusal_statuses = {
    "recall_not_found": (404, "召回不存在"),
    "recall_forbidden": (403, "该召回属于其他令牌，请用本令牌重新查询"),
    "recall_expired": (400, "召回已过期（有效期 24 小时）"),
    "memory_not_in_recall": (400, "记忆不属于这次召回"),
    "memory_not_found": (404, "记忆已删除"),
}


def _label(value: str) -> str:
    if not 1 <= len(value) <= label_characters_max or not value.strip():
        raise ValueError(f"须为 1—{label_characters_max} 个字符且不能全为空白")
    return value


class PrepareIn(BaseModel):
    """Body of POST /entries/{entry_id}/prepare (``{}`` uses every default)."""

    model_config = ConfigDict(strict=True, extra="ignore", title="PrepareRequest")

    text: str | None = Field(default=None, max_length=query_text_characters_max,
                             description="查询文本；省略则由本入口近期消息自动构造，空字符串表示不提供查询文本")
    participants: list[str] | None = Field(default=None, max_length=participants_max,
                                           description="主体 ID 或无歧义名字；空数组不取人物要点")
    participant_names: dict[str, str] | None = Field(default=None, description="主体 ID（或 participants 中的名字）→ 本次显示名，最多 100 项")
    people_limit: int = Field(default=people_limit_default, ge=0, le=people_limit_max, description="人物摘要人数上限，严格整数 0—3")
    known_memory_ids: list[int] = Field(default_factory=list, max_length=known_memory_ids_max, description="宿主上下文中已有的记忆 ID，从结果中排除")
    recent_limit: int = Field(default=recent_limit_default, ge=0, le=recent_limit_max, description="近期消息条数，默认 20，最多 100")
    memory_limit: int = Field(default=memory_limit_default, ge=0, le=memory_limit_max, description="记忆条数，默认且最多 8")
    token_budget: int = Field(default=token_budget_default, ge=0, le=token_budget_max, description="记忆估算 token 预算，默认且最多 1500")
    goal_limit: int = Field(default=goal_limit_default, ge=0, le=goal_limit_max, description="目标条数，默认且最多 10")
    judge: bool = Field(default=True, description="false 关闭召回判断")
    judge_budget_seconds: float = Field(default=judge_budget_seconds_default, gt=0, le=judge_budget_seconds_default,
                                        description="召回判断预算（秒），默认 10，只能缩短且须大于 0")

    @field_validator("participants")
    @classmethod
    def _participants(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            _label(item)
        return value

    @field_validator("participant_names")
    @classmethod
    def _names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > participant_names_max:
            raise ValueError(f"最多 {participant_names_max} 项")
        for key, name in value.items():
            _label(key)
            _label(name)
        return value

    def query(self) -> PrepareQuery:
        return PrepareQuery(
            text=self.text if "text" in self.model_fields_set else None,
            participants=None if self.participants is None else tuple(self.participants),
            participant_names=self.participant_names,
            people_limit=self.people_limit,
            known_memory_ids=frozenset(self.known_memory_ids),
            recent_limit=self.recent_limit,
            memory_limit=self.memory_limit,
            token_budget=self.token_budget,
            goal_limit=self.goal_limit,
            judge=self.judge,
            judge_budget_seconds=float(self.judge_budget_seconds),
        )


Labels = list[str] | None


class SearchIn(BaseModel):
    """Body of POST /memories/search."""

    model_config = ConfigDict(strict=True, extra="ignore", title="SearchRequest")

    text: str | None = Field(default=None, max_length=query_text_characters_max, description="查询文本；省略或为空时按筛选条件列出")
    entry_id: str | None = Field(default=None, description="可选入口；给出时检查令牌权限，无权返回 403")
    include_forgotten: bool = Field(default=False, description="深度读取遗忘记忆（不恢复）")
    include_goals: bool = Field(default=False, description="返回 goals 分区")
    include_state: bool = Field(default=False, description="返回 state 分区")
    people: Labels = Field(default=None, max_length=filter_values_max, description="只要涉及这些人物的记忆")
    kinds: Labels = Field(default=None, max_length=filter_values_max, description="记忆类型筛选")
    stances: Labels = Field(default=None, max_length=filter_values_max, description="立场筛选")
    time_from: str | None = Field(default=None, max_length=100, description="发生时间下界（带时区 ISO）")
    time_to: str | None = Field(default=None, max_length=100, description="发生时间上界（带时区 ISO）")
    limit: int = Field(default=search_limit_default, ge=1, le=search_limit_max, description="最多 100")

    @field_validator("people", "kinds", "stances")
    @classmethod
    def _labels(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            _label(item)
        return value

    @field_validator("time_from", "time_to")
    @classmethod
    def _aware(cls, value: str | None) -> str | None:
        if value is not None:
            parse_aware_time(value)
        return value

    def query(self) -> SearchQuery:
        def seconds(value: str | None) -> float | None:
            return None if value is None else parse_aware_time(value).timestamp()

        def labels(value: list[str] | None) -> tuple[str, ...] | None:
            return None if value is None else tuple(value)

        return SearchQuery(
            text=self.text, entry_id=self.entry_id, include_forgotten=self.include_forgotten,
            include_goals=self.include_goals, include_state=self.include_state,
            people=labels(self.people), kinds=labels(self.kinds), stances=labels(self.stances),
            time_from=seconds(self.time_from), time_to=seconds(self.time_to), limit=self.limit,
        )


class FeedbackIn(BaseModel):
    """Body of POST /feedback: the memories actually used in the reply."""

    model_config = ConfigDict(strict=True, extra="ignore", title="FeedbackRequest")

    recall_id: str = Field(min_length=1, max_length=recall_id_characters_max, description="prepare 或 search 返回的召回标识")
    memory_ids: list[int] = Field(max_length=feedback_memory_ids_max, description="实际使用的记忆 ID；完全没用可传空数组")


async def _object_body() -> Any:
    """The JSON body (an empty body counts as ``{}``), or ``HostError`` 400."""
    data = await request.get_data(cache=False, as_text=False)
    if not data.strip():
        return {}
    if request.mimetype != "application/json":
        raise HostError(400, code_invalid_request, fields=[FieldProblem("header.content-type", "需要 Content-Type: application/json")])
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "正文须为 UTF-8")]) from None
    except ValueError as exc:
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", f"JSON 格式错误：{exc}")]) from None


def _validated(adapter: TypeAdapter, document: Any) -> Any:
    if not isinstance(document, dict):
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "需要 JSON 对象")])
    try:
        return adapter.validate_python(document)
    except ValidationError as exc:
        fields = [FieldProblem(_path("body", error["loc"]), _chinese(error)) for error in exc.errors()]
        raise HostError(400, code_invalid_request, fields=fields) from None


_prepare_adapter = TypeAdapter(PrepareIn)
_search_adapter = TypeAdapter(SearchIn)
_feedback_adapter = TypeAdapter(FeedbackIn)


def _json(document: Any) -> Response:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=200, content_type="application/json")


def _unavailable(exc: Exception) -> HostError:
    error = HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
    error.__cause__ = exc
    return error


def install_recall_routes(app: QuartTrio, dependencies: Any) -> None:
    """Adds prepare, memories/search and feedback to the host app."""
    env, engine = dependencies.env, dependencies.engine

    async def index() -> Any:
        return await host_memory_indexes.index_for(engine, env.embedder)

    @app.post(f"{api_prefix}/entries/<entry:entry_id>/prepare")
    async def post_prepare(entry_id: str) -> Response:
        admission = admission_of(request.scope)
        assert admission.entry_id == entry_id, "the gate and the router read the same segment"
        body = _validated(_prepare_adapter, await _object_body())
        try:
            document = await prepare_entry(
                engine, await index(), env.model, admission.grant, entry_id, body.query(),
                recall_id=env.ids.new_id(recall_id_prefix), now=env.clock.wall(),
            )
        except StorageError as exc:
            raise _unavailable(exc) from exc
        return _json(document)

    @app.post(f"{api_prefix}/memories/search")
    async def post_search() -> Response:
        grant = admission_of(request.scope).grant
        body = _validated(_search_adapter, await _object_body())
        if body.entry_id is not None:
            problem = entry_id_problem(body.entry_id)
            if problem is not None:
                raise HostError(400, code_invalid_request, fields=[FieldProblem("body.entry_id", problem)])
            if not grant.scope.allows(body.entry_id):
                raise HostError(403, code_entry_forbidden)
        try:
            document = await search_memories(
                engine, await index(), grant, body.query(),
                recall_id=env.ids.new_id(recall_id_prefix), now=env.clock.wall(),
            )
        except StorageError as exc:
            raise _unavailable(exc) from exc
        return _json(document)

    @app.post(f"{api_prefix}/feedback")
    async def post_feedback() -> Response:
        grant = admission_of(request.scope).grant
        body = _validated(_feedback_adapter, await _object_body())
        now = env.clock.wall()
        try:
            outcome = await engine.write(
                lambda connection: apply_feedback(connection, grant, body.recall_id, body.memory_ids, now))
        except StorageError as exc:
            raise _unavailable(exc) from exc
        if isinstance(outcome, FeedbackRefused):
            status, message = refusal_statuses[outcome.reason]
            field = "body.recall_id" if not outcome.positions else None
            fields = ([FieldProblem(field, message)] if field else
                      [FieldProblem(f"body.memory_ids[{position}]", message) for position in outcome.positions])
            raise HostError(status, outcome.reason, message=message, fields=fields)
        return _json({"recall_id": outcome.recall_id, "accepted": list(outcome.accepted),
                      "strengthened": list(outcome.strengthened)})


def recall_openapi_paths() -> dict[str, Any]:
    """The OpenAPI path items of prepare, memories/search and feedback."""
    from ._openapi import _operation

    source = {"type": "object", "properties": {
        "entry_id": {"type": ["string", "null"], "description": "来源入口；不在本令牌范围内时为 null"},
        "entry_name": {"type": ["string", "null"], "description": "来源入口名称；范围外为 null"},
        "message_id": {"type": "integer"},
        "occurred_at": {"type": ["string", "null"], "description": "来源消息的发生时间；范围外为 null"},
    }}
    memory = {"type": "object", "properties": {
        "id": {"type": "integer"}, "content": {"type": "string"}, "kind": {"type": "string"},
        "stance": {"type": "string"}, "lifecycle": {"type": "string"},
        "belief": {"type": "number", "description": "相信程度 0—1"},
        "people": {"type": "array", "items": {"type": "string"}},
        "occurred_at": {"type": "string", "format": "date-time"},
        "forgotten": {"type": "boolean"},
        "reason": {"type": "string", "enum": ["relevant", "person_highlight"]},
        "sources": {"type": "array", "items": source},
        "subject_annotations": {"type": "array", "items": {"type": "object"}},
    }}
    hint = {"type": "object", "required": ["code", "message"], "description": "运行提示；宿主须忽略未知 code",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}
    memories = {"type": "array", "items": memory}
    prepare_response = {"type": "object", "properties": {
        "persona": {"type": "object", "description": "角色描述、版本和更新提示（尚无角色存储时各字段为 null）"},
        "memories": memories,
        "recent_messages": {"type": "array", "description": "本入口近期原始消息，按顺序；unlearned 表示尚未成功学习",
                            "items": {"type": "object"}},
        "state": {"type": "object", "description": "宿主报告的当前活动；无活动为 {}"},
        "goals": {"type": "array", "description": "本入口及全局的当前适用目标和询问（去重待复核且未到兜底时刻的不注入），"
                  "最早截止在前；每项带 hints：deadline_near、deadline_passed、basis_changed、dedup_pending",
                  "items": {"type": "object"}},
        "hints": {"type": "array", "items": hint},
        "entry_profile": {"type": ["object", "null"], "description": "本版尚无画像生成，始终为 null"},
        "people": {"type": "array", "description": "本版尚无人物摘要，始终为 []"},
        "judgment": {"type": "object", "description": "召回判断：applied、disabled、skipped 或 degraded"},
        "recall_id": {"type": "string", "description": "用于 POST /feedback，属于本令牌，有效 24 小时"},
    }}
    search_response = {"type": "object", "properties": {
        "memories": memories, "hints": {"type": "array", "items": hint}, "recall_id": {"type": "string"},
        "goals": {"type": "array", "description": "仅 include_goals 时返回：令牌范围内（给出 entry_id 时为该入口）及全局的"
                  "当前适用目标，形状同 prepare.goals，最多 10 项", "items": {"type": "object"}},
        "state": {"type": "object", "description": "仅 include_state 时返回"},
    }}
    feedback_response = {"type": "object", "properties": {
        "recall_id": {"type": "string"},
        "accepted": {"type": "array", "items": {"type": "integer"}, "description": "本次接受的记忆 ID（去重、保持顺序）"},
        "strengthened": {"type": "array", "items": {"type": "integer"}, "description": "本次新强化的记忆 ID；重试时为空"},
    }}
    entry_parameter = {"name": "entry_id", "in": "path", "required": True, "description": "入口 ID",
                       "schema": {"type": "string", "minLength": 1, "maxLength": 200}}
    return {
        f"{api_prefix}/entries/{{entry_id}}/prepare": {
            "parameters": [entry_parameter],
            "post": _operation(
                "准备回复上下文",
                "返回八个分区及 judgment、recall_id。{} 使用默认值；text 省略时由近期消息自动构造查询，"
                "空字符串表示不提供查询文本。模型失败不会返回 503，而是在 hints 中说明。",
                request=PrepareIn.model_json_schema(), success=("200", "准备结果", prepare_response),
                errors=("400", "401", "403", "413", "429", "503"),
            ),
        },
        f"{api_prefix}/memories/search": {
            "post": _operation(
                "检索记忆",
                "按文本召回或按筛选条件列出记忆；entry_id 给出时检查令牌权限（无权 403）。"
                "include_forgotten 只读取不恢复；来源入口不在令牌范围内时来源元数据为 null。",
                request=SearchIn.model_json_schema(), success=("200", "检索结果", search_response),
                errors=("400", "401", "403", "413", "429", "503"),
            ),
        },
        f"{api_prefix}/feedback": {
            "post": _operation(
                "提交使用反馈",
                "提交回复实际使用的记忆。召回属于发起它的令牌（否则 403），有效 24 小时；过期或记忆不属于该召回返回 400，"
                "召回不存在或记忆已删除返回 404。同一召回和记忆重试不会重复强化。",
                request=FeedbackIn.model_json_schema(), success=("200", "反馈结果", feedback_response),
                errors=("400", "401", "403", "404", "413", "429", "503"),
            ),
        },
    }


__all__ = [
    "FeedbackIn",
    "PrepareIn",
    "SearchIn",
    "install_recall_routes",
    "recall_openapi_paths",
    "refusal_statuses",
]
