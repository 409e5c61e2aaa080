"""Which request is which, before any framework code runs: API paths, entry segments and the
body limit of each route.

The gate needs this to check an entry's scope before the body is read and to pick the body
limit per route, while quart's router only runs later.  Keeping the table here (and tested)
means adding a route is one line in each place rather than a guess in the middleware.
"""

from __future__ import annotations

api_prefix = "/api/v1"
entries_prefix = f"{api_prefix}/entries/"
entry_actions = frozenset({"messages", "prepare", "learn"})
"""``/api/v1/entries/{entry_id}/{action}``: the routes whose path names an entry."""

state_body_bytes_max = 32_768
goal_body_bytes_max = 32_768
media_body_bytes_max = 14 * 1024 * 1024
messages_body_bytes_max = 64 * 1024 * 1024
other_body_bytes_max = 256 * 1024
"""The contract's transfer limits (state and goal bodies, media, message batches, other
writes), counted while streaming whatever Content-Length says."""

content_bytes_max = 32_768
"""One message's ``content`` / ``quote_content`` in UTF-8 bytes (413, never truncated)."""

assert other_body_bytes_max < media_body_bytes_max < messages_body_bytes_max
assert content_bytes_max < other_body_bytes_max

body_limits = (
    state_body_bytes_max,
    media_body_bytes_max,
    messages_body_bytes_max,
    other_body_bytes_max,
)


def is_api_path(path: str) -> bool:
    return path == api_prefix or path.startswith(api_prefix + "/")


def entry_segment(path: str) -> str | None:
    """The entry id of ``/api/v1/entries/{entry_id}/{action}`` (the ASGI-decoded text between
    the prefix and the last ``/action``, slashes and colons included), else None."""
    if not path.startswith(entries_prefix):
        return None
    entry_id, separator, action = path[len(entries_prefix):].rpartition("/")
    if not separator or action not in entry_actions:
        return None
    return entry_id


intake_route_path = f"{entries_prefix}{{entry_id}}/messages"
raw_routes: dict[str, frozenset[str]] = {intake_route_path: frozenset({"POST"})}
"""Routes served by plain ASGI handlers beside quart (path template -> methods)."""


def is_intake_path(path: str) -> bool:
    """``/api/v1/entries/{entry_id}/messages``: served by ``IntakeRoute``, not by quart."""
    return path.endswith("/messages") and entry_segment(path) is not None


def body_bytes_max_for(method: str, path: str) -> int:
    """The transfer limit of a request (GETs get the small default; they carry no body)."""
    if path == f"{api_prefix}/state" and method in ("PUT", "PATCH", "DELETE"):
        return state_body_bytes_max
    if (path == f"{api_prefix}/goals" and method == "POST") or (
        path.startswith(f"{api_prefix}/goals/") and method == "PATCH"
    ):
        return goal_body_bytes_max
    if path == f"{api_prefix}/media" and method == "POST":
        return media_body_bytes_max
    if method == "POST" and path.endswith("/messages") and entry_segment(path) is not None:
        return messages_body_bytes_max
    return other_body_bytes_max


__all__ = [
    "api_prefix",
    "body_bytes_max_for",
    "body_limits",
    "content_bytes_max",
    "entries_prefix",
    "entry_actions",
    "entry_segment",
    "goal_body_bytes_max",
    "is_api_path",
    "media_body_bytes_max",
    "messages_body_bytes_max",
    "other_body_bytes_max",
    "state_body_bytes_max",
]
