"""Request models of the host API (pydantic) and their translation to entry-actor messages.

Why validation happens in two passes: the contract gives byte limits (``content`` and
``quote_content``, 32768 UTF-8 bytes, answered with 413) and character limits (answered with
400).  Byte limits are checked first, on the raw JSON, so a too-large message is reported as
413 even when other fields are also wrong; otherwise every character, type and rule problem of
every message is reported at once as 400, with paths such as ``body.occurred_at`` (one object)
or ``body[3].content`` (an array).  A batch with any problem is refused whole.

Unknown request fields are ignored (compatible additions; an old ``host`` field never
overrides the token's name).  Models are strict: no silent coercion of numbers to strings.

Why a second, hand-written validator: pydantic cost about 8 µs per message (a third of a
100-message batch's time in the event loop).  ``_plain_message`` accepts only the plain case
(every field of the right type and length, a named pace at most) and builds exactly the
``NewMessage`` the model would; anything else, valid or not, goes through pydantic, so every
error message and field path still comes from the model (``tests/http/host`` pin them and
a test checks that both agree).
"""

from __future__ import annotations

import datetime
import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from troupe.actors.host import (
    NewMessage,
    Pace,
    messages_per_batch_max,
    named_paces,
    pace_count_max,
    pace_idle_seconds_max,
    pace_idle_seconds_min,
    pace_max_wait_seconds_max,
)

from ._errors import FieldProblem, HostError, code_invalid_request, code_payload_too_large
from ._routes import content_bytes_max

name_characters_max = 200
"""sender, entry_name, account_id, scene_identity, quote_author, quote_author_account_id."""
short_characters_max = 100
"""platform, entry_kind, occurred_at."""
dedupe_key_characters_max = 300
quote_content_characters_max = 32_768
media_ids_max = 100
media_id_characters_max = 100

message_kinds = ("message", "self_output", "action_result", "event")
MessageKind = Literal["message", "self_output", "action_result", "event"]
MediaId = str
"""Media object ids are opaque strings (the media work may narrow the format)."""


class CustomPace(BaseModel):
    """``{"count","idle_seconds","max_wait_seconds"}``; ``max_wait_seconds >= idle_seconds``."""

    model_config = ConfigDict(strict=True, extra="forbid")

    count: int = Field(ge=1, le=pace_count_max, description="攒够多少条消息即开始学习")
    idle_seconds: float = Field(ge=pace_idle_seconds_min, le=pace_idle_seconds_max, description="多久没有新消息即开始学习（秒）")
    max_wait_seconds: float = Field(ge=pace_idle_seconds_min, le=pace_max_wait_seconds_max, description="最早一条待学习消息最多等待多久（秒）")

    @model_validator(mode="after")
    def _wait_covers_idle(self) -> CustomPace:
        if self.max_wait_seconds < self.idle_seconds:
            raise ValueError("max_wait_seconds 不能小于 idle_seconds")
        return self

    def pace(self) -> Pace:
        return Pace(self.count, float(self.idle_seconds), float(self.max_wait_seconds))


def _pace_branch(value: Any) -> str:
    return "custom" if isinstance(value, dict | CustomPace) else "named"


PaceIn = Annotated[
    Annotated[str, Tag("named")] | Annotated[CustomPace, Tag("custom")],
    Discriminator(_pace_branch),
]
"""A named pace or a custom one; error paths read ``body.pace.named`` / ``body.pace.custom.count``."""


