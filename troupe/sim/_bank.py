"""The reference workload: bank accounts with idempotency keys, and transfers on reminders.

It exists to exercise the runtime and storage the way the surfaces will: every account is an
event-sourced actor (journal records plus a snapshot every few records), every operation
carries a client idempotency key, and a transfer is a second actor that persists its intent,
then completes on a durable reminder by asking two accounts, retrying across crashes.

Invariants (checked after every restart and at the end):
- no acknowledged write lost: every acknowledged operation is in its account's journal with
  the same result;
- no effect applied twice: an idempotency key appears at most once per journal, and a retried
  operation returns the result the first acknowledgement gave;
- the actor's recovery agrees with an independent model: balances and results re-derived from
  the raw journal rows by the checker's own code (``derive_account``, which never calls
  ``apply_record`` or ``replay``) equal what snapshot-plus-replay recovers (snapshots keep the
  journal whole so that the raw rows stay there to re-derive from);
- every client operation (and every transfer's withdrawal and deposit) is recorded in a
  ``History`` and each account's history must be linearizable against ``AccountModel``;
- at quiescence every acknowledged transfer has finished, and a finished transfer moved the
  money both out and in.

``planted_bugs``: ``ack_before_commit`` makes deposits reply before their journal record is
committed (flushed later by a timer), which a crash in between turns into a lost write: the
simulator's own tests use it to prove that sweeps find, shrink and replay such bugs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from troupe.runtime import Actor, ActorError, ActorKind, Overloaded, PoisonMessage, Unavailable
from troupe.storage import (
    StorageError,
    cbor_decode,
    journal_append,
    journal_load,
    journal_snapshot,
    reminder_set,
    state_get,
    state_put,
)

from ._history import Attempt, History, check_linearizable
from ._trace_queries import PoisonedReminders
from ._violation import Violation
from ._workload import World, register_workload

accounts_count = 6
snapshot_every_records = 16
ask_timeout_seconds = 10.0
client_pause_seconds_max = 0.05
transfer_retry_seconds = 1.0
amount_max = 100
idle_seconds = 2.0
"""Short, so idle passivation happens between a client's requests, not only at shutdown."""


@dataclass(frozen=True)
class Deposit:
    idempotency_key: str
    amount: int

    @property
    def trace_id(self) -> str:
        return self.idempotency_key


@dataclass(frozen=True)
class Withdraw:
    idempotency_key: str
    amount: int

    @property
    def trace_id(self) -> str:
        return self.idempotency_key


@dataclass(frozen=True)
class Balance:
    pass


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class StartTransfer:
    transfer_id: str
    source: str
    destination: str
    amount: int

    @property
    def trace_id(self) -> str:
        return self.transfer_id


def empty_account() -> dict[str, Any]:
    return {"balance": 0, "applied": {}}


