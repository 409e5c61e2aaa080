"""The character surface's workload: a N.E.K.O main server and its helpers speaking HTTP to the
real memory-server app, under faults.

Why over HTTP: the character contract's promises (an acknowledged turn is durable, ``/new_dialog``
waits for a running renew/settle, a released character does no derived work until reload, a
replayed or revoked claim is refused) are kept jointly by the gate, the app's handlers, the
character and lifecycle actors, the outbox runner and storage.  Calling the actors directly
would skip half of them, so every operation goes through ``world.apps["character"]`` (the
in-process ASGI driver) while the simulator's runtime fault points, storage faults, crashes and
power losses are armed.

Who the clients are (each client step picks one role):

- the **main server** caches turns (``/cache``), processes and renews them, and settles
  conversations (``/settle`` with ``[]``, with what it cached again, or with uncached
  messages) for four characters; every ``input_history`` is a JSON string, every message
  carries a unique tag (``#m<number>#``) so storage can be checked message by message; a
  request whose outcome is unknown (timeout, 503, a crashed turn) is retried with the same body;
- a **reader** asks ``/new_dialog``, ``/query_memory`` (sometimes a burst of concurrent
  queries to one character, which the app runs side by side outside the actor's turn, racing
  releases and reloads) and ``/get_recent_history``;
- **character management** releases characters with a fresh claim token and the generation it
  last published (retries reuse the token, as the contract says), reloads them (releasing
  exactly that token, sometimes publishing the next generation), replays revoked tokens and
  sends stale generations;
- the **launcher** blocks the server into limited mode and continues it again, and asks
  ``/health``.

Invariants (checked after every restart and at quiescence against committed storage, and on
every response):

- no acknowledged history lost: every message of an acknowledged ``/cache``, ``/process``,
  ``/renew`` or ``/settle`` is among the character's raw time-indexed rows (kept up to
  ``time_indexed_rows_per_character_max``, far more than a run writes); nothing is stored that
  no client sent, no message more often than it was sent, and a write is all or nothing (the
  never-before-sent messages of one write are stored equally often);
- the newest acknowledged write stays in recent history: compressions keep at least
  ``recent_history_kept_messages`` newest messages, so when the last acknowledged write and
  everything sent after it fit in that many messages, all of its messages are in recent
  history (a compression that drops messages appended while it ran breaks this);
- ``/new_dialog`` never observes a half-settled state: when a renew/settle was acknowledged
  before the new_dialog was sent, the detailed compression it registered has run before the
  answer, so the answer shows at most ``recent_history_kept_messages_detailed`` history lines
  plus the messages of writes that were not acknowledged before that settle was sent
  (excused when that compression failed for good);
- a released character runs no derived task until reload: no derived outbox task of a
  character completes (trace ``character_task``) between a release's acknowledgement and the
  first reload that could end that claim; a held release answers ``/query_memory`` with 503;
- a released character's handles are not read after the release answered: no leased recall
  of a character starts reading (trace ``character_lease_read``) between a release's
  acknowledgement and the first reload that could end that claim, and none that started
  before the acknowledgement ends (``character_lease_end``) after it;
- replayed or revoked claims are always refused: a release with a token that an acknowledged
  reload released, or with a fresh token whose generation is below an acknowledged published
  one, answers 409 ``status: "cancelled"`` with the contract's body; a fresh token at the
  current generation is never refused;
- outbox tasks complete exactly once: no character completes more tasks of a kind (trace)
  than its outbox holds ``done`` rows of that kind, no task id is traced twice as completed,
  and a ``done`` row never becomes active again;
- limited mode: while a block is acknowledged and no continue has been sent, every gated
  route answers the contract's 409 body; while a continue is acknowledged (or the process
  started) and no block has been sent, none does; ``/health`` keeps one ``instance_id`` per
  process lifetime and a new one per lifetime;
- the app never raises (the driver counts it), and a 500 from a route without a documented
  failure body only follows a crash of a character actor's turn.

Trade-off: one step is one request (with its retries) or one short exchange (release then
reload, block then continue), so the workload stays cheap; the storage checks run only at the
two checkpoints.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import cbor2
import trio

from ._asgi import AsgiDriver
from ._trace_queries import _TraceFollower
from ._violation import Violation
from ._workload import World, check_shares, choose_by_share, read_checkpoint, register_workload
from ._workload_http import HttpExchange, retry_seconds, send_traced

checker_name = "character"
surface_name = "character"

character_names = ("小天", "小雪", "Neko", "阿狸")
"""The characters the main server talks for (valid names, three of them not ASCII)."""

client_pause_seconds_max = 0.2
request_seconds_max = 20.0
"""Shorter than the app's actor asks: a slow turn becomes an unknown outcome to retry."""
new_dialog_seconds_max = 150.0
"""``/new_dialog`` may wait for a running renew/settle (the app waits up to 120 s)."""
attempts_max = 3
retry_sleep_seconds_max = 3.0
messages_per_write_max = 4
query_burst_share = 0.4
"""Share of ``/query_memory`` steps that send a burst of concurrent queries to one character."""
query_burst_size_max = 4
blocked_seconds_max = 2.0
"""How long the launcher keeps the server in limited mode before it continues."""
continue_attempts_max = 8

recent_history_kept_messages = 10
"""Mirror of ``_reflection.recent_history_kept_messages``: the fewest newest messages any
compression keeps (written here, not imported: a checker must not take the code's word)."""
recent_history_kept_messages_detailed = 20
"""Mirror of ``_reflection.recent_history_kept_messages_detailed``: what a renew/settle's
detailed compression keeps."""
context_history_lines_max = 40
"""Mirror of ``_context.context_history_messages_max``: history lines ``/new_dialog`` shows."""
time_indexed_rows_kept = 100_000
"""Mirror of ``_store.time_indexed_rows_per_character_max``."""
outbox_finished_rows_kept = 1_000
"""Mirror of ``_outbox.outbox_finished_tasks_per_character_max`` (older finished rows are pruned)."""

