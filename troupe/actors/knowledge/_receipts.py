"""Persistent idempotency receipts: a retried write never creates a second memory, across
restarts, and a failed one is retried only when an operator authorised it.

Why receipts live in the knowledge database, in the same transaction as what they acknowledge:
an agent retries a turn whose answer it never saw.  If the receipt and the evidence were
committed separately, a crash between them would leave either evidence without a receipt (the
retry writes a second one) or a completed receipt without evidence.  Here the store's write
functions (``_store.write_evidence``, ``update_knowledge``, ``record_lifecycle``) take the
receipt, write the rows and complete the receipt with the response in ONE job, so an
uncertain commit resolves to exactly one evidence per key: either everything committed (the
retry replays the stored response) or nothing did (the retry runs afresh).

The state machine, per ``(scope, namespace, key)``:

    (absent) --take--> IN_PROGRESS --complete--> COMPLETED        (replayed forever after)
                           |
                           +--------fail------> FAILED --recover--> RETRY_AUTHORIZED
                                                  ^                      |
                                                  +---fail--- IN_PROGRESS <--take (identical request)

- Keys are per scope (schema migration 3): a scope is a hard filter everywhere in the
  contract, and the same key in another scope is another request, never a 409 that would tell
  one scope's caller what another scope holds (``/memory/update`` answers 404 for another
  scope's item for the same reason).  It also keeps each receipt with its one writer, the
  scope's actor.
- Namespaces keep the three endpoints apart (``write``, ``update`` and ``lifecycle``): the same
  external key may be used by a turn's write and its lifecycle event (contract §3.2b); the
  update namespace is the contract's ``update:<key>``.
- A request is identified by ``request_hash``: SHA-256 over the operation and the canonical
  JSON of the request as the server rebuilt it from its own schema (``request_hash``); a hash
  sent by a client is never used (the recover endpoint hashes the original request itself).
- Same key + same hash after completion → the FIRST response, byte for byte
  (``Receipt.response_json``, the exact text stored at completion); same key + other hash →
  409 ``IDEMPOTENCY_CONFLICT``; in progress → 409 ``IDEMPOTENCY_IN_PROGRESS``; failed (or
  authorised, for another hash) → 409 ``IDEMPOTENCY_FAILED`` / ``IDEMPOTENCY_CONFLICT``.
- ``IN_PROGRESS`` is durable only for work split over several jobs (the store's own writes
  never leave it behind).  A receipt still in progress when its scope's actor activates was
  left by a crashed activation: ``receipts_fail_in_progress`` turns it FAILED, because its
  side effects are unknown and the contract forbids replaying them automatically.
- Recovery (contract §3.2c): only a FAILED receipt whose hash equals the original request's
  may be authorised; that increments ``recovery_count`` and keeps ``recovery_reason`` and
  ``recovered_at``; the next identical request consumes the authorisation atomically (the
  take and the work are one job); a retry after that fails closed again.  404
  ``IDEMPOTENCY_NOT_FOUND`` without a receipt, 409 ``IDEMPOTENCY_CONFLICT`` for another
  payload, ``IDEMPOTENCY_IN_PROGRESS`` while running, ``IDEMPOTENCY_COMPLETED`` once done, and
  ``IDEMPOTENCY_CONFLICT`` for a receipt already authorised and not yet used.  A receipt is
  never overwritten by a refused recovery.

Receipts are never deleted: forgetting the evidence a receipt acknowledged keeps the receipt,
so a replay answers the first response and nothing comes back to life.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

receipt_namespace_write = "write"
receipt_namespace_update = "update"
receipt_namespace_lifecycle = "lifecycle"
receipt_namespaces = (receipt_namespace_write, receipt_namespace_update,
                      receipt_namespace_lifecycle)

operation_memory_write = "MEMORY_WRITE"
operation_memory_update = "MEMORY_UPDATE"
operation_lifecycle = "LIFECYCLE"
operation_namespaces = {
    operation_memory_write: receipt_namespace_write,
    operation_memory_update: receipt_namespace_update,
    operation_lifecycle: receipt_namespace_lifecycle,
}
"""The recover endpoint's ``operation`` → the receipt namespace it addresses."""
recovery_operations = tuple(operation_namespaces)

