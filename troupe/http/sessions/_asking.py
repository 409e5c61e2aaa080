"""The actor ask and the request readers both session prefixes share (/v2 in ``_app``, /api in
``api._routes_core``).

Why one module: the two prefixes are two sets of handlers over the same session actors, and
the mapping of a refusal or a runtime failure to a ``SessionsError`` (overloaded / draining with
Retry-After, internal_error) must not drift between them; nor may the reading of a query
integer or a JSON body.  Each prefix renders the error in its own dialect afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart import request

from troupe.actors.sessions import SessionRefused
from troupe.runtime import ActorCrashed, AskTimeout, Overloaded, Unavailable

from ._errors import SessionsError, draining_retry_after_seconds, retry_after_seconds_default
from ._schemas import parse_json

ask_timeout_seconds = 60.0


def make_session_ask(dependencies: Any) -> Callable[..., Any]:
    """``await ask(kind, key, message)``: the reply, or ``SessionsError`` for a refusal or a
    runtime failure (overloaded / draining with Retry-After, internal_error).

    ``dependencies`` has ``system`` (the actor system) and ``shutdown`` (set while draining)."""
    system, shutdown = dependencies.system, dependencies.shutdown

    async def ask(kind: str, key: str, message: Any) -> Any:
        try:
            reply = await system.ref(kind, key).ask(message, timeout=ask_timeout_seconds)
        except (Overloaded, Unavailable) as exc:
            if shutdown.is_set():
                raise SessionsError("draining", retry_after_seconds=draining_retry_after_seconds) from exc
            seconds = max(retry_after_seconds_default, round(exc.retry_after_seconds + 0.5))
            raise SessionsError("overloaded", retry_after_seconds=seconds) from exc
        except AskTimeout as exc:
            raise SessionsError("overloaded") from exc
        except ActorCrashed as exc:
            raise SessionsError("internal_error") from exc
        if isinstance(reply, SessionRefused):
            raise SessionsError.from_refusal(reply)
        return reply

    return ask


def query_integer(name: str, default: int | None, minimum: int, maximum: int | None, *,
                  explain: bool = True) -> int | None:
    """The query argument ``name`` as an integer in ``minimum..maximum`` (no upper bound when
    ``maximum`` is None), ``default`` when absent or empty; else 400 ``validation_failed`` on
    ``query.<name>``, with the allowed range as the message when ``explain`` (the /v2 dialect;
    /api names only the field)."""
    text = request.args.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        problem: dict[str, str] = {"field": f"query.{name}"}
        if explain:
            limit = f"{minimum}–{maximum}" if maximum is not None else f">= {minimum}"
            problem["message"] = f"须为整数 {limit}"
        raise SessionsError("validation_failed", detail={"fields": [problem]})
    return value


async def json_body(empty_as: Any = None) -> Any:
    """The request's JSON body (``empty_as`` for an empty one), read once without caching."""
    return parse_json(await request.get_data(cache=False, as_text=False), empty_as=empty_as)


__all__ = ["ask_timeout_seconds", "json_body", "make_session_ask", "query_integer"]
