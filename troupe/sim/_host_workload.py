"""The host surface's workload: chat-bot hosts speaking HTTP to the real host app, under faults.

Why over HTTP: the host contract's promises (an acknowledged message is stored once with the id
it was given, a refused batch changes nothing, a token sees only its scope, every error is the
unified body) are kept jointly by validation, the gate, the entry actor, the learners and the
storage engine.  Calling the actors directly would skip half of them, so every operation goes
through ``world.apps["host"]`` (an in-process ASGI driver) while the simulator's runtime fault
points, storage faults and crashes are armed.

What the hosts do: three tokens (scope all, a prefix, a list) post single messages and batches to
four entries with a short custom pace (so batches close and learn within a run), retry after
timeouts, 429/5xx and crashes with the SAME body and dedupe keys (also in a later process
lifetime), re-post acknowledged keys with edited content (dedupe must not overwrite), post
invalid batches (400/413/404, and 403 outside the scope) that must change nothing, upload small
PNG files and reference them, ask for learning, prepare (with and without text), search, give
feedback on what a recall returned (and retry it), report state and read status.

Invariants, checked after every restart and at quiescence against committed storage (and on
every response):

- every acknowledged message is stored exactly once, with the id that was acknowledged (stable
  across retries and restarts), its original content and the posting token's name; nothing is
  stored that no host sent, nor anything from a refused batch; a batch whose outcome the host
  never learned is stored whole or not at all;
- batches are never lost: after a restart every open batch has its learner's durable ``claim``
  reminder and every entry with pending messages its ``pace`` reminder; at quiescence (120 s
  of quiet) nothing is pending, every batch is finished and its messages learned or failed
  (work whose reminder the runtime dropped as poison is excused, as the trace shows);
- strengthening is applied once per (recall, memory): no two feedback answers strengthen the
  same pair, and each memory's strength equals its strengthened pairs in storage;
- no token sees another scope's content: no response names an entry (id or name) outside the
  asking token's scope, recent messages are the entry's own, status lists only entries in scope
  and the ``other_entries_pending`` hint carries counts and times only;
- every error is the unified envelope with a documented code for its status; 401 carries
  ``WWW-Authenticate: Bearer``; 429 and 503 carry ``Retry-After`` with the same number in
  ``retry_after_seconds`` and a ``retry_at``.

Trade-off: a step is one request (plus its retries), so the workload stays cheap next to the
others; the response-level checks run on every answer, the storage checks only at the two
checkpoints.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from troupe.auth import TokenScope, new_token_secret

from ._asgi import AsgiDriver, AsgiResponse
from ._host_goals_workload import HostGoalsWorkload
from ._tokens import TokenGrant, write_tokens
from ._trace_queries import OverrunningTurns, PoisonedReminders
from ._violation import Violation
from ._workload import World, check_shares, choose_by_share, read_checkpoint, register_workload
from ._workload_http import HttpExchange, send_retrying, send_traced

checker_name = "host"
api = "/api/v1"

client_pause_seconds_max = 0.2
request_seconds_max = 20.0
"""Shorter than the app's 60 s actor ask: a slow turn becomes an unknown outcome to retry."""
attempts_max = 4
retry_sleep_seconds_max = 3.0
batch_messages_max = 6
unresolved_batches_max = 16
"""Unknown-outcome batches kept for a later retry (older ones stay checked, just not retried)."""
recalls_kept_max = 32
goals_step_share = 0.35
"""Steps handed to the goals, notifications and events part (``_host_goals_workload``)."""

host_entry_names: dict[str, str] = {
    "astrbot:group-a": "甲群",
    "astrbot:private-b": "乙私聊",
    "qq:group-c": "丙群",
    "wx:room-d": "丁房间",
}
"""Entry ids and the names they are created with: distinctive strings no message contains, so a
response that mentions one outside the token's scope is a leak."""

custom_pace = {"count": 8, "idle_seconds": 10, "max_wait_seconds": 30}
"""Short on purpose: batches close by count, idle time and maximum wait within a run."""


@dataclass(frozen=True)
class HostToken:
    name: str
    scope: TokenScope


host_tokens = (
    HostToken("sim-host-all", TokenScope.all()),
    HostToken("sim-host-astrbot", TokenScope.of_prefix("astrbot:")),
    HostToken("sim-host-list", TokenScope.of_entries(["qq:group-c", "astrbot:private-b"])),
)