receipt_state_in_progress = "IN_PROGRESS"
receipt_state_completed = "COMPLETED"
receipt_state_failed = "FAILED"
receipt_state_retry_authorized = "RETRY_AUTHORIZED"
receipt_states = (receipt_state_in_progress, receipt_state_completed, receipt_state_failed,
                  receipt_state_retry_authorized)

idempotency_key_characters_max = 128
idempotency_key_pattern = re.compile(r"[A-Za-z0-9._:-]{1,128}")
assert idempotency_key_pattern.pattern.endswith(f",{idempotency_key_characters_max}}}")
recovery_reason_characters_min = 3
"""The recover ``reason`` after trimming, at least (contract §3.2c)."""
recovery_reason_characters_max = 256
receipt_error_characters_max = 1024
"""A failure's description kept on the receipt (longer ones are cut)."""

code_idempotency_conflict = "IDEMPOTENCY_CONFLICT"
code_idempotency_in_progress = "IDEMPOTENCY_IN_PROGRESS"
code_idempotency_failed = "IDEMPOTENCY_FAILED"
code_idempotency_not_found = "IDEMPOTENCY_NOT_FOUND"
code_idempotency_completed = "IDEMPOTENCY_COMPLETED"
code_idempotency_key_required = "IDEMPOTENCY_KEY_REQUIRED"
code_invalid_recovery_request = "INVALID_RECOVERY_REQUEST"

decision_proceed = "proceed"
decision_replay = "replay"
decision_refuse = "refuse"


# ------------------------------------------------------------------------- validation


def idempotency_key_problem(key: object) -> str | None:
    """Why ``key`` is not a valid idempotency key (1–128 of letters, digits, ``. _ : -``)."""
    if not isinstance(key, str) or not key:
        return "idempotency_key is empty"
    if len(key) > idempotency_key_characters_max:
        return f"idempotency_key is longer than {idempotency_key_characters_max} characters"
    if not idempotency_key_pattern.fullmatch(key):
        return "idempotency_key may contain only letters, digits and . _ : -"
    return None


def recovery_reason_problem(reason: object) -> str | None:
    """Why ``reason`` (trimmed) is not a valid recovery reason (3–256 characters)."""
    if not isinstance(reason, str):
        return "reason must be text"
    length = len(reason.strip())
    if length < recovery_reason_characters_min:
        return f"reason must have at least {recovery_reason_characters_min} characters"
    if length > recovery_reason_characters_max:
        return f"reason must have at most {recovery_reason_characters_max} characters"
    return None


# --------------------------------------------------------------------------- hashing


def _canonical_value(value: Any) -> Any:
    """JSON's data model with one spelling per value: integral floats become integers (210.0
    and 210 are the same amount), non-finite numbers are refused, tuples are arrays."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a request holds a non-finite number")
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("a request object has a key that is not text")
        return {key: _canonical_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(item) for item in value]
    raise ValueError(f"a request holds a {type(value).__name__}, which JSON does not have")


def canonical_request_json(request: Mapping[str, Any]) -> str:
    """Sorted keys, no whitespace, UTF-8 text (not ``\\u`` escapes), integral floats as
    integers: two requests with the same meaning give the same text."""
    return json.dumps(_canonical_value(request), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)


def request_hash(operation: str, request: Mapping[str, Any]) -> str:
    """SHA-256 hex over the operation and the canonical request.  ``request`` must be what the
    server rebuilt from its own schema (``model.model_dump(mode="json")`` of the endpoint's
    request model, defaults included), for the endpoint and for recovery alike."""
    assert operation in operation_namespaces, operation
    digest = hashlib.sha256()
    digest.update(operation.encode("ascii"))
    digest.update(b"\n")
    digest.update(canonical_request_json(request).encode("utf-8"))
    return digest.hexdigest()


def response_json_text(response: Mapping[str, Any]) -> str:
    """The stored form of a response: compact JSON in the response's own key order.  The HTTP
    layer sends exactly this text, the first time and on every replay."""
    return json.dumps(dict(response), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def receipt_key_text(namespace: str, key: str) -> str:
    """The contract's spelling of a receipt: ``key``, ``update:key`` or ``lifecycle:key``."""
    return key if namespace == receipt_namespace_write else f"{namespace}:{key}"


