"""``POST /api/v1/entries/{entry_id}/messages`` as a plain ASGI route, outside quart.

Why not a quart route like the others: message intake is the host surface's hot path (hosts
post every message of every chat), and the issue's target is single-message intake at half
the request rate of a bare quart hello world.  Quart's per-request machinery (request and app
contexts, URL adapter, before/after hooks, response object) is a fixed cost that a bare hello
world pays too, so it alone kept intake below the target.  This route does only what intake
needs: read the body, validate it (``_schemas.parse_message_batch``, the same validation),
ask the entry actor, answer.  It runs behind the same gate (Host, readiness, token, rate, entry
scope, per-route ``BodyLimit``) and renders errors with the same ``error_response_parts``, so
nothing a client can observe differs from the quart routes: any method but POST answers 400
``method_not_allowed`` with ``Allow: POST``, as werkzeug's routing does for the others.

The one quart behaviour reproduced by hand is the crash boundary: an unexpected exception is
logged and answered 500 ``internal_error``; the process goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from troupe.actors.host import (
    AcceptMessages,
    MediaRefused,
    MessagesAccepted,
    StorageUnavailable,
    entry_kind_name,
)
from troupe.http import read_request_body, send_answer
from troupe.storage import StorageError

from ._errors import (
    FieldProblem,
    HostError,
    code_internal_error,
    code_media_not_found,
    code_method_not_allowed,
    code_unavailable,
    encode_document,
    error_document,
    error_response_parts,
    retry_after_seconds_unknown,
)
from ._gate import admission_of
from ._schemas import decode_json_body, json_media_type, parse_message_batch

allowed_methods = "POST"

logger = logging.getLogger("troupe.host")

Ask = Callable[[Any, str, str, Any], Awaitable[Any]]


class IntakeRoute:
    """The ASGI app of the intake path.  ``ask(system, kind, key, message)`` is the app's
    ``ask_actor`` (runtime failures become 503/500 ``HostError``s)."""

    def __init__(self, *, system: Any, ask: Ask, wall: Callable[[], float]) -> None:
        self.system = system
        self.ask = ask
        self.wall = wall

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            if scope["method"] != "POST":
                raise HostError(400, code_method_not_allowed, headers={"Allow": allowed_methods})
            data = await read_request_body(receive)
            if data is None:
                return  # the client disconnected before sending its body: nobody to answer
            status, headers, body = 200, {}, await self._accept(scope, data)
        except HostError as error:
            status, headers, body = error_response_parts(error, self.wall())
        except StorageError:
            unavailable = HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
            status, headers, body = error_response_parts(unavailable, self.wall())
        except Exception:
            logger.exception("unhandled error in the host intake route")
            status, headers, body = 500, {}, encode_document(error_document(code_internal_error))
        await send_answer(send, status, body, content_type=json_media_type, headers=headers)

    async def _accept(self, scope: Any, data: bytes) -> bytes:
        admission = admission_of(scope)
        assert admission.entry_id is not None, "the gate names the entry of an intake path"
        document = decode_json_body(_media_type(scope), data)
        messages = parse_message_batch(document)
        base = "body[{}]" if isinstance(document, list) else "body"
        reply = await self.ask(
            self.system, entry_kind_name, admission.entry_id, AcceptMessages(tuple(messages), admission.grant)
        )
        if isinstance(reply, MediaRefused):
            fields = [
                FieldProblem(f"{base.format(index)}.media_ids[{position}]", "媒体对象不存在或不可引用")
                for index, position, _ in reply.refusals
            ]
            raise HostError(404, code_media_not_found, fields=fields)
        if isinstance(reply, StorageUnavailable):
            raise HostError(503, code_unavailable, retry_after_seconds=retry_after_seconds_unknown)
        assert isinstance(reply, MessagesAccepted)
        answer = {"message_ids": list(reply.message_ids), "pending_count": reply.pending_count}
        return json.dumps(answer, separators=(",", ":")).encode("ascii")


def _media_type(scope: Any) -> str:
    """The Content-Type without parameters, lower case ('' when absent)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-type":
            return value.decode("latin-1").partition(";")[0].strip().lower()
    return ""


__all__ = ["IntakeRoute"]