senders = ("小明", "小红", "Alice", "Bob")
contents = (
    "我喜欢吃寿司。", "我最爱看星星。", "I like hiking in the mountains.", "我明天要去北京出差。",
    "哈哈", "今天天气不错", "I love green tea.", "我讨厌下雨天。", "好的", "I plan to visit Kyoto next month.",
)
query_texts = ("寿司", "星星", "hiking", "北京", "tea", "下雨")
png_bodies = tuple(b"\x89PNG\r\n\x1a\n" + bytes([number]) * 24 for number in range(3))
"""Small files with a valid PNG header (only the header is checked); identical bytes share one blob."""

documented_codes: dict[int, frozenset[str]] = {
    400: frozenset({"bad_host", "invalid_request", "method_not_allowed", "recall_expired", "memory_not_in_recall"}),
    401: frozenset({"unauthorized"}),
    403: frozenset({"entry_forbidden", "recall_forbidden"}),
    404: frozenset({"not_found", "media_not_found", "recall_not_found", "memory_not_found"}),
    413: frozenset({"payload_too_large"}),
    429: frozenset({"rate_limited"}),
    500: frozenset({"internal_error"}),
    503: frozenset({"unavailable"}),
}
transient_statuses = frozenset({429, 500, 503})
"""Answers after which a host retries the same request (500: a crashed turn may have committed)."""
error_keys = frozenset({"code", "message", "fields", "retry_after_seconds", "retry_at"})
pending_hint_keys = frozenset({"code", "message", "entry_count", "time_from", "time_to", "time_basis"})


@dataclass
class SentBatch:
    """One message batch as a host sent it (retries resend ``body`` unchanged)."""

    number: int
    entry_id: str
    token: str
    body: Any
    keys: tuple[str, ...]
    """Every message's dedupe key, in input order."""
    fresh: tuple[str, ...]
    """Keys this batch introduced (never sent before)."""
    valid: bool
    outcome: str = "unknown"
    """``acknowledged``, ``refused`` (nothing may be stored) or ``unknown``."""
    sequences: tuple[int, ...] = ()


@dataclass
class SentKey:
    content: str
    token: str
    batch: int


@dataclass
class Recall:
    token: str
    memory_ids: tuple[int, ...]


