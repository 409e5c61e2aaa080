"""The knowledge surface's workload: an agent writing its memory over the real PIXIU app, under
faults.

Why over HTTP: the knowledge contract's promises (an acknowledged write is durable, one
idempotency key is one memory for ever, a failed receipt is retried only once an operator
authorised it, forgetting is for good, sensitive evidence never reaches an agent context, a
scope never leaks into another) are kept jointly by the schemas, the scope actor
``("knowledge_scope", scope)``, the receipts, the structuring outbox, the recall index and
storage.  So every operation goes through ``world.apps["knowledge"]`` (the in-process ASGI
driver) while the simulator's runtime fault points, storage faults, crashes and power losses
are armed, and this workload also arms the surface's own domain fault point
``sensitivity_check_fails`` (``troupe.runtime.domain_fault_point_names``) in about half the
seeds that arm runtime faults.

What the agent does (each client step picks one operation):

- writes CONVERSATION turns and TOOL_RESULT results (agent provenance, an idempotency key per
  request) to ``user:*`` and ``shared:*`` scopes; some carry sensitive content (a phone number,
  a password): accepted in ``user:*`` (and flagged), refused 422 in ``shared:*``;
- retries a request whose outcome it does not know (no answer, 500, 503 ``OVERLOADED``) with
  the same key and the same payload, in the step and in later steps, across crashes; on 409
  ``IDEMPOTENCY_FAILED`` it asks ``/agent/idempotency/recover`` and retries exactly once;
  sometimes it asks recovery for a request that was acknowledged (must be 409
  ``IDEMPOTENCY_COMPLETED``);
- races two updates of one item on the same ``expected_version``;
- asks ``/agent/context`` and ``/memory/query`` and reads ``/evidence/{id}``;
- forgets a memory by its tag (``confirm=false`` then ``confirm=true`` with the token).

Every text carries a unique tag ``tg<n>z`` (the workload's own marker: the same in every retry
of one request), so any text a read returns says exactly whose content it shows.

Invariants (on every answer, after every restart and at quiescence against committed storage):

- **one memory per key**: all the acknowledgements of one key name the same evidence id; the
  store never holds more than one evidence row per key (nor ever a different one than it held
  before), and that evidence links to at most one knowledge item; a request refused with 422
  never leaves evidence;
- **durability**: an acknowledged write's or update's evidence stays in the store until a
  forget removes it (then its tombstone is there); at quiescence every surviving write
  evidence is structured into knowledge or still queued;
- **forgetting**: no read invoked after a forget was acknowledged returns a forgotten knowledge
  or evidence id or shows a forgotten evidence's tag; forgotten ids never come back into the
  store; at quiescence a read of every scope is checked against the store's tombstones;
- **sensitivity**: no agent context shows a sensitive write's tag or lists its evidence; a
  sensitive write is answered with ``sensitivity > 0``; the store keeps no sensitive evidence in
  a ``shared:*`` scope;
- **scopes**: a read asked for scope S returns items of S only, evidence written to S only and
  tags written to S only;
- **updates**: an acknowledged update answers ``expected_version + 1``, and two different
  updates of one item are never both acknowledged at the same version;
- every refusal is one of the contract's codes with the documented envelope, and a 500 is
  ``INTERNAL_ERROR``.

Trade-off: one step is one request (with its retries) or one short exchange (plan then confirm,
two racing updates), so the workload is cheap; the store checks run only at the checkpoints.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from ._asgi import AsgiDriver
from ._violation import Violation
from ._workload import World, check_shares, choose_by_share, read_checkpoint, register_workload
from ._workload_http import HttpExchange, retry_seconds, send_traced

checker_name = "knowledge"
surface_name = "knowledge"

user_scopes = ("user:alice", "user:bob")
shared_scopes = ("shared:team", "shared:ops")
scopes = user_scopes + shared_scopes

client_pause_seconds_max = 0.2
request_seconds_max = 20.0
"""Shorter than the app's actor asks (60 s): a slow turn becomes an unknown outcome."""
attempts_max = 3
"""Attempts of one request within one step; an unsettled request is retried in later steps."""
retry_sleep_seconds_max = 3.0
sensitive_share = 0.12
reply_lost_share = 0.15
"""Share of 200s the agent never sees (the reply lost on the way): it resends the request."""
tool_result_share = 0.35
shared_tool_titles = ("天气查询", "日程安排", "汇率换算")
"""TOOL_RESULT titles shared by several writes: their evidence lands on one item (a merge)."""
sensitivity_fault_arm_probability = 0.5
sensitivity_fault_rate_range = (0.01, 0.3)
sensitivity_fault_point = "sensitivity_check_fails"
"""Mirror of the scope actor's point name (written here: the workload arms it)."""
agent_context_chars_range = (64, 2_000)
agent_context_top_k_max = 20

