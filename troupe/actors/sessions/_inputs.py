"""Strict inputs with receipts: text posted *into the running turn*, acknowledged with a receipt.

The tansr SDK's strict input path (``input_capabilities`` / ``submit_input`` / ``input_status``)
differs from ``POST …/messages`` in three ways, and each shaped this module:

- **A target.**  An input names the turn it is meant for (``{historyEpoch, turnId}``, read from
  the input capabilities while that turn runs).  An input for a turn that already ended is
  *late* and refused (``input_target_closed``), never queued for a later turn; one whose history
  epoch is not the session's current one (a checkpoint restore replaced the history since) is
  refused as stale (``input_target_stale``), and so is a status query for it.
- **Idempotency by ``inputId``.**  Concurrent duplicates (same id, same content, same target,
  same durability) get byte-identical receipts: the actor handles one message at a time, and the
  first one stores the receipt before it replies, so the second finds it.  The same id with
  anything else is ``input_conflict`` and changes nothing.  A duplicate after the turn ended
  gets the receipt as it is now (``consumed``), unchanged.
- **Consumption.**  An accepted input waits in the turn's ``TurnInbox``; the kernel takes what
  is waiting at its next model step (and runs one more step when inputs arrived after its last
  answer), so the input's text joins the conversation and the turn's history exactly once.  At
  the turn's end the actor settles every receipt of the turn in the same storage write as the
  turn itself: ``consumed`` when the turn's committed messages carry it, else ``closed`` with
  the turn's end reason (``server_draining`` when an eviction or a drain passivated the actor
  mid-turn: the turn still ends and commits, see ``_kernel``).  A crash mid-turn loses the turn;
  its ``accepted`` receipts are found at the next load and become ``cancelled`` (``turn_lost``).

Durability: every accepted receipt is written to storage before the reply, whatever the client
asked for, so an acknowledged receipt survives a crash.  ``durability`` echoes the request
(``memory`` unless it said ``durable``); ``durable`` is only accepted where the deployment
turned ``durableAck`` on (``SessionSettings.input_durable_ack``), otherwise it is refused
(``capability_disabled``) and never silently downgraded.

Receipts kept: the current and the last turn's (the SDK's ``receiptRetention``
``current-and-last-turn``): settling a turn deletes the receipts of older turns, a restore
deletes the old epoch's, so a session keeps at most ``input_receipts_kept_max``.

Refusal details name their cause in ``cause`` (``late``, ``durable_ack_unavailable``): the
unified envelope reserves ``detail.reason`` for a closed set of its own.

The history epoch is ``h<generation>``; the generation lives in its own table (absent = 1) and
a checkpoint restore increments it in the restore's own transaction.
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import apsw

from troupe.storage import Migration

from ._protocol import SessionRefused, SessionRequest

inputs_per_turn_max = 32
"""Inputs one turn accepts (distinct ids); one more is ``input_limit_exceeded``."""

input_text_characters_max = 262_144
"""The text of one input (``content.text``, or the text blocks joined); the SDK's own bound."""

input_blocks_max = 64
"""Text blocks in one input's ``content.blocks``."""

input_id_characters_max = 128
"""``inputId``, ``historyEpoch`` and ``turnId`` are at most this long (the SDK's bound)."""

input_receipts_kept_max = 2 * inputs_per_turn_max
"""Receipts kept per session: the current and the last turn's."""

input_capabilities_version = 1

assert input_receipts_kept_max >= 2 * inputs_per_turn_max

InputState = Literal["accepted", "consumed", "closed", "cancelled"]
Durability = Literal["memory", "durable"]
input_states: tuple[str, ...] = ("reserved", "accepted", "consumed", "closed", "cancelled")
durabilities: tuple[str, ...] = ("memory", "durable")

reason_turn_lost = "turn_lost"
"""A crash took the turn before it ended: its accepted inputs were never consumed."""

inputs_component = "sessions_inputs"