@dataclass
class _Model:
    """What the hosts were told, kept across process lifetimes."""

    keys: dict[tuple[str, str], SentKey] = field(default_factory=dict)
    acknowledged: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    """(entry, dedupe key) -> (message id, trace sequence of the acknowledgement)."""
    owners: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Acknowledged message id -> (entry, dedupe key): the inverse of ``acknowledged``."""
    batches: list[SentBatch] = field(default_factory=list)
    unresolved: list[SentBatch] = field(default_factory=list)
    refused_keys: dict[tuple[str, str], int] = field(default_factory=dict)
    media: list[tuple[str, str]] = field(default_factory=list)
    """(media id, upload entry) of acknowledged uploads."""
    recalls: dict[str, Recall] = field(default_factory=dict)
    strengthened: Counter = field(default_factory=Counter)
    """(recall id, memory id) -> how many feedback answers said they strengthened it."""


class HostWorkload:
    name = "host"

    def __init__(self) -> None:
        self._poisoned: PoisonedReminders | None = None
        self._overrunning: OverrunningTurns | None = None
        self.model = _Model()
        self.secrets: dict[str, str] = {}
        self.tokens_generation = 0
        self.counter = 0
        self.responses = 0
        self._pending: list[Violation] = []
        self.goals = HostGoalsWorkload(label="host")
        """Goals, reminders, notifications and the events stream: a share of the steps and
        the same checkpoints (so ``--workload host`` covers them)."""

    def services(self, world: World) -> list[Any]:
        return self.goals.services(world)

    def actor_kinds(self, world: World) -> list[Any]:
        return []  # the host surface's kinds come with the server (``SimServer``)

    def migrations(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = (), actors: tuple[tuple[str, str], ...] = ()) -> None:
        self._pending.append(Violation(f"host: {text}", sequences=sequences, actors=actors, checker=checker_name))

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    async def _ensure_tokens(self, world: World) -> bool:
        """The three tokens exist in this lifetime's database (created once, re-created if a
        power loss took them).  False when storage refused; the step is skipped."""
        if self.tokens_generation == world.generation:
            return True
        if not self.secrets:
            self.secrets = {token.name: new_token_secret(world.random) for token in host_tokens}
        grants = [TokenGrant(token.name, token.scope, self.secrets[token.name]) for token in host_tokens]
        if not await write_tokens(world, grants):
            return False
        self.tokens_generation = world.generation
        return True

    async def _send(self, world: World, driver: AsgiDriver, token: str | None, method: str, path: str,
                    body: Any = None, *, raw: bytes | None = None) -> HttpExchange:
        """One request; checks the envelope of any error.  ``response`` is None when the
        exchange failed (timeout, cut short): an unknown outcome."""
        headers = [("content-type", "application/json")]
        if token is not None:
            headers.append(("authorization", f"Bearer {self.secrets.get(token, 'troupe_unknown')}"))
        data = raw if raw is not None else (b"" if body is None else json.dumps(body, ensure_ascii=False).encode())
        exchange = await send_traced(world, driver, "host", method, path, violate=self._violate,
                                     envelope=envelope_problem, invoke_labels={"token": token or ""},
                                     headers=headers, body=data, seconds_max=request_seconds_max)
        self.responses += exchange.response is not None
        return exchange

    async def _send_retrying(self, world: World, driver: AsgiDriver, token: str, method: str, path: str,
                             body: Any = None) -> HttpExchange:
        """Send, and resend the same body after a timeout or a transient status."""
        return await send_retrying(world, lambda: self._send(world, driver, token, method, path, body),
                                   attempts_max=attempts_max, transient_statuses=transient_statuses,
                                   sleep_seconds_max=retry_sleep_seconds_max)

    def _unexpected(self, what: str, exchange: HttpExchange, expected: str) -> None:
        response = exchange.response
        if response is None or response.status in transient_statuses:
            return  # still unknown after the retries: nothing to hold against the surface
        self._violate(f"{what} answered {response.status} {response.body[:160]!r}, expected {expected}",
                      exchange.sequences)

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get("host")
        if driver is None or world.engine is None:
            return
        if not await self._ensure_tokens(world):
            return
        if world.random.random() < goals_step_share:
            await self.goals.client_step(world, client)
            return
        operation = choose_by_share(world.random.random(), _operations)
        if operation is not None:
            await operation(self, world, driver)

    def _pick_token(self, world: World) -> HostToken:
        return host_tokens[world.random.randrange(0, len(host_tokens))]

    def _pick_entry(self, world: World, token: HostToken, *, inside: bool = True) -> str | None:
        entries = [entry for entry in host_entry_names if token.scope.allows(entry) == inside]
        return entries[world.random.randrange(0, len(entries))] if entries else None

    def _message(self, world: World, entry_id: str, key: str, content: str) -> dict[str, Any]:
        second = int(world.env.clock.wall()) % 86_400
        message: dict[str, Any] = {
            "sender": senders[world.random.randrange(0, len(senders))],
            "content": content,
            "occurred_at": f"2026-09-21T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}+08:00",
            "dedupe_key": key,
            "entry_name": host_entry_names[entry_id],
            "pace": dict(custom_pace),
        }
        if world.random.random() < 0.2:
            message["quote_author"] = senders[0]
            message["quote_content"] = contents[0]
        return message

    async def post_messages(self, world: World, driver: AsgiDriver) -> None:
        model = self.model
        if model.unresolved and world.random.random() < 0.3:
            batch = model.unresolved.pop(0)  # a host retrying what it never heard back about
        else:
            batch = self._new_batch(world)
        await self._deliver(world, driver, batch)

    def _new_batch(self, world: World) -> SentBatch:
        model = self.model
        token = self._pick_token(world)
        inside = world.random.random() < 0.9
        entry_id = self._pick_entry(world, token, inside=inside) or self._pick_entry(world, token)
        assert entry_id is not None
        count = 1 if world.random.random() < 0.5 else world.random.randrange(2, batch_messages_max + 1)
        number = self._next()
        messages, keys, fresh = [], [], []
        acknowledged_here = [key for (entry, key) in model.acknowledged if entry == entry_id]
        for index in range(count):
            content = contents[world.random.randrange(0, len(contents))]
            if acknowledged_here and world.random.random() < 0.15:
                # A host re-sending an edited message under its old key: the original stands.
                key = acknowledged_here[world.random.randrange(0, len(acknowledged_here))]
                if key in keys:
                    continue
                content = f"{content}（改）"
            else:
                key = f"k{number}-{index}"
                fresh.append(key)
            keys.append(key)
            messages.append(self._message(world, entry_id, key, content))
        media = [media_id for media_id, upload_entry in model.media if token.scope.allows(upload_entry)]
        if media and world.random.random() < 0.3:
            messages[0]["media_ids"] = [media[world.random.randrange(0, len(media))]]
        valid = token.scope.allows(entry_id)
        if world.random.random() < 0.12:
            valid = False
            _spoil(world, messages[-1], fresh=keys[-1] in fresh)
        body: Any = messages[0] if len(messages) == 1 and world.random.random() < 0.5 else messages
        batch = SentBatch(number, entry_id, token.name, body, tuple(keys), tuple(fresh), valid)
        model.batches.append(batch)
        if valid:
            for key, message in zip(keys, messages, strict=True):
                if key in fresh:
                    model.keys[(entry_id, key)] = SentKey(message["content"], token.name, number)
        else:
            for key in fresh:
                model.refused_keys[(entry_id, key)] = number
        return batch

    async def _deliver(self, world: World, driver: AsgiDriver, batch: SentBatch) -> None:
        path = f"{api}/entries/{batch.entry_id}/messages"
        exchange = await self._send_retrying(world, driver, batch.token, "POST", path, batch.body)
        batch.sequences += exchange.sequences
        response, document = exchange.response, exchange.document
        if response is None or response.status in transient_statuses:
            if batch.valid and batch not in self.model.unresolved and len(self.model.unresolved) < unresolved_batches_max:
                self.model.unresolved.append(batch)
            return
        actors = (("entry", batch.entry_id),)
        if not batch.valid:
            if response.status in (400, 403, 404, 413):
                batch.outcome = "refused"
            else:
                self._unexpected(f"invalid batch #{batch.number} to {batch.entry_id}", exchange, "400/403/404/413")
            return
        if response.status != 200:
            self._unexpected(f"batch #{batch.number} to {batch.entry_id}", exchange, "200")
            return
        ids = document.get("message_ids") if isinstance(document, dict) else None
        if not isinstance(ids, list) or len(ids) != len(batch.keys) or not isinstance(document.get("pending_count"), int):
            self._violate(f"batch #{batch.number} acknowledged with a malformed body {response.body[:160]!r}",
                          exchange.sequences, actors)
            return
        batch.outcome = "acknowledged"
        owners = self.model.owners
        for key, message_id in zip(batch.keys, ids, strict=True):
            address = (batch.entry_id, key)
            earlier = self.model.acknowledged.get(address)
            if earlier is not None and earlier[0] != message_id:
                self._violate(f"dedupe key {key!r} of {batch.entry_id} acknowledged as id {message_id}, "
                              f"earlier as {earlier[0]}", (earlier[1], *exchange.sequences), actors)
                continue
            owner = owners.get(message_id)
            if owner is not None and owner != address:
                self._violate(f"message id {message_id} acknowledged for {address} and for {owner}",
                              exchange.sequences, actors)
            if earlier is None:
                self.model.acknowledged[address] = (message_id, exchange.sequences[-1])
                owners.setdefault(message_id, address)

    async def upload_media(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        entry_id = self._pick_entry(world, token)
        assert entry_id is not None
        data = png_bodies[world.random.randrange(0, len(png_bodies))]
        body: dict[str, Any] = {"entry_id": entry_id, "content_type": "image/png",
                                "data_base64": base64.b64encode(data).decode("ascii")}
        if world.random.random() < 0.5:
            body["understanding_text"] = "一张猫的照片"
        exchange = await self._send_retrying(world, driver, token.name, "POST", f"{api}/media", body)
        if exchange.response is None or exchange.response.status in transient_statuses:
            return
        document = exchange.document
        if exchange.response.status != 201 or not isinstance(document, dict) or not isinstance(document.get("id"), str):
            self._unexpected("POST /media", exchange, "201")
            return
        self.model.media.append((document["id"], entry_id))

    async def learn(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        entry_id = self._pick_entry(world, token)
        exchange = await self._send_retrying(world, driver, token.name, "POST", f"{api}/entries/{entry_id}/learn")
        document = exchange.document
        if exchange.response is not None and exchange.response.status == 200:
            if not isinstance(document, dict) or document.get("accepted") is not True:
                self._violate(f"POST /learn answered {exchange.response.body[:160]!r}", exchange.sequences)
        else:
            self._unexpected(f"POST /learn on {entry_id}", exchange, "200")

    async def prepare(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        inside = world.random.random() < 0.9
        entry_id = self._pick_entry(world, token, inside=inside)
        if entry_id is None:
            return
        body: dict[str, Any] = {}
        roll = world.random.random()
        if roll < 0.4:
            body["text"] = query_texts[world.random.randrange(0, len(query_texts))]
        elif roll < 0.6:
            body["text"] = ""  # no query text: recent messages, state and hints only
        if world.random.random() < 0.3:
            body["recent_limit"] = world.random.randrange(0, 10)
        exchange = await self._send_retrying(world, driver, token.name, "POST", f"{api}/entries/{entry_id}/prepare", body)
        if not inside:
            if exchange.response is not None and exchange.response.status not in transient_statuses:
                self._expect_code(exchange, 403, "entry_forbidden", f"prepare on {entry_id} outside {token.name}")
            return
        if exchange.response is None or exchange.response.status != 200:
            self._unexpected(f"prepare on {entry_id}", exchange, "200")
            return
        self._check_visible(token, exchange, f"prepare on {entry_id}")
        document = exchange.document
        if not isinstance(document, dict) or not isinstance(document.get("recall_id"), str):
            self._violate(f"prepare on {entry_id} answered {exchange.response.body[:160]!r}", exchange.sequences)
            return
        self._check_recent(entry_id, document.get("recent_messages"), exchange)
        self._check_hints(document.get("hints"), exchange)
        self._remember_recall(token, document)

    async def search(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        body: dict[str, Any] = {"text": query_texts[world.random.randrange(0, len(query_texts))],
                                "include_state": world.random.random() < 0.3}
        if world.random.random() < 0.4:
            body["entry_id"] = self._pick_entry(world, token)
        exchange = await self._send_retrying(world, driver, token.name, "POST", f"{api}/memories/search", body)
        if exchange.response is None or exchange.response.status != 200:
            self._unexpected("search", exchange, "200")
            return
        self._check_visible(token, exchange, "search")
        if isinstance(exchange.document, dict) and isinstance(exchange.document.get("recall_id"), str):
            self._remember_recall(token, exchange.document)

    def _remember_recall(self, token: HostToken, document: dict[str, Any]) -> None:
        memories = document.get("memories") or []
        ids = tuple(memory["id"] for memory in memories if isinstance(memory, dict) and isinstance(memory.get("id"), int))
        recalls = self.model.recalls
        if len(recalls) >= recalls_kept_max:
            recalls.pop(next(iter(recalls)))
        recalls[document["recall_id"]] = Recall(token.name, ids)

    async def feedback(self, world: World, driver: AsgiDriver) -> None:
        recalls = self.model.recalls
        if not recalls:
            return
        recall_ids = list(recalls)
        recall_id = recall_ids[world.random.randrange(0, len(recall_ids))]
        recall = recalls[recall_id]
        chosen = [memory_id for memory_id in recall.memory_ids if world.random.random() < 0.7]
        foreign = world.random.random() < 0.1
        token = recall.token
        if foreign:
            token = next(candidate.name for candidate in host_tokens if candidate.name != recall.token)
        body = {"recall_id": recall_id, "memory_ids": chosen}
        exchange = await self._send_retrying(world, driver, token, "POST", f"{api}/feedback", body)
        if foreign:
            if exchange.response is not None and exchange.response.status not in transient_statuses:
                self._expect_code(exchange, 403, "recall_forbidden", "feedback on another token's recall")
            return
        if exchange.response is None or exchange.response.status != 200:
            self._unexpected(f"feedback on {recall_id}", exchange, "200")
            return
        document = exchange.document
        accepted = document.get("accepted") if isinstance(document, dict) else None
        strengthened = document.get("strengthened") if isinstance(document, dict) else None
        if accepted != list(dict.fromkeys(chosen)) or not isinstance(strengthened, list) or not set(strengthened) <= set(chosen):
            self._violate(f"feedback on {recall_id} answered {exchange.response.body[:200]!r} for {chosen}",
                          exchange.sequences)
            return
        for memory_id in strengthened:
            pair = (recall_id, memory_id)
            self.model.strengthened[pair] += 1
            if self.model.strengthened[pair] > 1:
                self._violate(f"memory {memory_id} strengthened twice for recall {recall_id}", exchange.sequences)

    async def state(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        roll = world.random.random()
        if roll < 0.3:
            method, body = "PUT", {"activity": "聊天", "details": {"topic": "寿司"},
                                   "entry_id": self._pick_entry(world, token)}
        elif roll < 0.55:
            method, body = "PATCH", ({} if world.random.random() < 0.5 else {"details": {"mood_note": "开心"}})
        elif roll < 0.65:
            method, body = "DELETE", None
        else:
            method, body = "GET", None
        exchange = await self._send_retrying(world, driver, token.name, method, f"{api}/state", body)
        if exchange.response is None or exchange.response.status != 200:
            self._unexpected(f"{method} /state", exchange, "200")
            return
        self._check_visible(token, exchange, f"{method} /state")

    async def status(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        exchange = await self._send_retrying(world, driver, token.name, "GET", f"{api}/status")
        if exchange.response is None or exchange.response.status != 200:
            self._unexpected("GET /status", exchange, "200")
            return
        self._check_visible(token, exchange, "GET /status")
        document = exchange.document
        listed = [*(item.get("entry_id") for item in document.get("entries", [])),
                  *(item.get("entry_id") for item in document.get("batches", []))]
        outside = sorted({entry for entry in listed if not isinstance(entry, str) or not token.scope.allows(entry)})
        if outside:
            self._violate(f"status for {token.name} lists entries outside its scope: {outside}", exchange.sequences)

    async def bad_token(self, world: World, driver: AsgiDriver) -> None:
        entry_id = list(host_entry_names)[world.random.randrange(0, len(host_entry_names))]
        exchange = await self._send(world, driver, None, "POST", f"{api}/entries/{entry_id}/prepare", {})
        if exchange.response is None or exchange.response.status in (429, 503):
            return
        self._expect_code(exchange, 401, "unauthorized", "a request without a token")
        if exchange.response.status == 401 and not (exchange.response.header("www-authenticate") or "").startswith("Bearer"):
            self._violate("401 without WWW-Authenticate: Bearer", exchange.sequences)

    # ------------------------------------------------------------------ response checks
    def _expect_code(self, exchange: HttpExchange, status: int, code: str, what: str) -> None:
        response = exchange.response
        assert response is not None
        found = (exchange.document or {}).get("error", {}) if isinstance(exchange.document, dict) else {}
        if response.status != status or not isinstance(found, dict) or found.get("code") != code:
            self._violate(f"{what} answered {response.status} {response.body[:160]!r}, expected {status} {code}",
                          exchange.sequences)

    def _check_visible(self, token: HostToken, exchange: HttpExchange, what: str) -> None:
        """No entry outside the token's scope is named (by id or by name) anywhere in the answer."""
        assert exchange.response is not None
        text = exchange.response.body.decode("utf-8", "replace")
        hidden = [entry for entry in host_entry_names if not token.scope.allows(entry)]
        leaked = sorted(entry for entry in hidden if entry in text or host_entry_names[entry] in text)
        if leaked:
            self._violate(f"{what} shows {token.name} entries outside its scope: {leaked}", exchange.sequences)

    def _check_recent(self, entry_id: str, recent: Any, exchange: HttpExchange) -> None:
        if not isinstance(recent, list):
            self._violate(f"prepare on {entry_id}: recent_messages is {recent!r}", exchange.sequences)
            return
        owners = self.model.owners
        strangers = sorted(item.get("id") for item in recent
                           if isinstance(item, dict) and owners.get(item.get("id"), (entry_id,))[0] != entry_id)
        if strangers:
            self._violate(f"prepare on {entry_id} shows other entries' messages {strangers}", exchange.sequences)

    def _check_hints(self, hints: Any, exchange: HttpExchange) -> None:
        for hint in hints if isinstance(hints, list) else []:
            if isinstance(hint, dict) and hint.get("code") == "other_entries_pending" and not set(hint) <= pending_hint_keys:
                self._violate(f"other_entries_pending reveals {sorted(set(hint) - pending_hint_keys)}", exchange.sequences)

    # ------------------------------------------------------------------ invariants
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=False)
        return [*self._take_pending(), *await self.goals.after_restart(world)]

    async def at_quiescence(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=True)
        return [*self._take_pending(), *await self.goals.at_quiescence(world)]

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    async def _check_storage(self, world: World, *, quiescent: bool) -> None:
        snapshot = await read_checkpoint(world, _read_snapshot, self._violate)
        if snapshot is None:
            return
        self._check_messages(snapshot)
        if self._poisoned is None:
            self._poisoned, self._overrunning = PoisonedReminders(world.tracer), OverrunningTurns(world.tracer)
        overrunning = self._overrunning.current()
        poisoned_entries = {key for key, name in self._poisoned.of_kind("entry") if name == "pace"}
        poisoned_entries |= {key for kind, key in overrunning if kind == "entry"}
        poisoned_learners = {key for key, name in self._poisoned.of_kind("learner") if name == "claim"}
        poisoned_learners |= {key for kind, key in overrunning if kind == "learner"}
        self._check_batches(snapshot, quiescent, poisoned_entries, poisoned_learners)
        self._check_strength(snapshot)

    def _check_messages(self, snapshot: _Snapshot) -> None:
        model = self.model
        stored = snapshot.messages
        for address, (message_id, sequence) in model.acknowledged.items():
            actors = (("entry", address[0]),)
            row = stored.get(address)
            if row is None:
                self._violate(f"acknowledged message {address[1]!r} of {address[0]} (id {message_id}) is not stored",
                              (sequence,), actors)
                continue
            sent = model.keys[address]
            if row.id != message_id:
                self._violate(f"message {address[1]!r} of {address[0]} acknowledged as id {message_id} "
                              f"but stored as {row.id}", (sequence,), actors)
            if row.content != sent.content or row.source != sent.token:
                self._violate(f"message {address[1]!r} of {address[0]} was overwritten: stored "
                              f"{row.content!r} from {row.source!r}, sent {sent.content!r} by {sent.token!r}",
                              (sequence,), actors)
        for address in stored:
            if address in model.refused_keys:
                self._violate(f"message {address[1]!r} of {address[0]} is stored although its batch "
                              f"#{model.refused_keys[address]} was refused", (), (("entry", address[0]),))
            elif address not in model.keys:
                self._violate(f"message {address[1]!r} of {address[0]} is stored but no host sent it")
        for batch in model.batches:
            if batch.outcome != "unknown" or not batch.valid or not batch.fresh:
                continue
            present = [key for key in batch.fresh if (batch.entry_id, key) in stored]
            if present and len(present) != len(batch.fresh):
                self._violate(f"batch #{batch.number} to {batch.entry_id} is stored in part: "
                              f"{len(present)} of {len(batch.fresh)} new messages", batch.sequences[-2:],
                              (("entry", batch.entry_id),))

    def _check_batches(self, snapshot: _Snapshot, quiescent: bool, poisoned_entries: set[str],
                       poisoned_learners: set[str]) -> None:
        reminders = snapshot.reminders
        for batch_id, entry_id, state, learner_key, count in snapshot.batches:
            members = snapshot.batch_members.get(batch_id, Counter())
            if sum(members.values()) != count:
                self._violate(f"batch {batch_id} of {entry_id} says {count} messages, {sum(members.values())} "
                              f"point at it", (), (("entry", entry_id),))
            if state in ("waiting", "running"):
                if learner_key in poisoned_learners:
                    continue
                if quiescent:
                    self._violate(f"batch {batch_id} of {entry_id} is still {state} after the quiet period",
                                  (), (("learner", learner_key),))
                elif ("learner", learner_key, "claim") not in reminders:
                    self._violate(f"open batch {batch_id} of {entry_id} has no claim reminder for learner "
                                  f"{learner_key} after a restart: it would never run", (), (("learner", learner_key),))
            elif state == "succeeded" and set(members) - {"learned"}:
                self._violate(f"succeeded batch {batch_id} of {entry_id} has messages {dict(members)}")
            elif state in ("abandoned", "refused") and set(members) - {"failed"}:
                self._violate(f"{state} batch {batch_id} of {entry_id} has messages {dict(members)}")
        for entry_id, pending in snapshot.pending.items():
            if entry_id in poisoned_entries or not pending:
                continue
            if quiescent:
                self._violate(f"{pending} messages of {entry_id} still pending after the quiet period",
                              (), (("entry", entry_id),))
            elif ("entry", entry_id, "pace") not in reminders:
                self._violate(f"{pending} pending messages of {entry_id} have no pace reminder after a restart",
                              (), (("entry", entry_id),))

    def _check_strength(self, snapshot: _Snapshot) -> None:
        for memory_id, strength in snapshot.strengths.items():
            marked = snapshot.strengthened_pairs.get(memory_id, 0)
            if strength != marked:
                self._violate(f"memory {memory_id} has strength {strength} but {marked} strengthened recalls")
        for (recall_id, memory_id), times in self.model.strengthened.items():
            if times and (recall_id, memory_id) not in snapshot.strengthened_set:
                self._violate(f"memory {memory_id} was strengthened for recall {recall_id} but storage lost it")


