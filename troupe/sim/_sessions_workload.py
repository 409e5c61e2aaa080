"""The sessions surface's workload: mobile apps running agent sessions over the real sessions app.

Why over HTTP: the sessions contract's promises (a reconnect gets an exact replay or an explicit
gap, seqs only grow across epochs, a crash loses at most the running turn, one webhook per turn
and only when nobody was watching, no bridge request waits forever) are kept jointly by the
app's gate and SSE writer, the session actor, its ring and subscribers, the kernel, the bridges,
the webhook deliveries and the storage engine.  So every operation goes through
``world.apps["sessions"]`` (the in-process ASGI driver, which streams) while the simulator's
runtime fault points, storage faults, crashes and power losses are armed.

What the apps do (one simulator client = one phone = one end user with its own token, created
through the storage API like the host workload's tokens): create sessions (with a client tool
declared), post prompts written in the local model's directives (``/client``, ``/permission``,
``/ask``, ``/slow``, ``/fail``: turns of several steps that wait on the phone), follow the SSE
stream for a random while and hang up (answering tool, permission and question requests as
they arrive, or not), reconnect with ``Last-Event-ID`` = the last seq consumed, get "killed"
and come back cold (``POST /v2/sessions {resume}``, L3), interrupt, read history, make
checkpoints and fork from them, close.  The webhook target behind the simulated network
(``http://hooks.sim.test/turn-end``) answers, fails or hangs, in phases.

The webhook: ``troupe serve`` installs the deliveries from ``TANSR_SERVE_NOTIFY_URL``; the
simulator does not touch ``os.environ``, so this workload builds the same ``WebhookDeliveries``
in ``services(world)`` (one per process lifetime, supervised by the root, published into
``env.extras`` exactly as ``_install_webhooks`` does).

Invariants (checked on every frame, after every restart and at quiescence):

- **seq**: within a session, every event a phone consumes has a seq above everything it
  consumed before, across connections, epochs, crashes and cold starts (the phone keeps its
  cursor like a real app keeps it on disk);
- **replay**: a connection with cursor ``C`` delivers ``C + 1``, ``C + 2``, ... with no hole
  and no duplicate, unless a ``server.replay.gap`` frame came first; a gap ``ahead_of_log`` is
  itself a violation (the log went below a seq a phone had consumed);
- **durability**: a turn is *acknowledged* when a phone saw its ``turn.completed`` on the
  stream AND a later ``GET …/history`` (a read of committed storage) listed that turn's
  messages.  Seeing ``turn.completed`` alone acknowledges nothing: the turn is committed after
  its terminal event is streamed, so a crash in between loses it by design.  Every
  acknowledged turn must stay in the history for good; every committed ``turn.completed``
  event must come with its turn's messages (one commit), and the watermark covers every
  committed event; a session whose create was acknowledged (201) never disappears;
- **webhook**: at most one nonce per (sessionId, turnId) (the same nonce again after a crash
  or a retry is allowed); every delivery verifies with an HMAC check written here (not the
  signing module's); no delivery is decided (trace ``session_webhook``) while a phone's
  connection to that session was open across the decision and was hung up by the phone only
  later;
- **bridges**: every committed tool / permission / question request has its end (result,
  cancel or closed frame) in the committed log, and at quiescence no session keeps a turn
  running past every bridge deadline.

Trade-off: streams are followed for simulated seconds (cheap), but every step is still a
request through the real app, so this workload is slower per step than the in-memory ones.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import cbor2
import httpx
import trio

from troupe.auth import (
    TokenScope,
    new_token_secret,
    sessions_audience,
)

from ._asgi import AsgiDriver, AsgiError, AsgiResponse
from ._tokens import TokenGrant, write_tokens
from ._violation import Violation
from ._workload import World, check_shares, choose_by_share, read_checkpoint, register_workload
from ._workload_http import send_traced

checker_name = "sessions"
api = "/v2"

client_pause_seconds_max = 0.3
request_seconds_max = 20.0
follow_seconds_min = 0.5
follow_seconds_max = 12.0
"""How long a phone keeps a stream open before it hangs up (a random drop)."""
answer_delay_seconds_max = 1.5
sessions_per_phone_max = 4
webhook_host = "hooks.sim.test"
webhook_path = "/turn-end"
webhook_secret_text = "sim-webhook-secret"
webhook_hang_seconds = 30.0
"""A hanging receiver holds the request longer than the delivery's 5 s attempt timeout."""
quiescence_poll_seconds = 30.0
quiescence_wait_seconds_max = 2400.0
"""How long the quiescence check waits for running turns to end: above every bridge deadline
(question 600 s) times a few queued turns; a turn still running after it waits on nothing."""
client_tool_name = "pick_color"