inputs_tables_sql = """
    CREATE TABLE agent_session_input_epochs (
        session_id TEXT PRIMARY KEY,
        generation INTEGER NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE agent_session_inputs (
        session_id TEXT NOT NULL,
        input_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        history_epoch TEXT NOT NULL,
        ordinal INTEGER NOT NULL,
        revision INTEGER NOT NULL,
        state TEXT NOT NULL,
        durability TEXT NOT NULL,
        digest TEXT NOT NULL,
        reason TEXT,
        PRIMARY KEY (session_id, input_id)
    ) WITHOUT ROWID;
"""

inputs_migrations: tuple[Migration, ...] = (
    Migration(component=inputs_component, number=1, name="agent_session_inputs", sql=inputs_tables_sql),
)
"""Appended to ``sessions_migrations`` (its own component, so its numbering is its own)."""


def history_epoch_of(generation: int) -> str:
    return f"h{generation}"


# ---------------------------------------------------------------------------------------------
# Requests (HTTP layer → ("session", id))
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputTarget:
    history_epoch: str
    turn_id: str

    def encode(self) -> dict[str, str]:
        return {"historyEpoch": self.history_epoch, "turnId": self.turn_id}


@dataclass(frozen=True, kw_only=True)
class ReadInputCapabilities(SessionRequest):
    """``GET /api/sessions/:id/input-capabilities`` → ``InputCapabilities``."""


@dataclass(frozen=True, kw_only=True)
class SubmitInput(SessionRequest):
    """``POST /api/sessions/:id/inputs``; the HTTP layer checked the shapes and the bounds
    (``text`` is the content's text, ``blocks`` True when it came as text blocks)."""

    input_id: str
    target: InputTarget
    text: str
    blocks: bool = False
    durability: Durability = "memory"

    def digest(self) -> str:
        """What makes two submissions "the same input": content form, text, target, durability."""
        canonical = json.dumps(
            [self.target.history_epoch, self.target.turn_id, "blocks" if self.blocks else "text",
             self.text, self.durability],
            ensure_ascii=False, separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ReadInputStatus(SessionRequest):
    """``GET /api/sessions/:id/inputs/:inputId?historyEpoch=&turnId=``."""

    input_id: str
    target: InputTarget


# ---------------------------------------------------------------------------------------------
# Replies
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputReceipt:
    session_id: str
    input_id: str
    turn_id: str
    history_epoch: str
    ordinal: int
    revision: int
    state: str
    durability: str
    digest: str = field(repr=False, default="")
    reason: str | None = None

    def encode(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "sessionId": self.session_id,
            "inputId": self.input_id,
            "historyEpoch": self.history_epoch,
            "turnId": self.turn_id,
            "source": "strict",
            "state": self.state,
            "durability": self.durability,
            "ordinal": self.ordinal,
            "revision": self.revision,
        }
        if self.reason is not None:
            body["reason"] = self.reason
        return body


@dataclass(frozen=True)
class InputAccepted:
    """202 ``{outcome: "accepted", receipt}`` (also for a duplicate, whatever its state now)."""

    receipt: InputReceipt

    def encode(self) -> dict[str, Any]:
        return {"outcome": "accepted", "receipt": self.receipt.encode()}


@dataclass(frozen=True)
class InputStatus:
    receipt: InputReceipt

    def encode(self) -> dict[str, Any]:
        return {"receipt": self.receipt.encode()}


@dataclass(frozen=True)
class InputCapabilities:
    history_epoch: str
    target: InputTarget | None
    durable_ack: bool

    def encode(self) -> dict[str, Any]:
        return {
            "version": input_capabilities_version,
            "text": True,
            "textBlocks": True,
            "image": False,
            "memoryAck": True,
            "durableAck": self.durable_ack,
            "receiptRetention": "current-and-last-turn",
            "historyEpoch": self.history_epoch,
            "target": None if self.target is None else self.target.encode(),
            "limits": {
                "inputsPerTurn": inputs_per_turn_max,
                "textCharacters": input_text_characters_max,
                "blocks": input_blocks_max,
                "idCharacters": input_id_characters_max,
            },
        }


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------

_receipt_columns = "input_id, turn_id, history_epoch, ordinal, revision, state, durability, digest, reason"


def read_generation(connection: apsw.Connection, session_id: str) -> int:
    for (generation,) in connection.execute(
        "SELECT generation FROM agent_session_input_epochs WHERE session_id = ?", (session_id,)
    ):
        return int(generation)
    return 1


def advance_history_epoch(connection: apsw.Connection, session_id: str) -> int:
    """A restore replaced the history: a new generation, the old epoch's receipts dropped."""
    generation = read_generation(connection, session_id) + 1
    connection.execute(
        "INSERT INTO agent_session_input_epochs (session_id, generation) VALUES (?, ?) "
        "ON CONFLICT (session_id) DO UPDATE SET generation = excluded.generation",
        (session_id, generation),
    )
    connection.execute("DELETE FROM agent_session_inputs WHERE session_id = ?", (session_id,))
    return generation


def load_receipts(connection: apsw.Connection, session_id: str) -> tuple[int, list[InputReceipt]]:
    """The generation and the kept receipts; ``accepted`` ones are orphans of a lost turn (no
    turn runs when a book loads) and are settled ``cancelled`` here, in the caller's write."""
    generation = read_generation(connection, session_id)
    receipts = [
        _decode(session_id, found)
        for found in connection.execute(
            f"SELECT {_receipt_columns} FROM agent_session_inputs WHERE session_id = ? ORDER BY turn_id, ordinal",
            (session_id,),
        )
    ]
    settled = []
    for receipt in receipts:
        if receipt.state == "accepted":
            receipt = replace(receipt, state="cancelled", revision=receipt.revision + 1, reason=reason_turn_lost)
            _update(connection, receipt)
        settled.append(receipt)
    return generation, settled


def insert_receipt(connection: apsw.Connection, receipt: InputReceipt) -> None:
    connection.execute(
        f"INSERT INTO agent_session_inputs (session_id, {_receipt_columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (receipt.session_id, receipt.input_id, receipt.turn_id, receipt.history_epoch, receipt.ordinal,
         receipt.revision, receipt.state, receipt.durability, receipt.digest, receipt.reason),
    )


