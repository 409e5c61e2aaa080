"""Client-operation histories and a linearizability checker (Knossos / Wing-Gong-Lowe style).

Why: "every acknowledged write is in storage" says nothing about what clients *saw*.  A runtime
that keeps a crashed actor's dirty instance, or runs two instances of one key at once, answers
reads that no sequential execution could have produced, while storage may look fine.  So every
client operation is recorded with its invocation and its completion, and each key's history is
checked against an independent sequential model of the workload: is there one order of the
operations, consistent with real time, in which the model gives every acknowledged result?

An operation may be attempted several times (a client retries the same operation id after a
timeout); its attempts are merged into one logical operation, invoked at the first attempt.
Outcomes:

- ``ok``: acknowledged with a value; it took effect exactly once, between its first invocation
  and this acknowledgement;
- ``fail``: definitely not applied (refused before it was queued); it is left out;
- ``unknown``: timed out, crashed or cut off by a process crash; it may or may not have taken
  effect, at any time after its invocation (its completion is +infinity).  A workload may later
  *resolve* it from durable state (``History.resolve``): applied with this value (completing no
  later than the resolution) or not applied.

The search is WGL's depth-first search over (linearized set, model state) with memoisation, so
each configuration is explored once; it is bounded by ``configurations_max`` per key, and a key
that hits the bound is *undecided* (counted in ``History.undecided_keys``), never a violation.
Trade-off: memoising on the model state needs states that hash cheaply; models keep digests
(a length and a chained hash) rather than whole logs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from troupe.runtime import Tracer

from ._violation import Violation

configurations_max = 200_000
"""Configurations explored per key before the checker gives up on it (undecided)."""
summary_characters_max = 60
"""Longest argument or value summary written into a trace event."""

outcomes = ("ok", "fail", "unknown")


class Model(Protocol):
    """A sequential specification of one key: ``step`` must be pure and deterministic."""

    initial: Any
    read_only: frozenset[str]
    """Operation names without effect: an unknown one is simply dropped."""

    def step(self, state: Any, name: str, argument: Any) -> tuple[Any, Any]:
        """Apply ``name(argument)`` to ``state``; return ``(new_state, result)``."""


@dataclass(eq=False)
class Attempt:
    """One send of an operation: an ``invoke`` trace event and, if it returned, its outcome."""

    operation: Operation
    client: Any
    invoke_order: int
    sequence: int
    """The trace sequence of the ``invoke`` event (0 when the tracer is disabled)."""
    outcome: str = "pending"
    value: Any = None
    complete_order: float = math.inf
    complete_sequence: int = 0


@dataclass(eq=False)
class Operation:
    """A logical client operation on one key; retries of the same id are its attempts."""

    identity: str
    key: str
    name: str
    argument: Any
    attempts: list[Attempt] = field(default_factory=list)
    resolved_value: Any = None
    resolved_order: float | None = None
    """Set by ``History.resolve(applied=True)``: it took effect, completing no later than this."""
    settled_attempts: int = 0
    """Attempts before this index were resolved as not applied."""

    @property
    def invoke_order(self) -> int:
        return self.attempts[0].invoke_order

    def first_ok(self) -> Attempt | None:
        for attempt in self.attempts:
            if attempt.outcome == "ok":
                return attempt
        return None

    @property
    def status(self) -> str:
        """``ok`` (applied, value known), ``unknown`` (maybe applied) or ``fail`` (not applied)."""
        if self.first_ok() is not None or self.resolved_order is not None:
            return "ok"
        for attempt in self.attempts[self.settled_attempts:]:
            if attempt.outcome in ("pending", "unknown"):
                return "unknown"
        return "fail"

    @property
    def value(self) -> Any:
        attempt = self.first_ok()
        return attempt.value if attempt is not None else self.resolved_value

    @property
    def complete_order(self) -> float:
        attempt = self.first_ok()
        if attempt is not None:
            return attempt.complete_order
        if self.resolved_order is not None:
            return self.resolved_order
        return math.inf

    @property
    def sequences(self) -> tuple[int, ...]:
        """Trace sequences of the first invocation and of the acknowledgement, if any."""
        numbers = [self.attempts[0].sequence]
        attempt = self.first_ok()
        if attempt is not None:
            numbers.append(attempt.complete_sequence)
        return tuple(number for number in numbers if number)


def summarize(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= summary_characters_max else text[: summary_characters_max - 3] + "..."


class History:
    """The operations clients invoked, in real-time order, per key.

    ``kind`` is the trace kind of its events (``client`` unless a workload wants its own lane).
    """

    def __init__(self, tracer: Tracer | None = None, *, kind: str = "client") -> None:
        self.tracer = tracer or Tracer(enabled=False)
        self.kind = kind
        self._order = 0
        self._operations: dict[str, Operation] = {}
        self._by_key: dict[str, list[Operation]] = {}
        self.undecided_keys: list[str] = []
        """Keys the last ``check_linearizable`` gave up on (hit ``configurations_max``)."""

    def _tick(self) -> int:
        self._order += 1
        return self._order

    def invoke(self, client: Any, key: str, name: str, argument: Any = None,
               operation_id: str | None = None) -> Attempt:
        """Record an invocation; an ``operation_id`` seen before makes this a retry of it."""
        identity = operation_id if operation_id is not None else f"op-{len(self._operations) + 1}"
        operation = self._operations.get(identity)
        if operation is None:
            operation = Operation(identity, key, name, argument)
            self._operations[identity] = operation
            self._by_key.setdefault(key, []).append(operation)
        else:
            assert (operation.key, operation.name) == (key, name), f"operation {identity} reused"
        sequence = self.tracer.record(
            "invoke", self.kind, key, op=identity, name=name, argument=summarize(argument),
            client=str(client), attempt=len(operation.attempts) + 1,
        )
        attempt = Attempt(operation, client, self._tick(), sequence)
        operation.attempts.append(attempt)
        return attempt

    def complete(self, attempt: Attempt, outcome: str, value: Any = None) -> None:
        """``ok`` with the reply, ``fail`` (certainly not applied) or ``unknown``."""
        assert outcome in outcomes, outcome
        assert attempt.outcome == "pending", "an attempt completes once"
        event = {"ok": "ack", "fail": "fail", "unknown": "unknown"}[outcome]
        attempt.complete_sequence = self.tracer.record(
            event, self.kind, attempt.operation.key, op=attempt.operation.identity,
            value=summarize(value),
        )
        attempt.outcome = outcome
        attempt.value = value
        attempt.complete_order = self._tick() if outcome != "unknown" else math.inf

    def resolve(self, operation: Operation, applied: bool, value: Any = None) -> None:
        """Settle an operation whose outcome was unknown, from durable state read *now*:
        applied (with ``value``, completing no later than now) or not applied."""
        if operation.first_ok() is not None or operation.resolved_order is not None:
            return
        if applied:
            operation.resolved_value = value
            operation.resolved_order = self._tick()
        else:
            operation.settled_attempts = len(operation.attempts)

    def get(self, identity: str) -> Operation | None:
        return self._operations.get(identity)

    def keys(self) -> list[str]:
        return sorted(self._by_key)

    def operations(self, key: str | None = None) -> list[Operation]:
        if key is not None:
            return list(self._by_key.get(key, ()))
        return list(self._operations.values())

    def unsettled(self) -> Iterable[Operation]:
        """Operations whose outcome is still unknown (candidates for ``resolve``)."""
        return [operation for operation in self._operations.values() if operation.status == "unknown"]


@dataclass(frozen=True, eq=False)
class _Entry:
    operation: Operation
    invoke: int
    complete: float
    known: bool
    """True for an acknowledged (or resolved) operation: its result must match the model."""


def check_linearizable(history: History, model: Model, *, checker: str = "linearizability",
                       configurations_max: int = configurations_max,
                       kind: str = "") -> list[Violation]:
    """Check each key's operations against ``model``; one violation per key at most.

    Keys whose search exceeded ``configurations_max`` are listed in ``history.undecided_keys``.
    ``kind`` is the actor kind the keys belong to (for ``Violation.actors``).
    """
    violations = []
    history.undecided_keys = []
    for key in history.keys():
        entries = _entries(history.operations(key), model)
        verdict = _search(entries, model, configurations_max)
        if verdict is None:
            history.undecided_keys.append(key)
        elif verdict is not True:
            violations.append(_describe(key, entries, verdict, model, checker, kind))
    return violations


def _entries(operations: list[Operation], model: Model) -> list[_Entry]:
    entries = []
    for operation in operations:
        status = operation.status
        if status == "fail" or (status == "unknown" and operation.name in model.read_only):
            continue
        entries.append(_Entry(operation, operation.invoke_order, operation.complete_order, status == "ok"))
    entries.sort(key=lambda entry: entry.invoke)
    return entries


@dataclass
class _Frame:
    mask: int
    state: Any
    via: int
    """The entry linearized last to reach this frame (-1 at the root)."""
    candidates: list[int] | None = None
    next: int = 0


@dataclass
class _Stuck:
    """The deepest configuration the search reached: what it could not get past."""

    linearized: int
    mask: int
    state: Any
    via: int


def _search(entries: list[_Entry], model: Model, limit: int) -> bool | _Stuck | None:
    """True if linearizable, None if undecided, else where the deepest attempt got stuck."""
    known = [index for index, entry in enumerate(entries) if entry.known]
    unknown = [index for index, entry in enumerate(entries) if not entry.known]
    by_deadline = sorted(known, key=lambda index: entries[index].complete)
    required = 0
    for index in known:
        required |= 1 << index
    visited = {(0, model.initial)}
    stack = [_Frame(0, model.initial, -1)]
    deepest = _Stuck(0, 0, model.initial, -1)
    while stack:
        frame = stack[-1]
        if frame.candidates is None:
            if frame.mask & required == required:
                return True
            frame.candidates = _candidates(frame.mask, entries, known, unknown, by_deadline)
            linearized = (frame.mask & required).bit_count()
            if linearized > deepest.linearized:
                deepest = _Stuck(linearized, frame.mask, frame.state, frame.via)
        if frame.next >= len(frame.candidates):
            stack.pop()
            continue
        index = frame.candidates[frame.next]
        frame.next += 1
        entry = entries[index]
        operation = entry.operation
        state, result = model.step(frame.state, operation.name, operation.argument)
        if entry.known and result != operation.value:
            continue
        configuration = (frame.mask | (1 << index), state)
        if configuration in visited:
            continue
        visited.add(configuration)
        if len(visited) > limit:
            return None
        stack.append(_Frame(configuration[0], state, index))
    return deepest


def _candidates(mask: int, entries: list[_Entry], known: list[int], unknown: list[int],
                by_deadline: list[int]) -> list[int]:
    """Entries that may be linearized next: not yet linearized and invoked before the earliest
    completion among the acknowledged ones still to place.  Acknowledged ones first, earliest
    deadline first (the usual way out); unknown ones last (they may also never take effect)."""
    deadline = math.inf
    for index in by_deadline:
        if not mask >> index & 1:
            deadline = entries[index].complete
            break
    chosen = [index for index in known if not mask >> index & 1 and entries[index].invoke < deadline]
    chosen.sort(key=lambda index: entries[index].complete)
    chosen += [index for index in unknown if not mask >> index & 1 and entries[index].invoke < deadline]
    return chosen


def _describe(key: str, entries: list[_Entry], stuck: _Stuck, model: Model, checker: str,
              kind: str) -> Violation:
    unplaced = [entry for index, entry in enumerate(entries) if entry.known and not stuck.mask >> index & 1]
    blocking = min(unplaced, key=lambda entry: entry.complete, default=None)
    assert blocking is not None, "a stuck search leaves an acknowledged operation unplaced"
    operation = blocking.operation
    _, expected = model.step(stuck.state, operation.name, operation.argument)
    sequences = list(operation.sequences)
    text = (
        f"not linearizable: {key}: {operation.name}({summarize(operation.argument)}) "
        f"returned {summarize(operation.value)}, but after {stuck.linearized} operations the "
        f"model answers {summarize(expected)}"
    )
    if stuck.via >= 0:
        previous = entries[stuck.via].operation
        text += f" (last placed: {previous.identity} {previous.name})"
        sequences = list(previous.sequences) + sequences
    actors = ((kind, key),) if kind else ()
    return Violation(text, tuple(sorted(set(sequences))), actors, checker)
