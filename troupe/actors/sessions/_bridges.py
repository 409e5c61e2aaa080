"""The three bridges between a running turn and the people on the other side of the stream.

A turn sometimes needs an answer from the client: the result of a client tool it declared
(``server.tool.request``), a permission verdict before a host-side tool with effects runs
(``server.permission.request``) or answers to questions (``server.question.request``).  The
kernel awaits the answer; the session actor delivers it when ``POST …/tool-results/:callId``,
``…/permission/:requestId`` or ``…/questions/:requestId`` arrives.  ``Bridges`` is that
rendezvous, owned by exactly one session actor (never a module-level registry).

The contract's rules, and where they live here:

- The server never resends a request: the request frame is a control event with an id, kept in
  the ring, so a client that reconnects sees it again on replay.  Each request frame carries a
  relative ``ttlMs`` and the server's wall clock ``ts`` (clients judge expiry by their own
  receive time plus ``ttlMs``); tool requests add the absolute ``deadlineAt``, permission
  requests ``expiresAt`` (both milliseconds of the Env's wall clock).
- First valid answer wins: a second answer for the same id is ``request_already_answered``
  (409, harmless); an answer after the request was cancelled (interrupt) or expired is
  ``request_cancelled`` (410); an id never issued (or forgotten long ago) is
  ``request_not_found`` (404).  A permission answer whose digest is not the request's digest
  is ``digest_mismatch`` (409) and does not settle the request.
- Permission requests never carry the tool's arguments: only ``name``, a ``summary``, the
  ``attribution`` and ``digest`` = SHA-256 of the canonical JSON of the arguments.  After
  ``permission_ttl_seconds`` (120 s) the verdict is deny and the turn continues;
  ``server.permission.closed`` tells every client to close its dialog (also after an answer
  or a cancel, so a second device does not keep a stale dialog open).
- An answer in the structured shape (``{questionId, selectedOptionIds, freeText?}``, what the
  SDK sends) must name a question the request asked and only options that question offered
  (an option's ``id``, else its ``label``); otherwise it is ``validation_failed`` (400, a
  payload problem in the contract's table) and the request stays pending, so the right answer
  can still follow.  Free-form answers (strings, other objects) are the client's business and
  pass unchecked, as the contract's ``{ answers: [...] }`` allows.
- Questions never hang: when no subscriber has been connected for
  ``question_unattended_grace_seconds`` (60 s) the tool degrades to "decide and continue";
  with a subscriber it still ends after ``question_ttl_seconds``.  ``server.question.closed``
  closes the dialog in every case.
- ``cancel_all(reason)`` (interrupt, close, drain) ends every pending request at once:
  ``server.tool.cancel`` for tool requests, the ``closed`` frames for the other two; later
  answers get 410.

Deadlines are trio deadlines: the Env's monotonic clock *is* trio's clock (the MockClock in the
simulator), so waits are deterministic under a seed, and wall-clock times only appear in the
frames.  Pending requests are bounded (``pending_requests_max``); the ids of settled requests
are remembered in a bounded LRU (``settled_requests_remembered_max``) to tell 409 and 410 from
404.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import trio

from ._protocol import SessionRefused

tool_timeout_seconds_default = 120.0
"""A client tool's default deadline (``timeoutMs`` 120000 in the declaration)."""

permission_ttl_seconds = 120.0
"""A permission request unanswered this long is denied, and the turn continues."""

question_unattended_grace_seconds = 60.0
"""Questions degrade to "decide and continue" after this long without any subscriber."""

question_ttl_seconds = 600.0
"""Questions end (degraded) after this long even with subscribers: nothing hangs forever."""

question_watch_interval_seconds = 1.0
"""How often a pending question looks at ``has_subscribers()``."""

pending_requests_max = 64
"""Pending bridge requests per session (all three kinds together)."""

settled_requests_remembered_max = 1024
"""Settled request ids remembered per session to answer 409 / 410 instead of 404."""

summary_chars_max = 512
"""Permission summaries are cut to this many characters (they are shown in a dialog)."""

assert question_unattended_grace_seconds < question_ttl_seconds
assert question_watch_interval_seconds < question_unattended_grace_seconds
assert pending_requests_max < settled_requests_remembered_max

RequestKind = Literal["tool", "permission", "question"]
Verdict = Literal["allow", "deny"]