phrases = (
    "我喜欢吃寿司", "我最近在学吉他", "I like hiking in the mountains", "我明天要去北京出差",
    "请保持回答简洁", "I love green tea", "我讨厌下雨天", "周末想去看电影", "我养了一只猫叫团子", "最近在读三体",
)
tag_pattern = re.compile(r"tg(\d+)z")
error_codes = frozenset({
    "INVALID_REQUEST", "IDEMPOTENCY_CONFLICT", "IDEMPOTENCY_IN_PROGRESS", "IDEMPOTENCY_FAILED",
    "IDEMPOTENCY_NOT_FOUND", "IDEMPOTENCY_COMPLETED", "IDEMPOTENCY_KEY_REQUIRED", "INVALID_RECOVERY_REQUEST",
    "SENSITIVE_SHARED_SCOPE", "SENSITIVITY_CHECK_FAILED", "SCHEMA_NOT_READY", "NOT_FOUND", "CONFLICT_TIMEOUT",
    "REQUEST_NOT_FOUND", "INTERNAL_ERROR", "VERSION_CONFLICT", "KNOWLEDGE_NOT_ACTIVE", "OVERLOADED",
})
"""The contract's codes (written here, not imported: a checker must not take the code's word)."""
error_body_keys = frozenset({"error", "message", "request_id"})
unknown_outcome_codes = frozenset({"OVERLOADED", "INTERNAL_ERROR"})
"""Answers after which the request may or may not have been applied (a timed-out ask keeps
running; a crash after the commit)."""


# ---------------------------------------------------------------------------------------------
# What the agent was told, kept across process lifetimes
# ---------------------------------------------------------------------------------------------


@dataclass
class SentRequest:
    """One idempotent request (a write or an update) as the agent sent it; retries resend
    ``body`` unchanged."""

    number: int
    key: str
    route: str
    """``/memory/write`` or ``/memory/update``."""
    operation: str
    """The recover endpoint's name: ``MEMORY_WRITE`` or ``MEMORY_UPDATE``."""
    scope: str
    body: dict[str, Any]
    tag: int
    sensitive: bool
    knowledge_id: str | None = None
    expected_version: int = 0
    outcome: str = "unknown"
    """``acknowledged``, ``refused`` (certainly never applied) or ``unknown``."""
    evidence_id: str | None = None
    version: int = 0
    invoke_seq: int = 0
    ack_seq: int = 0
    attempts: int = 0
    recovery_count: int = 0
    reply_dropped: bool = False
    """A 200 the agent did not see (``reply_lost_share``): it retried."""
    busy: bool = False
    settled: bool = False
    """Nothing more to do: acknowledged, refused, or lost to a newer version."""

    @property
    def acknowledged(self) -> bool:
        return self.outcome == "acknowledged"

    @property
    def encoded(self) -> bytes:
        return json.dumps(self.body, ensure_ascii=False).encode()


@dataclass
class _Snapshot:
    evidence: dict[str, tuple[str, str, int, str]]
    """evidence id -> (scope, idempotency key or "", sensitivity, origin)."""
    by_key: dict[str, list[str]]
    links: dict[str, set[str]]
    """evidence id -> knowledge ids it is linked to."""
    items: dict[str, str]
    """knowledge id -> scope."""
    queued: set[str]
    forgotten: set[str]


def _read_snapshot(connection: Any) -> _Snapshot:
    """Everything the checkers compare, from one read transaction."""
    evidence: dict[str, tuple[str, str, int, str]] = {}
    by_key: dict[str, list[str]] = {}
    for evidence_id, scope, key, sensitivity, origin in connection.execute(
            "SELECT id, scope, idempotency_key, sensitivity, origin FROM knowledge_evidence"):
        evidence[evidence_id] = (scope, key or "", int(sensitivity), origin)
        if key:
            by_key.setdefault(f"{origin}:{key}", []).append(evidence_id)
    links: dict[str, set[str]] = {}
    for knowledge_id, evidence_id in connection.execute("SELECT knowledge_id, evidence_id FROM knowledge_links"):
        links.setdefault(evidence_id, set()).add(knowledge_id)
    items = {row[0]: row[1] for row in connection.execute("SELECT id, scope FROM knowledge_items")}
    queued = {row[0] for row in connection.execute("SELECT evidence_id FROM knowledge_structuring")}
    forgotten = {row[0] for row in connection.execute("SELECT id FROM knowledge_forgotten")}
    return _Snapshot(evidence, by_key, links, items, queued, forgotten)