def apply_record(state: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """Pure and idempotent by key: applying a record twice is applying it once."""
    if record["key"] in state["applied"]:
        return state
    balance = state["balance"]
    if record["ok"]:
        balance += record["amount"] if record["op"] == "deposit" else -record["amount"]
    applied = dict(state["applied"])
    applied[record["key"]] = [record["ok"], balance]
    return {"balance": balance, "applied": applied}


def replay(snapshot: Any, records: list[tuple[int, Any]]) -> dict[str, Any]:
    state = snapshot if snapshot is not None else empty_account()
    for _, record in records:
        state = apply_record(state, record)
    return state


def derive_account(rows: list[tuple[int, bytes]]) -> tuple[int, dict[str, tuple[bool, int]]]:
    """The checker's own reading of an account's raw journal rows, written apart from the
    actor's ``apply_record``: the balance, and per idempotency key the (ok, balance) its
    first record left.  A key recorded again changes nothing (the duplicate check reports it)."""
    balance = 0
    results: dict[str, tuple[bool, int]] = {}
    for _, payload in sorted(rows):
        record = cbor_decode(payload)
        if record["key"] in results:
            continue
        if record["ok"] and record["op"] == "deposit":
            balance += record["amount"]
        elif record["ok"]:
            balance -= record["amount"]
        results[record["key"]] = (bool(record["ok"]), balance)
    return balance, results


class AccountModel:
    """The sequential specification of one account, for the history checker."""

    initial = 0
    read_only = frozenset({"balance"})

    def step(self, balance: int, name: str, amount: Any) -> tuple[int, Any]:
        if name == "deposit":
            return balance + amount, {"ok": True, "balance": balance + amount}
        if name == "withdraw":
            if balance >= amount:
                return balance - amount, {"ok": True, "balance": balance - amount}
            return balance, {"ok": False, "balance": balance}
        return balance, balance


def outcome_of(error: BaseException) -> str:
    """Refused before it was queued: certainly not applied.  Anything else: maybe applied."""
    return "fail" if isinstance(error, (Overloaded, Unavailable)) else "unknown"


class Account(Actor):
    async def on_activate(self) -> None:
        key = self.context.key
        loaded = await self.context.storage.read(lambda connection: journal_load(connection, "account", key))
        self.state = replay(loaded.snapshot, loaded.records)
        self.unflushed: list[dict[str, Any]] = []

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Balance):
            return self.state["balance"]
        if isinstance(message, Flush):
            await self._commit(self.unflushed)
            self.unflushed = []
            return None
        previous = self.state["applied"].get(message.idempotency_key)
        if previous is not None:
            return {"ok": previous[0], "balance": previous[1]}
        operation = "deposit" if isinstance(message, Deposit) else "withdraw"
        ok = operation == "deposit" or self.state["balance"] >= message.amount
        record = {"key": message.idempotency_key, "op": operation, "amount": message.amount, "ok": ok}
        if operation == "deposit" and "ack_before_commit" in self.context.env.planted_bugs:
            # THE PLANTED BUG: acknowledge now, commit later.
            self.unflushed.append(record)
            self.context.start_timer("flush", 0.5, Flush())
        else:
            await self._commit([record])
        self.state = apply_record(self.state, record)
        return {"ok": ok, "balance": self.state["balance"]}

    async def _commit(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        key = self.context.key
        state_after = self.state
        for record in records:
            state_after = apply_record(state_after, record)

        def write(connection) -> None:
            last = journal_append(connection, "account", key, records)
            if last % snapshot_every_records < len(records):
                journal_snapshot(connection, "account", key, last, state_after, prune=False)

        await self.context.storage.write(write)


class Transfer(Actor):
    def __init__(self, context: Any, history: History | None = None) -> None:
        super().__init__(context)
        self.history = history

    async def _ask_account(self, account: str, message: Any) -> Any:
        """Ask an account, recording the operation in the workload's history (the transfer is
        that account's client)."""
        attempt = None
        if self.history is not None:
            name = "deposit" if isinstance(message, Deposit) else "withdraw"
            attempt = self.history.invoke("transfer", account, name, message.amount, message.idempotency_key)
        try:
            result = await self.context.ref("account", account).ask(message, timeout=ask_timeout_seconds)
        except (ActorError, StorageError) as error:
            if attempt is not None:
                self.history.complete(attempt, outcome_of(error))
            raise
        if attempt is not None:
            self.history.complete(attempt, "ok", result)
        return result

    async def on_activate(self) -> None:
        key = self.context.key
        self.state = await self.context.storage.read(lambda connection: state_get(connection, "transfer", key))

    async def receive(self, message: StartTransfer) -> Any:
        if self.state is not None:
            return {"status": self.state["status"]}
        state = {
            "source": message.source,
            "destination": message.destination,
            "amount": message.amount,
            "status": "pending",
        }
        key = self.context.key
        due = self.context.env.clock.wall()

        def write(connection) -> None:
            state_put(connection, "transfer", key, state)
            reminder_set(connection, "transfer", key, "run", due, None)

        await self.context.storage.write(write)
        self.context.reminder_armed("run", due)
        self.state = state
        return {"status": "pending"}

    async def on_reminder(self, name: str, payload: Any) -> None:
        if self.state is None or self.state["status"] != "pending":
            return
        key = self.context.key
        amount = self.state["amount"]
        try:
            taken = await self._ask_account(self.state["source"], Withdraw(f"{key}:out", amount))
            status = "refused"
            if taken["ok"]:
                await self._ask_account(self.state["destination"], Deposit(f"{key}:in", amount))
                status = "done"
        except PoisonMessage:
            # The runtime quarantined a step as poison: retrying is refused until the process
            # restarts, so the transfer waits for an operator, durably and visibly.
            status = "quarantined"
        except (ActorError, StorageError):
            # Not this transfer's fault: try again later (every step is idempotent).
            await self.context.set_reminder("run", self.context.env.clock.wall() + transfer_retry_seconds)
            return
        state = dict(self.state, status=status)
        await self.context.storage.write(lambda connection: state_put(connection, "transfer", key, state))
        self.state = state


class BankWorkload:
    """Clients deposit, withdraw, transfer and retry; the checker holds them to their acks."""

    name = "bank"

    def __init__(self) -> None:
        self.accounts = [f"acct-{index}" for index in range(accounts_count)]
        self.issued: list[tuple[str, str, Any]] = []  # (kind, key, message) of every request
        self.acknowledged: dict[str, tuple[str, str, Any]] = {}  # idempotency key -> (kind, key, result)
        self.violations: list[str] = []
        self.counter = 0
        self.quarantined_transfers = 0
        """Transfers left for an operator because the runtime refused a step as poison."""
        self.history: History | None = None
        self.undecided_keys = 0

    def actor_kinds(self, world: World) -> list[ActorKind]:
        self._bind(world)
        return [
            ActorKind("account", Account, idle_seconds=idle_seconds),
            ActorKind("transfer", partial(Transfer, history=self.history), idle_seconds=idle_seconds),
        ]

    def _bind(self, world: World) -> None:
        if self.history is None:
            self.history = History(world.tracer)

    def migrations(self) -> list[Any]:
        return []

    async def client_step(self, world: World, client: int) -> None:
        self._bind(world)
        random = world.random
        draw = random.random()
        self.counter += 1
        if draw < 0.1 and self.issued:
            kind, key, message = self.issued[random.randrange(0, len(self.issued))]
        else:
            idempotency_key = f"c{client}-{self.counter}"
            amount = random.randrange(1, amount_max + 1)
            account = self.accounts[random.randrange(0, len(self.accounts))]
            kind = "account"
            key = account
            if draw < 0.5:
                message = Deposit(idempotency_key, amount)
            elif draw < 0.8:
                message = Withdraw(idempotency_key, amount)
            elif draw < 0.9:
                kind = "transfer"
                key = f"t-{idempotency_key}"
                other = self.accounts[random.randrange(0, len(self.accounts))]
                message = StartTransfer(key, account, other, amount)
            else:
                message = Balance()
            if not isinstance(message, Balance):
                self.issued.append((kind, key, message))
        attempt = self._invoke(client, kind, key, message)
        try:
            result = await world.system.ref(kind, key).ask(message, timeout=ask_timeout_seconds)
        except (ActorError, StorageError) as error:
            result = None
            if attempt is not None:
                self.history.complete(attempt, outcome_of(error))
        else:
            if attempt is not None:
                self.history.complete(attempt, "ok", result)
        if result is not None and not isinstance(message, Balance):
            self._acknowledge(kind, key, message, result)
        await trio.sleep(random.random() * client_pause_seconds_max)

    def _invoke(self, client: int, kind: str, key: str, message: Any) -> Attempt | None:
        """Record an account operation in the history (transfers are recorded by the transfer
        actor, as the client of the two accounts it moves money between)."""
        if kind != "account":
            return None
        if isinstance(message, Balance):
            return self.history.invoke(client, key, "balance")
        name = "deposit" if isinstance(message, Deposit) else "withdraw"
        return self.history.invoke(client, key, name, message.amount, message.idempotency_key)

    def _acknowledge(self, kind: str, key: str, message: Any, result: Any) -> None:
        identity = message.transfer_id if kind == "transfer" else message.idempotency_key
        earlier = self.acknowledged.get(identity)
        if earlier is None:
            self.acknowledged[identity] = (kind, key, result)
        elif kind == "account" and earlier[2] != result:
            self.violations.append(
                f"dedupe broken: {identity} first acknowledged {earlier[2]}, retry returned {result}"
            )

    async def _durable_state(self, world: World) -> tuple[dict[str, tuple[dict[str, Any], list[str], Any]], dict[str, Any]]:
        """What storage holds now, in one read: per account the state the actor's own recovery
        (snapshot plus replay) gives, the idempotency keys of its raw journal rows, and the
        checker's independent derivation from those rows; per acknowledged transfer its stored
        state (None if lost)."""
        transfer_keys = sorted(key for kind, key, _ in self.acknowledged.values() if kind == "transfer")

        def load(connection):
            journals = {}
            for account in self.accounts:
                rows = list(connection.execute(
                    "SELECT seq, payload FROM journal WHERE kind = 'account' AND key = ? ORDER BY seq", (account,)
                ))
                journals[account] = (journal_load(connection, "account", account), rows)
            transfers = {key: state_get(connection, "transfer", key) for key in transfer_keys}
            return journals, transfers

        journals, transfers = await world.engine.read(load)
        recovered = {}
        for account, (journal, rows) in journals.items():
            keys = [cbor_decode(payload)["key"] for _, payload in rows]
            recovered[account] = (replay(journal.snapshot, journal.records), keys, derive_account(rows))
        return recovered, transfers

    def _recovery_violations(self, recovered, transfers) -> list[Any]:
        violations: list[Any] = self.violations
        self.violations = []
        for account, (state, keys, (balance, results)) in recovered.items():
            if len(keys) != len(set(keys)):
                violations.append(f"effect applied twice: duplicate idempotency key in {account}'s journal")
            recovered_results = {key: tuple(value) for key, value in state["applied"].items()}
            if state["balance"] != balance or recovered_results != results:
                violations.append(
                    f"recovery differs from the journal: {account} recovers balance {state['balance']}, "
                    f"its journal rows give {balance}"
                )
        for identity, (kind, key, result) in sorted(self.acknowledged.items()):
            if kind != "account":
                continue
            stored = recovered[key][2][1].get(identity)
            if stored is None:
                violations.append(self._about(identity, f"acknowledged write lost: {identity} on {key} ({result})", key))
            elif stored != (result["ok"], result["balance"]):
                violations.append(self._about(identity, f"acknowledged result changed: {identity} on {key}: {result} vs {list(stored)}", key))
        for key, state in transfers.items():
            if state is None:
                violations.append(self._about_transfer(key, f"acknowledged transfer lost: {key}"))
        self._resolve(recovered)
        return violations

    def _about(self, identity: str, text: str, account: str) -> Violation:
        """A violation naming the trace records of the client operation ``identity``."""
        operation = self.history.get(identity) if self.history is not None else None
        sequences = operation.sequences if operation is not None else ()
        return Violation(text, sequences, (("account", account),), "bank")

    def _about_transfer(self, key: str, text: str) -> Violation:
        """A violation naming the trace records of the transfer's two steps (the transfer
        actor is their client)."""
        sequences: tuple[int, ...] = ()
        for step in (f"{key}:out", f"{key}:in"):
            operation = self.history.get(step) if self.history is not None else None
            if operation is not None:
                sequences += tuple(operation.sequences)
        return Violation(text, sequences, (("transfer", key),), "bank")

    def _resolve(self, recovered) -> None:
        """Settle operations whose outcome was unknown by what the journal rows say now."""
        if self.history is None:
            return
        for operation in self.history.unsettled():
            if operation.name == "balance":
                continue
            stored = recovered[operation.key][2][1].get(operation.identity)
            value = {"ok": stored[0], "balance": stored[1]} if stored is not None else None
            self.history.resolve(operation, stored is not None, value)

    async def after_restart(self, world: World) -> list[Any]:
        self._bind(world)
        return self._recovery_violations(*await self._durable_state(world))

    async def at_quiescence(self, world: World) -> list[Any]:
        self._bind(world)
        recovered, transfers = await self._durable_state(world)
        violations = self._recovery_violations(recovered, transfers)
        poisoned = PoisonedReminders(world.tracer).of_kind("transfer")  # asked once, at the end
        for key, state in transfers.items():
            if state is None:
                continue
            if state["status"] == "pending" and (key, "run") in poisoned:
                # The runtime dropped the transfer's reminder as poison: it waits for an operator.
                self.quarantined_transfers += 1
                continue
            out = recovered[state["source"]][2][1].get(f"{key}:out")
            arrived = recovered[state["destination"]][2][1].get(f"{key}:in")
            if state["status"] == "pending":
                violations.append(self._about_transfer(key, f"transfer never finished: {key}"))
            elif state["status"] == "quarantined":
                self.quarantined_transfers += 1
            elif state["status"] == "done" and not (out and out[0] and arrived):
                violations.append(self._about_transfer(key, f"transfer {key} done but money not moved out and in"))
            elif state["status"] == "refused" and (arrived or (out and out[0])):
                violations.append(self._about_transfer(key, f"transfer {key} refused but money moved"))
        for account in self.accounts:
            attempt = self.history.invoke("checker", account, "balance")
            try:
                balance = await world.system.ref("account", account).ask(Balance(), timeout=ask_timeout_seconds)
            except ActorError:
                # Reads carry no identity, so two injected crashes of any two reads quarantine
                # every read of this account until the process restarts: nothing to compare.
                self.history.complete(attempt, "fail")
                continue
            self.history.complete(attempt, "ok", balance)
            if balance != recovered[account][2][0]:
                violations.append(f"{account}: actor balance {balance} differs from its journal")
        violations += check_linearizable(self.history, AccountModel(), checker="bank", kind="account")
        self.undecided_keys = len(self.history.undecided_keys)
        return violations


register_workload("bank", BankWorkload)