def settle_receipts(connection: apsw.Connection, session_id: str, turn_id: str,
                    settled: Sequence[InputReceipt]) -> None:
    """Write the turn's settled receipts and keep only that turn's (it becomes the last turn)."""
    for receipt in settled:
        _update(connection, receipt)
    connection.execute("DELETE FROM agent_session_inputs WHERE session_id = ? AND turn_id != ?", (session_id, turn_id))


def _update(connection: apsw.Connection, receipt: InputReceipt) -> None:
    connection.execute(
        "UPDATE agent_session_inputs SET state = ?, revision = ?, reason = ? WHERE session_id = ? AND input_id = ?",
        (receipt.state, receipt.revision, receipt.reason, receipt.session_id, receipt.input_id),
    )


def _decode(session_id: str, found: Sequence[Any]) -> InputReceipt:
    input_id, turn_id, history_epoch, ordinal, revision, state, durability, digest, reason = found
    return InputReceipt(session_id=session_id, input_id=input_id, turn_id=turn_id, history_epoch=history_epoch,
                        ordinal=int(ordinal), revision=int(revision), state=state, durability=durability,
                        digest=digest, reason=reason)


# ---------------------------------------------------------------------------------------------
# The running turn's inbox (what the kernel sees) and the session's book
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TakenInput:
    input_id: str
    text: str


class TurnInbox:
    """Accepted inputs of the running turn waiting for the kernel's next step.

    Synchronous on purpose (like ``publish``): the kernel's "take, and close when nothing is
    waiting" and its ``turn.completed`` happen without an await between them, so no input can be
    accepted into a turn that has already decided to end.
    """

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.pending: deque[TakenInput] = deque()
        self.taken: list[str] = []
        self.accepted = 0
        self.closed = False

    def take(self, *, close_if_empty: bool = False) -> list[TakenInput]:
        """Everything waiting, in acceptance order; ``close_if_empty`` ends admission when there
        is nothing (the kernel is about to end the turn)."""
        taken = list(self.pending)
        self.pending.clear()
        self.taken.extend(item.input_id for item in taken)
        if not taken and close_if_empty:
            self.closed = True
        return taken

    def close(self) -> None:
        self.closed = True