class Publish(Protocol):
    """The session actor's publisher: assigns the next seq, appends to the ring, fans out,
    returns the seq.  Synchronous, so it is safe in ``finally`` blocks and under cancellation.
    Types starting with ``server.`` are control events (``source: "server"``), every other type
    is a kernel event (``source: "kernel"``)."""

    def __call__(self, type: str, payload: dict[str, Any], turn_id: str | None) -> int: ...


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 text: the same value always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """The permission digest: SHA-256 hex of the canonical JSON of the tool's arguments."""
    return hashlib.sha256(canonical_json(dict(arguments)).encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# What the kernel gets back
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolAnswer:
    """How a client tool request ended: ``answered`` (``result``, ``is_error``), ``timeout``
    (the deadline passed), ``cancelled`` (interrupt) or ``refused`` (too many pending)."""

    status: Literal["answered", "timeout", "cancelled", "refused"]
    result: Any = None
    is_error: bool = False


@dataclass(frozen=True)
class PermissionDecision:
    """``verdict`` and why: ``answered`` by a client, ``expired`` (deny and continue),
    ``cancelled`` (interrupt: deny), ``refused`` (too many pending: deny)."""

    verdict: Verdict
    reason: Literal["answered", "expired", "cancelled", "refused"]
    request_id: str | None = None


@dataclass(frozen=True)
class QuestionAnswer:
    """``answered`` (``answers`` as the client sent them), ``degraded`` (nobody answered:
    decide and continue; ``why`` is ``unattended`` or ``expired``), ``cancelled`` or
    ``refused``."""

    status: Literal["answered", "degraded", "cancelled", "refused"]
    answers: tuple[Any, ...] = ()
    why: str | None = None
    request_id: str | None = None


@dataclass(frozen=True)
class Answered:
    """The answer settled its request (200 ``{accepted: true}``)."""

    request_id: str


AnswerOutcome = Answered | SessionRefused
"""What ``answer_*`` returns: ``Answered`` or a refusal with ``request_not_found`` (404),
``request_already_answered`` (409), ``request_cancelled`` (410), ``digest_mismatch``
(409) or, for a structured question answer naming what was not asked, ``validation_failed``
(400)."""


def offered_option_ids(question: Mapping[str, Any]) -> frozenset[str]:
    """The option ids a question offers: each option's ``id``, else its ``label`` (the kernel
    passes the model's options through as given; a bare string option is its own id)."""
    offered = set()
    for option in question.get("options") or ():
        if isinstance(option, str):
            offered.add(option)
        elif isinstance(option, Mapping):
            for key in ("id", "label"):
                if isinstance(option.get(key), str):
                    offered.add(option[key])
                    break
    return frozenset(offered)


def answers_problem(questions: Sequence[Mapping[str, Any]], answers: Sequence[Any]) -> dict[str, Any] | None:
    """Why structured answers do not fit the questions asked (``reason`` and the offending
    ``questionId`` / ``optionId``), or None.  Only answers carrying ``selectedOptionIds`` are
    structured; the rest are free-form and not judged here.  An option named twice is refused
    (``option_repeated``), and so is more than one option for a question not marked
    ``multiSelect: true`` (``single_select``)."""
    by_id = {str(question.get("id")): question for question in questions if question.get("id") is not None}
    for answer in answers:
        if not isinstance(answer, Mapping) or "selectedOptionIds" not in answer:
            continue
        question_id, selected = answer.get("questionId"), answer["selectedOptionIds"]
        question = by_id.get(question_id) if isinstance(question_id, str) else None
        if question is None:
            return {"reason": "question_not_asked", "questionId": question_id}
        if not isinstance(selected, list) or not all(isinstance(option, str) for option in selected):
            return {"reason": "options_malformed", "questionId": question_id}
        offered = offered_option_ids(question)
        for option in selected:
            if option not in offered:
                return {"reason": "option_not_offered", "questionId": question_id, "optionId": option}
        if len(set(selected)) != len(selected):
            return {"reason": "option_repeated", "questionId": question_id}
        if len(selected) > 1 and question.get("multiSelect") is not True:
            # A question the model did not mark ``multiSelect: true`` takes one option at most.
            return {"reason": "single_select", "questionId": question_id, "optionsMax": 1}
    return None


# ---------------------------------------------------------------------------------------------
# Pending requests
# ---------------------------------------------------------------------------------------------


@dataclass
class _Pending:
    kind: RequestKind
    request_id: str
    turn_id: str | None
    digest: str | None = None
    done: trio.Event = field(default_factory=trio.Event)
    outcome: Literal["answered", "expired", "cancelled"] | None = None
    value: Any = None
    is_error: bool = False
    questions: tuple[Mapping[str, Any], ...] = ()

    def settle(self, outcome: Literal["answered", "expired", "cancelled"], value: Any = None,
               is_error: bool = False) -> None:
        assert self.outcome is None, (self.request_id, self.outcome)
        self.outcome = outcome
        self.value = value
        self.is_error = is_error
        self.done.set()


@dataclass
class BridgeStatistics:
    requests: int = 0
    answered: int = 0
    expired: int = 0
    cancelled: int = 0
    refused: int = 0
    pending: int = 0


class Bridges:
    """The pending tool, permission and question requests of one session.

    ``publish`` is the actor's synchronous publisher; ``has_subscribers`` says whether any SSE
    connection is attached right now; ``wall_milliseconds`` and ``new_id`` come from the Env
    (``env.clock.wall`` and ``env.ids.new_id``), so ids and frame times repeat under a seed.
    """

    def __init__(
        self,
        *,
        publish: Publish,
        has_subscribers: Callable[[], bool],
        wall_milliseconds: Callable[[], int],
        new_id: Callable[[str], str],
        permission_ttl: float = permission_ttl_seconds,
        question_grace: float = question_unattended_grace_seconds,
        question_ttl: float = question_ttl_seconds,
    ) -> None:
        assert 0 < question_grace < question_ttl
        self._publish = publish
        self._has_subscribers = has_subscribers
        self._wall_milliseconds = wall_milliseconds
        self._new_id = new_id
        self._permission_ttl = permission_ttl
        self._question_grace = question_grace
        self._question_ttl = question_ttl
        self._pending: dict[str, _Pending] = {}
        self._settled: OrderedDict[str, str] = OrderedDict()
        self._statistics = BridgeStatistics()

    @classmethod
    def for_env(cls, env: Any, *, publish: Publish, has_subscribers: Callable[[], bool],
                **limits: float) -> Bridges:
        """Bridges whose ids and frame times come from ``env``."""
        return cls(
            publish=publish,
            has_subscribers=has_subscribers,
            wall_milliseconds=lambda: int(env.clock.wall() * 1000),
            new_id=env.ids.new_id,
            **limits,
        )

    # -- the kernel's side ------------------------------------------------------------------

    async def request_tool(
        self,
        *,
        turn_id: str | None,
        call_id: str,
        name: str,
        arguments: Mapping[str, Any],
        timeout_seconds: float = tool_timeout_seconds_default,
    ) -> ToolAnswer:
        """Publish ``server.tool.request`` and wait for the client's result until the deadline.

        ``call_id`` is the kernel's call id (the one in ``tool.proposed`` and the transcript);
        it is the ``:callId`` the client answers to.
        """
        assert timeout_seconds > 0, timeout_seconds
        pending = self._open("tool", call_id, turn_id)
        if pending is None:
            return ToolAnswer("refused")
        ttl_ms = int(timeout_seconds * 1000)
        now_ms = self._wall_milliseconds()
        self._publish(
            "server.tool.request",
            {"callId": call_id, "name": name, "args": dict(arguments),
             "deadlineAt": now_ms + ttl_ms, "ttlMs": ttl_ms, "ts": now_ms},
            turn_id,
        )
        with trio.move_on_after(timeout_seconds):
            await pending.done.wait()
        self._close_expired(pending)
        if pending.outcome == "answered":
            return ToolAnswer("answered", pending.value, pending.is_error)
        return ToolAnswer("timeout" if pending.outcome == "expired" else "cancelled")

    async def request_permission(
        self,
        *,
        turn_id: str | None,
        call_id: str,
        name: str,
        arguments: Mapping[str, Any],
        summary: str | None,
        attribution: Mapping[str, Any],
    ) -> PermissionDecision:
        """Publish ``server.permission.request`` (digest and summary, never the arguments) and
        wait for a verdict; deny after ``permission_ttl_seconds``."""
        request_id = self._new_id("perm_")
        pending = self._open("permission", request_id, turn_id)
        if pending is None:
            return PermissionDecision("deny", "refused")
        pending.digest = arguments_digest(arguments)
        ttl_ms = int(self._permission_ttl * 1000)
        now_ms = self._wall_milliseconds()
        payload: dict[str, Any] = {"requestId": request_id, "name": name}
        if summary:
            payload["summary"] = summary[:summary_chars_max]
        payload.update(
            attribution={**attribution, "callId": call_id}, digest=pending.digest,
            expiresAt=now_ms + ttl_ms, ttlMs=ttl_ms, ts=now_ms,
        )
        self._publish("server.permission.request", payload, turn_id)
        with trio.move_on_after(self._permission_ttl):
            await pending.done.wait()
        if self._close_expired(pending):
            self._publish_closed("server.permission.closed", pending, "expired",
                              {"verdict": "deny"})
        if pending.outcome == "answered":
            return PermissionDecision(pending.value, "answered", request_id)
        return PermissionDecision("deny", pending.outcome or "expired", request_id)

    async def ask_questions(
        self, *, turn_id: str | None, questions: Sequence[Mapping[str, Any]]
    ) -> QuestionAnswer:
        """Publish ``server.question.request`` and wait for answers; degrade after
        ``question_unattended_grace_seconds`` with no subscriber, or ``question_ttl_seconds``
        in any case."""
        request_id = self._new_id("q_")
        pending = self._open("question", request_id, turn_id)
        if pending is None:
            return QuestionAnswer("refused")
        pending.questions = tuple(dict(question) for question in questions)
        ttl_ms = int(self._question_ttl * 1000)
        self._publish(
            "server.question.request",
            {"requestId": request_id, "questions": [dict(question) for question in pending.questions],
             "ttlMs": ttl_ms, "ts": self._wall_milliseconds()},
            turn_id,
        )
        unattended: list[bool] = []
        with trio.move_on_after(self._question_ttl):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_unattended, unattended, nursery.cancel_scope)
                await pending.done.wait()
                nursery.cancel_scope.cancel()
        why = "unattended" if unattended else "expired"
        if self._close_expired(pending):
            self._publish_closed("server.question.closed", pending, "degraded", {"why": why})
        if pending.outcome == "answered":
            return QuestionAnswer("answered", tuple(pending.value), request_id=request_id)
        if pending.outcome == "cancelled":
            return QuestionAnswer("cancelled", request_id=request_id)
        return QuestionAnswer("degraded", why=why, request_id=request_id)

    async def _watch_unattended(self, unattended: list[bool], scope: trio.CancelScope) -> None:
        """Ends the wait once nobody has been subscribed for the whole grace period."""
        unattended_since: float | None = None
        while True:
            now = trio.current_time()
            if self._has_subscribers():
                unattended_since = None
            elif unattended_since is None:
                unattended_since = now
            elif now - unattended_since >= self._question_grace:
                unattended.append(True)
                scope.cancel()
                return
            # A deployment with a short grace (tests) is watched proportionally often.
            await trio.sleep(min(question_watch_interval_seconds, self._question_grace / 4))

    # -- the actor's side -------------------------------------------------------------------

    def answer_tool(self, call_id: str, result: Any, *, is_error: bool = False) -> AnswerOutcome:
        """``POST …/tool-results/:callId``: the first valid answer wins."""
        pending, refusal = self._find("tool", call_id)
        if refusal is not None:
            return refusal
        assert pending is not None
        self._settle(pending, "answered", result, is_error)
        return Answered(call_id)

    def answer_permission(self, request_id: str, digest: str, verdict: Verdict) -> AnswerOutcome:
        """``POST …/permission/:requestId``: the digest must repeat the request's digest."""
        assert verdict in ("allow", "deny"), verdict
        pending, refusal = self._find("permission", request_id)
        if refusal is not None:
            return refusal
        assert pending is not None
        if digest != pending.digest:
            return SessionRefused(
                "digest_mismatch", "摘要与权限请求不符", {"requestId": request_id}
            )
        self._settle(pending, "answered", verdict)
        self._publish_closed("server.permission.closed", pending, "answered",
                             {"verdict": verdict})
        return Answered(request_id)

    def answer_question(self, request_id: str, answers: Sequence[Any]) -> AnswerOutcome:
        """``POST …/questions/:requestId``: structured answers may name only what was asked."""
        pending, refusal = self._find("question", request_id)
        if refusal is not None:
            return refusal
        assert pending is not None
        problem = answers_problem(pending.questions, answers)
        if problem is not None:
            return SessionRefused("validation_failed", "答案引用了请求未提供的问题或选项",
                                  {"requestId": request_id, **problem})
        self._settle(pending, "answered", tuple(answers))
        self._publish_closed("server.question.closed", pending, "answered", {})
        return Answered(request_id)

    def cancel_all(self, reason: str, *, turn_id: str | None = None) -> int:
        """End every pending request (of ``turn_id`` only, when given): ``server.tool.cancel``
        for tool requests, ``closed`` frames for the others.  Returns how many ended.
        Synchronous, so an interrupted turn can call it from a ``finally`` block."""
        ended = 0
        for pending in list(self._pending.values()):
            if turn_id is not None and pending.turn_id != turn_id:
                continue
            self._settle(pending, "cancelled")
            ended += 1
            if pending.kind == "tool":
                self._publish(
                    "server.tool.cancel",
                    {"callId": pending.request_id, "reason": reason,
                     "ts": self._wall_milliseconds()},
                    pending.turn_id,
                )
            elif pending.kind == "permission":
                self._publish_closed("server.permission.closed", pending, "cancelled",
                                     {"verdict": "deny", "why": reason})
            else:
                self._publish_closed("server.question.closed", pending, "cancelled",
                                     {"why": reason})
        return ended

    def pending_count(self) -> int:
        return len(self._pending)

    def statistics(self) -> BridgeStatistics:
        self._statistics.pending = len(self._pending)
        return BridgeStatistics(**vars(self._statistics))

    # -- internals --------------------------------------------------------------------------

    def _open(self, kind: RequestKind, request_id: str, turn_id: str | None) -> _Pending | None:
        assert request_id not in self._pending, request_id
        if len(self._pending) >= pending_requests_max:
            self._statistics.refused += 1
            return None
        self._statistics.requests += 1
        pending = _Pending(kind, request_id, turn_id)
        self._pending[request_id] = pending
        return pending

    def _find(self, kind: RequestKind, request_id: str) -> tuple[_Pending | None, SessionRefused | None]:
        pending = self._pending.get(request_id)
        if pending is not None and pending.kind == kind:
            return pending, None
        settled = self._settled.get(request_id)
        if settled == f"{kind}:answered":
            return None, SessionRefused(
                "request_already_answered", "该请求已有应答", {"requestId": request_id}
            )
        if settled in (f"{kind}:cancelled", f"{kind}:expired"):
            return None, SessionRefused(
                "request_cancelled", "该请求已取消或过期", {"requestId": request_id}
            )
        return None, SessionRefused("request_not_found", "没有这个待答请求", {"requestId": request_id})

    def _settle(self, pending: _Pending, outcome: Literal["answered", "expired", "cancelled"],
                value: Any = None, is_error: bool = False) -> None:
        pending.settle(outcome, value, is_error)
        del self._pending[pending.request_id]
        self._settled[pending.request_id] = f"{pending.kind}:{outcome}"
        while len(self._settled) > settled_requests_remembered_max:
            self._settled.popitem(last=False)
        counter = {"answered": "answered", "expired": "expired", "cancelled": "cancelled"}[outcome]
        setattr(self._statistics, counter, getattr(self._statistics, counter) + 1)

    def _close_expired(self, pending: _Pending) -> bool:
        """After a wait: a request nobody settled has expired.  True when it just did."""
        if pending.outcome is not None:
            return False
        self._settle(pending, "expired")
        return True

    def _publish_closed(self, type: str, pending: _Pending, outcome: str,
                        extra: dict[str, Any]) -> None:
        self._publish(
            type,
            {"requestId": pending.request_id, "outcome": outcome, **extra,
             "ts": self._wall_milliseconds()},
            pending.turn_id,
        )


__all__ = [
    "AnswerOutcome",
    "Answered",
    "BridgeStatistics",
    "Bridges",
    "PermissionDecision",
    "Publish",
    "QuestionAnswer",
    "ToolAnswer",
    "answers_problem",
    "arguments_digest",
    "canonical_json",
    "offered_option_ids",
    "pending_requests_max",
    "permission_ttl_seconds",
    "question_ttl_seconds",
    "question_unattended_grace_seconds",
    "settled_requests_remembered_max",
    "tool_timeout_seconds_default",
]