# ---------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Receipt:
    """One receipt row.  Times are wall-clock seconds; ``response_json`` is set once
    COMPLETED and never changes."""

    namespace: str
    key: str
    scope: str
    operation: str
    request_hash: str
    state: str
    response_json: str | None
    error: str | None
    created_at: float
    updated_at: float
    completed_at: float | None
    failed_at: float | None
    recovery_count: int
    recovery_reason: str | None
    recovered_at: float | None
    retry_consumed_at: float | None

    def response(self) -> dict[str, Any] | None:
        return None if self.response_json is None else json.loads(self.response_json)


@dataclass(frozen=True)
class ReceiptDecision:
    """What to do with a request carrying an idempotency key.

    ``action`` is ``proceed`` (run it; ``recovered`` when it consumed an authorisation),
    ``replay`` (answer ``response_json``, nothing else) or ``refuse`` (answer ``status`` with
    ``code`` and ``message``)."""

    action: str
    receipt: Receipt | None = None
    code: str | None = None
    message: str | None = None
    status: int | None = None
    recovered: bool = False

    @property
    def response_json(self) -> str | None:
        return None if self.receipt is None else self.receipt.response_json


_columns = ("namespace, key, scope, operation, request_hash, state, response_json, error, "
            "created_at, updated_at, completed_at, failed_at, recovery_count, recovery_reason, "
            "recovered_at, retry_consumed_at")


def _receipt(row: tuple) -> Receipt:
    return Receipt(*row)


def receipt_get(connection: apsw.Connection, namespace: str, key: str, *,
                scope: str) -> Receipt | None:
    """The receipt of ``(scope, namespace, key)``, or ``None``."""
    assert namespace in receipt_namespaces, namespace
    row = connection.execute(
        f"SELECT {_columns} FROM knowledge_receipts WHERE scope = ? AND namespace = ? AND key = ?",
        (scope, namespace, key)).fetchone()
    return None if row is None else _receipt(row)


def _refuse(receipt: Receipt, code: str, message: str, status: int = 409) -> ReceiptDecision:
    return ReceiptDecision(decision_refuse, receipt, code=code, message=message, status=status)


def receipt_check(connection: apsw.Connection, namespace: str, key: str,
                  request_hash: str, *, scope: str) -> ReceiptDecision:
    """The decision for a request, without changing anything (any job or read)."""
    receipt = receipt_get(connection, namespace, key, scope=scope)
    if receipt is None:
        return ReceiptDecision(decision_proceed)
    shown = receipt_key_text(namespace, key)
    if receipt.request_hash != request_hash:
        return _refuse(receipt, code_idempotency_conflict,
                       f"idempotency key {shown!r} is bound to a different request")
    if receipt.state == receipt_state_completed:
        return ReceiptDecision(decision_replay, receipt)
    if receipt.state == receipt_state_in_progress:
        return _refuse(receipt, code_idempotency_in_progress,
                       f"the first request with idempotency key {shown!r} has not finished")
    if receipt.state == receipt_state_failed:
        return _refuse(receipt, code_idempotency_failed,
                       f"the first request with idempotency key {shown!r} failed; "
                       "recover it with /agent/idempotency/recover before retrying")
    assert receipt.state == receipt_state_retry_authorized, receipt.state
    return ReceiptDecision(decision_proceed, receipt, recovered=True)


def receipt_take(connection: apsw.Connection, namespace: str, key: str, *, scope: str,
                 operation: str, request_hash: str, now: float) -> ReceiptDecision:
    """Check and, when the decision is ``proceed``, mark the receipt IN_PROGRESS (a new one,
    or consuming a retry authorisation).  Call it inside the job that does the work and
    completes the receipt, so the take, the work and the completion commit together."""
    assert operation_namespaces.get(operation) == namespace, (operation, namespace)
    decision = receipt_check(connection, namespace, key, request_hash, scope=scope)
    if decision.action != decision_proceed:
        return decision
    if decision.recovered:
        connection.execute(
            "UPDATE knowledge_receipts SET state = ?, updated_at = ?, retry_consumed_at = ?, "
            "error = NULL WHERE scope = ? AND namespace = ? AND key = ? AND state = ?",
            (receipt_state_in_progress, now, now, scope, namespace, key,
             receipt_state_retry_authorized))
        assert connection.changes() == 1
    else:
        connection.execute(
            "INSERT INTO knowledge_receipts (namespace, key, scope, operation, request_hash, "
            "state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (namespace, key, scope, operation, request_hash, receipt_state_in_progress,
             now, now))
    taken = receipt_get(connection, namespace, key, scope=scope)
    return ReceiptDecision(decision_proceed, taken, recovered=decision.recovered)