derived_task_kinds = frozenset({
    "post_turn_signal", "fact_extraction", "history_review", "reflection_synthesis", "promotion",
    "correction", "index_catch_up",
})
"""Every outbox kind but ``recent_compression`` (the settle's own work): what a claim stops."""

exempt_paths = ("/health", "/shutdown", "/internal/storage/startup/continue", "/internal/storage/startup/block")
"""Routes limited mode does not gate."""
blocked_body_keys = frozenset({"ok", "error_code", "blocking_reason", "limited_mode", "error"})
cancelled_body_keys = frozenset({"status", "character_name", "derived_task_claim_token", "message"})
actor_failure_events = (b"crash", b"turn_timeout", b"activation_failed", b"kind_failed", b"escalate",
                        b"poison_refused", b"commit_failed")
"""Trace events after which a route may answer 500 (the contract's "other failure"): a
crashed turn (also the gate's limited-mode check, which answers 500 before any route), a
message the runtime refuses as poison, or a failed commit.  A poison refusal excuses the 500
only while the quarantine lasts: within ``poison_quarantine_seconds`` of the ``poison`` record
(the second crash of an equal message) of the same actor and message type.  Retries resend
equal messages, so two injected crashes in a row still make the third attempt poison; what
the runtime no longer does (a message that ran, or a quarantine without end) is not excused."""
poison_quarantine_seconds = 60.0
"""Mirror of ``troupe.runtime._limits.poison_quarantine_seconds``."""

phrases = (
    "我喜欢吃寿司", "我最近在学吉他", "I like hiking in the mountains", "我明天要去北京出差",
    "今天有点累", "I love green tea", "我讨厌下雨天", "周末想去看电影", "我养了一只猫叫团子", "最近在读三体",
)
tag_pattern = re.compile(r"#m(\d+)#")
history_line_pattern = "{speaker}："

assert recent_history_kept_messages <= recent_history_kept_messages_detailed < context_history_lines_max
assert messages_per_write_max * attempts_max < recent_history_kept_messages_detailed


# ---------------------------------------------------------------------------------------------
# What the clients were told, kept across process lifetimes
# ---------------------------------------------------------------------------------------------


@dataclass
class SentWrite:
    """One history write as the main server sent it (retries resend ``body`` unchanged)."""

    number: int
    character: str
    route: str
    body: bytes
    tags: tuple[int, ...]
    fresh: tuple[int, ...]
    """Tags this write introduced (never sent before)."""
    invoke_seq: int = 0
    attempts: int = 0
    outcome: str = "unknown"
    """``acknowledged``, ``refused`` (certainly not applied: every attempt refused) or ``unknown``."""
    ack_seq: int = 0
    refusals: int = 0

    @property
    def acknowledged(self) -> bool:
        return self.outcome == "acknowledged"

    def certainly_before(self, sequence: int) -> bool:
        """Acknowledged before trace sequence ``sequence``."""
        return self.acknowledged and self.ack_seq < sequence


@dataclass
class Claim:
    """One release operation: its token, what it captured, and how far it got."""

    token: str
    character: str
    generation: int
    hold: bool
    ack_seq: int = 0
    """The first acknowledgement of the release (0: never acknowledged)."""
    ended_seq: float = math.inf
    """Invocation of the first reload that could end this claim (releasing the token, or
    publishing a generation above ``generation``)."""
    revoked_seq: int = 0
    """Acknowledgement of a reload that released this token: from then on it must be refused."""
    sequences: tuple[int, ...] = ()


@dataclass
class Suspect:
    """A ``/new_dialog`` answer that looked half-settled; decided at the next checkpoint
    (excused when the settle's compression failed for good)."""

    character: str
    lines: int
    bound: int
    sequences: tuple[int, ...]


@dataclass
class _LimitedModel:
    """Limited-mode switches of the current process lifetime (trace sequences)."""

    generation: int = 0
    blocks: list[tuple[int, int]] = field(default_factory=list)
    """(invoke, acknowledgement or 0) of every block sent this lifetime."""
    continues: list[tuple[int, int]] = field(default_factory=list)

    def certainly_blocked(self, invoke: int, complete: int) -> bool:
        """A block was acknowledged before ``invoke``, every continue sent before that block
        was acknowledged before it, and no continue was sent from then until ``complete``."""
        for block_invoke, block_ack in self.blocks:
            if not block_ack or block_ack >= invoke:
                continue
            earlier_settled = all(ack and ack < block_invoke for sent, ack in self.continues if sent < block_invoke)
            later_sent = any(block_invoke < sent < complete for sent, _ in self.continues)
            if earlier_settled and not later_sent:
                return True
        return False

    def certainly_open(self, invoke: int, complete: int) -> bool:
        """The lifetime started open, or a continue was acknowledged before ``invoke``; every
        block sent before ``complete`` was acknowledged before that start."""
        start = max([0] + [sent for sent, ack in self.continues if ack and ack < invoke])
        return all(ack and ack < start for sent, ack in self.blocks if sent < complete)


