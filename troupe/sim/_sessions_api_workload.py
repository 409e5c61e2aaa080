"""The ``sessions-api`` workload: phones speak the unified ``/api`` to the sessions surface and
post strict inputs into running turns, under the simulator's crashes and runtime faults.

Why its own workload (and not more steps in ``sessions``): the /api dialect answers in the
unified envelope and the input path has its own invariants; keeping them apart keeps both
checkers short.  Every step is a request through the real app (``World.apps["sessions"]``,
the simulator's ASGI driver), so the gate, validation, the envelope and the actors all run
under the seed.

Steps: create a session; post a slow prompt and, while it runs, read the input capabilities
and submit one input twice at once (concurrent duplicates), sometimes a conflicting third;
checkpoint and restore (the history epoch moves); close and resume; read an input's status.

Invariants:
- duplicates: two concurrent submissions of one input get identical receipts (both 202);
- conflicts: the same id with other content is refused with ``domainCode: input_conflict``;
- settlement: at quiescence every acknowledged input reads ``consumed``, or ``closed`` /
  ``cancelled`` with a reason, or is refused because its epoch moved or its receipt aged out
  of retention; never still ``accepted``;
- once: no input id appears twice in a session's stored history;
- consumption: a stored ``consumed`` receipt's input is in the session's stored history, a
  ``closed`` or ``cancelled`` one's is not;
- crashes: after a restart, an acknowledged receipt is still stored unless storage shows why it
  may be gone: a restore moved the history epoch, or a later turn of the session settled
  (retention is the current and the last turn).  Turns queued before the input count: the
  check reads storage, not what the phone posted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio

from troupe.auth import (
    TokenScope,
    new_token_secret,
    sessions_audience,
)
from troupe.storage import StorageError

from ._asgi import AsgiDriver
from ._tokens import TokenGrant, write_tokens
from ._violation import Violation
from ._workload import World, register_workload
from ._workload_http import send_traced

checker_name = "sessions-api"
client_pause_seconds_max = 0.3
request_seconds_max = 20.0
sessions_per_phone_max = 3
phones_count = 3
quiescence_poll_seconds = 5.0
quiescence_wait_seconds_max = 600.0
slow_prompts = ("/slow 0.2\n/say 好的", "/slow 0.5\n/say 慢慢来", "/slow 3\n/think 想一想\n/say 完成")
ok_statuses = frozenset({200, 201, 202, 204})
transient_statuses = frozenset({404, 409, 410, 429, 500, 503})


@dataclass
class _Input:
    session_id: str
    input_id: str
    target: dict[str, str]
    receipt: dict[str, Any]
    sequence: int


@dataclass
class _Session:
    session_id: str
    phone: int
    checkpoint_id: str | None = None
    closed: bool = False


@dataclass
class _Phone:
    index: int
    end_user: str
    token_name: str
    secret: str
    sessions: list[str] = field(default_factory=list)


class SessionsApiWorkload:
    name = "sessions-api"

    def __init__(self) -> None:
        self.phones: dict[int, _Phone] = {}
        self.sessions: dict[str, _Session] = {}
        self.inputs: list[_Input] = []
        self.tokens_generation = 0
        self.counter = 0
        self._pending: list[Violation] = []

    def actor_kinds(self, world: World) -> list[Any]:
        return []

    def migrations(self) -> list[Any]:
        return []

    def _violate(self, text: str, sequences: tuple[int, ...] = (), session_id: str | None = None) -> None:
        actors = (("session", session_id),) if session_id else ()
        self._pending.append(Violation(f"sessions-api: {text}", sequences=sequences, actors=actors,
                                       checker=checker_name))

    async def _ensure_tokens(self, world: World) -> bool:
        if self.tokens_generation == world.generation:
            return True
        if not self.phones:
            for index in range(phones_count):
                self.phones[index] = _Phone(index, f"u_api{index}", f"sim-api-{index}", new_token_secret(world.random))
        grants = [TokenGrant(phone.token_name, TokenScope.of_end_user(phone.end_user), phone.secret, sessions_audience)
                  for phone in self.phones.values()]
        if not await write_tokens(world, grants):
            return False
        self.tokens_generation = world.generation
        return True

    async def _send(self, world: World, driver: AsgiDriver, phone: _Phone, method: str, path: str,
                    body: Any = None) -> tuple[int | None, Any, int]:
        data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode()
        headers = [("content-type", "application/json"), ("authorization", f"Bearer {phone.secret}"),
                   ("tansr-session-family", "sdk1")]
        # No ``violate``: this workload has never held an app error against the surface (the
        # sessions workload does, on the same app).
        exchange = await send_traced(world, driver, "sessions", method, path, headers=headers, body=data,
                                     seconds_max=request_seconds_max)
        response, document, invoked, sequence = (exchange.response, exchange.document, exchange.invoke_seq,
                                                 exchange.complete_seq)
        if response is None:
            return None, None, invoked
        if response.status >= 400 and (not isinstance(document, dict) or document.get("contract") != "unified-v1"
                                       or document.get("status") != response.status):
            self._violate(f"{method} {path} answered {response.status} outside the unified envelope: "
                          f"{response.body[:160]!r}", (invoked, sequence))
        return response.status, document, sequence

    # ------------------------------------------------------------------ steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get("sessions")
        if driver is None or world.engine is None or not await self._ensure_tokens(world):
            return
        phone = self.phones[client % len(self.phones)]
        live = [self.sessions[key] for key in phone.sessions if not self.sessions[key].closed]
        if not live:
            await self.create(world, driver, phone)
            return
        session = live[world.random.randrange(0, len(live))]
        roll = world.random.random()
        if roll < 0.55:
            await self.turn_with_inputs(world, driver, phone, session)
        elif roll < 0.7:
            await self.checkpoint_and_restore(world, driver, phone, session)
        elif roll < 0.8:
            await self.close_and_resume(world, driver, phone, session)
        elif roll < 0.9:
            await self.status_of_one(world, driver, phone)
        else:
            await self.create(world, driver, phone)

    async def create(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        if len(phone.sessions) >= sessions_per_phone_max:
            return
        status, document, _ = await self._send(world, driver, phone, "POST", "/api/sessions", {})
        if status == 201 and isinstance(document, dict):
            session_id = document["sessionId"]
            self.sessions[session_id] = _Session(session_id, phone.index)
            phone.sessions.append(session_id)

    async def turn_with_inputs(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> None:
        base = f"/api/sessions/{session.session_id}"
        prompt = slow_prompts[world.random.randrange(0, len(slow_prompts))]
        status, _, _ = await self._send(world, driver, phone, "POST", f"{base}/messages", {"prompt": prompt})
        if status in (404, 410):
            await self.resume(world, driver, phone, session)
            return
        status, capabilities, _ = await self._send(world, driver, phone, "GET", f"{base}/input-capabilities")
        if status != 200 or not isinstance(capabilities, dict) or capabilities.get("target") is None:
            return
        target = capabilities["target"]
        self.counter += 1
        input_id = f"in-{self.counter}"
        body = {"inputId": input_id, "target": target, "content": {"text": f"插话 {input_id}"}, "ack": "memory"}
        results: list[tuple[int | None, Any, int]] = []

        async def submit() -> None:
            results.append(await self._send(world, driver, phone, "POST", f"{base}/inputs", body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit)
            nursery.start_soon(submit)
        accepted = [result for result in results if result[0] == 202]
        if len(accepted) == 2 and accepted[0][1] != accepted[1][1]:
            self._violate(f"duplicate submissions of {input_id} got different receipts: {accepted[0][1]} / "
                          f"{accepted[1][1]}", (accepted[0][2], accepted[1][2]), session.session_id)
        for status, _document, sequence in results:
            if status is not None and status not in ok_statuses and status not in transient_statuses:
                self._violate(f"input {input_id} answered {status}", (sequence,), session.session_id)
        if accepted:
            receipt = accepted[0][1]["receipt"]
            self.inputs.append(_Input(session.session_id, input_id, target, receipt, accepted[0][2]))
            if world.random.random() < 0.3:
                changed = {**body, "content": {"text": "改过的内容"}}
                status, document, sequence = await self._send(world, driver, phone, "POST", f"{base}/inputs", changed)
                code = (document or {}).get("detail", {}).get("domainCode") if isinstance(document, dict) else None
                if status is not None and status < 500 and status != 503 and code != "input_conflict" \
                        and status not in (404, 410):
                    self._violate(f"a conflicting {input_id} answered {status} {code}", (sequence,), session.session_id)

    async def checkpoint_and_restore(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> None:
        base = f"/api/sessions/{session.session_id}/checkpoints"
        if session.checkpoint_id is None or world.random.random() < 0.5:
            status, document, _ = await self._send(world, driver, phone, "POST", base, {"name": "sim"})
            if status == 201 and isinstance(document, dict):
                session.checkpoint_id = document.get("checkpointId")
            return
        await self._send(world, driver, phone, "POST", f"{base}/{session.checkpoint_id}/restore", {})

    async def close_and_resume(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> None:
        if world.random.random() < 0.5:
            await self._send(world, driver, phone, "DELETE", f"/api/sessions/{session.session_id}")
        await self.resume(world, driver, phone, session)

    async def resume(self, world: World, driver: AsgiDriver, phone: _Phone, session: _Session) -> None:
        await self._send(world, driver, phone, "POST", "/api/sessions", {"resume": {"sessionId": session.session_id}})

    async def status_of_one(self, world: World, driver: AsgiDriver, phone: _Phone) -> None:
        mine = [item for item in self.inputs if self.sessions[item.session_id].phone == phone.index]
        if mine:
            await self._status(world, driver, mine[world.random.randrange(0, len(mine))], final=False)

    async def _status(self, world: World, driver: AsgiDriver, item: _Input, *, final: bool) -> None:
        phone = self.phones[self.sessions[item.session_id].phone]
        path = (f"/api/sessions/{item.session_id}/inputs/{item.input_id}"
                f"?historyEpoch={item.target['historyEpoch']}&turnId={item.target['turnId']}")
        status, document, sequence = await self._send(world, driver, phone, "GET", path)
        if status == 200:
            receipt = document["receipt"]
            if receipt["revision"] < item.receipt["revision"]:
                self._violate(f"receipt of {item.input_id} went back to revision {receipt['revision']}",
                              (item.sequence, sequence), item.session_id)
            if final and receipt["state"] not in ("consumed", "closed", "cancelled"):
                self._violate(f"input {item.input_id} is still {receipt['state']} after its turn ended",
                              (item.sequence, sequence), item.session_id)
            if receipt["state"] in ("closed", "cancelled") and not receipt.get("reason"):
                self._violate(f"input {item.input_id} was {receipt['state']} without a reason",
                              (item.sequence, sequence), item.session_id)
        elif status is not None and final:
            code = (document or {}).get("detail", {}).get("domainCode") if isinstance(document, dict) else None
            if code not in ("input_target_stale", "input_not_found"):
                self._violate(f"status of {item.input_id} answered {status} {code}", (item.sequence, sequence),
                              item.session_id)

    # ------------------------------------------------------------------ checkers
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world)
        pending, self._pending = self._pending, []
        return pending

    async def at_quiescence(self, world: World) -> list[Violation]:
        driver = world.apps.get("sessions")
        if world.engine is not None and driver is not None and self.tokens_generation \
                and await self._ensure_tokens(world):
            await self._wait_for_turns(world, driver)
            for item in self.inputs:
                await self._status(world, driver, item, final=True)
        if world.engine is not None:
            await self._check_storage(world)
        pending, self._pending = self._pending, []
        return pending

    async def _wait_for_turns(self, world: World, driver: AsgiDriver) -> None:
        waited = 0.0
        while waited < quiescence_wait_seconds_max:
            running = False
            for session in self.sessions.values():
                status, document, _ = await self._send(world, driver, self.phones[session.phone], "GET",
                                                       f"/api/sessions/{session.session_id}")
                running = running or (status == 200 and document.get("status") == "running")
            if not running:
                return
            await trio.sleep(quiescence_poll_seconds)
            waited += quiescence_poll_seconds

    async def _check_storage(self, world: World) -> None:
        try:
            stored = await world.engine.read(_read_inputs)
        except StorageError as error:
            self._violate(f"input receipts unreadable: {type(error).__name__}")
            return
        for session_id, input_ids in stored.carried.items():
            seen: set[str] = set()
            for input_id in input_ids:
                if input_id in seen:
                    self._violate(f"input {input_id} was consumed twice in {session_id}", (), session_id)
                seen.add(input_id)
        for (session_id, input_id), state in stored.states.items():
            carried = input_id in stored.carried.get(session_id, ())
            if state == "consumed" and not carried:
                self._violate(f"input {input_id} reads consumed but is not in the stored history", (), session_id)
            if state in ("closed", "cancelled") and carried:
                self._violate(f"input {input_id} reads {state} but is in the stored history", (), session_id)
        for item in self.inputs:
            if (item.session_id, item.input_id) in stored.states or stored.pruned(item):
                continue
            self._violate(f"acknowledged receipt of {item.input_id} was lost", (item.sequence,), item.session_id)


@dataclass
class _Stored:
    """What storage holds of the inputs: receipts' states, each session's history epoch
    generation, the input ids its history carries, and the newest turn its history has."""

    states: dict[tuple[str, str], str]
    generations: dict[str, int]
    carried: dict[str, list[str]]
    newest_turns: dict[str, str]

    def pruned(self, item: _Input) -> bool:
        """Retention (the current and the last turn, within the current history epoch) may have
        dropped the receipt: a restore moved the epoch, or a later turn settled.  Every settled
        turn commits its user message (with its ``turnId``) in the settling write, and the
        simulator's ids grow with time, so a stored turn id above the input's is the later turn."""
        epoch = f"h{self.generations.get(item.session_id, 1)}"
        if epoch != item.target["historyEpoch"]:
            return True
        return self.newest_turns.get(item.session_id, "") > item.target["turnId"]


def _read_inputs(connection: Any) -> _Stored:
    states = {(session_id, input_id): state for session_id, input_id, state in
              connection.execute("SELECT session_id, input_id, state FROM agent_session_inputs")}
    generations = {session_id: int(generation) for session_id, generation in
                   connection.execute("SELECT session_id, generation FROM agent_session_input_epochs")}
    carried: dict[str, list[str]] = {}
    newest_turns: dict[str, str] = {}
    for session_id, text in connection.execute(
            "SELECT session_id, message_json FROM agent_session_messages ORDER BY session_id, position"):
        message = json.loads(text)
        turn_id = message.get("turnId")
        if isinstance(turn_id, str) and turn_id > newest_turns.get(session_id, ""):
            newest_turns[session_id] = turn_id
        input_id = message.get("inputId")
        if input_id is not None and message.get("role") == "user":
            carried.setdefault(session_id, []).append(input_id)
    return _Stored(states, generations, carried, newest_turns)


register_workload("sessions-api", SessionsApiWorkload, in_default=False)