def receipt_complete(connection: apsw.Connection, namespace: str, key: str,
                     response: Mapping[str, Any], now: float, *, scope: str) -> str:
    """Store the first response of an IN_PROGRESS receipt and mark it COMPLETED; returns the
    exact response text to send (see ``response_json_text``)."""
    text = response_json_text(response)
    connection.execute(
        "UPDATE knowledge_receipts SET state = ?, response_json = ?, completed_at = ?, "
        "updated_at = ?, error = NULL WHERE scope = ? AND namespace = ? AND key = ? AND state = ?",
        (receipt_state_completed, text, now, now, scope, namespace, key,
         receipt_state_in_progress))
    assert connection.changes() == 1, f"receipt {namespace}:{key} was not in progress"
    return text


def receipt_insert_completed(connection: apsw.Connection, namespace: str, key: str, *, scope: str,
                             operation: str, request_hash: str, response: Mapping[str, Any],
                             now: float) -> str:
    """A fresh request's take and completion at once: one INSERT of the COMPLETED receipt.

    Only for a key ``receipt_check`` found absent, inside the job that did the work: the take,
    the work and the completion commit together anyway, so the IN_PROGRESS state in between
    was never visible to anyone (``receipt_take`` + ``receipt_complete`` wrote and read the
    row three times for the same end state).  Returns the stored response text."""
    assert operation_namespaces.get(operation) == namespace, (operation, namespace)
    text = response_json_text(response)
    connection.execute(
        "INSERT INTO knowledge_receipts (namespace, key, scope, operation, request_hash, state, "
        "response_json, created_at, updated_at, completed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (namespace, key, scope, operation, request_hash, receipt_state_completed, text, now, now, now))
    return text


def receipt_fail(connection: apsw.Connection, namespace: str, key: str, *, scope: str,
                 operation: str, request_hash: str, error: str, now: float) -> Receipt | None:
    """Record that the request with this hash failed (in its own job, after the job that
    tried the work rolled back).  Creates the receipt FAILED when the rollback removed it,
    turns IN_PROGRESS or an unused authorisation into FAILED (a consumed authorisation stays
    consumed: the retry after a failed retry fails closed), and leaves a COMPLETED receipt or
    one bound to another hash alone (returns ``None`` then)."""
    assert operation_namespaces.get(operation) == namespace, (operation, namespace)
    error = error[:receipt_error_characters_max]
    receipt = receipt_get(connection, namespace, key, scope=scope)
    if receipt is None:
        connection.execute(
            "INSERT INTO knowledge_receipts (namespace, key, scope, operation, request_hash, "
            "state, error, created_at, updated_at, failed_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (namespace, key, scope, operation, request_hash, receipt_state_failed, error,
             now, now, now))
        return receipt_get(connection, namespace, key, scope=scope)
    if receipt.request_hash != request_hash or receipt.state == receipt_state_completed:
        return None
    consumed_at = receipt.retry_consumed_at
    if receipt.state == receipt_state_retry_authorized:
        # The failed attempt's job rolled back its consumption; it still used the retry.
        consumed_at = now
    connection.execute(
        "UPDATE knowledge_receipts SET state = ?, error = ?, failed_at = ?, updated_at = ?, "
        "retry_consumed_at = ? WHERE scope = ? AND namespace = ? AND key = ?",
        (receipt_state_failed, error, now, now, consumed_at, scope, namespace, key))
    return receipt_get(connection, namespace, key, scope=scope)


def receipts_fail_in_progress(connection: apsw.Connection, *, scope: str, error: str,
                              now: float) -> int:
    """Turn every IN_PROGRESS receipt of ``scope`` FAILED; returns how many.  The scope's
    actor calls it when it activates: it is the only writer of its scope's receipts, so one
    still in progress then was left by an activation that crashed mid-work."""
    connection.execute(
        "UPDATE knowledge_receipts SET state = ?, error = ?, failed_at = ?, updated_at = ? "
        "WHERE scope = ? AND state = ?",
        (receipt_state_failed, error[:receipt_error_characters_max], now, now, scope,
         receipt_state_in_progress))
    return connection.changes()


