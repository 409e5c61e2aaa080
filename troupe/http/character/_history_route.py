"""``/cache``, ``/process``, ``/renew`` and ``/settle`` as a plain ASGI route, outside quart.

Why not quart routes like the others: these four are the surface's hot path (the companion's
main server posts after every turn), and issue 9's target is 1,000 ``/cache`` turns a second.
Quart's per-request machinery (request and app contexts, a second URL match after the gate's,
hooks, the response object) is a fixed cost per request that these routes do not need: the
gate has already checked Host, Origin, the route, limited mode and the name, and bounds the
body.  The host surface's message intake made the same trade (``troupe/http/host/
_intake_route.py``).

Nothing a client can observe differs from the quart routes: the same parsing (``_schemas``:
400 ``{"detail"}`` for a body that is not a JSON object with a string ``input_history``), the
same 200 ``{"status": "error", "message"}`` for an ``input_history`` that is not a message
array, the same 503 with ``Retry-After`` for backpressure (the app's ``ask``), and the same
"other failure" body (``failure_documents``: 200 ``{"status": "error", "message": "internal
error"}``) for a crashed turn or any unexpected exception, which is logged; the process goes
on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from troupe.actors.character import (
    CacheHistory,
    ProcessHistory,
    RenewHistory,
    SettleHistory,
    character_kind_name,
    parse_input_history,
)
from troupe.http import read_request_body, send_answer

from ._errors import CharacterError, encode_document
from ._gate import route_of
from ._schemas import history_text, parse_body

logger = logging.getLogger("troupe.character")

history_requests = {"cache": CacheHistory, "process": ProcessHistory, "renew": RenewHistory, "settle": SettleHistory}
"""The operations this route serves and the character request each one asks."""

json_content_type = "application/json"

Ask = Callable[..., Awaitable[Any]]
ActorFailure = type[Exception]


class HistoryRoute:
    """The ASGI app of the four history routes.  ``ask(kind, key, message)`` is the app's
    asker (backpressure raises ``CharacterError`` 503, a crashed turn ``actor_failed``);
    ``failures`` is the app's ``failure_documents``."""

    def __init__(self, *, ask: Ask, actor_failed: ActorFailure, failures: dict[str, tuple[int, Any]]) -> None:
        self.ask = ask
        self.actor_failed = actor_failed
        self.failures = failures

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        route = route_of(scope)
        assert route.operation is not None and route.operation.name in history_requests
        name = route.operation.name
        headers: dict[str, str] = {}
        try:
            data = await read_request_body(receive)
            if data is None:
                return  # the client disconnected before sending its body: nobody to answer
            status, document = 200, await self._answer(name, route.character_name, data)
        except CharacterError as error:
            status, document, headers = error.status, error.document, error.headers
        except Exception as exc:
            if not isinstance(exc, self.actor_failed):
                logger.exception("character route %s failed", name, exc_info=exc)
            status, document = self.failures[name]
        body = encode_document(document)
        await send_answer(send, status, body, content_type=json_content_type, headers=headers)

    async def _answer(self, name: str, character: str | None, data: bytes) -> Any:
        assert character is not None, "the gate names the character of a history route"
        text = history_text(parse_body(data, required=True))
        messages = parse_input_history(text)
        if isinstance(messages, str):
            return {"status": "error", "message": messages}
        reply = await self.ask(character_kind_name, character, history_requests[name](messages=tuple(messages)))
        return reply.encode()


__all__ = ["HistoryRoute", "history_requests"]