class MessageIn(BaseModel):
    """One message posted by a host."""

    model_config = ConfigDict(strict=True, extra="ignore", title="Message")

    sender: str = Field(max_length=name_characters_max, description="发言者显示名")
    content: str = Field(description="正文，可为空；最多 32768 个 UTF-8 字节")
    occurred_at: str = Field(max_length=short_characters_max, description="带时区的 ISO 8601 发生时间")
    dedupe_key: str = Field(min_length=1, max_length=dedupe_key_characters_max, description="平台去重键；重试必须沿用")
    account_id: str | None = Field(default=None, max_length=name_characters_max, description="稳定账号 ID，用于区分同名账号")
    kind: MessageKind = Field(default="message", description="message、self_output、action_result 或 event")
    quote_author: str | None = Field(default=None, max_length=name_characters_max, description="被引用原话的作者")
    quote_author_account_id: str | None = Field(default=None, max_length=name_characters_max, description="被引用作者的账号 ID")
    quote_content: str | None = Field(default=None, max_length=quote_content_characters_max, description="被引用的原话；最多 32768 个 UTF-8 字节")
    media_ids: list[MediaId] = Field(default_factory=list, max_length=media_ids_max, description="POST /media 返回的对象 ID，最多 100 个，不得重复，保留顺序")
    entry_name: str | None = Field(default=None, max_length=name_characters_max, description="入口名称（仅首次创建入口时使用）")
    entry_kind: str | None = Field(default=None, max_length=short_characters_max, description="入口类型（仅首次创建入口时使用）")
    pace: PaceIn | None = Field(default=None, description="学习节奏：命名节奏或自定义对象（仅首次创建入口时使用）")
    scene_identity: str | None = Field(default=None, max_length=name_characters_max, description="场景身份")
    platform: str | None = Field(default=None, max_length=short_characters_max, description="平台名")

    @field_validator("occurred_at")
    @classmethod
    def _aware_time(cls, value: str) -> str:
        parse_aware_time(value)
        return value

    @field_validator("media_ids")
    @classmethod
    def _unique_media(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("media_ids 不得重复")
        for media_id in value:
            if not 1 <= len(media_id) <= media_id_characters_max:
                raise ValueError(f"媒体 ID 须为 1—{media_id_characters_max} 个字符")
        return value

    @field_validator("pace")
    @classmethod
    def _known_pace(cls, value: str | CustomPace | None) -> str | CustomPace | None:
        if isinstance(value, str) and value not in named_paces:
            raise ValueError(f"未知节奏 {value!r}，可用：{'、'.join(named_paces)}")
        return value

    def to_new_message(self) -> NewMessage:
        moment = parse_aware_time(self.occurred_at)
        pace = None
        if isinstance(self.pace, str):
            pace = named_paces[self.pace]
        elif isinstance(self.pace, CustomPace):
            pace = self.pace.pace()
        return NewMessage(
            dedupe_key=self.dedupe_key, sender=self.sender, content=self.content,
            occurred_at=moment.isoformat(), occurred_at_seconds=moment.timestamp(),
            kind=self.kind, account_id=self.account_id, quote_author=self.quote_author,
            quote_author_account_id=self.quote_author_account_id,
            quote_content=self.quote_content, scene_identity=self.scene_identity,
            platform=self.platform, media_ids=tuple(self.media_ids), entry_name=self.entry_name,
            entry_kind=self.entry_kind, pace=pace,
        )


class MessagesAccepted(BaseModel):
    """Response of POST /entries/{entry_id}/messages."""

    message_ids: list[int] = Field(description="按输入顺序的消息 ID；重复去重键返回原消息 ID")
    pending_count: int = Field(description="本入口 pending / batched 消息数，不是新生成记忆数")


_message_adapter = TypeAdapter(MessageIn)


def parse_aware_time(value: str) -> datetime.datetime:
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("需要带时区的 ISO 时间") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("需要带时区的 ISO 时间")
    return moment


def _path(base: str, location: tuple[Any, ...]) -> str:
    text = base
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _chinese(error: Any) -> str:
    kind = error["type"]
    context = error.get("ctx") or {}
    if kind == "missing":
        return "缺少必填字段"
    if kind == "string_type":
        return "需要字符串"
    if kind == "string_too_long":
        return f"最多 {context.get('max_length')} 个字符"
    if kind == "string_too_short":
        return f"至少 {context.get('min_length')} 个字符"
    if kind == "too_long":
        return f"最多 {context.get('max_length')} 项"
    if kind == "literal_error":
        return f"取值须为 {context.get('expected')}"
    if kind in ("int_type", "int_from_float"):
        return "需要整数"
    if kind == "float_type":
        return "需要数字"
    if kind in ("greater_than_equal", "less_than_equal"):
        bound = context.get("ge", context.get("le"))
        return f"须{'不小于' if kind == 'greater_than_equal' else '不大于'} {bound}"
    if kind in ("greater_than", "less_than"):
        bound = context.get("gt", context.get("lt"))
        return f"须{'大于' if kind == 'greater_than' else '小于'} {bound}"
    if kind == "too_short":
        return f"至少 {context.get('min_length')} 项"
    if kind == "bool_type":
        return "需要 true 或 false"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "需要 JSON 对象"
    if kind == "list_type":
        return "需要数组"
    if kind == "extra_forbidden":
        return "不支持的字段"
    if kind == "value_error":
        return str(context.get("error", error["msg"]))
    return str(error["msg"])


_plain_fields: tuple[tuple[str, int], ...] = (
    ("account_id", name_characters_max),
    ("quote_author", name_characters_max),
    ("quote_author_account_id", name_characters_max),
    ("quote_content", quote_content_characters_max),
    ("scene_identity", name_characters_max),
    ("platform", short_characters_max),
    ("entry_name", name_characters_max),
    ("entry_kind", short_characters_max),
)
"""Optional text fields and their character limits, as ``MessageIn`` declares them."""

_message_kind_set = frozenset(message_kinds)


def _plain_text(value: Any, characters_max: int) -> bool:
    """A str within the limit that pydantic would take (it refuses lone surrogates)."""
    if type(value) is not str or len(value) > characters_max:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _plain_message(item: Any) -> NewMessage | None:
    """The message ``MessageIn`` would make of ``item`` when ``item`` is the plain case, else
    None (then pydantic decides, and reports any problem)."""
    if type(item) is not dict:
        return None
    sender, content = item.get("sender"), item.get("content")
    occurred_at, dedupe_key = item.get("occurred_at"), item.get("dedupe_key")
    if not (
        _plain_text(sender, name_characters_max)
        and _plain_text(content, len(content) if type(content) is str else 0)
        and _plain_text(occurred_at, short_characters_max)
        and _plain_text(dedupe_key, dedupe_key_characters_max)
        and dedupe_key
    ):
        return None
    optional: dict[str, Any] = {}
    for name, characters_max in _plain_fields:
        value = item.get(name)
        if value is not None and not _plain_text(value, characters_max):
            return None
        optional[name] = value
    kind = item.get("kind", "message")
    if type(kind) is not str or kind not in _message_kind_set:
        return None
    media_ids = item.get("media_ids", [])
    if type(media_ids) is not list:
        return None
    if media_ids:
        if not all(_plain_text(media_id, media_id_characters_max) and media_id for media_id in media_ids):
            return None
        if len(media_ids) > media_ids_max or len(set(media_ids)) != len(media_ids):
            return None
    pace = item.get("pace")
    if pace is not None:
        if type(pace) is not str or pace not in named_paces:
            return None
        pace = named_paces[pace]
    try:
        moment = parse_aware_time(occurred_at)
    except ValueError:
        return None
    return NewMessage(
        dedupe_key=dedupe_key, sender=sender, content=content,
        occurred_at=moment.isoformat(), occurred_at_seconds=moment.timestamp(),
        kind=kind, media_ids=tuple(media_ids), pace=pace, **optional,
    )


def _byte_problems(base: str, item: Any) -> list[FieldProblem]:
    problems = []
    if isinstance(item, dict):
        for name in ("content", "quote_content"):
            value = item.get(name)
            if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > content_bytes_max:
                problems.append(FieldProblem(f"{base}.{name}", f"最多 {content_bytes_max} 个 UTF-8 字节"))
    return problems


json_media_type = "application/json"


def decode_json_body(media_type: str, data: bytes) -> Any:
    """The request body as JSON, or ``HostError`` 400 (content type, encoding, syntax).
    ``media_type`` is the Content-Type without parameters, lower case."""
    if media_type != json_media_type:
        problem = FieldProblem("header.content-type", "需要 Content-Type: application/json")
        raise HostError(400, code_invalid_request, fields=[problem])
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "正文须为 UTF-8")]) from None
    except ValueError as exc:
        problem = FieldProblem("body", f"JSON 格式错误：{exc}")
        raise HostError(400, code_invalid_request, fields=[problem]) from None