@dataclass
class _Row:
    id: int
    content: str
    source: str


@dataclass
class _Snapshot:
    messages: dict[tuple[str, str], _Row]
    batches: list[tuple[int, str, str, str, int]]
    batch_members: dict[int, Counter]
    pending: dict[str, int]
    """Messages not yet in a batch, by entry (batched ones are their batch's business)."""
    reminders: set[tuple[str, str, str]]
    strengths: dict[int, int]
    strengthened_pairs: dict[int, int]
    strengthened_set: set[tuple[str, int]]


def _read_snapshot(connection: Any) -> _Snapshot:
    """Everything the checkers compare, from one read transaction."""
    messages = {
        (entry_id, key): _Row(message_id, content, source)
        for message_id, entry_id, key, content, source in connection.execute(
            "SELECT id, entry_id, dedupe_key, content, source FROM host_messages")
    }
    batches = list(connection.execute(
        "SELECT id, entry_id, state, learner_key, message_count FROM host_batches ORDER BY id"))
    members: dict[int, Counter] = {}
    pending: dict[str, int] = {}
    for batch_id, entry_id, state, count in connection.execute(
            "SELECT batch_id, entry_id, learning_state, count(*) FROM host_messages "
            "GROUP BY batch_id, entry_id, learning_state"):
        if batch_id is not None:
            members.setdefault(batch_id, Counter())[state] += count
        if state == "pending":
            pending[entry_id] = pending.get(entry_id, 0) + count
    reminders = {tuple(row) for row in connection.execute(
        "SELECT kind, key, name FROM reminders WHERE kind IN ('entry', 'learner')")}
    strengths = dict(connection.execute("SELECT id, strength FROM host_memories"))
    pairs = list(connection.execute(
        "SELECT recall_id, memory_id FROM host_recall_memories WHERE strengthened_at IS NOT NULL"))
    return _Snapshot(messages, batches, members, pending, reminders, strengths,
                     dict(Counter(memory_id for _, memory_id in pairs)), set(pairs))