class InputBook:
    """One session's receipts (current and last turn) and its history epoch, in memory.

    Loaded from the store at first use in an activation; every change is written before it is
    acknowledged.  The running turn's ``TurnInbox`` lives here too.
    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.loaded = False
        self.generation = 1
        self.receipts: dict[str, InputReceipt] = {}
        self.inbox: TurnInbox | None = None

    @property
    def history_epoch(self) -> str:
        return history_epoch_of(self.generation)

    def load(self, generation: int, receipts: Iterable[InputReceipt]) -> None:
        self.loaded = True
        self.generation = generation
        self.receipts = {receipt.input_id: receipt for receipt in receipts}

    def open_turn(self, turn_id: str) -> TurnInbox:
        self.inbox = TurnInbox(turn_id)
        return self.inbox

    def running_target(self) -> InputTarget | None:
        if self.inbox is None or self.inbox.closed:
            return None
        return InputTarget(self.history_epoch, self.inbox.turn_id)

    def admit(self, message: SubmitInput, *, durable_ack: bool) -> InputReceipt | SessionRefused:
        """The receipt to store and return (``revision`` 0 marks "new, store it first"), or the
        refusal; nothing changes here."""
        if message.target.history_epoch != self.history_epoch:
            return _stale(message.target, self.history_epoch)
        if message.durability == "durable" and not durable_ack:
            return SessionRefused("capability_disabled", "此部署未开启 durable 确认；不会降级为 memory",
                                  {"cause": "durable_ack_unavailable"})
        digest = message.digest()
        existing = self.receipts.get(message.input_id)
        if existing is not None:
            if existing.digest != digest:
                return SessionRefused("input_conflict", "同一 inputId 的内容、目标或确认级别不同",
                                      {"inputId": message.input_id})
            return existing
        inbox = self.inbox
        if inbox is None or inbox.closed or inbox.turn_id != message.target.turn_id:
            return SessionRefused("input_target_closed", "目标轮已结束或不是运行中的轮",
                                  {"turnId": message.target.turn_id, "cause": "late"})
        if inbox.accepted >= inputs_per_turn_max:
            return SessionRefused("input_limit_exceeded", f"本轮最多接受 {inputs_per_turn_max} 条输入",
                                  {"limit": inputs_per_turn_max})
        return InputReceipt(
            session_id=self.session_id, input_id=message.input_id, turn_id=inbox.turn_id,
            history_epoch=self.history_epoch, ordinal=inbox.accepted + 1, revision=0, state="accepted",
            durability=message.durability, digest=digest,
        )

    def accepted(self, receipt: InputReceipt, text: str) -> None:
        """The receipt was stored: it counts, and its text waits for the kernel."""
        assert self.inbox is not None and self.inbox.turn_id == receipt.turn_id
        self.receipts[receipt.input_id] = receipt
        self.inbox.accepted += 1
        self.inbox.pending.append(TakenInput(receipt.input_id, text))

    def status(self, input_id: str, target: InputTarget) -> InputReceipt | SessionRefused:
        if target.history_epoch != self.history_epoch:
            return _stale(target, self.history_epoch)
        receipt = self.receipts.get(input_id)
        if receipt is None or receipt.turn_id != target.turn_id:
            return SessionRefused("input_not_found", "没有这条输入的回执（或已超出保留范围）",
                                  {"inputId": input_id})
        return receipt

    def settlement(self, turn_id: str, messages: Sequence[Mapping[str, Any]], reason: str) -> list[InputReceipt]:
        """The turn's receipts after its end: ``consumed`` when its committed ``messages`` carry
        the input, else ``closed`` with ``reason``."""
        if self.inbox is not None and self.inbox.turn_id == turn_id:
            self.inbox.close()
        carried = {message.get("inputId") for message in messages if message.get("role") == "user"}
        settled = []
        for receipt in self.receipts.values():
            if receipt.turn_id != turn_id or receipt.state != "accepted":
                continue
            if receipt.input_id in carried:
                settled.append(replace(receipt, state="consumed", revision=receipt.revision + 1))
            else:
                settled.append(replace(receipt, state="closed", revision=receipt.revision + 1, reason=reason))
        return settled

    def settled(self, turn_id: str, settled: Sequence[InputReceipt]) -> None:
        """The settlement was written: keep the turn's receipts, drop older turns'."""
        for receipt in settled:
            self.receipts[receipt.input_id] = receipt
        self.receipts = {key: value for key, value in self.receipts.items() if value.turn_id == turn_id}
        if self.inbox is not None and self.inbox.turn_id == turn_id:
            self.inbox = None

    def restored(self, generation: int) -> None:
        self.generation = generation
        self.receipts.clear()


def _stale(target: InputTarget, current: str) -> SessionRefused:
    return SessionRefused("input_target_stale", "历史纪元已变化（快照恢复），请重新读取 input-capabilities",
                          {"historyEpoch": target.history_epoch, "currentHistoryEpoch": current})


# ---------------------------------------------------------------------------------------------
# The session actor's handlers (registered in ``SessionActor._handlers``)
# ---------------------------------------------------------------------------------------------


def book_of(actor: Any) -> InputBook:
    """The actor's book, created on first use (per activation)."""
    book = getattr(actor, "input_book", None)
    if book is None:
        book = InputBook(actor.session_id)
        actor.input_book = book
    return book