class CharacterWorkload:
    name = "character"

    def __init__(self) -> None:
        self.counter = 0
        self.tags = 0
        self.messages: dict[int, dict[str, Any]] = {}
        """tag -> the message as sent."""
        self.tag_owner: dict[int, str] = {}
        self.tag_writes: dict[int, list[SentWrite]] = {}
        self.writes: list[SentWrite] = []
        self.cached_since_settle: dict[str, list[int]] = {name: [] for name in character_names}
        self.claims: list[Claim] = []
        self.published_acknowledged: dict[str, int] = dict.fromkeys(character_names, 0)
        self.published_invoked: dict[str, int] = dict.fromkeys(character_names, 0)
        self.limited = _LimitedModel()
        self.limited_busy = False
        self.continue_needed = False
        self.instance_ids: dict[int, str] = {}
        self.suspects: list[Suspect] = []
        self.completions: Counter = Counter()
        """(character, task kind) -> completions traced."""
        self.completed_ids: dict[str, int] = {}
        """task id -> trace sequence of its completion (when the trace names it)."""
        self.done_ids: set[str] = set()
        self.responses = 0
        self._follower: _TraceFollower | None = None
        self._lease_follower: _TraceFollower | None = None
        self._reading: dict[tuple[str, Any], int] = {}
        """(character, lease number) -> trace sequence its read started (this lifetime)."""
        self._pending: list[Violation] = []
        self._reported: set[str] = set()

    def actor_kinds(self, world: World) -> list[Any]:
        return []  # the character surface's kinds come with the server (``SimServer``)

    def migrations(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = (), character: str | None = None,
                 *, once: bool = False) -> None:
        """``once``: a storage finding, reported at the first checkpoint that sees it only."""
        if once:
            if text in self._reported:
                return
            self._reported.add(text)
        actors = (("character", character),) if character else ()
        self._pending.append(Violation(f"character: {text}", sequences=tuple(sorted(set(sequences))),
                                       actors=actors, checker=checker_name))

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def _track_lifetime(self, world: World) -> None:
        if self.limited.generation != world.generation:
            self.limited = _LimitedModel(generation=world.generation)
            self.limited_busy = False
            self.continue_needed = False

    async def _send(self, world: World, driver: AsgiDriver, method: str, path: str, body: bytes = b"",
                    *, seconds_max: float = request_seconds_max) -> HttpExchange:
        """One request (``send_traced``: traced, an app that raised reported); checks what every
        answer must satisfy.  ``response`` is None when the exchange failed (timeout, cut
        short): an unknown outcome."""
        headers = [("content-type", "application/json")] if body else []
        exchange = await send_traced(world, driver, surface_name, method, path, violate=self._violate,
                                     headers=headers, body=body, seconds_max=seconds_max)
        if exchange.response is None:
            return exchange
        self.responses += 1
        self._check_limited_mode(world, method, path, exchange)
        return exchange

    def _check_limited_mode(self, world: World, method: str, path: str, exchange: HttpExchange) -> None:
        response = exchange.response
        assert response is not None
        route = path.partition("?")[0]
        if route in exempt_paths or world.generation != self.limited.generation:
            return
        document = exchange.document
        blocked = response.status == 409 and isinstance(document, dict) and document.get("error_code") == "storage_startup_blocked"
        if blocked and not (set(document) == blocked_body_keys and document["ok"] is False
                            and document["limited_mode"] is True and isinstance(document["blocking_reason"], str)
                            and isinstance(document["error"], str)):
            self._violate(f"{method} {route}: limited-mode 409 is not the contract's body: {response.body[:200]!r}",
                          exchange.sequences)
        if response.status in (500, 503) and not blocked:
            return  # the gate's own check failed transiently: no verdict
        if self.limited.certainly_blocked(exchange.invoke_seq, exchange.complete_seq) and not blocked:
            self._violate(f"{method} {route} answered {response.status} in limited mode (a block was "
                          "acknowledged and no continue sent)", exchange.sequences)
        elif blocked and self.limited.certainly_open(exchange.invoke_seq, exchange.complete_seq):
            self._violate(f"{method} {route} answered 409 storage_startup_blocked although no block was "
                          "sent since the last acknowledged continue", exchange.sequences)

    def _actor_failed_between(self, world: World, first: int, last: int) -> bool:
        """Did any actor turn crash, time out or fail to activate between two trace sequences
        (or the runtime refuse a message it still quarantines)?"""
        records = world.tracer.records
        for index in range(max(0, first - 1), min(len(records), last)):
            encoded = records[index]
            if any(marker in encoded for marker in actor_failure_events):
                _, moment, event, kind, key, fields = cbor2.loads(encoded)
                if event == "poison_refused":
                    if _quarantined(records, index, moment, kind, key, fields.get("message")):
                        return True
                elif event.encode() in actor_failure_events:
                    return True
        return len(records) < last  # the trace kept in memory ran out: no verdict

    def _unexpected_500(self, world: World, what: str, exchange: HttpExchange, character: str | None = None) -> None:
        """A 500 is only allowed after an actor's turn crashed (the route has no failure body)."""
        if not self._actor_failed_between(world, exchange.invoke_seq, exchange.complete_seq):
            body = exchange.response.body[:160] if exchange.response is not None else b""
            self._violate(f"{what} answered 500 {body!r} with no actor or storage failure in the trace",
                          exchange.sequences, character)

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get(surface_name)
        if driver is None or world.engine is None:
            return
        self._track_lifetime(world)
        if self.continue_needed and not self.limited_busy:
            await self._continue(world, driver)
            return
        operation = choose_by_share(world.random.random(), _operations)
        if operation is not None:
            await operation(self, world, driver)

    def _pick_character(self, world: World) -> str:
        return character_names[world.random.randrange(0, len(character_names))]

    def _new_message(self, world: World, character: str) -> int:
        self.tags += 1
        tag = self.tags
        role = "user" if world.random.random() < 0.55 else "assistant"
        text = f"{phrases[world.random.randrange(0, len(phrases))]} #m{tag}#"
        content: Any = text if world.random.random() < 0.8 else [{"type": "text", "text": text}]
        self.messages[tag] = {"role": role, "content": content}
        self.tag_owner[tag] = character
        return tag

    # -- the main server ------------------------------------------------------------------
    async def turn(self, world: World, driver: AsgiDriver) -> None:
        character = self._pick_character(world)
        roll = world.random.random()
        route = "cache" if roll < 0.5 else "process" if roll < 0.62 else "renew" if roll < 0.72 else "settle"
        resent: list[int] = []
        fresh: list[int] = []
        if route == "settle":
            choice = world.random.random()
            if choice < 0.35:
                pass  # settle what /cache wrote: an empty list
            elif choice < 0.7:
                resent = list(self.cached_since_settle[character][-messages_per_write_max:])
                if world.random.random() < 0.5:
                    fresh = [self._new_message(world, character)]
            else:
                fresh = [self._new_message(world, character) for _ in range(1 + world.random.randrange(0, 3))]
        else:
            fresh = [self._new_message(world, character)
                     for _ in range(1 + world.random.randrange(0, messages_per_write_max))]
        tags = tuple(resent + fresh)
        history = json.dumps([self.messages[tag] for tag in tags], ensure_ascii=False)
        body = json.dumps({"input_history": history}, ensure_ascii=False).encode()
        write = SentWrite(self._next(), character, route, body, tags, tuple(fresh))
        self.writes.append(write)
        for tag in tags:
            self.tag_writes.setdefault(tag, []).append(write)
        await self._deliver(world, driver, write)
        if route == "cache" and write.acknowledged:
            self.cached_since_settle[character].extend(tags)
        elif route == "settle" and write.acknowledged:
            self.cached_since_settle[character] = []

    async def _deliver(self, world: World, driver: AsgiDriver, write: SentWrite) -> None:
        path = f"/{write.route}/{quote(write.character, safe='')}"
        expected = {"cache": {"status": "cached", "count": len(write.tags)},
                    "process": {"status": "processed"}, "renew": {"status": "processed"},
                    "settle": {"status": "settled"}}[write.route]
        for attempt in range(attempts_max):
            write.attempts += 1
            exchange = await self._send(world, driver, "POST", path, write.body)
            if not write.invoke_seq:
                write.invoke_seq = exchange.invoke_seq
            response, document = exchange.response, exchange.document
            if response is not None and response.status == 200 and document == expected:
                write.outcome, write.ack_seq = "acknowledged", exchange.complete_seq
                return
            if response is not None and response.status == 409:
                write.refusals += 1  # limited mode: refused at the gate, nothing applied
                if write.refusals == write.attempts:
                    write.outcome = "refused"
                return
            if response is not None and response.status == 200:
                if not (isinstance(document, dict) and document.get("status") == "error"
                        and isinstance(document.get("message"), str) and set(document) == {"status", "message"}):
                    self._violate(f"{path} answered {response.body[:200]!r}, expected {expected} or a "
                                  "status error body", exchange.sequences, write.character)
                    return
            elif response is not None and response.status not in (500, 503):
                self._violate(f"{path} answered {response.status} {response.body[:160]!r}", exchange.sequences,
                              write.character)
                return
            elif response is not None and response.status == 500:
                self._unexpected_500(world, f"POST {path}", exchange, write.character)
            if attempt + 1 < attempts_max:
                await trio.sleep(retry_seconds(response, world, retry_sleep_seconds_max))

    # -- the reader -----------------------------------------------------------------------
    async def new_dialog(self, world: World, driver: AsgiDriver) -> None:
        character = self._pick_character(world)
        path = f"/new_dialog/{quote(character, safe='')}"
        sent_at = world.tracer.sequence + 1  # the http_invoke about to be recorded
        settle = max((write for write in self.writes if write.character == character
                      and write.route in ("renew", "settle") and write.certainly_before(sent_at)),
                     key=lambda write: write.ack_seq, default=None)
        exchange = await self._send(world, driver, "GET", path, seconds_max=new_dialog_seconds_max)
        response = exchange.response
        if response is None or response.status in (409, 503):
            return
        if response.status == 500:
            self._unexpected_500(world, "GET /new_dialog", exchange, character)
            return
        if response.status != 200 or not (response.header("content-type") or "").startswith("text/plain"):
            self._violate(f"{path} answered {response.status} {response.header('content-type')!r}", exchange.sequences,
                          character)
            return
        text = response.body.decode("utf-8", "replace")
        self._check_shown_tags(character, text, exchange)
        if settle is None:
            return
        lines = _history_lines(text, character)
        later = sum(len(write.tags) * write.attempts for write in self.writes
                    if write.character == character and write is not settle
                    and not write.certainly_before(settle.invoke_seq))
        bound = recent_history_kept_messages_detailed + later
        if bound < context_history_lines_max and lines > bound:
            self.suspects.append(Suspect(character, lines, bound,
                                         (settle.invoke_seq, settle.ack_seq, *exchange.sequences)))

    def _check_shown_tags(self, character: str, text: str, exchange: HttpExchange) -> None:
        """Context shows only messages someone sent to this very character."""
        strangers = sorted({int(tag) for tag in tag_pattern.findall(text)} - {
            tag for tag, owner in self.tag_owner.items() if owner == character})
        if strangers:
            self._violate(f"/new_dialog of {character} shows messages it was never sent: {strangers[:5]}",
                          exchange.sequences, character)

    async def query_memory(self, world: World, driver: AsgiDriver) -> None:
        character = self._pick_character(world)
        if world.random.random() >= query_burst_share:
            await self._query_one(world, driver, character)
            return
        # Concurrent queries to one character: leased recalls overlap, and race whatever
        # release or reload the other clients send meanwhile.
        count = 2 + world.random.randrange(0, query_burst_size_max - 1)
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(self._query_one, world, driver, character)

    async def _query_one(self, world: World, driver: AsgiDriver, character: str) -> None:
        path = f"/query_memory/{quote(character, safe='')}"
        query: dict[str, Any] = {}
        roll = world.random.random()
        if roll < 0.7:
            query["query"] = phrases[world.random.randrange(0, len(phrases))][:4]
        if roll > 0.5:
            query["time"] = "2026-09-01/2026-12-31"
        held = self._certainly_held(character, world.tracer.sequence + 1)
        exchange = await self._send(world, driver, "POST", path, json.dumps(query, ensure_ascii=False).encode())
        response, document = exchange.response, exchange.document
        if response is None or response.status == 409:
            return
        if response.status == 500:
            self._unexpected_500(world, "POST /query_memory", exchange, character)
            return
        if response.status == 503:
            if not (response.header("retry-after") or "").isdigit():
                self._violate(f"{path} answered 503 without Retry-After", exchange.sequences, character)
            return
        if response.status != 200 or not isinstance(document, dict) or not isinstance(document.get("results"), list):
            self._violate(f"{path} answered {response.status} {response.body[:200]!r}", exchange.sequences, character)
            return
        degraded = "error_code" in document  # the contract's answer for a failed recall
        if held is not None and not degraded and held.ended_seq > exchange.complete_seq:
            self._violate(f"{path} recalled for {character} while a held release was in force (claim "
                          f"{held.token}); expected 503", (*held.sequences, *exchange.sequences), character)
        for hit in document["results"]:
            if not isinstance(hit, dict) or hit.get("tier") not in ("fact", "reflection", "fact_archive"):
                self._violate(f"{path} returned a malformed hit {hit!r:.160}", exchange.sequences, character)
                return

    async def recent_history(self, world: World, driver: AsgiDriver) -> None:
        character = self._pick_character(world)
        path = f"/get_recent_history/{quote(character, safe='')}"
        exchange = await self._send(world, driver, "GET", path)
        response = exchange.response
        if response is None or response.status in (409, 503):
            return
        if response.status == 500:
            self._unexpected_500(world, "GET /get_recent_history", exchange, character)
        elif response.status != 200 or not isinstance(exchange.document, str):
            self._violate(f"{path} answered {response.status} {response.body[:160]!r}", exchange.sequences, character)

    # -- character management -------------------------------------------------------------
    def _certainly_held(self, character: str, sequence: int) -> Claim | None:
        for claim in self.claims:
            if (claim.character == character and claim.hold and claim.ack_seq and claim.ack_seq < sequence
                    and claim.ended_seq > sequence):
                return claim
        return None

    def _open_claims(self, character: str | None = None) -> list[Claim]:
        """Claims sent but not yet released by an acknowledged reload."""
        return [claim for claim in self.claims if not claim.revoked_seq
                and (character is None or claim.character == character)]

    async def manage(self, world: World, driver: AsgiDriver) -> None:
        open_claims = self._open_claims()
        roll = world.random.random()
        if open_claims and roll < 0.5:
            claim = open_claims[world.random.randrange(0, len(open_claims))]
            await self._reload(world, driver, claim)
            return
        revoked = [claim for claim in self.claims if claim.revoked_seq]
        if revoked and roll < 0.65:
            await self._replay(world, driver, revoked[world.random.randrange(0, len(revoked))])
            return
        character = self._pick_character(world)
        if self.published_acknowledged[character] >= 1 and roll < 0.75:
            await self._stale_release(world, driver, character)
            return
        claim = Claim(f"op-{self._next()}", character, self.published_invoked[character],
                      hold=world.random.random() < 0.3)
        self.claims.append(claim)
        await self._release(world, driver, claim)
        if world.random.random() < 0.6:
            await trio.sleep(world.random.random() * 3.0)
            await self._reload(world, driver, claim)

    def _release_path(self, character: str, token: str, generation: int, hold: bool) -> str:
        query = {"derived_task_claim_token": token, "derived_task_claim_generation": str(generation)}
        if hold:
            query["hold_derived_task_admission"] = "true"
        return f"/release_character/{quote(character, safe='')}?{urlencode(query)}"

    async def _release(self, world: World, driver: AsgiDriver, claim: Claim) -> None:
        """Release with the claim's token; retries reuse it."""
        path = self._release_path(claim.character, claim.token, claim.generation, claim.hold)
        for attempt in range(attempts_max):
            exchange = await self._send(world, driver, "POST", path)
            claim.sequences += (exchange.invoke_seq,)
            response, document = exchange.response, exchange.document
            if response is not None and response.status == 200:
                if not (isinstance(document, dict) and document.get("status") == "success"
                        and document.get("character_name") == claim.character
                        and document.get("derived_task_claim_token") == claim.token
                        and isinstance(document.get("cancelled_derived_tasks"), int)
                        and document["cancelled_derived_tasks"] >= 0):
                    self._violate(f"release answered {response.body[:200]!r}", exchange.sequences, claim.character)
                elif not claim.ack_seq:
                    claim.ack_seq = exchange.complete_seq
                    claim.sequences += (exchange.complete_seq,)
                return
            if response is not None and response.status == 409 and _is_cancelled(document):
                if claim.revoked_seq == 0 and claim.ended_seq == math.inf:
                    self._violate(f"a fresh claim {claim.token} on {claim.character} at generation "
                                  f"{claim.generation} (published: {self.published_acknowledged[claim.character]}) "
                                  f"was refused: {response.body[:200]!r}", exchange.sequences, claim.character)
                return
            if response is not None and response.status == 409:
                return  # limited mode
            if response is not None and response.status == 500:
                self._unexpected_500(world, "POST /release_character", exchange, claim.character)
            elif response is not None and response.status != 503:
                self._violate(f"release answered {response.status} {response.body[:160]!r}", exchange.sequences,
                              claim.character)
                return
            if attempt + 1 < attempts_max:
                await trio.sleep(retry_seconds(response, world, retry_sleep_seconds_max))

    async def _reload(self, world: World, driver: AsgiDriver, claim: Claim) -> None:
        """Reload releasing exactly this claim's token; sometimes publishing the next generation."""
        character = claim.character
        body: dict[str, Any] = {"release_derived_task_claims": {character: [claim.token]}}
        publish = None
        if world.random.random() < 0.4:
            publish = self.published_invoked[character] + 1
            body["resume_derived_task_names"] = [character]
            body["resume_derived_task_generations"] = [publish]
        data = json.dumps(body, ensure_ascii=False).encode()
        # Recorded before sending (the ``http_invoke`` about to be recorded): a process crash
        # may end this client step inside the request, after the reload took effect.
        self._reload_sent(character, claim.token, publish, world.tracer.sequence + 1)
        for attempt in range(attempts_max):
            exchange = await self._send(world, driver, "POST", "/reload", data)
            response, document = exchange.response, exchange.document
            if response is not None and response.status == 200 and isinstance(document, dict):
                if document.get("status") == "success" and isinstance(document.get("message"), str):
                    claim.revoked_seq = exchange.complete_seq
                    claim.sequences += (exchange.complete_seq,)
                    if publish is not None:
                        self.published_acknowledged[character] = max(self.published_acknowledged[character], publish)
                    return
                if document.get("status") != "error" or not isinstance(document.get("message"), str):
                    self._violate(f"/reload answered {response.body[:200]!r}", exchange.sequences, character)
                    return
            elif response is not None and response.status == 409:
                return  # limited mode
            elif response is not None and response.status not in (500, 503):
                self._violate(f"/reload answered {response.status} {response.body[:160]!r}", exchange.sequences,
                              character)
                return
            elif response is not None and response.status == 500:
                self._unexpected_500(world, "POST /reload", exchange, character)
            if attempt + 1 < attempts_max:
                await trio.sleep(retry_seconds(response, world, retry_sleep_seconds_max))

    def _reload_sent(self, character: str, token: str, publish: int | None, sequence: int) -> None:
        """A reload may end every claim it releases, and every older-generation claim it publishes over."""
        if publish is not None:
            self.published_invoked[character] = max(self.published_invoked[character], publish)
        for claim in self.claims:
            if claim.character != character or claim.ended_seq != math.inf:
                continue
            if claim.token == token or (publish is not None and claim.generation < publish):
                claim.ended_seq = sequence

    async def _replay(self, world: World, driver: AsgiDriver, claim: Claim) -> None:
        """A release with a token an acknowledged reload released: always 409 cancelled."""
        path = self._release_path(claim.character, claim.token, claim.generation, world.random.random() < 0.3)
        await self._expect_cancelled(world, driver, path, claim.character, claim.token,
                                     f"replayed claim {claim.token} (released by the reload acknowledged at "
                                     f"#{claim.revoked_seq})", (claim.revoked_seq,))

    async def _stale_release(self, world: World, driver: AsgiDriver, character: str) -> None:
        """A fresh token capturing a generation below the published one: always 409 cancelled."""
        token = f"op-{self._next()}"
        generation = self.published_acknowledged[character] - 1
        path = self._release_path(character, token, generation, False)
        await self._expect_cancelled(world, driver, path, character, token,
                                     f"stale claim {token} at generation {generation} (published "
                                     f"{self.published_acknowledged[character]})", ())

    async def _expect_cancelled(self, world: World, driver: AsgiDriver, path: str, character: str, token: str,
                                what: str, sequences: tuple[int, ...]) -> None:
        exchange = await self._send(world, driver, "POST", path)
        response, document = exchange.response, exchange.document
        if response is None or response.status in (503,) or (response.status == 409 and not _is_cancelled(document)):
            return
        if response.status == 500:
            self._unexpected_500(world, "POST /release_character", exchange, character)
            return
        if response.status != 409 or not (document.get("character_name") == character
                                          and document.get("derived_task_claim_token") == token):
            self._violate(f"{what} on {character} answered {response.status} {response.body[:200]!r}, "
                          "expected 409 cancelled", (*sequences, *exchange.sequences), character)

    # -- the launcher ---------------------------------------------------------------------
    async def limited_mode(self, world: World, driver: AsgiDriver) -> None:
        if self.limited_busy:
            await self.health(world, driver)
            return
        self.limited_busy = True
        try:
            reason = f"moving memory/ ({self._next()})"
            limited = self.limited
            # Registered before it is sent (``_send`` records the invocation first): requests
            # answered while it is in flight must know it may have applied.
            limited.blocks.append((world.tracer.sequence + 1, 0))
            self.continue_needed = True
            exchange = await self._send(world, driver, "POST", "/internal/storage/startup/block",
                                        json.dumps({"reason": reason}).encode())
            assert limited.blocks[-1][0] == exchange.invoke_seq
            response = exchange.response
            if response is not None and response.status == 200:
                if exchange.document == {"ok": True, "limited_mode": True, "reason": reason}:
                    limited.blocks[-1] = (exchange.invoke_seq, exchange.complete_seq)
                else:
                    self._violate(f"block answered {response.body[:200]!r}", exchange.sequences)
            if limited.blocks[-1][1]:
                # A gated route now: the contract's 409 (checked in ``_send``).
                await self._send(world, driver, "GET", f"/new_dialog/{quote(self._pick_character(world), safe='')}")
            await trio.sleep(world.random.random() * blocked_seconds_max)
            await self._continue(world, driver)
        finally:
            self.limited_busy = False

    async def _continue(self, world: World, driver: AsgiDriver) -> None:
        limited = self.limited
        for _ in range(continue_attempts_max):
            limited.continues.append((world.tracer.sequence + 1, 0))
            index = len(limited.continues) - 1
            exchange = await self._send(world, driver, "POST", "/internal/storage/startup/continue", b"")
            response = exchange.response
            acknowledged = (response is not None and response.status == 200 and isinstance(exchange.document, dict)
                            and exchange.document.get("ok") is True and exchange.document.get("limited_mode") is False
                            and exchange.document.get("initialized") is True)
            if acknowledged:
                limited.continues[index] = (exchange.invoke_seq, exchange.complete_seq)
                self.continue_needed = False
                return
            if response is not None and response.status == 200:
                self._violate(f"continue answered {response.body[:200]!r}", exchange.sequences)
                return
            await trio.sleep(retry_seconds(response, world, retry_sleep_seconds_max))

    async def health(self, world: World, driver: AsgiDriver) -> None:
        exchange = await self._send(world, driver, "GET", "/health")
        response, document = exchange.response, exchange.document
        if response is None or response.status in (500, 503):
            return
        if response.status != 200 or not isinstance(document, dict) or not (
                document.get("app") == "N.E.K.O" and document.get("service") == "memory"
                and document.get("status") == "ok" and isinstance(document.get("instance_id"), str)):
            self._violate(f"/health answered {response.status} {response.body[:200]!r}", exchange.sequences)
            return
        instance = document["instance_id"]
        known = self.instance_ids.setdefault(world.generation, instance)
        if known != instance:
            self._violate(f"/health changed instance_id within one process lifetime: {known} -> {instance}",
                          exchange.sequences)
        others = [generation for generation, seen in self.instance_ids.items()
                  if seen == instance and generation != world.generation]
        if others:
            self._violate(f"/health reports the instance_id of process lifetime {others[0]} again: {instance}",
                          exchange.sequences)

    # ------------------------------------------------------------------ invariants
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=False)
        return self._take_pending()

    async def at_quiescence(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=True)
        return self._take_pending()

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    async def _check_storage(self, world: World, *, quiescent: bool) -> None:
        snapshot = await read_checkpoint(world, _read_snapshot, self._violate)
        if snapshot is None:
            return
        self._check_raw_rows(snapshot)
        self._check_recent_tail(snapshot)
        self._check_suspects(snapshot)
        self._check_tasks(world, snapshot)
        self._check_leases(world)

    def _check_leases(self, world: World) -> None:
        """A released character's handles are not read after the release answered."""
        if self._lease_follower is None:
            self._lease_follower = _TraceFollower(world.tracer, (
                b"character_lease_", b"sim_restart", b"sim_clean_restart", b"sim_crash", b"sim_power_loss"))
        for sequence, _, event, kind, key, fields in self._lease_follower.new_records():
            if event in ("sim_restart", "sim_clean_restart", "sim_crash", "sim_power_loss"):
                self._reading.clear()  # lease numbers start again with the next engine
                continue
            if kind != "character" or event not in ("character_lease_read", "character_lease_end"):
                continue
            lease = fields.get("lease")
            if event == "character_lease_read":
                self._reading[(key, lease)] = sequence
                for claim in self.claims:
                    if claim.character == key and claim.ack_seq and claim.ack_seq < sequence < claim.ended_seq:
                        self._violate(f"a leased recall of {key} started reading after the release with claim "
                                      f"{claim.token} answered (no reload sent yet)",
                                      (*claim.sequences, sequence), key, once=True)
                        break
                continue
            started = self._reading.pop((key, lease), None)
            if started is None:
                continue
            for claim in self.claims:
                if claim.character == key and claim.ack_seq and started < claim.ack_seq < sequence:
                    self._violate(f"a leased recall of {key} was still reading when the release with claim "
                                  f"{claim.token} answered", (*claim.sequences, started, sequence), key, once=True)
                    break

    def _check_raw_rows(self, snapshot: _Snapshot) -> None:
        for write in self.writes:
            stored = snapshot.raw.get(write.character, Counter())
            if snapshot.raw_counts.get(write.character, 0) >= time_indexed_rows_kept:
                continue  # the oldest rows were pruned on purpose
            missing = [tag for tag in write.tags if stored[tag] == 0]
            if write.acknowledged and missing:
                self._violate(f"acknowledged {write.route} #{write.number} to {write.character}: messages "
                              f"{missing[:5]} are not in the raw rows", (write.invoke_seq, write.ack_seq),
                              write.character, once=True)
            # Only messages no later write re-sent (a settle re-sends what /cache wrote).
            counts = {stored[tag] for tag in write.fresh if len(self.tag_writes[tag]) == 1}
            if len(counts) > 1:
                self._violate(f"{write.route} #{write.number} to {write.character} is stored in part: counts "
                              f"{sorted(counts)} over its {len(write.fresh)} new messages", (write.invoke_seq,),
                              write.character, once=True)
            if write.outcome == "refused" and any(stored[tag] for tag in write.fresh):
                self._violate(f"{write.route} #{write.number} to {write.character} was refused but is stored",
                              (write.invoke_seq,), write.character, once=True)
        for character, stored in snapshot.raw.items():
            for tag, times in stored.items():
                if self.tag_owner.get(tag) != character:
                    self._violate(f"raw rows of {character} hold message #m{tag}# that no client sent to it",
                                  (), character, once=True)
                    continue
                sent = sum(write.attempts for write in self.tag_writes.get(tag, ()))
                if times > sent:
                    self._violate(f"message #m{tag}# of {character} is stored {times} times but was sent "
                                  f"{sent} times", (), character, once=True)

    def _check_recent_tail(self, snapshot: _Snapshot) -> None:
        for character in character_names:
            acknowledged = [write for write in self.writes if write.character == character and write.acknowledged
                            and write.tags]
            if not acknowledged:
                continue
            last = max(acknowledged, key=lambda write: write.ack_seq)
            after = sum(len(write.tags) * write.attempts for write in self.writes
                        if write.character == character and write is not last
                        and not write.certainly_before(last.invoke_seq))
            if len(last.tags) + after > recent_history_kept_messages:
                continue
            recent = snapshot.recent.get(character, set())
            missing = [tag for tag in last.tags if tag not in recent]
            if missing:
                self._violate(f"recent history of {character} lost messages {missing} of its newest acknowledged "
                              f"write ({last.route} #{last.number}; {after} messages sent after it)",
                              (last.invoke_seq, last.ack_seq), character, once=True)

    def _check_suspects(self, snapshot: _Snapshot) -> None:
        suspects, self.suspects = self.suspects, []
        for suspect in suspects:
            if suspect.character in snapshot.compressions_failed:
                continue
            self._violate(f"/new_dialog of {suspect.character} showed {suspect.lines} history lines after an "
                          f"acknowledged settle (at most {suspect.bound} once the settle's compression ran): "
                          "a half-settled state", suspect.sequences, suspect.character, once=True)

    def _check_tasks(self, world: World, snapshot: _Snapshot) -> None:
        if self._follower is None:
            self._follower = _TraceFollower(world.tracer, (b"character_task",))
        for sequence, _, event, kind, key, fields in self._follower.new_records():
            if event != "character_task" or kind != "character" or not fields.get("completed"):
                continue
            task_kind = fields.get("task")
            self.completions[(key, task_kind)] += 1
            task_id = fields.get("task_id")
            if isinstance(task_id, str):
                if task_id in self.completed_ids:
                    self._violate(f"outbox task {task_id} ({task_kind}) of {key} completed twice",
                                  (self.completed_ids[task_id], sequence), key, once=True)
                self.completed_ids.setdefault(task_id, sequence)
            if task_kind in derived_task_kinds:
                for claim in self.claims:
                    if claim.character == key and claim.ack_seq and claim.ack_seq < sequence < claim.ended_seq:
                        self._violate(f"derived task {task_kind} of {key} completed while released (claim "
                                      f"{claim.token} acknowledged, no reload sent yet)",
                                      (claim.ack_seq, sequence), key, once=True)
                        break
        for (character, task_kind), traced in self.completions.items():
            if snapshot.finished.get(character, 0) >= outbox_finished_rows_kept:
                continue  # finished rows are pruned beyond the cap
            done = snapshot.done.get((character, task_kind), 0)
            if traced > done:
                self._violate(f"{traced} {task_kind} tasks of {character} were traced as completed but only "
                              f"{done} are done in the outbox: a task completed twice", (), character, once=True)
        for task_id in self.done_ids & snapshot.active_ids:
            self._violate(f"outbox task {task_id} was done and is active again", once=True)
        self.done_ids |= snapshot.done_ids