class KnowledgeWorkload:
    name = "knowledge"

    def __init__(self) -> None:
        self.counter = 0
        self.requests: dict[str, SentRequest] = {}
        """idempotency key -> request (keys are unique across scopes and namespaces)."""
        self.tag_scope: dict[int, str] = {}
        self.tag_request: dict[int, SentRequest] = {}
        self.sensitive_tags: set[int] = set()
        self.evidence_scope: dict[str, str] = {}
        self.evidence_tag: dict[str, int] = {}
        self.sensitive_evidence: set[str] = set()
        self.items: dict[str, tuple[str, int]] = {}
        """knowledge id -> (scope, highest version a read showed)."""
        self.forgotten: dict[str, int] = {}
        """forgotten knowledge or evidence id -> trace sequence of the forget's acknowledgement."""
        self.forgotten_tags: dict[int, int] = {}
        self.store_evidence_by_key: dict[str, str] = {}
        """idempotency key -> the evidence id a checkpoint found (must never change)."""
        self.versions_won: dict[tuple[str, int], str] = {}
        """(knowledge id, version) -> key of the acknowledged update that made it."""
        self.responses = 0
        self.reads_checked = 0
        self._fault_point_armed = False
        self._pending: list[Violation] = []
        self._reported: set[str] = set()

    def actor_kinds(self, world: World) -> list[Any]:
        return []  # the knowledge surface's kinds come with the server (``SimServer``)

    def migrations(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = (), scope: str | None = None, *,
                 once: bool = False) -> None:
        """``once``: a storage finding, reported at the first checkpoint that sees it only."""
        if once:
            if text in self._reported:
                return
            self._reported.add(text)
        actors = (("knowledge_scope", scope),) if scope else ()
        self._pending.append(Violation(f"knowledge: {text}", sequences=tuple(sorted(set(sequences))),
                                       actors=actors, checker=checker_name))

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def _arm_domain_fault_point(self, world: World) -> None:
        """Arm ``sensitivity_check_fails`` in the run's seeded fault points (once per run, in
        about half the seeds that have runtime fault points at all)."""
        fault_points = world.env.fault_points
        rates = getattr(fault_points, "rates", None)
        if self._fault_point_armed or not isinstance(rates, dict):
            return
        self._fault_point_armed = True
        if world.random.random() < sensitivity_fault_arm_probability:
            low, high = sensitivity_fault_rate_range
            rates[sensitivity_fault_point] = math.exp(
                math.log(low) + (math.log(high) - math.log(low)) * world.random.random())

    async def _send(self, world: World, driver: AsgiDriver, method: str, path: str, body: bytes = b"") -> HttpExchange:
        """One request; checks what every answer must satisfy.  ``response`` is None when the
        exchange failed (timeout, cut short): an unknown outcome."""
        headers = [("content-type", "application/json")] if body else []
        exchange = await send_traced(world, driver, surface_name, method, path, violate=self._violate,
                                     headers=headers, body=body, seconds_max=request_seconds_max)
        if exchange.response is None:
            return exchange
        self.responses += 1
        if exchange.response.status >= 400:
            self._check_error_body(method, path, exchange)
        return exchange

    def _check_error_body(self, method: str, path: str, exchange: HttpExchange) -> None:
        response, document = exchange.response, exchange.document
        assert response is not None
        if not (isinstance(document, dict) and set(document) == error_body_keys and document["error"] in error_codes
                and isinstance(document["message"], str) and document["request_id"] == response.header("x-request-id")):
            self._violate(f"{method} {path} answered {response.status} without the contract's error body: "
                          f"{response.body[:200]!r}", exchange.sequences)
        elif response.status == 500 and (document["error"] != "INTERNAL_ERROR" or document["message"] != "internal error"):
            self._violate(f"{method} {path} answered 500 with details: {response.body[:200]!r}", exchange.sequences)

    def _unexpected(self, what: str, exchange: HttpExchange, scope: str | None = None) -> None:
        body = exchange.response.body[:200] if exchange.response is not None else b""
        self._violate(f"{what} answered {exchange.status} {body!r}", exchange.sequences, scope)

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get(surface_name)
        if driver is None or world.engine is None:
            return
        self._arm_domain_fault_point(world)
        operation = choose_by_share(world.random.random(), _operations)
        if operation is not None:
            await operation(self, world, driver)

    def _new_tag(self, scope: str, sensitive: bool) -> int:
        tag = self._next()
        self.tag_scope[tag] = scope
        if sensitive:
            self.sensitive_tags.add(tag)
        return tag

    def _sensitive_text(self, world: World, tag: int) -> str:
        if world.random.random() < 0.5:
            return f"我的手机号是 138{tag % 100_000_000:08d}"
        return f"我的密码是 pw{tag}secret"

    def _pick_scope(self, world: World) -> str:
        return scopes[world.random.randrange(0, len(scopes))]

    # -- writes ------------------------------------------------------------------------------
    async def write(self, world: World, driver: AsgiDriver) -> None:
        scope = self._pick_scope(world)
        sensitive = world.random.random() < sensitive_share
        tag = self._new_tag(scope, sensitive)
        number = self._next()
        phrase = phrases[world.random.randrange(0, len(phrases))]
        secret = f" {self._sensitive_text(world, tag)}" if sensitive else ""
        provenance: dict[str, Any] = {"session_id": f"session-{number % 7}", "run_id": f"run-{number % 3}",
                                      "turn_id": f"turn-{number}", "occurred_at": 1_788_393_600 + number}
        if world.random.random() < tool_result_share:
            title = (shared_tool_titles[world.random.randrange(0, len(shared_tool_titles))]
                     if world.random.random() < 0.5 else f"工具结果 tg{tag}z")
            provenance.update(tool_call_id=f"call-{number}", tool_name="lookup", approved=True)
            body = {"source_type": "TOOL_RESULT", "scope": scope,
                    "raw": {"title": title, "result": f"{phrase} tg{tag}z{secret}"}}
        else:
            body = {"source_type": "CONVERSATION", "scope": scope,
                    "raw": {"user": f"{phrase} tg{tag}z{secret}", "assistant": f"好的，我记住了 tg{tag}z"}}
        key = f"agent-{number}:w"
        body.update(provenance=provenance, idempotency_key=key)
        request = SentRequest(number, key, "/memory/write", "MEMORY_WRITE", scope, body, tag, sensitive)
        self._register(request)
        await self._deliver(world, driver, request)

    def _register(self, request: SentRequest) -> None:
        self.requests[request.key] = request
        self.tag_request[request.tag] = request

    async def retry_unsettled(self, world: World, driver: AsgiDriver) -> None:
        """The agent retries a request whose outcome it never learned (same key, same body)."""
        waiting = [request for request in self.requests.values() if not request.settled and not request.busy]
        if not waiting:
            await self.write(world, driver)
            return
        await self._deliver(world, driver, waiting[world.random.randrange(0, len(waiting))])

    async def _deliver(self, world: World, driver: AsgiDriver, request: SentRequest) -> None:
        """Send ``request`` until it is settled or ``attempts_max`` attempts were made."""
        if request.busy or request.settled:
            return
        request.busy = True
        try:
            authorised = False
            for attempt in range(attempts_max):
                request.attempts += 1
                exchange = await self._send(world, driver, "POST", request.route, request.encoded)
                if not request.invoke_seq:
                    request.invoke_seq = exchange.invoke_seq
                verdict = self._judge(request, exchange)
                if verdict == "acknowledged" and not request.reply_dropped and world.random.random() < reply_lost_share:
                    # The reply is lost on its way back: the agent retries, unaware (the
                    # checker keeps what the server said).
                    request.reply_dropped, request.settled = True, False
                    continue
                if verdict in ("settled", "acknowledged"):
                    return
                if verdict == "failed_receipt":
                    if authorised:
                        # The authorised retry failed again: it needs a new authorisation.
                        authorised = False
                    if await self._recover(world, driver, request):
                        authorised = True
                        continue  # the one authorised retry, right away
                if attempt + 1 < attempts_max:
                    await trio.sleep(retry_seconds(exchange.response, world, retry_sleep_seconds_max))
        finally:
            request.busy = False

    def _judge(self, request: SentRequest, exchange: HttpExchange) -> str:
        """What one answer to ``request`` says: ``settled``, ``retry`` or ``failed_receipt``."""
        status, code = exchange.status, _error_code(exchange)
        what = f"{request.route} {request.key}"
        if status == 200:
            self._acknowledged(request, exchange)
            return "acknowledged"
        if status == 0 or code in unknown_outcome_codes or code == "SENSITIVITY_CHECK_FAILED":
            return "retry"
        if request.acknowledged:
            self._violate(f"{what} was acknowledged, and resent unchanged it answered {status} {code}",
                          (request.ack_seq, *exchange.sequences), request.scope)
            request.settled = True
            return "settled"
        if code == "IDEMPOTENCY_FAILED":
            return "failed_receipt"
        if code == "IDEMPOTENCY_IN_PROGRESS":
            return "retry"
        if code == "SENSITIVE_SHARED_SCOPE":
            if not (request.sensitive and request.scope in shared_scopes):
                self._unexpected(f"{what} (not sensitive or not shared)", exchange, request.scope)
            request.outcome = "refused" if request.outcome == "unknown" else request.outcome
            request.settled = True
            return "settled"
        if request.route == "/memory/update" and code in ("VERSION_CONFLICT", "NOT_FOUND", "KNOWLEDGE_NOT_ACTIVE"):
            # Another update won that version, or the item was forgotten or replaced: this one
            # was certainly not applied (a replay of an applied one would have answered 200).
            request.settled = True
            if request.outcome == "unknown":
                request.outcome = "refused"
            return "settled"
        if code == "IDEMPOTENCY_CONFLICT":
            self._violate(f"{what} resent unchanged was answered IDEMPOTENCY_CONFLICT", exchange.sequences,
                          request.scope)
            request.settled = True
            return "settled"
        self._unexpected(what, exchange, request.scope)
        request.settled = True
        return "settled"

    def _acknowledged(self, request: SentRequest, exchange: HttpExchange) -> None:
        document, what = exchange.document, f"{request.route} {request.key}"
        evidence_id = document.get("evidence_id") if isinstance(document, dict) else None
        if not isinstance(evidence_id, str) or not evidence_id:
            self._unexpected(f"{what} (no evidence_id)", exchange, request.scope)
            request.settled = True
            return
        if request.sensitive and request.scope in shared_scopes:
            self._violate(f"{what}: sensitive content accepted into {request.scope}", exchange.sequences,
                          request.scope)
        if request.route == "/memory/write":
            if document.get("status") != "accepted" or not isinstance(document.get("sensitivity"), int):
                self._unexpected(what, exchange, request.scope)
            elif request.sensitive and document["sensitivity"] <= 0:
                self._violate(f"{what}: sensitive content answered sensitivity {document['sensitivity']}",
                              exchange.sequences, request.scope)
        else:
            version = document.get("version")
            if document.get("status") != "updated" or document.get("knowledge_id") != request.knowledge_id:
                self._unexpected(what, exchange, request.scope)
            elif version != request.expected_version + 1:
                self._violate(f"{what}: expected_version {request.expected_version} acknowledged as version "
                              f"{version}", exchange.sequences, request.scope)
            else:
                winner = self.versions_won.setdefault((request.knowledge_id, version), request.key)
                if winner != request.key:
                    other = self.requests[winner]
                    self._violate(f"updates {winner} and {request.key} of {request.knowledge_id} were both "
                                  f"acknowledged at version {version}",
                                  (other.invoke_seq, other.ack_seq, *exchange.sequences), request.scope)
                request.version = version
        if request.evidence_id is not None and request.evidence_id != evidence_id:
            self._violate(f"{what} was acknowledged with two evidence ids: {request.evidence_id} then {evidence_id}",
                          (request.ack_seq, *exchange.sequences), request.scope)
        if request.evidence_id is None:
            request.evidence_id = evidence_id
            request.ack_seq = exchange.complete_seq
            self.evidence_scope[evidence_id] = request.scope
            self.evidence_tag[evidence_id] = request.tag
            if request.sensitive:
                self.sensitive_evidence.add(evidence_id)
        request.outcome = "acknowledged"
        request.settled = True

    async def _recover(self, world: World, driver: AsgiDriver, request: SentRequest) -> bool:
        """Ask for one more try of a failed receipt; True when it was authorised."""
        body = {"operation": request.operation, "original_request": request.body, "confirm_duplicate_risk": True,
                "reason": f"agent verified turn {request.number} is missing"}
        exchange = await self._send(world, driver, "POST", "/agent/idempotency/recover",
                                    json.dumps(body, ensure_ascii=False).encode())
        document, code = exchange.document, _error_code(exchange)
        if exchange.status == 200:
            if not (isinstance(document, dict) and document.get("status") == "RETRY_AUTHORIZED"
                    and document.get("idempotency_key") == request.key
                    and document.get("operation") == request.operation
                    and isinstance(document.get("recovery_count"), int)):
                self._unexpected(f"recover {request.key}", exchange, request.scope)
                return False
            if request.acknowledged:
                self._violate(f"recover {request.key} authorised a retry of an acknowledged request",
                              exchange.sequences, request.scope)
            if document["recovery_count"] <= request.recovery_count:
                self._violate(f"recover {request.key}: recovery_count went from {request.recovery_count} to "
                              f"{document['recovery_count']}", exchange.sequences, request.scope)
            request.recovery_count = max(request.recovery_count, document["recovery_count"])
            return True
        if code == "IDEMPOTENCY_NOT_FOUND" and request.acknowledged:
            self._violate(f"recover {request.key} of an acknowledged request found no receipt", exchange.sequences,
                          request.scope)
        elif code in ("IDEMPOTENCY_COMPLETED", "IDEMPOTENCY_CONFLICT", "IDEMPOTENCY_IN_PROGRESS",
                      "IDEMPOTENCY_NOT_FOUND", "SENSITIVITY_CHECK_FAILED") or code in unknown_outcome_codes:
            pass  # completed meanwhile, authorised by an earlier attempt, or transient
        elif exchange.status != 0:
            self._unexpected(f"recover {request.key}", exchange, request.scope)
        return False

    async def recover_acknowledged(self, world: World, driver: AsgiDriver) -> None:
        """Recovery of an acknowledged request must never authorise a retry."""
        done = [request for request in self.requests.values() if request.acknowledged and not request.busy]
        if not done:
            await self.write(world, driver)
            return
        request = done[world.random.randrange(0, len(done))]
        body = {"operation": request.operation, "original_request": request.body, "confirm_duplicate_risk": True,
                "reason": "operator double-checks"}
        exchange = await self._send(world, driver, "POST", "/agent/idempotency/recover",
                                    json.dumps(body, ensure_ascii=False).encode())
        if exchange.status == 200:
            self._violate(f"recover {request.key} authorised a retry of an acknowledged request",
                          (request.ack_seq, *exchange.sequences), request.scope)
        elif exchange.status and _error_code(exchange) not in ("IDEMPOTENCY_COMPLETED", *unknown_outcome_codes):
            self._unexpected(f"recover of acknowledged {request.key}", exchange, request.scope)

    # -- updates -----------------------------------------------------------------------------
    async def update_race(self, world: World, driver: AsgiDriver) -> None:
        """Two updates of one item on the same ``expected_version``, sent together."""
        candidates = sorted(knowledge_id for knowledge_id in self.items if knowledge_id not in self.forgotten)
        if not candidates:
            await self.agent_context(world, driver)
            return
        knowledge_id = candidates[world.random.randrange(0, len(candidates))]
        scope, version = self.items[knowledge_id]
        racers = []
        for _ in range(1 + (world.random.random() < 0.7)):
            sensitive = scope in user_scopes and world.random.random() < sensitive_share
            tag = self._new_tag(scope, sensitive)
            number = self._next()
            secret = f" {self._sensitive_text(world, tag)}" if sensitive else ""
            key = f"agent-{number}:u"
            body = {"knowledge_id": knowledge_id, "expected_version": version, "scope": scope,
                    "body": {"note": f"{phrases[world.random.randrange(0, len(phrases))]} tg{tag}z{secret}"},
                    "idempotency_key": key}
            request = SentRequest(number, key, "/memory/update", "MEMORY_UPDATE", scope, body, tag, sensitive,
                                  knowledge_id=knowledge_id, expected_version=version)
            self._register(request)
            racers.append(request)
        async with trio.open_nursery() as nursery:
            for request in racers:
                nursery.start_soon(self._deliver, world, driver, request)

    # -- reads -------------------------------------------------------------------------------
    async def agent_context(self, world: World, driver: AsgiDriver, *, scope: str | None = None,
                            query: str | None = None, forgotten: set[str] | None = None) -> None:
        scope = scope or self._pick_scope(world)
        if query is None:
            query = "" if world.random.random() < 0.25 else phrases[world.random.randrange(0, len(phrases))]
        low, high = agent_context_chars_range
        max_chars = low if world.random.random() < 0.1 else low + world.random.randrange(0, high - low + 1)
        top_k = 1 + world.random.randrange(0, agent_context_top_k_max)
        number = self._next()
        body = {"query": query, "scope": scope, "session_id": f"session-{number % 7}", "turn_id": f"turn-{number}",
                "top_k": top_k, "max_chars": max_chars}
        sent_at = world.tracer.sequence + 1
        exchange = await self._send(world, driver, "POST", "/agent/context", json.dumps(body, ensure_ascii=False).encode())
        document = exchange.document
        if exchange.status in (0, 500, 503):
            return
        if exchange.status != 200 or not isinstance(document, dict) or not isinstance(document.get("context"), str) \
                or not isinstance(document.get("items"), list):
            self._unexpected("/agent/context", exchange, scope)
            return
        self.reads_checked += 1
        context, items = document["context"], document["items"]
        if len(context) > max_chars:
            self._violate(f"/agent/context answered {len(context)} characters for max_chars {max_chars}",
                          exchange.sequences, scope)
        if len(items) > top_k:
            self._violate(f"/agent/context answered {len(items)} items for top_k {top_k}", exchange.sequences, scope)
        shown_evidence: list[str] = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("knowledge_id"), str) \
                    or not isinstance(item.get("evidence_ids"), list) or not isinstance(item.get("version"), int):
                self._unexpected("/agent/context (malformed item)", exchange, scope)
                return
            knowledge_id = item["knowledge_id"]
            if item.get("scope") != scope:
                self._violate(f"/agent/context for {scope} returned {knowledge_id} of scope {item.get('scope')!r}",
                              exchange.sequences, scope)
            if not item["evidence_ids"]:
                self._violate(f"/agent/context returned {knowledge_id} without evidence", exchange.sequences, scope)
            shown_evidence.extend(item["evidence_ids"])
            self._check_id(knowledge_id, "/agent/context", sent_at, exchange, scope, forgotten)
            if item.get("scope") == scope:
                known = self.items.get(knowledge_id)
                self.items[knowledge_id] = (scope, max(item["version"], known[1] if known else 0))
        for evidence_id in shown_evidence:
            self._check_id(evidence_id, "/agent/context", sent_at, exchange, scope, forgotten)
            if evidence_id in self.sensitive_evidence:
                self._violate(f"/agent/context listed sensitive evidence {evidence_id}", exchange.sequences, scope)
        self._check_tags(context, "/agent/context", sent_at, exchange, scope, sensitive_banned=True)

    def _check_id(self, identifier: str, what: str, sent_at: int, exchange: HttpExchange, scope: str | None,
                  forgotten: set[str] | None = None) -> None:
        """A returned knowledge or evidence id: not forgotten before the read, of the asked scope."""
        forgotten_at = self.forgotten.get(identifier)
        if (forgotten_at is not None and forgotten_at < sent_at) or (forgotten is not None and identifier in forgotten):
            self._violate(f"{what} returned {identifier}, forgotten before the read was sent",
                          (*((forgotten_at,) if forgotten_at else ()), *exchange.sequences), scope)
        written_to = self.evidence_scope.get(identifier) or (self.items.get(identifier) or (None,))[0]
        if scope is not None and written_to is not None and written_to != scope:
            self._violate(f"{what} for {scope} returned {identifier} of {written_to}", exchange.sequences, scope)

    def _check_tags(self, text: str, what: str, sent_at: int, exchange: HttpExchange, scope: str | None, *,
                    sensitive_banned: bool) -> None:
        for tag in sorted({int(found) for found in tag_pattern.findall(text)}):
            owner = self.tag_scope.get(tag)
            if owner is None:
                self._violate(f"{what} shows tg{tag}z, which no client wrote", exchange.sequences, scope)
                continue
            if scope is not None and owner != scope:
                self._violate(f"{what} for {scope} shows tg{tag}z written to {owner}", exchange.sequences, scope)
            if sensitive_banned and tag in self.sensitive_tags:
                self._violate(f"{what} shows sensitive content tg{tag}z", exchange.sequences, scope)
            forgotten_at = self.forgotten_tags.get(tag)
            if forgotten_at is not None and forgotten_at < sent_at:
                self._violate(f"{what} shows tg{tag}z, forgotten before the read was sent",
                              (forgotten_at, *exchange.sequences), scope)

    async def query(self, world: World, driver: AsgiDriver) -> None:
        scope = self._pick_scope(world) if world.random.random() < 0.8 else None
        text = phrases[world.random.randrange(0, len(phrases))]
        if world.random.random() < 0.3 and self.tag_scope:
            text = f"tg{world.random.randrange(1, self.counter + 1)}z"
        hint: dict[str, Any] = {"top_k": 1 + world.random.randrange(0, 10)}
        if scope is not None:
            hint["scope"] = scope
        sent_at = world.tracer.sequence + 1
        exchange = await self._send(world, driver, "POST", "/memory/query",
                                    json.dumps({"text": text, "context_hint": hint}, ensure_ascii=False).encode())
        document = exchange.document
        if exchange.status in (0, 500, 503):
            return
        if exchange.status != 200 or not isinstance(document, dict) or not isinstance(document.get("answer"), str) \
                or not isinstance(document.get("source_evidence"), list):
            self._unexpected("/memory/query", exchange, scope)
            return
        self.reads_checked += 1
        for evidence_id in document["source_evidence"]:
            self._check_id(evidence_id, "/memory/query", sent_at, exchange, scope)
        source = document.get("source_knowledge")
        if isinstance(source, str):
            self._check_id(source, "/memory/query", sent_at, exchange, scope)
        self._check_tags(document["answer"], "/memory/query", sent_at, exchange, scope, sensitive_banned=False)

    async def evidence(self, world: World, driver: AsgiDriver) -> None:
        known = sorted(self.evidence_scope)
        if not known:
            await self.write(world, driver)
            return
        evidence_id = known[world.random.randrange(0, len(known))]
        sent_at = world.tracer.sequence + 1
        exchange = await self._send(world, driver, "GET", f"/evidence/{evidence_id}")
        document = exchange.document
        if exchange.status in (0, 404, 500, 503):
            return  # a lost evidence is the store checks' finding
        if exchange.status != 200 or not isinstance(document, dict):
            self._unexpected(f"/evidence/{evidence_id}", exchange)
            return
        forgotten_at = self.forgotten.get(evidence_id)
        if forgotten_at is not None and forgotten_at < sent_at:
            self._violate(f"/evidence/{evidence_id} answered 200 after it was forgotten",
                          (forgotten_at, *exchange.sequences), self.evidence_scope[evidence_id])
        request = self.tag_request[self.evidence_tag[evidence_id]]
        if document.get("scope") != request.scope or document.get("id") != evidence_id:
            self._unexpected(f"/evidence/{evidence_id} (scope or id)", exchange, request.scope)
        elif request.route == "/memory/write" and document.get("raw") != request.body["raw"]:
            self._violate(f"/evidence/{evidence_id} shows raw {document.get('raw')!r:.120} but "
                          f"{request.body['raw']!r:.120} was written", exchange.sequences, request.scope)

    # -- forgetting --------------------------------------------------------------------------
    async def forget(self, world: World, driver: AsgiDriver) -> None:
        """Plan a forget by a written tag, then (usually) confirm it with the plan's token."""
        written = [request for request in self.requests.values()
                   if request.route == "/memory/write" and request.tag not in self.forgotten_tags]
        if not written:
            await self.write(world, driver)
            return
        request = written[world.random.randrange(0, len(written))]
        command = f"忘记 tg{request.tag}z"
        scope = request.scope if world.random.random() < 0.5 else None
        plan_body: dict[str, Any] = {"command": command, "confirm": False}
        if scope is not None:
            plan_body["scope"] = scope
        sent_at = world.tracer.sequence + 1
        exchange = await self._send(world, driver, "POST", "/forget", json.dumps(plan_body, ensure_ascii=False).encode())
        document = exchange.document
        if exchange.status in (0, 500, 503):
            return
        if exchange.status != 200 or not isinstance(document, dict) or not isinstance(document.get("targets"), list) \
                or not isinstance(document.get("confirmation_token"), str):
            self._unexpected("/forget (plan)", exchange, scope)
            return
        for target in document["targets"]:
            if isinstance(target, dict) and isinstance(target.get("id"), str):
                self._check_id(target["id"], "/forget (plan)", sent_at, exchange, scope)
        if world.random.random() < 0.15:
            return  # the user never confirms
        confirm_body = {**plan_body, "confirm": True, "confirmation_token": document["confirmation_token"]}
        exchange = await self._send(world, driver, "POST", "/forget",
                                    json.dumps(confirm_body, ensure_ascii=False).encode())
        document = exchange.document
        if exchange.status in (0, 500, 503) or _error_code(exchange) in ("REQUEST_NOT_FOUND", "CONFLICT_TIMEOUT"):
            return  # unknown, or the plan was used or expired meanwhile (a crash, a clock jump)
        if exchange.status != 200 or not isinstance(document, dict) or document.get("status") != "forgotten" \
                or not isinstance(document.get("forgotten_ids"), list):
            self._unexpected("/forget (confirm)", exchange, scope)
            return
        for identifier in document["forgotten_ids"]:
            if not isinstance(identifier, str):
                continue
            self.forgotten.setdefault(identifier, exchange.complete_seq)
            tag = self.evidence_tag.get(identifier)
            if tag is not None:
                self.forgotten_tags.setdefault(tag, exchange.complete_seq)

    # ------------------------------------------------------------------ invariants
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=False)
        return self._take_pending()

    async def at_quiescence(self, world: World) -> list[Violation]:
        if world.engine is None:
            return self._take_pending()
        driver = world.apps.get(surface_name)
        if driver is not None:
            # Faults are off: the agent settles what it never learned (replays, or a recovery
            # and its one retry), so every key's story ends before the store is counted.
            for request in sorted(self.requests.values(), key=lambda request: request.number):
                await self._deliver(world, driver, request)
        snapshot = await self._check_storage(world, quiescent=True)
        if snapshot is not None and driver is not None:
            # A last read of every scope, judged against the store's own tombstones.
            for scope in scopes:
                await self.agent_context(world, driver, scope=scope, query="", forgotten=snapshot.forgotten)
                for phrase in phrases[:3]:
                    await self.agent_context(world, driver, scope=scope, query=phrase, forgotten=snapshot.forgotten)
        return self._take_pending()

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    async def _check_storage(self, world: World, *, quiescent: bool) -> _Snapshot | None:
        snapshot = await read_checkpoint(world, _read_snapshot, self._violate)
        if snapshot is None:
            return None
        self._check_keys(snapshot)
        self._check_durable(snapshot, quiescent=quiescent)
        self._check_forgotten(snapshot)
        for evidence_id, (scope, key, sensitivity, _) in snapshot.evidence.items():
            if sensitivity > 0 and scope.startswith("shared:"):
                self._violate(f"sensitive evidence {evidence_id} ({key}) is stored in {scope}", (), scope, once=True)
        return snapshot

    def _check_keys(self, snapshot: _Snapshot) -> None:
        """One evidence per key, ever; one knowledge per evidence; refused keys stored nothing."""
        for origin_key, evidence_ids in snapshot.by_key.items():
            key = origin_key.partition(":")[2]
            request = self.requests.get(key)
            scope = request.scope if request is not None else None
            if len(evidence_ids) > 1:
                self._violate(f"idempotency key {key} has {len(evidence_ids)} evidence rows: {sorted(evidence_ids)}",
                              (), scope, once=True)
            for evidence_id in evidence_ids:
                first = self.store_evidence_by_key.setdefault(key, evidence_id)
                if first != evidence_id:
                    self._violate(f"idempotency key {key} had evidence {first} and now has {evidence_id}", (), scope,
                                  once=True)
                if request is None:
                    continue
                if request.evidence_id is not None and request.evidence_id != evidence_id:
                    self._violate(f"idempotency key {key} was acknowledged with {request.evidence_id} but the store "
                                  f"holds {evidence_id}", (request.ack_seq,), scope, once=True)
                if request.outcome == "refused" and request.route == "/memory/write":
                    self._violate(f"write {key} was refused but its evidence {evidence_id} is stored",
                                  (request.invoke_seq,), scope, once=True)
                if snapshot.evidence[evidence_id][0] != request.scope:
                    self._violate(f"evidence {evidence_id} of {key} is stored in {snapshot.evidence[evidence_id][0]}",
                                  (), scope, once=True)
                if request.route == "/memory/write" and len(snapshot.links.get(evidence_id, ())) > 1:
                    self._violate(f"write {key} became {len(snapshot.links[evidence_id])} knowledge items",
                                  (), scope, once=True)

    def _check_durable(self, snapshot: _Snapshot, *, quiescent: bool) -> None:
        for request in self.requests.values():
            evidence_id = request.evidence_id
            if evidence_id is None or not request.acknowledged:
                continue
            if evidence_id not in snapshot.evidence and evidence_id not in snapshot.forgotten:
                self._violate(f"acknowledged {request.route} {request.key}: evidence {evidence_id} is lost",
                              (request.invoke_seq, request.ack_seq), request.scope, once=True)
            elif (quiescent and request.route == "/memory/write" and evidence_id in snapshot.evidence
                  and not snapshot.links.get(evidence_id) and evidence_id not in snapshot.queued):
                self._violate(f"acknowledged write {request.key}: evidence {evidence_id} was never structured and "
                              "is no longer queued", (request.ack_seq,), request.scope, once=True)

    def _check_forgotten(self, snapshot: _Snapshot) -> None:
        for identifier, sequence in self.forgotten.items():
            if identifier in snapshot.evidence or identifier in snapshot.items:
                self._violate(f"{identifier}, forgotten, is in the store again", (sequence,), once=True)
        for identifier in snapshot.forgotten:
            if identifier in snapshot.evidence or identifier in snapshot.items:
                self._violate(f"{identifier} has a tombstone and is in the store", (), once=True)
            for knowledge_id in snapshot.links.get(identifier, ()):
                self._violate(f"forgotten evidence {identifier} is linked to {knowledge_id}", (), once=True)


def _error_code(exchange: HttpExchange) -> str:
    """The contract's error code of an answer (``""`` when it has none)."""
    document = exchange.document
    return document.get("error", "") if isinstance(document, dict) else ""


Operation = Callable[[KnowledgeWorkload, World, AsgiDriver], Awaitable[None]]
_operations: tuple[tuple[float, Operation], ...] = (
    (0.36, KnowledgeWorkload.write),
    (0.08, KnowledgeWorkload.retry_unsettled),
    (0.03, KnowledgeWorkload.recover_acknowledged),
    (0.10, KnowledgeWorkload.update_race),
    (0.20, KnowledgeWorkload.agent_context),
    (0.10, KnowledgeWorkload.query),
    (0.06, KnowledgeWorkload.evidence),
    (0.07, KnowledgeWorkload.forget),
)
check_shares(_operations)


register_workload("knowledge", KnowledgeWorkload)

__all__ = ["KnowledgeWorkload", "scopes"]