async def loaded_book(actor: Any) -> InputBook:
    book = book_of(actor)
    if not book.loaded:
        session_id = actor.session_id
        generation, receipts = await actor.context.storage.write(lambda connection: load_receipts(connection, session_id))
        book.load(generation, receipts)
    return book


async def handle_capabilities(actor: Any, message: ReadInputCapabilities) -> Any:
    book = await loaded_book(actor)
    target = book.running_target() if actor.live and not actor.closing else None
    return InputCapabilities(book.history_epoch, target, bool(getattr(actor.settings, "input_durable_ack", False)))


async def handle_submit(actor: Any, message: SubmitInput) -> Any:
    refusal = actor._require_live()
    if refusal is not None:
        return refusal
    book = await loaded_book(actor)
    decided = book.admit(message, durable_ack=bool(getattr(actor.settings, "input_durable_ack", False)))
    if isinstance(decided, SessionRefused):
        return decided
    if decided.revision > 0:
        return InputAccepted(decided)
    receipt = replace(decided, revision=1)
    await actor.context.storage.write(lambda connection: insert_receipt(connection, receipt))
    actor.context.trace("session_input_accepted", session=actor.session_id, input=receipt.input_id,
                        turn=receipt.turn_id)
    book.accepted(receipt, message.text)
    return InputAccepted(receipt)


async def handle_status(actor: Any, message: ReadInputStatus) -> Any:
    book = await loaded_book(actor)
    found = book.status(message.input_id, message.target)
    if isinstance(found, SessionRefused):
        return found
    return InputStatus(found)


input_handlers: dict[type, Any] = {
    ReadInputCapabilities: handle_capabilities,
    SubmitInput: handle_submit,
    ReadInputStatus: handle_status,
}
"""Merged into ``SessionActor._handlers``."""


__all__ = [
    "InputAccepted",
    "InputBook",
    "InputCapabilities",
    "InputReceipt",
    "InputStatus",
    "InputTarget",
    "ReadInputCapabilities",
    "ReadInputStatus",
    "SubmitInput",
    "TakenInput",
    "TurnInbox",
    "advance_history_epoch",
    "book_of",
    "history_epoch_of",
    "input_blocks_max",
    "input_capabilities_version",
    "input_handlers",
    "input_id_characters_max",
    "input_receipts_kept_max",
    "input_text_characters_max",
    "inputs_component",
    "inputs_migrations",
    "inputs_per_turn_max",
    "load_receipts",
    "settle_receipts",
]