def parse_message_batch(document: Any) -> list[NewMessage]:
    """One object or an array of 1..1000: validated messages, or ``HostError`` (413/400)."""
    if isinstance(document, dict):
        items = [("body", document)]
    elif isinstance(document, list):
        if not 1 <= len(document) <= messages_per_batch_max:
            problem = FieldProblem("body", f"数组须包含 1—{messages_per_batch_max} 条消息")
            raise HostError(400, code_invalid_request, fields=[problem])
        items = [(f"body[{index}]", item) for index, item in enumerate(document)]
    else:
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "需要 JSON 对象或数组")])
    too_large = [problem for base, item in items for problem in _byte_problems(base, item)]
    if too_large:
        # ``field``: the legacy member of this response, which the contract keeps.
        raise HostError(413, code_payload_too_large, fields=too_large, extra={"field": too_large[0].field})
    problems: list[FieldProblem] = []
    messages: list[NewMessage] = []
    for base, item in items:
        plain = _plain_message(item)
        if plain is not None:
            messages.append(plain)
            continue
        try:
            model = _message_adapter.validate_python(item)
        except ValidationError as exc:
            problems.extend(FieldProblem(_path(base, error["loc"]), _chinese(error)) for error in exc.errors())
            continue
        messages.append(model.to_new_message())
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)
    return messages


__all__ = [
    "CustomPace",
    "MessageIn",
    "MessagesAccepted",
    "dedupe_key_characters_max",
    "media_ids_max",
    "message_kinds",
    "name_characters_max",
    "parse_aware_time",
    "parse_message_batch",
    "quote_content_characters_max",
    "short_characters_max",
]