@dataclass
class _Snapshot:
    raw: dict[str, Counter]
    """character -> tag -> how many raw rows carry it."""
    raw_counts: dict[str, int]
    recent: dict[str, set[int]]
    done: dict[tuple[str, str], int]
    finished: dict[str, int]
    done_ids: set[str]
    active_ids: set[str]
    compressions_failed: set[str]
    """Characters with a detailed compression that ended ``failed`` or ``cancelled``."""


def _tags_of(text: str) -> list[int]:
    return [int(tag) for tag in tag_pattern.findall(text)]


def _read_snapshot(connection: Any) -> _Snapshot:
    """Everything the checkers compare, from one read transaction."""
    raw: dict[str, Counter] = {}
    raw_counts: Counter = Counter()
    for name, content in connection.execute("SELECT name, content_json FROM character_time_indexed"):
        raw_counts[name] += 1
        counter = raw.setdefault(name, Counter())
        for tag in _tags_of(content):
            counter[tag] += 1
    recent: dict[str, set[int]] = {}
    for name, content in connection.execute("SELECT name, content_json FROM character_recent"):
        recent.setdefault(name, set()).update(_tags_of(content))
    done: Counter = Counter()
    finished: Counter = Counter()
    done_ids: set[str] = set()
    active_ids: set[str] = set()
    failed: set[str] = set()
    for task_id, name, kind, state, payload in connection.execute(
            "SELECT task_id, name, kind, state, payload_json FROM character_outbox"):
        if state == "done":
            done[(name, kind)] += 1
            done_ids.add(task_id)
        if state in ("done", "failed", "cancelled"):
            finished[name] += 1
        else:
            active_ids.add(task_id)
        if kind == "recent_compression" and state in ("failed", "cancelled") and '"detailed":true' in payload:
            failed.add(name)
    return _Snapshot(raw, dict(raw_counts), recent, dict(done), dict(finished), done_ids, active_ids, failed)