def receipt_recover(connection: apsw.Connection, operation: str, key: str, *, scope: str,
                    request_hash: str, reason: str, now: float) -> ReceiptDecision:
    """Authorise exactly one retry of a FAILED receipt (contract §3.2c).  ``proceed`` carries
    the updated receipt (``RETRY_AUTHORIZED``, ``recovery_count`` + 1, ``recovery_reason``
    trimmed, ``recovered_at`` = ``now``); ``refuse`` carries 404/409 and changes nothing."""
    assert recovery_reason_problem(reason) is None, reason
    namespace = operation_namespaces[operation]
    receipt = receipt_get(connection, namespace, key, scope=scope)
    shown = receipt_key_text(namespace, key)
    if receipt is None:
        return ReceiptDecision(decision_refuse, None, code=code_idempotency_not_found,
                               message=f"no receipt for idempotency key {shown!r}", status=404)
    if receipt.request_hash != request_hash:
        return _refuse(receipt, code_idempotency_conflict,
                       f"the original request differs from the one receipt {shown!r} holds")
    if receipt.state == receipt_state_completed:
        return _refuse(receipt, code_idempotency_completed,
                       f"receipt {shown!r} is completed; a completed request is never re-run")
    if receipt.state == receipt_state_in_progress:
        return _refuse(receipt, code_idempotency_in_progress,
                       f"the request with idempotency key {shown!r} is still running")
    if receipt.state == receipt_state_retry_authorized:
        return _refuse(receipt, code_idempotency_conflict,
                       f"a retry of receipt {shown!r} is already authorised and not yet used")
    connection.execute(
        "UPDATE knowledge_receipts SET state = ?, recovery_count = recovery_count + 1, "
        "recovery_reason = ?, recovered_at = ?, updated_at = ? "
        "WHERE scope = ? AND namespace = ? AND key = ? AND state = ?",
        (receipt_state_retry_authorized, reason.strip(), now, now, scope, namespace, key,
         receipt_state_failed))
    assert connection.changes() == 1
    return ReceiptDecision(decision_proceed, receipt_get(connection, namespace, key, scope=scope))


def recovery_response(receipt: Receipt) -> dict[str, Any]:
    """The recover endpoint's 200 body for an authorised receipt (contract §3.2c)."""
    assert receipt.state == receipt_state_retry_authorized and receipt.recovered_at is not None
    return {
        "operation": receipt.operation,
        "idempotency_key": receipt.key,
        "status": receipt_state_retry_authorized,
        "recovery_count": receipt.recovery_count,
        "authorized_at": int(receipt.recovered_at),
    }


__all__ = [
    "Receipt",
    "ReceiptDecision",
    "canonical_request_json",
    "code_idempotency_completed",
    "code_idempotency_conflict",
    "code_idempotency_failed",
    "code_idempotency_in_progress",
    "code_idempotency_key_required",
    "code_idempotency_not_found",
    "code_invalid_recovery_request",
    "decision_proceed",
    "decision_refuse",
    "decision_replay",
    "idempotency_key_characters_max",
    "idempotency_key_problem",
    "operation_lifecycle",
    "operation_memory_update",
    "operation_memory_write",
    "operation_namespaces",
    "receipt_check",
    "receipt_complete",
    "receipt_error_characters_max",
    "receipt_fail",
    "receipt_get",
    "receipt_insert_completed",
    "receipt_key_text",
    "receipt_namespace_lifecycle",
    "receipt_namespace_update",
    "receipt_namespace_write",
    "receipt_namespaces",
    "receipt_recover",
    "receipt_state_completed",
    "receipt_state_failed",
    "receipt_state_in_progress",
    "receipt_state_retry_authorized",
    "receipt_states",
    "receipt_take",
    "receipts_fail_in_progress",
    "recovery_operations",
    "recovery_reason_characters_max",
    "recovery_reason_characters_min",
    "recovery_reason_problem",
    "recovery_response",
    "request_hash",
    "response_json_text",
]
