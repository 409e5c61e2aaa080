"""The messages the HTTP layer sends to a session actor, and the replies it gets back.

A session is the virtual actor ``("session", session_id)`` (``session_kind_name``); the
per-end-user admission and listing actor is ``("end_user", end_user_id)``.  The HTTP slice
validates and authenticates a request, turns it into one of the frozen request dataclasses
below and asks the actor; the actor answers with a reply dataclass or a ``SessionRefused``.

Errors inside the domain are reply values, never exceptions: a refusal carries the contract's
/v2 code (``refusal_statuses`` lists every code the actors use and its HTTP status, so the
HTTP layer and the actors agree on one table) and, for 429 / 503, the seconds for
``Retry-After``.  Exceptions that do escape an actor are our bugs (500 ``internal_error``).

Every request carries the authenticated ``end_user_id`` (the actor checks ownership itself, so
no route can forget it) and ``via``, the prefix the request came through (``"v2"`` or
``"api"``): the actor remembers which prefixes touched it and logs ``api.legacy_prefix_mixed``
once when both did, without an extra round trip.  All requests are keyword-only.

Times in replies are integer milliseconds of the Env's wall clock, as the contract wants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from troupe.runtime import Env

session_kind_name = "session"
end_user_kind_name = "end_user"
session_id_prefix = "s_"

OpenMode = Literal["create", "resume", "fork"]
SessionStatus = Literal["running", "idle", "ended"]
Via = Literal["v2", "api"]
PromptStrategy = Literal["fallback", "prepend"]


def new_session_id(env: Env) -> str:
    """A fresh session id from the Env (never uuid4: simulator replays must repeat it)."""
    return session_id_prefix + env.ids.new_id()


# ---------------------------------------------------------------------------------------------
# Refusals and acknowledgements
# ---------------------------------------------------------------------------------------------

refusal_statuses: dict[str, int] = {
    # The contract's /v2 table.
    "unauthorized": 401,
    "forbidden": 403,
    "session_not_found": 404,
    "session_ended": 409,
    "session_limit_exceeded": 429,
    "resume_unavailable": 409,
    "create_failed": 400,
    "validation_failed": 400,
    "invalid_json": 400,
    "payload_too_large": 413,
    "turn_running": 409,
    "checkpoints_not_wired": 409,
    "checkpoint_not_found": 404,
    "session_mismatch": 409,
    "cwd_not_allowed": 400,
    "cwd_invalid": 400,
    "cwd_unavailable": 409,
    "overloaded": 503,
    "draining": 503,
    "upstream_unavailable": 503,
    "rate_limited": 429,
    "internal_error": 500,
    "store_corrupted": 500,
    # Bridge and input outcomes the contract names by status only ("重复 409", "取消后 410",
    # "digest 不符 409", "运行中注入 blocks 恒 422").
    "midturn_blocks_rejected": 422,
    "request_not_found": 404,
    "request_already_answered": 409,
    "request_cancelled": 410,
    "digest_mismatch": 409,
    # Strict inputs (``_inputs``): the SDK's input path.
    "input_conflict": 409,
    "input_target_stale": 409,
    "input_target_closed": 409,
    "input_not_found": 404,
    "input_limit_exceeded": 422,
    "capability_disabled": 404,
}
"""Every code a session or end-user actor may refuse with, and its HTTP status."""


@dataclass(frozen=True)
class SessionRefused:
    """The request was refused; ``code`` is a key of ``refusal_statuses``."""

    code: str
    message: str
    detail: dict[str, Any] | None = None
    retry_after_seconds: float | None = None

    def __post_init__(self) -> None:
        assert self.code in refusal_statuses, self.code

    @property
    def status(self) -> int:
        return refusal_statuses[self.code]


@dataclass(frozen=True)
class Accepted:
    """202 ``{sessionId, accepted: true}`` (messages, interrupt, close), 200 ``{accepted: true}``
    (bridge answers) or 204 (checkpoint delete): the route knows which."""

    session_id: str

    def encode(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "accepted": True}


# ---------------------------------------------------------------------------------------------
# Validated create options
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientToolDeclaration:
    """One entry of ``clientTools``, already validated against the contract's shape by the
    HTTP layer (name pattern, description 1–2048, timeoutMs 1000–600000); the kernel's
    profiles check the clash with built-in tools and the count."""

    name: str
    description: str
    parameters: dict[str, Any] | None = None
    read_only: bool = False
    effects: tuple[str, ...] | None = None
    timeout_ms: int = 120_000


@dataclass(frozen=True)
class PlatformPromptOptions:
    """``platform.system`` / ``platform.systemAppend`` and the composition strategy.

    ``system`` is ``None`` when omitted (the platform default applies) and ``()`` when the
    client sent ``[]`` explicitly, which the ``fallback`` strategy honours.
    """

    system: tuple[str, ...] | None = None
    system_append: tuple[str, ...] | None = None
    strategy: PromptStrategy = "fallback"


@dataclass(frozen=True)
class CreateOptions:
    """What a session is assembled from; stored with the session so a resume reassembles the
    same thing (capability changes only reach new and reassembled sessions)."""

    model: str | None = None
    tools: tuple[str, ...] | None = None
    """The allow-list from the create request; it can only narrow the profile's tools."""
    client_tools: tuple[ClientToolDeclaration, ...] = ()
    capabilities_profile: str = "mobile-default"
    thinking_budget: int | None = None
    max_turns: int | None = None
    cwd: str | None = None
    platform: PlatformPromptOptions = field(default_factory=PlatformPromptOptions)