def _spoil(world: World, message: dict[str, Any], *, fresh: bool) -> None:
    """Make one message of a batch invalid in one of the ways the contract refuses."""
    choice = world.random.randrange(0, 4)
    if choice == 0:
        message["occurred_at"] = "2026-09-21T10:00:00"  # no timezone: 400
    elif choice == 1:
        message["content"] = "字" * 11_000  # 33,000 UTF-8 bytes: 413
    elif choice == 2:
        message["kind"] = "bogus"  # 400
    elif fresh:
        message["media_ids"] = ["media_" + "0" * 28]  # never uploaded: 404, rolled back in the actor
    else:
        message["sender"] = "名" * 201  # 400 (a repeated key's media would not be re-checked)


optional_error_members = frozenset({"field", "canonical_id"})
"""Members the contract allows beside the fixed ones: the legacy ``field`` of an oversized
message, and ``canonical_id`` on some errors."""


def _has_fixed_members(error: dict[str, Any]) -> bool:
    members = set(error)
    return error_keys <= members and members - error_keys <= optional_error_members


def envelope_problem(response: AsgiResponse, document: Any,
                     codes: dict[int, frozenset[str]] | None = None) -> str | None:
    """Why an error response is not the host contract's unified body (None when it is);
    ``codes`` are the documented codes by status (default: this workload's routes)."""
    if not (response.header("content-type") or "").startswith("application/json"):
        return f"content-type {response.header('content-type')!r} is not JSON"
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or set(document) != {"error"} or not _has_fixed_members(error):
        return f"not the unified error body: {response.body[:200]!r}"
    allowed = (documented_codes if codes is None else codes).get(response.status)
    if allowed is None or error["code"] not in allowed:
        return f"undocumented code {error['code']!r} for status {response.status}"
    fields = error["fields"]
    if not isinstance(fields, list) or not all(isinstance(item, dict) and set(item) == {"field", "message"}
                                               for item in fields):
        return f"fields is not an array of {{field, message}}: {fields!r}"
    retry_after = response.header("retry-after")
    if response.status in (429, 503):
        if retry_after is None or not retry_after.isdigit() or int(retry_after) < 1:
            return f"{response.status} without a valid Retry-After ({retry_after!r})"
        if error["retry_after_seconds"] != int(retry_after) or not isinstance(error["retry_at"], str):
            return f"retry fields {error['retry_after_seconds']!r}/{error['retry_at']!r} disagree with Retry-After {retry_after}"
    elif error["retry_after_seconds"] is not None or error["retry_at"] is not None:
        return "retry fields set on a status that is not 429/503"
    return None


Operation = Callable[[HostWorkload, World, AsgiDriver], Awaitable[None]]
_operations: tuple[tuple[float, Operation], ...] = (
    (0.45, HostWorkload.post_messages),
    (0.06, HostWorkload.upload_media),
    (0.05, HostWorkload.learn),
    (0.12, HostWorkload.prepare),
    (0.05, HostWorkload.search),
    (0.10, HostWorkload.feedback),
    (0.07, HostWorkload.state),
    (0.05, HostWorkload.status),
    (0.05, HostWorkload.bad_token),
)
check_shares(_operations)


register_workload("host", HostWorkload)

__all__ = ["HostWorkload", "envelope_problem", "host_entry_names", "host_tokens"]