def _history_lines(text: str, character: str) -> int:
    """The recent-history lines of a ``/new_dialog`` text (``主人：…``, ``<character>：…``,
    ``系统：…`` in the 近期对话 section; the summary line is not one)."""
    section = text.partition("======近期对话======")[2].partition("\n\n")[0]
    speakers = tuple(history_line_pattern.format(speaker=speaker) for speaker in ("主人", character, "系统"))
    return sum(1 for line in section.splitlines() if line.startswith(speakers))


def _quarantined(records: list[bytes], index: int, moment: int, kind: str, key: str, message: Any) -> bool:
    """Is the refusal at ``records[index]`` (``moment`` in trace microseconds) within the
    quarantine of a ``poison`` record of the same actor and message type before it?"""
    earliest = moment - round(poison_quarantine_seconds * 1_000_000)
    for encoded in reversed(records[:index]):
        if b"poison" not in encoded:
            continue
        _, at, event, poisoned_kind, poisoned_key, fields = cbor2.loads(encoded)
        if at < earliest:
            return False
        if event == "poison" and (poisoned_kind, poisoned_key, fields.get("message")) == (kind, key, message):
            return True
    return False


def _is_cancelled(document: Any) -> bool:
    return (isinstance(document, dict) and set(document) == cancelled_body_keys and document["status"] == "cancelled"
            and isinstance(document["message"], str))


Operation = Callable[[CharacterWorkload, World, AsgiDriver], Awaitable[None]]
_operations: tuple[tuple[float, Operation], ...] = (
    (0.50, CharacterWorkload.turn),
    (0.18, CharacterWorkload.new_dialog),
    (0.08, CharacterWorkload.query_memory),
    (0.04, CharacterWorkload.recent_history),
    (0.13, CharacterWorkload.manage),
    (0.04, CharacterWorkload.limited_mode),
    (0.03, CharacterWorkload.health),
)
check_shares(_operations)


register_workload("character", CharacterWorkload)

__all__ = ["CharacterWorkload", "character_names"]