@dataclass(frozen=True)
class TextBlock:
    text: str


@dataclass(frozen=True)
class ImageBlock:
    mime: str
    data: str
    """Base64 text as the client sent it."""


InputBlock = TextBlock | ImageBlock


# ---------------------------------------------------------------------------------------------
# Requests (HTTP layer → ("session", id))
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SessionRequest:
    end_user_id: str
    via: Via = "v2"


@dataclass(frozen=True, kw_only=True)
class OpenSession(SessionRequest):
    """``POST /v2/sessions``: sent to the actor of the session being created, resumed or forked.

    - ``create``: the key is a fresh ``new_session_id``; ``options`` are stored.
    - ``resume``: the key is ``resume.sessionId``; a live session is attached (200, created
      False); a dormant one is reassembled from the store with its stored options.
    - ``fork``: the key is a fresh id; the new session starts from checkpoint
      ``fork_checkpoint_id`` of ``fork_source_session_id`` (which must belong to the same end
      user) with the source's options, at lastSeq 1.

    ``prompt``, when present, starts the first turn right after the session opens.
    """

    mode: OpenMode
    options: CreateOptions = field(default_factory=CreateOptions)
    prompt: str | None = None
    fork_source_session_id: str | None = None
    fork_checkpoint_id: str | None = None

    def __post_init__(self) -> None:
        assert (self.mode == "fork") == (self.fork_source_session_id is not None)


@dataclass(frozen=True)
class SessionOpened:
    """``created`` False = attach to a live session (200); True = a new epoch (201).
    ``last_seq`` is 0 for a create, the watermark for an attach, the new epoch's start
    watermark for a resume, 1 for a fork."""

    session_id: str
    resumed: bool
    last_seq: int
    created: bool

    def encode(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "resumed": self.resumed, "lastSeq": self.last_seq}


@dataclass(frozen=True, kw_only=True)
class PostInput(SessionRequest):
    """``POST …/messages``: exactly one of ``prompt`` and ``blocks``."""

    prompt: str | None = None
    blocks: tuple[InputBlock, ...] | None = None

    def __post_init__(self) -> None:
        assert (self.prompt is None) != (self.blocks is None)


class FrameSink(Protocol):
    """What the session actor needs from one SSE connection's subscriber (the streams slice's
    ``Subscriber`` satisfies it): frames are offered synchronously, never awaited, so one slow
    connection cannot stall the session; the subscriber applies its own slow-consumer policy."""

    def offer(self, frame: bytes) -> None: ...

    def close(self, reason: str) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Subscribe(SessionRequest):
    """``GET …/events``: replay after ``last_event_id`` (``None`` or -1 = everything retained),
    a gap frame first when the cursor is older than the ring or the epoch, then live frames.

    Replay and registration happen in one actor turn, so no live frame can slip between them.
    ``exclude`` holds kernel event type prefixes (``hook``, ``mcp``); control and gap frames are
    never filtered.
    """

    last_event_id: int | None = None
    exclude: tuple[str, ...] = ()
    subscriber: Any


@dataclass(frozen=True)
class Subscribed:
    session_id: str
    last_seq: int
    replayed_frames: int
    gap: bool


@dataclass(frozen=True, kw_only=True)
class Unsubscribe(SessionRequest):
    """The connection ended (client gone, slow consumer, shutdown): stop offering frames."""

    subscriber: Any


@dataclass(frozen=True, kw_only=True)
class Interrupt(SessionRequest):
    """``POST …/interrupt``: abort the running turn; idempotent (Accepted when idle)."""


@dataclass(frozen=True, kw_only=True)
class CloseSession(SessionRequest):
    """``DELETE /v2/sessions/:id``: abort any turn, end the epoch sealed, release the end
    user's slot; the store keeps everything, so the session can be resumed."""


@dataclass(frozen=True, kw_only=True)
class ReadMeta(SessionRequest):
    """``GET /v2/sessions/:id`` (``?include=applicationPrompt``)."""

    include_application_prompt: bool = False


