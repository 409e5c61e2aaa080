"""The messages the HTTP layer sends to a character actor and to the lifecycle actor, and the
replies it gets back (the N.E.K.O memory server contract, ``seeds/003``).

A character is the virtual actor ``("character", name)`` (``character_kind_name``); the
process-wide lifecycle (limited mode, ``instance_id``, ``/shutdown``, ``/reload``,
``reset_confirmed_at``) is the single actor ``("character_lifecycle", "main")``.  The HTTP slice
decodes and validates the name (``character_name_problem`` in ``_store``), parses
``input_history`` with ``parse_input_history`` below, turns the request into one of the frozen
request dataclasses and asks the actor.

Domain failures are reply values, never exceptions, because the contract answers most of them
with a 200 whose body says ``status: "error"`` / ``ok: false``: ``CharacterFailed`` is that
body, ``ClaimRefused`` is the 409 ``status: "cancelled"`` of a revoked or replayed claim, and
``MemoryUnavailable`` is the 503 of ``/query_memory`` while the character's fact and
reflection stores are not open (released, or not yet initialised).  An exception that escapes
an actor is our bug: the HTTP layer answers it as the route's "other failure" (500 or the
route's error body).

Times inside the domain are float seconds of the Env's wall clock; the HTTP layer formats
them as the contract's naive ISO strings.  All requests are keyword-only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import trio

from troupe.runtime import AskTimeout

character_kind_name = "character"
lifecycle_kind_name = "character_lifecycle"
lifecycle_key = "main"

# Bounds on one ``input_history``: the body limit caps bytes, these cap what one turn may
# make the actor store and index.
input_history_messages_max = 1_000
history_message_characters_max = 100_000
# ``/record_surfaced`` and ``/reload`` lists, and claim tokens.
reflection_ids_max = 100
reload_names_max = 1_000
claim_tokens_per_character_max = 100
claim_token_characters_max = 256
reason_characters_max = 2_000
# ``ask_waiting``: how often a deferred request re-asks (finds a restarted actor).
waiting_recheck_seconds = 1.0

HistoryRole = Literal["user", "assistant", "system"]
history_roles: tuple[str, ...] = ("user", "assistant", "system")

assert input_history_messages_max >= 1
assert history_message_characters_max >= 1


# ---------------------------------------------------------------------------------------------
# input_history
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryMessage:
    """One message of ``input_history``.  ``content`` is the text, or the parts exactly as
    the caller sent them (multimodal: ``[{"type": "text", "text": ...}, ...]``)."""

    role: HistoryRole
    content: str | tuple[Any, ...]

    @property
    def text(self) -> str:
        """The message's text: the string itself, or the text parts joined by newlines
        (images and other parts carry no text to remember)."""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for part in self.content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)

    def encode(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) else list(self.content)
        return {"role": self.role, "content": content}

    @classmethod
    def decode(cls, value: dict[str, Any]) -> HistoryMessage:
        """From ``encode()``'s shape, as stored (already validated when it was parsed)."""
        content = value["content"]
        return cls(role=value["role"], content=content if isinstance(content, str) else tuple(content))


def parse_input_history(text: Any) -> list[HistoryMessage] | str:
    """Parse the ``input_history`` JSON string into messages, or return the problem text.

    All or nothing: one bad message rejects the whole history, so a malformed request is
    never half applied.  ``"[]"`` is a valid empty history.
    """
    if not isinstance(text, str):
        return "input_history must be a JSON string holding a message array"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return "input_history is not valid JSON"
    if not isinstance(value, list):
        return "input_history must be a JSON array of messages"
    if len(value) > input_history_messages_max:
        return f"input_history holds more than {input_history_messages_max} messages"
    messages: list[HistoryMessage] = []
    for index, item in enumerate(value):
        problem = _message_problem(item)
        if problem is not None:
            return f"input_history[{index}]: {problem}"
        content = item["content"]
        messages.append(HistoryMessage(role=item["role"], content=content if isinstance(content, str) else tuple(content)))
    return messages


def _message_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "a message must be an object"
    if item.get("role") not in history_roles:
        return "role must be one of user, assistant, system"
    content = item.get("content")
    if isinstance(content, str):
        size = len(content)
    elif isinstance(content, list):
        size = len(json.dumps(content, ensure_ascii=False))
    else:
        return "content must be a string or an array"
    if size > history_message_characters_max:
        return f"content is longer than {history_message_characters_max} characters"
    return None