request_types = {"server.tool.request": "callId", "server.permission.request": "requestId",
                 "server.question.request": "requestId"}
end_types = {"server.tool.cancel": "callId", "tool.completed": "callId", "tool.failed": "callId",
             "server.permission.closed": "requestId", "server.question.closed": "requestId"}
turn_end_types = frozenset({"turn.completed", "turn.aborted"})
transient_statuses = frozenset({409, 429, 500, 503})

prompts = (
    "/client pick_color {\"hint\": \"sky\"}\n/say 好的",
    "/permission WebFetch {\"url\": \"https://93.184.216.34/docs\"}\n/say 查完了",
    "/ask [{\"question\": \"咖啡还是茶？\", \"options\": [{\"label\": \"咖啡\"}, {\"label\": \"茶\"}]}]\n/say 明白",
    "/slow 4\n/say 慢慢来",
    "/client pick_color {}\n/ask [\"几点？\"]\n/slow 2\n/say 完成",
    "/fail 模型坏了",
    "你好",
)


@dataclass
class _Connection:
    """One SSE connection as a phone saw it."""

    session_id: str
    cursor: int
    opened: int
    """Trace sequence of the response start (the actor had registered the subscriber)."""
    closed: int | None = None
    """Trace sequence of the end, as the phone saw it."""
    closed_by: str = ""
    """``phone`` (it hung up), ``server`` (the stream ended) or ``gone`` (crash, error)."""
    last_seq: int | None = None
    gap_pending: bool = False


@dataclass
class _Session:
    session_id: str
    phone: int
    created_sequence: int
    cursor: int = 0
    """The last seq the phone consumed: kept across cold starts, like an app keeps it on disk."""
    completed: dict[str, int] = field(default_factory=dict)
    """turn id -> seq of the ``turn.completed`` the phone saw."""
    acknowledged: dict[str, int] = field(default_factory=dict)
    """turn id -> trace sequence of the history read that showed it committed."""
    checkpoints: list[str] = field(default_factory=list)
    needs_resume: bool = False


@dataclass
class _Phone:
    index: int
    end_user: str
    token_name: str
    secret: str = ""
    sessions: list[str] = field(default_factory=list)


@dataclass
class _Delivery:
    time: float
    session_id: str
    turn_id: str
    nonce: str
    sequence: int