@dataclass(frozen=True)
class SessionMeta:
    session_id: str
    end_user_id: str
    status: SessionStatus
    live: bool
    last_seq: int
    created_at_ms: int
    last_activity_at_ms: int
    title: str | None = None
    application_prompt: dict[str, Any] | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "sessionId": self.session_id,
            "endUserId": self.end_user_id,
            "status": self.status,
            "live": self.live,
            "lastSeq": self.last_seq,
            "createdAt": self.created_at_ms,
            "lastActivityAt": self.last_activity_at_ms,
        }
        if self.title is not None:
            body["title"] = self.title
        if self.application_prompt is not None:
            body["applicationPrompt"] = self.application_prompt
        return body


@dataclass(frozen=True, kw_only=True)
class ReadHistory(SessionRequest):
    """``GET …/history?offset=&limit=``; ``limit`` None = the rest."""

    offset: int = 0
    limit: int | None = None


@dataclass(frozen=True)
class SessionHistory:
    """History and ``last_seq`` read at the same instant (the L2 rebuild depends on it)."""

    session_id: str
    last_seq: int
    messages: tuple[dict[str, Any], ...]
    total: int
    offset: int
    next_offset: int | None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "sessionId": self.session_id,
            "lastSeq": self.last_seq,
            "messages": list(self.messages),
            "total": self.total,
            "offset": self.offset,
        }
        if self.next_offset is not None:
            body["nextOffset"] = self.next_offset
        return body


@dataclass(frozen=True, kw_only=True)
class AnswerTool(SessionRequest):
    """``POST …/tool-results/:callId``: the first valid answer wins."""

    call_id: str
    result: Any
    is_error: bool = False


@dataclass(frozen=True, kw_only=True)
class AnswerPermission(SessionRequest):
    """``POST …/permission/:requestId``: ``digest`` must repeat the request's digest."""

    request_id: str
    digest: str
    verdict: Literal["allow", "deny"]


@dataclass(frozen=True, kw_only=True)
class AnswerQuestion(SessionRequest):
    """``POST …/questions/:requestId``."""

    request_id: str
    answers: tuple[Any, ...]


@dataclass(frozen=True, kw_only=True)
class Compact(SessionRequest):
    """``POST …/compact``: idle only (``turn_running`` otherwise)."""


@dataclass(frozen=True)
class CompactResult:
    """One of the contract's three ``CompactResult`` shapes, already in contract form."""

    body: dict[str, Any]

    def encode(self) -> dict[str, Any]:
        return dict(self.body)


@dataclass(frozen=True, kw_only=True)
class ListCheckpoints(SessionRequest):
    pass


@dataclass(frozen=True, kw_only=True)
class CreateCheckpoint(SessionRequest):
    """``201 CheckpointMeta`` (``_checkpoints.CheckpointMeta``)."""

    name: str | None = None


@dataclass(frozen=True, kw_only=True)
class RestoreCheckpoint(SessionRequest):
    """Idle only; replaces the history in place → ``_checkpoints.RestoreResult``."""

    checkpoint_id: str


@dataclass(frozen=True, kw_only=True)
class DeleteCheckpoint(SessionRequest):
    checkpoint_id: str


@dataclass(frozen=True, kw_only=True)
class ExportCheckpoint(SessionRequest):
    checkpoint_id: str


@dataclass(frozen=True, kw_only=True)
class ImportCheckpoint(SessionRequest):
    """Self-contained CBOR bytes from ``ExportCheckpoint`` → ``_checkpoints.CheckpointMeta``;
    another session's export is ``session_mismatch``."""

    data: bytes


@dataclass(frozen=True)
class CheckpointList:
    """``200 {checkpoints}``; the items are ``_checkpoints.CheckpointMeta`` (oldest first)."""

    checkpoints: tuple[Any, ...]

    def encode(self) -> dict[str, Any]:
        return {"checkpoints": [checkpoint.encode() for checkpoint in self.checkpoints]}


@dataclass(frozen=True)
class CheckpointExport:
    checkpoint_id: str
    data: bytes


@dataclass(frozen=True, kw_only=True)
class ChangeCwd(SessionRequest):
    """``POST …/cwd``: idle only; the HTTP layer has checked the shape and the policy."""

    cwd: str


@dataclass(frozen=True)
class CwdChanged:
    cwd: str
    previous: str | None

    def encode(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "from": self.previous}


@dataclass(frozen=True)
class Drain:
    """Shutdown (not from a client): abort the running turn (it ends ``turn.aborted``), send
    every live stream a ``retry: <retry_milliseconds>`` frame and close it."""

    retry_milliseconds: int = 30_000


# ---------------------------------------------------------------------------------------------
# Requests to ("end_user", id)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ListSessions(SessionRequest):
    """``GET /v2/sessions?limit=1–200&offset=``: the end user's sessions, newest activity first
    (the bounds are the store's ``sessions_list_limit_min`` / ``sessions_list_limit_max``)."""

    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class SessionList:
    sessions: tuple[SessionMeta, ...]
    total: int

    def encode(self) -> dict[str, Any]:
        return {"sessions": [meta.encode() for meta in self.sessions], "total": self.total}