# ---------------------------------------------------------------------------------------------
# Deferred replies: requests that wait for the settle lock
# ---------------------------------------------------------------------------------------------


class ReplyWaiter:
    """Where a deferred reply is delivered.  ``NewDialog`` and ``ReleaseCharacter`` wait for
    a running renew/settle: the actor cannot hold its turn (the compression's own end must
    reach its mailbox), so it answers ``ReplyDeferred`` at once, keeps the waiter, and fulfils
    it in the turn that releases the settle lock, before any later message.  Use
    ``ask_waiting``, which also re-asks now and then so a waiter whose actor restarted (and
    forgot it) is queued again."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.reply: Any = None

    def fulfil(self, reply: Any) -> None:
        if not self.event.is_set():
            self.reply = reply
            self.event.set()


@dataclass(frozen=True)
class ReplyDeferred:
    """The request waits for the settle lock; its reply arrives through its waiter."""


async def ask_waiting(ref: Any, message: Any, *, timeout_seconds: float,
                      recheck_seconds: float = waiting_recheck_seconds) -> Any:
    """Ask a request that may be deferred (``NewDialog``, ``ReleaseCharacter``) and return
    its final reply.  Raises ``AskTimeout`` after ``timeout_seconds`` overall."""
    waiter = ReplyWaiter()
    message = replace(message, waiter=waiter)
    with trio.move_on_after(timeout_seconds):
        while True:
            reply = await ref.ask(message, timeout=timeout_seconds)
            if not isinstance(reply, ReplyDeferred):
                return reply
            with trio.move_on_after(recheck_seconds):
                await waiter.event.wait()
            if waiter.event.is_set():
                return waiter.reply
    raise AskTimeout(f"no reply to {type(message).__name__} within {timeout_seconds} s")


# ---------------------------------------------------------------------------------------------
# Replies shared by many routes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CharacterFailed:
    """The route's 200 error body: ``{"status": "error", "message": ...}`` (history routes,
    ``/reload``) or ``{"ok": false, "error": ...}`` (``/internal/*``); the route knows which.
    ``message`` never carries exception text from inside the process."""

    message: str

    def encode(self) -> dict[str, Any]:
        return {"status": "error", "message": self.message}


@dataclass(frozen=True)
class ClaimRefused:
    """409 ``status: "cancelled"``: the claim token was revoked, replayed or belongs to an
    older identity generation."""

    character_name: str
    claim_token: str
    message: str

    def encode(self) -> dict[str, Any]:
        return {
            "status": "cancelled",
            "character_name": self.character_name,
            "derived_task_claim_token": self.claim_token,
            "message": self.message,
        }


@dataclass(frozen=True)
class MemoryUnavailable:
    """503 from ``/query_memory``: the character's fact and reflection stores are not open
    (released, or still being opened: ``retry_after_seconds`` then says when to ask again)."""

    message: str = "memory stores are not initialised"
    retry_after_seconds: float | None = None


# ---------------------------------------------------------------------------------------------
# Requests to ("character", name): dialogue persistence
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CacheHistory:
    """``POST /cache``: append non-empty history to recent history, write the raw
    time-indexed rows and register the post-turn signal tasks, all in one write; no
    extraction in the request path.  → ``HistoryCached`` | ``CharacterFailed``."""

    messages: tuple[HistoryMessage, ...]


@dataclass(frozen=True)
class HistoryCached:
    count: int

    def encode(self) -> dict[str, Any]:
        return {"status": "cached", "count": self.count}


@dataclass(frozen=True, kw_only=True)
class ProcessHistory:
    """``POST /process``: like ``/cache`` plus the ordinary recent-history compression and
    the review task behind the start-up gate.  → ``HistoryProcessed`` | ``CharacterFailed``."""

    messages: tuple[HistoryMessage, ...]


@dataclass(frozen=True, kw_only=True)
class RenewHistory:
    """``POST /renew``: the first history after a renewed conversation; the detailed
    compression runs under the settle lock.  → ``HistoryProcessed`` | ``CharacterFailed``."""

    messages: tuple[HistoryMessage, ...]


@dataclass(frozen=True)
class HistoryProcessed:
    def encode(self) -> dict[str, Any]:
        return {"status": "processed"}


@dataclass(frozen=True, kw_only=True)
class SettleHistory:
    """``POST /settle``: settle what ``/cache`` wrote (even when ``messages`` is empty);
    messages not cached yet are written and registered too.  → ``HistorySettled`` |
    ``CharacterFailed``."""

    messages: tuple[HistoryMessage, ...] = ()


@dataclass(frozen=True)
class HistorySettled:
    def encode(self) -> dict[str, Any]:
        return {"status": "settled"}


# ---------------------------------------------------------------------------------------------
# Requests to ("character", name): context and recall
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class NewDialog:
    """``GET /new_dialog``: waits for a running renew/settle; ``""`` for an unknown
    character.  Ask it with ``ask_waiting``.  → ``ContextText`` (or ``ReplyDeferred``
    to a plain ask)."""

    waiter: ReplyWaiter | None = None


@dataclass(frozen=True, kw_only=True)
class RecentHistory:
    """``GET /get_recent_history``: the localised history string (the localised "no
    history" string for an unknown character).  → ``ContextText``."""


@dataclass(frozen=True, kw_only=True)
class GetSettings:
    """``GET /get_settings``: persona and active reflections as one string (``""`` for an
    unknown character).  → ``ContextText``."""


@dataclass(frozen=True)
class ContextText:
    """A text/plain (``/new_dialog``) or JSON-string (the other two) answer."""

    text: str


@dataclass(frozen=True, kw_only=True)
class GetPersona:
    """``GET /get_persona``: the full internal persona object.  → ``PersonaDocument``."""


@dataclass(frozen=True)
class PersonaDocument:
    persona: dict[str, Any]

    def encode(self) -> dict[str, Any]:
        return dict(self.persona)


@dataclass(frozen=True, kw_only=True)
class QueryMemory:
    """``POST /query_memory``: both optional; the routing and time rules live in
    ``_recall``.  → ``MemoryResults`` | ``MemoryUnavailable``.

    ``leased``: the turn only admits the query and answers a ``RecallLease`` (``_recall``)
    that the caller runs outside the actor's turn, so queries of one character overlap
    (the HTTP route asks this way); a memory without leases answers the query itself."""

    query: str | None = None
    time: str | None = None
    leased: bool = False


@dataclass(frozen=True)
class MemoryHit:
    """One result; times are wall seconds (``None`` when unknown), formatted by HTTP."""

    id: str
    text: str
    tier: Literal["fact", "reflection", "fact_archive"]
    entity: str | None
    score: float | None
    created_at: float | None
    event_start_at: float | None
    event_end_at: float | None


@dataclass(frozen=True)
class MemoryResults:
    """The normal answer.  ``time`` is set only for time-only recall (the contract echoes
    the input ``time`` then, and every score is ``None``); ``error_code`` is
    ``"hybrid_recall_failed"`` for the degraded empty answer."""

    results: tuple[MemoryHit, ...]
    query: str | None
    candidates_total: int
    elapsed_ms: float
    time: str | None = None
    error_code: str | None = None


@dataclass(frozen=True, kw_only=True)
class LastConversationGap:
    """``GET /last_conversation_gap``.  → ``ConversationGap``."""


@dataclass(frozen=True)
class ConversationGap:
    """Seconds since the last conversation, ``-1`` when there was none."""

    gap_seconds: float

    def encode(self) -> dict[str, Any]:
        return {"gap_seconds": self.gap_seconds}


# ---------------------------------------------------------------------------------------------
# Requests to ("character", name): reflection and proactive chat
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Reflect:
    """``POST /reflect``: synthesise now and schedule promotion (fire and forget).
    → ``ReflectResult``."""


@dataclass(frozen=True)
class ReflectResult:
    reflection: dict[str, Any] | None

    def encode(self) -> dict[str, Any]:
        # Promotion is fire-and-forget, so the contract fixes auto_transitions at 0.
        return {"reflection": self.reflection, "auto_transitions": 0}


@dataclass(frozen=True, kw_only=True)
class FollowupTopics:
    """``GET /followup_topics``: candidates, NOT marked surfaced.  → ``Topics``."""


@dataclass(frozen=True)
class Topics:
    topics: tuple[dict[str, Any], ...]

    def encode(self) -> dict[str, Any]:
        return {"topics": list(self.topics)}


@dataclass(frozen=True, kw_only=True)
class RecordSurfaced:
    """``POST /record_surfaced``: empty is a no-op; the answer is ``{"ok": true}`` even when
    persisting fails (logged).  → ``SurfacedRecorded``."""

    reflection_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class SurfacedRecorded:
    recorded: int

    def encode(self) -> dict[str, Any]:
        return {"ok": True}


@dataclass(frozen=True, kw_only=True)
class CancelCorrection:
    """``POST /cancel_correction``.  → ``CorrectionCancelled``."""


@dataclass(frozen=True)
class CorrectionCancelled:
    status: Literal["cancelled", "no_task"]

    def encode(self) -> dict[str, Any]:
        return {"status": self.status}


# ---------------------------------------------------------------------------------------------
# Requests to ("character", name): funnel
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Funnel:
    """``GET /api/memory/funnel``: the HTTP layer has applied the defaults (the last seven
    days) and checked ``since <= until``.  → ``FunnelCounts``."""

    since: float
    until: float

    def __post_init__(self) -> None:
        assert self.since <= self.until


@dataclass(frozen=True)
class FunnelCounts:
    """``counts`` holds the ten counters of ``_funnel``; times stay wall seconds."""

    character_name: str
    since: float
    until: float
    counts: dict[str, int]


# ---------------------------------------------------------------------------------------------
# Requests to ("character", name): claims and generations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReleaseCharacter:
    """``POST /release_character``: drain and cancel the derived tasks, close the
    character's storage handles and in-memory indexes, and keep the claim until a reload
    releases it.  Repeating the same token (a retry) answers the same success with 0
    cancelled tasks.  → ``CharacterReleased`` | ``ClaimRefused``."""

    claim_token: str
    claim_generation: int
    hold_admission: bool = False
    waiter: ReplyWaiter | None = None
    """Release waits for a running renew/settle: ask it with ``ask_waiting``."""


@dataclass(frozen=True)
class CharacterReleased:
    character_name: str
    cancelled_derived_tasks: int
    claim_token: str

    def encode(self) -> dict[str, Any]:
        return {
            "status": "success",
            "character_name": self.character_name,
            "cancelled_derived_tasks": self.cancelled_derived_tasks,
            "derived_task_claim_token": self.claim_token,
        }


@dataclass(frozen=True, kw_only=True)
class ReloadCharacter:
    """Sent by the lifecycle actor during ``/reload`` (not by HTTP): release exactly
    ``release_tokens``, publish ``publish_generation`` when given (dropping only claims of
    older generations), drop in-memory components so they rebuild from storage, and resume
    derived-task admission when no claim is left.  → ``CharacterReloaded``."""

    release_tokens: tuple[str, ...] = ()
    publish_generation: int | None = None
    components_generation: int = 0


@dataclass(frozen=True)
class CharacterReloaded:
    character_name: str
    released_tokens: int
    generation: int
    admission_open: bool


@dataclass(frozen=True, kw_only=True)
class CharacterStatus:
    """Diagnostics for tests and the simulator: → ``CharacterState``."""


@dataclass(frozen=True)
class CharacterState:
    character_name: str
    generation: int
    claims: tuple[tuple[str, int], ...]
    """(token, generation) of every live claim."""
    admission_open: bool
    stores_open: bool
    settling: bool
    outbox_pending: int


# ---------------------------------------------------------------------------------------------
# Requests to ("character_lifecycle", "main")
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Health:
    """``GET /health`` and the limited-mode check of every other route.  → ``LifecycleState``.

    ``request_number`` makes each request a distinct message: the runtime quarantines a
    message that crashed twice as poison and refuses every EQUAL message after it, and one
    quarantined field-less ``Health`` would make every route answer 500 until the process
    restarts (found by the character simulator workload, seed 3 with two injected crashes)."""

    request_number: int = 0


@dataclass(frozen=True)
class LifecycleState:
    instance_id: str
    limited_mode: bool
    blocking_reason: str | None
    shutdown_enabled: bool
    components_generation: int

    def health(self) -> dict[str, Any]:
        return {"app": "N.E.K.O", "service": "memory", "status": "ok", "instance_id": self.instance_id}

    def blocked_body(self) -> dict[str, Any]:
        """The 409 body every gated route answers in limited mode."""
        reason = self.blocking_reason or "storage startup is not complete"
        return {
            "ok": False,
            "error_code": "storage_startup_blocked",
            "blocking_reason": reason,
            "limited_mode": True,
            "error": f"memory server is in limited mode: {reason}",
        }


@dataclass(frozen=True, kw_only=True)
class StartupContinue:
    """``/internal/storage/startup/continue``: leave limited mode.  → ``StartupSwitched``."""

    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class StartupBlock:
    """``/internal/storage/startup/block``: enter limited mode.  → ``StartupSwitched``."""

    reason: str | None = None


@dataclass(frozen=True)
class StartupSwitched:
    limited_mode: bool
    reason: str | None

    def encode(self) -> dict[str, Any]:
        if self.limited_mode:
            return {"ok": True, "limited_mode": True, "reason": self.reason}
        return {"ok": True, "initialized": True, "limited_mode": False, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class RequestShutdown:
    """``POST /shutdown``: the actor only answers whether shutdown is enabled; the serving
    layer triggers the shutdown itself.  → ``ShutdownAnswer``."""


@dataclass(frozen=True)
class ShutdownAnswer:
    accepted: bool

    def encode(self) -> dict[str, Any]:
        return {"status": "shutdown_signal_received" if self.accepted else "shutdown_disabled"}


@dataclass(frozen=True, kw_only=True)
class Reload:
    """``POST /reload``: ``resume_names[i]`` is published at ``resume_generations[i]`` (the
    HTTP layer checked equal lengths and non-negative integers); ``release_claims`` maps a
    character name to the exact tokens to release.  → ``Reloaded`` | ``CharacterFailed``."""

    resume_names: tuple[str, ...] = ()
    resume_generations: tuple[int, ...] = ()
    release_claims: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert len(self.resume_names) == len(self.resume_generations)


@dataclass(frozen=True)
class Reloaded:
    message: str
    components_generation: int

    def encode(self) -> dict[str, Any]:
        return {"status": "success", "message": self.message}


@dataclass(frozen=True, kw_only=True)
class ResetConfirmedAt:
    """``/internal/memory/reset_confirmed_at`` (strong memory ON → OFF): clear the confirmed
    time of every confirmed reflection.  → ``ResetDone`` | ``CharacterFailed``."""


@dataclass(frozen=True)
class ResetDone:
    count: int

    def encode(self) -> dict[str, Any]:
        return {"ok": True, "count": self.count}


__all__ = [
    "CacheHistory",
    "CancelCorrection",
    "CharacterFailed",
    "CharacterReleased",
    "CharacterReloaded",
    "CharacterState",
    "CharacterStatus",
    "ClaimRefused",
    "ContextText",
    "ConversationGap",
    "CorrectionCancelled",
    "FollowupTopics",
    "Funnel",
    "FunnelCounts",
    "GetPersona",
    "GetSettings",
    "Health",
    "HistoryCached",
    "HistoryMessage",
    "HistoryProcessed",
    "HistoryRole",
    "HistorySettled",
    "LastConversationGap",
    "LifecycleState",
    "MemoryHit",
    "MemoryResults",
    "MemoryUnavailable",
    "NewDialog",
    "PersonaDocument",
    "ProcessHistory",
    "QueryMemory",
    "RecentHistory",
    "RecordSurfaced",
    "Reflect",
    "ReflectResult",
    "Reload",
    "ReloadCharacter",
    "ReplyDeferred",
    "ReplyWaiter",
    "Reloaded",
    "ReleaseCharacter",
    "RenewHistory",
    "RequestShutdown",
    "ResetConfirmedAt",
    "ResetDone",
    "SettleHistory",
    "ShutdownAnswer",
    "StartupBlock",
    "StartupContinue",
    "StartupSwitched",
    "SurfacedRecorded",
    "Topics",
    "ask_waiting",
    "character_kind_name",
    "claim_token_characters_max",
    "claim_tokens_per_character_max",
    "history_message_characters_max",
    "history_roles",
    "input_history_messages_max",
    "lifecycle_key",
    "lifecycle_kind_name",
    "parse_input_history",
    "reason_characters_max",
    "reflection_ids_max",
    "reload_names_max",
    "waiting_recheck_seconds",
]
