"""``POST /api/v1/media``: JSON with Base64, checked against the allow-list and file headers.

Why checks run in this order: the gate already counted the transfer body (14 MiB, streaming,
Content-Length not trusted).  Then the JSON shape and the entry id (400), the upload entry's
scope (403: the entry sits in the body, so this is the first moment it can be checked), byte
limits (413: the decoded size is computed from the Base64 length before anything is decoded,
and the understanding text in UTF-8 bytes), and only then the work of decoding: strict
standard Base64 with padding (anything that does not re-encode to the same text, such as a
``data:`` prefix, newlines, the URL-safe alphabet or missing padding, is 400) and the file
header against the declared MIME type (400).  Nothing is stored unless every check passed;
the media actor then writes the file, the object and its authorisation record in one
transaction and the reply (201) is sent after the commit.  No model is called.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from troupe.actors.host import (
    MediaSaved,
    MediaUnavailable,
    SaveMedia,
    detect_media_type,
    media_bytes_max,
    media_header_matches,
    media_kind_name,
    media_store_key,
    media_types,
    understanding_text_bytes_max,
)
from troupe.auth import entry_id_problem

from ._errors import (
    FieldProblem,
    HostError,
    code_entry_forbidden,
    code_invalid_request,
    code_payload_too_large,
    code_unavailable,
    retry_after_seconds_unknown,
)
from ._gate import admission_of
from ._routes import api_prefix, media_body_bytes_max

media_path = f"{api_prefix}/media"

assert media_bytes_max * 4 // 3 < media_body_bytes_max, "a full-size file must fit the transfer limit"


def decoded_bytes_of(text: str) -> int:
    """The decoded size of standard padded Base64 ``text`` (exact when it is valid)."""
    return len(text) // 4 * 3 - text[-2:].count("=")


def strict_base64(text: str) -> bytes | None:
    """The bytes of standard Base64 with padding, or None for anything else (``data:``
    prefixes, whitespace, URL-safe letters, missing or extra padding, non-canonical bits)."""
    if not text.isascii() or len(text) % 4:
        return None
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
    except binascii.Error:
        return None
    return data if base64.b64encode(data).decode("ascii") == text else None


def _shape_problems(document: dict[str, Any]) -> list[FieldProblem]:
    problems = []
    entry_id = document.get("entry_id")
    if not isinstance(entry_id, str):
        problems.append(FieldProblem("body.entry_id", "缺少必填字段" if entry_id is None else "需要字符串"))
    elif (problem := entry_id_problem(entry_id)) is not None:
        problems.append(FieldProblem("body.entry_id", problem))
    content_type = document.get("content_type")
    if not isinstance(content_type, str):
        problems.append(FieldProblem("body.content_type", "缺少必填字段" if content_type is None else "需要字符串"))
    elif content_type.strip().lower() not in media_types:
        allowed = "、".join(media_types)
        problems.append(FieldProblem("body.content_type", f"不支持的媒体类型；可用：{allowed}"))
    data = document.get("data_base64")
    if not isinstance(data, str):
        problems.append(FieldProblem("body.data_base64", "缺少必填字段" if data is None else "需要字符串"))
    understanding = document.get("understanding_text")
    if understanding is not None and not isinstance(understanding, str):
        problems.append(FieldProblem("body.understanding_text", "需要字符串或 null"))
    return problems


def validate_upload(document: Any, allows: Any) -> tuple[str, str, bytes, str | None]:
    """``(entry_id, content_type, data, understanding_text)`` or ``HostError`` (400/403/413)."""
    if not isinstance(document, dict):
        raise HostError(400, code_invalid_request, fields=[FieldProblem("body", "需要 JSON 对象")])
    problems = _shape_problems(document)
    entry_id = document.get("entry_id")
    if problems and any(problem.field == "body.entry_id" for problem in problems):
        raise HostError(400, code_invalid_request, fields=problems)
    if not allows(entry_id):
        raise HostError(403, code_entry_forbidden, fields=[FieldProblem("body.entry_id", "令牌无权访问该入口")])
    if problems:
        raise HostError(400, code_invalid_request, fields=problems)
    text: str = document["data_base64"]
    understanding: str | None = document.get("understanding_text")
    too_large = []
    if decoded_bytes_of(text) > media_bytes_max:
        too_large.append(FieldProblem("body.data_base64", f"解码后最多 {media_bytes_max} 字节"))
    if understanding is not None and len(understanding.encode("utf-8", "surrogatepass")) > understanding_text_bytes_max:
        too_large.append(FieldProblem("body.understanding_text", f"最多 {understanding_text_bytes_max} 个 UTF-8 字节"))
    if too_large:
        raise HostError(413, code_payload_too_large, fields=too_large)
    data = strict_base64(text)
    if data is None:
        problem = FieldProblem("body.data_base64", "需要标准 Base64（标准字母表、带填充，不含 data: 前缀或换行）")
        raise HostError(400, code_invalid_request, fields=[problem])
    assert len(data) <= media_bytes_max
    content_type = document["content_type"].strip().lower()
    if not media_header_matches(content_type, data):
        detected = detect_media_type(data)
        seen = f"（文件头像是 {detected}）" if detected else ""
        problem = FieldProblem("body.data_base64", f"文件头与 {content_type} 不符{seen}")
        raise HostError(400, code_invalid_request, fields=[problem])
    return entry_id, content_type, data, understanding


def install_media_routes(app: QuartTrio, dependencies: Any) -> None:
    """Register ``POST /api/v1/media`` on the host app."""
    # Imported here: ``_app`` imports this module to register the route.
    from ._app import _json, _json_body, ask_actor

    system = dependencies.system

    @app.post(media_path)
    async def post_media() -> Response:
        admission = admission_of(request.scope)
        document = await _json_body()
        entry_id, content_type, data, understanding = validate_upload(document, admission.grant.scope.allows)
        command = SaveMedia.of(entry_id, content_type, data, understanding, admission.grant.name)
        reply = await ask_actor(system, media_kind_name, media_store_key, command)
        if isinstance(reply, MediaUnavailable):
            raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
        assert isinstance(reply, MediaSaved)
        return _json(reply.media.document(), 201)


def media_openapi_paths() -> dict[str, Any]:
    """The OpenAPI path item of ``POST /media`` (merged into the surface's document)."""
    from ._openapi import _operation

    request_schema = {
        "type": "object",
        "required": ["entry_id", "content_type", "data_base64"],
        "properties": {
            "entry_id": {"type": "string", "minLength": 1, "maxLength": 200, "description": "上传入口；令牌须有权访问"},
            "content_type": {"type": "string", "enum": list(media_types), "description": "MIME 类型；须与文件头一致"},
            "data_base64": {"type": "string", "description": f"标准 Base64（带填充，无 data: 前缀、无换行）；解码后最多 {media_bytes_max} 字节"},
            "understanding_text": {"type": ["string", "null"], "description": f"宿主对媒体的理解，最多 {understanding_text_bytes_max} 个 UTF-8 字节；空白视作未理解"},
        },
    }
    response_schema = {
        "type": "object",
        "required": ["id", "sha256", "content_type", "size_bytes", "kind", "understanding_source",
                     "understanding_text", "completed_at", "last_error"],
        "properties": {
            "id": {"type": "string", "description": "对象 ID，用于消息的 media_ids；每次上传都是新 ID"},
            "sha256": {"type": "string", "description": "文件 SHA-256（小写十六进制）；同字节文件共享存储"},
            "content_type": {"type": "string"},
            "size_bytes": {"type": "integer"},
            "kind": {"type": "string", "enum": ["image", "audio", "video"]},
            "understanding_source": {"type": ["string", "null"], "description": "host 表示宿主提供的理解；null 表示尚未理解"},
            "understanding_text": {"type": ["string", "null"]},
            "completed_at": {"type": ["string", "null"], "format": "date-time", "description": "理解完成时间"},
            "last_error": {"type": ["string", "null"]},
        },
    }
    return {
        media_path: {
            "post": _operation(
                "上传媒体",
                "JSON Base64 上传（不接受 multipart、URL 或文件路径）。白名单：PNG、JPEG、GIF、WebP、MP3、WAV、"
                "Ogg、FLAC、MP4、WebM，同时校验 MIME 与文件头，不符返回 400。解码后最多 10 MiB，传输正文最多"
                f" {media_body_bytes_max} 字节（流式计数），超限返回 413。每次上传产生新对象 ID，同字节文件共享存储；"
                "上传入口的授权记录与对象同一事务提交。没有消息引用的对象宽限 1 天后清理。上传不调用模型。",
                request=request_schema,
                success=("201", "已保存；返回当时的理解状态", response_schema),
                errors=("400", "401", "403", "413", "429", "503"),
            ),
        },
    }


__all__ = [
    "decoded_bytes_of",
    "install_media_routes",
    "media_openapi_paths",
    "media_path",
    "strict_base64",
    "validate_upload",
]