class SessionsWorkload:
    name = "sessions"

    def __init__(self) -> None:
        self.phones: dict[int, _Phone] = {}
        self.sessions: dict[str, _Session] = {}
        self.connections: list[_Connection] = []
        self.deliveries: list[_Delivery] = []
        self.nonces: dict[tuple[str, str], set[str]] = {}
        self._trace_position = 0
        self.tokens_generation = 0
        self.webhook_mode = "ok"
        self.responses = 0
        self._pending: list[Violation] = []
        self._deliveries_service: Any = None
        self._tracer: Any = None

    def actor_kinds(self, world: World) -> list[Any]:
        return []  # the sessions surface's kinds come with the server (``SimServer``)

    def migrations(self) -> list[Any]:
        return []

    def services(self, world: World) -> list[Any]:
        """The turn-end webhook deliveries of this lifetime, as ``_install_webhooks`` would
        build them from ``TANSR_SERVE_NOTIFY_URL`` (see the module docstring)."""
        from troupe.actors.sessions import WebhookDeliveries, WebhookSettings

        network = world.env.extras.get("network")
        if network is None or world.engine is None:
            return []
        self._tracer = world.tracer
        network.route(webhook_host, self._webhook_target)
        settings = WebhookSettings.from_environ({
            "TANSR_SERVE_NOTIFY_URL": f"http://{webhook_host}{webhook_path}",
            "TANSR_SERVE_NOTIFY_SECRET": webhook_secret_text,
        })
        deliveries = WebhookDeliveries(settings, env=world.env, storage=world.engine, tracer=world.tracer)
        deliveries.publish()
        self._deliveries_service = deliveries
        return [deliveries.child_spec()]

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = (), session_id: str | None = None) -> None:
        actors = (("session", session_id),) if session_id else ()
        self._pending.append(Violation(f"sessions: {text}", sequences=sequences, actors=actors, checker=checker_name))

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    async def _ensure_tokens(self, world: World) -> bool:
        if self.tokens_generation == world.generation:
            return True
        if not self.phones:
            for index in range(4):
                self.phones[index] = _Phone(index, f"u_phone{index}", f"sim-phone-{index}",
                                            new_token_secret(world.random))
        grants = [TokenGrant(phone.token_name, TokenScope.of_end_user(phone.end_user), phone.secret, sessions_audience)
                  for phone in self.phones.values()]
        if not await write_tokens(world, grants):
            return False
        self.tokens_generation = world.generation
        return True

    def _headers(self, phone: _Phone, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
        return [("content-type", "application/json"), ("authorization", f"Bearer {phone.secret}"), *extra]

    async def _send(self, world: World, driver: AsgiDriver, phone: _Phone, method: str, path: str,
                    body: Any = None) -> tuple[AsgiResponse | None, Any, tuple[int, ...]]:
        data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode()
        exchange = await send_traced(world, driver, "sessions", method, path, violate=self._violate,
                                     headers=self._headers(phone), body=data, seconds_max=request_seconds_max)
        response, document, sequences = exchange.response, exchange.document, exchange.sequences
        if response is None:
            return None, None, sequences
        self.responses += 1
        if response.status >= 400:
            error = document.get("error") if isinstance(document, dict) else None
            if not isinstance(error, dict) or not isinstance(error.get("code"), str) or "message" not in error:
                self._violate(f"{method} {path} answered {response.status} without the /v2 error body: "
                              f"{response.body[:160]!r}", sequences)
        return response, document, sequences

    @staticmethod
    def _code(document: Any) -> str:
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            return str(document["error"].get("code"))
        return ""

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get("sessions")
        if driver is None or world.engine is None:
            return
        if not await self._ensure_tokens(world):
            return
        phone = self.phones[client % len(self.phones)]
        if world.random.random() < 0.03:
            self.webhook_mode = ("ok", "ok", "fail", "hang")[world.random.randrange(0, 4)]
        if not phone.sessions:
            await self.create(world, driver, phone)
            return
        operation = choose_by_share(world.random.random(), _operations)
        if operation is not None:
            await operation(self, world, driver, phone)

    def _pick(self, world: World, phone: _Phone) -> _Session:
        return self.sessions[phone.sessions[world.random.randrange(0, len(phone.sessions))]]

    def _prompt(self, world: World) -> str:
        return prompts[world.random.randrange(0, len(prompts))]

    async def create(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        if len(phone.sessions) >= sessions_per_phone_max:
            await self.prompt(world, driver, phone)
            return
        body: dict[str, Any] = {
            "clientTools": [{"name": client_tool_name, "description": "让用户选一个颜色", "timeoutMs": 5000}],
        }
        if world.random.random() < 0.5:
            body["prompt"] = self._prompt(world)
        response, document, sequences = await self._send(world, driver, phone, "POST", f"{api}/sessions", body)
        if response is None or response.status != 201:
            if response is not None and response.status not in transient_statuses:
                self._violate(f"create answered {response.status} {response.body[:160]!r}", sequences)
            return
        session_id = document["sessionId"]
        if session_id in self.sessions:
            self._violate(f"create answered an existing session id {session_id}", sequences, session_id)
            return
        self.sessions[session_id] = _Session(session_id, phone.index, sequences[-1], cursor=int(document["lastSeq"]))
        phone.sessions.append(session_id)
        await self.follow(world, driver, phone, self.sessions[session_id])

    async def prompt(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        if session.needs_resume and not await self.resume(world, driver, phone, session):
            return
        path = f"{api}/sessions/{session.session_id}/messages"
        response, document, sequences = await self._send(world, driver, phone, "POST", path,
                                                          {"prompt": self._prompt(world)})
        if response is not None and self._code(document) in ("session_not_found", "session_ended"):
            session.needs_resume = True
            return
        if response is not None and response.status not in (202, *transient_statuses):
            self._violate(f"prompt answered {response.status} {response.body[:160]!r}", sequences,
                          session.session_id)
            return
        if world.random.random() < 0.8:
            await self.follow(world, driver, phone, session)

    async def resume(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> bool:
        """L3: ``POST /v2/sessions {resume}``; True when the session is live afterwards."""
        body = {"resume": {"sessionId": session.session_id}}
        response, document, sequences = await self._send(world, driver, phone, "POST", f"{api}/sessions", body)
        if response is None:
            return False
        if response.status in (200, 201):
            session.needs_resume = False
            return True
        if self._code(document) == "session_not_found":
            self._violate(f"session {session.session_id}, whose create was acknowledged, is gone: resume "
                          f"answered {response.body[:160]!r}", (session.created_sequence, *sequences),
                          session.session_id)
        elif response.status not in transient_statuses:
            self._violate(f"resume answered {response.status} {response.body[:160]!r}", sequences,
                          session.session_id)
        return False

    async def reconnect(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        if session.needs_resume and not await self.resume(world, driver, phone, session):
            return
        await self.follow(world, driver, phone, session)

    async def cold_start(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        """The app was killed: it comes back with only its stored cursor and resumes (L3)."""
        session = self._pick(world, phone)
        if await self.resume(world, driver, phone, session):
            await self.follow(world, driver, phone, session)

    async def interrupt(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        response, document, sequences = await self._send(
            world, driver, phone, "POST", f"{api}/sessions/{session.session_id}/interrupt")
        if response is not None and self._code(document) in ("session_not_found", "session_ended"):
            session.needs_resume = True
        elif response is not None and response.status not in (202, *transient_statuses):
            self._violate(f"interrupt answered {response.status} {response.body[:160]!r}", sequences,
                          session.session_id)

    async def history(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        response, document, sequences = await self._send(
            world, driver, phone, "GET", f"{api}/sessions/{session.session_id}/history")
        if response is None or response.status != 200 or not isinstance(document, dict):
            if response is not None and response.status not in transient_statuses:
                self._violate(f"history answered {response.status} {response.body[:160]!r}", sequences,
                              session.session_id)
            return
        turns = {message.get("turnId") for message in document.get("messages", []) if isinstance(message, dict)}
        for turn_id, sequence in session.acknowledged.items():
            if turn_id not in turns:
                self._violate(f"acknowledged turn {turn_id} of {session.session_id} is missing from its history",
                              (sequence, *sequences), session.session_id)
        for turn_id in session.completed:
            if turn_id in turns and turn_id not in session.acknowledged:
                session.acknowledged[turn_id] = sequences[-1]

    async def checkpoint_and_fork(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        if not session.checkpoints or world.random.random() < 0.5:
            response, document, sequences = await self._send(
                world, driver, phone, "POST", f"{api}/sessions/{session.session_id}/checkpoints", {"name": "sim"})
            if response is not None and response.status == 201 and isinstance(document, dict):
                session.checkpoints.append(document["checkpointId"])
            return
        if len(phone.sessions) >= sessions_per_phone_max:
            return
        checkpoint_id = session.checkpoints[world.random.randrange(0, len(session.checkpoints))]
        body = {"fork": {"sessionId": session.session_id, "checkpointId": checkpoint_id}}
        response, document, sequences = await self._send(world, driver, phone, "POST", f"{api}/sessions", body)
        if response is None or response.status != 201 or not isinstance(document, dict):
            return  # a checkpoint lost with an unknown outcome, the user's cap, a turn running
        forked = _Session(document["sessionId"], phone.index, sequences[-1], cursor=int(document["lastSeq"]))
        self.sessions[forked.session_id] = forked
        phone.sessions.append(forked.session_id)

    async def close(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        session = self._pick(world, phone)
        response, _, _ = await self._send(world, driver, phone, "DELETE", f"{api}/sessions/{session.session_id}")
        if response is not None and response.status == 202:
            session.needs_resume = True

    # ------------------------------------------------------------------ the stream
    async def follow(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> None:
        """Read the stream for a random while, answering bridge requests, then hang up."""
        seconds = follow_seconds_min + world.random.random() * (follow_seconds_max - follow_seconds_min)
        path = f"{api}/sessions/{session.session_id}/events"
        cursor = session.cursor
        headers = self._headers(phone, (("last-event-id", str(cursor)),))
        invoked = world.tracer.record("http_invoke", "http", "sessions", method="GET", path=path, cursor=cursor)
        connection: _Connection | None = None
        try:
            async with driver.stream("GET", path, headers=headers, start_seconds_max=request_seconds_max) as stream:
                if stream.status != 200:
                    with trio.move_on_after(request_seconds_max):
                        body = await stream.read()
                        if b"session_not_found" in body or b"session_ended" in body:
                            session.needs_resume = True
                    return
                opened = world.tracer.record("sessions_stream_open", "session", session.session_id, cursor=cursor)
                connection = _Connection(session.session_id, cursor, opened)
                self.connections.append(connection)
                async with trio.open_nursery() as answers:
                    with trio.move_on_after(seconds) as scope:
                        buffer = b""
                        async for chunk in stream:
                            buffer += chunk
                            while b"\n\n" in buffer:
                                block, buffer = buffer.split(b"\n\n", 1)
                                self._on_frame(world, driver, phone, session, connection, block, answers, invoked)
                    connection.closed_by = "phone" if scope.cancelled_caught else "server"
                    connection.closed = world.tracer.record("sessions_stream_close", "session", session.session_id,
                                                            by=connection.closed_by)
                    if connection.closed_by == "server":
                        session.needs_resume = True  # the epoch ended (drain, passivation, close)
                    answers.cancel_scope.cancel()
        except AsgiError:
            world.tracer.record("http_fail", "http", "sessions", path=path)
        finally:
            if connection is not None and connection.closed is None:
                connection.closed_by = "gone"
                connection.closed = world.tracer.record("sessions_stream_close", "session", session.session_id,
                                                        by="gone")

    def _on_frame(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session,
                  connection: _Connection, block: bytes, answers: trio.Nursery, invoked: int) -> None:
        event_name = seq_text = data_text = None
        for line in block.decode("utf-8", "replace").split("\n"):
            if line.startswith("event: "):
                event_name = line[7:]
            elif line.startswith("id: "):
                seq_text = line[4:]
            elif line.startswith("data: "):
                data_text = line[6:]
        if data_text is None:
            return  # ``retry:`` or a heartbeat
        try:
            data = json.loads(data_text)
        except ValueError:
            self._violate(f"undecodable frame on {session.session_id}: {block[:120]!r}", (invoked,), session.session_id)
            return
        if event_name == "server.replay.gap":
            connection.gap_pending = True
            if data.get("reason") == "ahead_of_log":
                sequence = world.tracer.record("sessions_gap", "session", session.session_id, cursor=connection.cursor)
                self._violate(f"cursor {connection.cursor} of {session.session_id} is ahead of the log: the log "
                              f"went below a seq the phone consumed", (invoked, sequence), session.session_id)
            return
        if seq_text is None or not seq_text.isdigit():
            self._violate(f"event without an id on {session.session_id}: {block[:120]!r}", (invoked,),
                          session.session_id)
            return
        seq = int(seq_text)
        previous = connection.cursor if connection.last_seq is None else connection.last_seq
        if data.get("seq") != seq or data.get("sessionId") != session.session_id:
            self._violate(f"frame id {seq} disagrees with its data {data_text[:120]}", (invoked,), session.session_id)
        if connection.gap_pending:
            if seq <= previous:
                self._violate(f"seq {seq} after a gap on {session.session_id} is not above {previous}",
                              (invoked,), session.session_id)
        elif seq != previous + 1:
            sequence = world.tracer.record("sessions_seq", "session", session.session_id, seq=seq, expected=previous + 1)
            what = "a silent hole" if seq > previous + 1 else "a duplicate or a step back"
            self._violate(f"{what} on {session.session_id}: seq {seq} after {previous} (cursor "
                          f"{connection.cursor}) without a gap frame", (invoked, sequence), session.session_id)
        if seq <= session.cursor:
            self._violate(f"seq {seq} of {session.session_id} is not above {session.cursor}, already consumed",
                          (invoked,), session.session_id)
        connection.gap_pending = False
        connection.last_seq = seq
        session.cursor = max(session.cursor, seq)
        kind = data.get("type")
        if kind == "turn.completed" and isinstance(data.get("turnId"), str):
            session.completed[data["turnId"]] = seq
        elif kind in request_types and world.random.random() < 0.8:
            answers.start_soon(self._answer, world, driver, phone, session, data)

    async def _answer(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session,
                      request: dict[str, Any]) -> None:
        await trio.sleep(world.random.random() * answer_delay_seconds_max)
        base = f"{api}/sessions/{session.session_id}"
        kind = request["type"]
        if kind == "server.tool.request":
            path, body = f"{base}/tool-results/{request.get('callId')}", {"result": {"color": "blue"}}
        elif kind == "server.permission.request":
            verdict = "allow" if world.random.random() < 0.5 else "deny"
            path, body = f"{base}/permission/{request.get('requestId')}", {"digest": request.get("digest"),
                                                                         "verdict": verdict}
        else:
            path, body = f"{base}/questions/{request.get('requestId')}", {"answers": ["茶"]}
        response, _, sequences = await self._send(world, driver, phone, "POST", path, body)
        if response is not None and response.status not in (202, 200, 404, 409, 410, *transient_statuses):
            self._violate(f"a bridge answer got {response.status} {response.body[:160]!r}", sequences,
                          session.session_id)

    # ------------------------------------------------------------------ the webhook target
    async def _webhook_target(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        headers = request.headers
        try:
            payload = json.loads(body)
            session_id, turn_id = str(payload["sessionId"]), str(payload["turnId"])
        except (ValueError, KeyError, TypeError):
            self._violate(f"a webhook body is not the turn-end payload: {body[:160]!r}")
            return httpx.Response(400)
        nonce = headers.get("x-tansr-nonce", "")
        timestamp = headers.get("x-tansr-timestamp", "")
        problem = webhook_signature_problem(headers.get("x-tansr-signature", ""), timestamp, nonce, body)
        if problem is not None:
            self._violate(f"webhook for turn {turn_id} of {session_id}: {problem}", (), session_id)
        sequence = self._tracer.record("sessions_webhook_received", "session", session_id, turn=turn_id,
                                       mode=self.webhook_mode) if self._tracer is not None else -1
        nonces = self.nonces.setdefault((session_id, turn_id), set())
        nonces.add(nonce)
        self.deliveries.append(_Delivery(trio.current_time(), session_id, turn_id, nonce, sequence))
        if len(nonces) > 1:
            first = next(delivery.sequence for delivery in self.deliveries
                         if (delivery.session_id, delivery.turn_id) == (session_id, turn_id))
            self._violate(f"turn {turn_id} of {session_id} got {len(nonces)} webhooks with distinct nonces",
                          (first, sequence), session_id)
        if self.webhook_mode == "fail":
            return httpx.Response(500)
        if self.webhook_mode == "hang":
            await trio.sleep(webhook_hang_seconds)
        return httpx.Response(204)

    def _check_webhook_decisions(self, world: World) -> None:
        """No turn-end webhook decided while a phone was connected to the session (see doc)."""
        records = world.tracer.records
        for index in range(self._trace_position, len(records)):
            encoded = records[index]
            if b"session_webhook" not in encoded:
                continue
            sequence, _, event, _, key, fields = cbor2.loads(encoded)
            if event != "session_webhook":
                continue
            session_id = fields.get("session", key)
            turn_id = fields.get("turn")
            for connection in self.connections:
                if (connection.session_id == session_id and connection.closed_by == "phone"
                        and connection.opened < sequence and connection.closed is not None
                        and sequence < connection.closed):
                    self._violate(f"turn {turn_id} of {session_id} was notified by webhook while a phone's "
                                  f"stream was live", (connection.opened, sequence, connection.closed), session_id)
        self._trace_position = len(records)

    # ------------------------------------------------------------------ invariants
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world)
        self._check_webhook_decisions(world)
        return self._take_pending()

    async def at_quiescence(self, world: World) -> list[Violation]:
        if world.engine is not None and world.apps.get("sessions") is not None and self.tokens_generation:
            await self._wait_for_turns(world, world.apps["sessions"])
        if world.engine is not None:
            await self._check_storage(world)
        self._check_webhook_decisions(world)
        return self._take_pending()

    async def _wait_for_turns(self, world: World, driver: AsgiDriver) -> None:
        """Every bridge request ends: no turn is still running once every deadline has passed."""
        if not await self._ensure_tokens(world):
            return
        waited = 0.0
        while True:
            running = []
            for session in self.sessions.values():
                phone = self.phones[session.phone]
                response, document, _ = await self._send(world, driver, phone, "GET",
                                                         f"{api}/sessions/{session.session_id}")
                if response is not None and response.status == 200 and document.get("status") == "running":
                    running.append(session.session_id)
            if not running:
                return
            if waited >= quiescence_wait_seconds_max:
                for session_id in running:
                    self._violate(f"session {session_id} still runs a turn {waited:.0f} s after the clients "
                                  f"stopped: a bridge request never ended", (), session_id)
                return
            await trio.sleep(quiescence_poll_seconds)
            waited += quiescence_poll_seconds

    async def _check_storage(self, world: World) -> None:
        snapshot = await read_checkpoint(world, _read_snapshot, self._violate)
        if snapshot is None:
            return
        for session in self.sessions.values():
            if session.session_id not in snapshot.watermarks:
                self._violate(f"session {session.session_id}, whose create was acknowledged, is not stored",
                              (session.created_sequence,), session.session_id)
                continue
            history = snapshot.history_turns.get(session.session_id, set())
            for turn_id, sequence in session.acknowledged.items():
                if turn_id not in history:
                    self._violate(f"acknowledged turn {turn_id} of {session.session_id} was lost",
                                  (sequence,), session.session_id)
        for session_id, (last_seq, max_seq) in snapshot.watermarks.items():
            if max_seq is not None and max_seq > last_seq:
                self._violate(f"session {session_id} stores event {max_seq} above its watermark {last_seq}",
                              (), session_id)
        for session_id, turn_id in snapshot.completed_turns:
            if turn_id not in snapshot.history_turns.get(session_id, set()):
                self._violate(f"committed turn.completed of {turn_id} in {session_id} without its messages "
                              f"(the turn was not committed in one write)", (), session_id)
        for session_id, request_id, seq in snapshot.unended_requests:
            self._violate(f"bridge request {request_id} (seq {seq}) of {session_id} is committed without its "
                          f"end", (), session_id)


def webhook_signature_problem(header: str, timestamp: str, nonce: str, body: bytes) -> str | None:
    """Independent check of ``x-tansr-signature`` (v2 over the canonical string, v1 over the
    body, HMAC-SHA256 with the configured secret), written from the contract."""
    key = webhook_secret_text.encode()
    if not timestamp.isdigit() or not nonce:
        return f"timestamp {timestamp!r} or nonce {nonce!r} missing"
    parts = dict(part.strip().split("=", 1) for part in header.split(",") if "=" in part)
    if set(parts) != {"v1", "v2"}:
        return f"signature header {header!r} lacks v2 or v1"
    canonical = "\n".join(("tansr-webhook-v2", "POST", webhook_path, timestamp, nonce,
                           hashlib.sha256(body).hexdigest())).encode()
    if not hmac.compare_digest(parts["v2"], hmac.new(key, canonical, hashlib.sha256).hexdigest()):
        return "v2 signature does not verify"
    if not hmac.compare_digest(parts["v1"], hmac.new(key, body, hashlib.sha256).hexdigest()):
        return "v1 signature does not verify"
    return None


@dataclass
class _Snapshot:
    watermarks: dict[str, tuple[int, int | None]]
    history_turns: dict[str, set[str]]
    completed_turns: list[tuple[str, str]]
    unended_requests: list[tuple[str, str, int]]


def _read_snapshot(connection: Any) -> _Snapshot:
    """What the storage checks compare, from one read transaction."""
    watermarks = {
        session_id: (last_seq, max_seq)
        for session_id, last_seq, max_seq in connection.execute(
            "SELECT s.session_id, s.last_seq, (SELECT max(seq) FROM agent_session_events e "
            "WHERE e.session_id = s.session_id) FROM agent_sessions s")
    }
    history: dict[str, set[str]] = {}
    for session_id, turn_id in connection.execute(
            "SELECT DISTINCT session_id, json_extract(message_json, '$.turnId') FROM agent_session_messages"):
        history.setdefault(session_id, set()).add(turn_id)
    completed = [tuple(row) for row in connection.execute(
        "SELECT session_id, json_extract(data, '$.turnId') FROM agent_session_events "
        "WHERE json_extract(data, '$.type') = 'turn.completed'")]
    types = sorted({*request_types, *end_types})
    placeholders = ",".join("?" for _ in types)
    requests: dict[tuple[str, str], int] = {}
    ended: set[tuple[str, str]] = set()
    for session_id, seq, data in connection.execute(
            f"SELECT session_id, seq, data FROM agent_session_events WHERE json_extract(data, '$.type') "
            f"IN ({placeholders}) ORDER BY session_id, seq", types):
        event = json.loads(data)
        kind = event.get("type")
        if kind in request_types:
            requests[(session_id, str(event.get(request_types[kind])))] = seq
        else:
            ended.add((session_id, str(event.get(end_types[kind]))))
    unended = [(session_id, request_id, seq) for (session_id, request_id), seq in requests.items()
               if (session_id, request_id) not in ended]
    return _Snapshot(watermarks, history, completed, unended)


Operation = Callable[[SessionsWorkload, World, AsgiDriver, _Phone], Awaitable[None]]
_operations: tuple[tuple[float, Operation], ...] = (
    (0.10, SessionsWorkload.create),
    (0.28, SessionsWorkload.prompt),
    (0.22, SessionsWorkload.reconnect),
    (0.10, SessionsWorkload.cold_start),
    (0.06, SessionsWorkload.interrupt),
    (0.14, SessionsWorkload.history),
    (0.07, SessionsWorkload.checkpoint_and_fork),
    (0.03, SessionsWorkload.close),
)
check_shares(_operations)


register_workload("sessions", SessionsWorkload)

__all__ = ["SessionsWorkload", "webhook_signature_problem"]
