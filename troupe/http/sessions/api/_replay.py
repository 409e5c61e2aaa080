"""The ``Idempotency-Key`` replay window of the unified ``/api`` writes.

Why: the SDK sends ``Idempotency-Key`` on a write when its caller gives a request key, and
``Client.retry_same_request`` resends exactly the same bytes with the same key after a
``same-request`` error (or after a lost reply, when the caller retries).  A write that already
ran must not run twice: the second arrival gets the first answer, byte for byte.  The session
family has no request id in its bodies (the manifest's ``requestIdPath`` is null), so the key
and a fingerprint of the request are all there is.

Rules (the SDK's reason codes, ``detail.reason``):

- Keys are per principal: ``(end user, key)``.  The fingerprint is SHA-256 over the method, the
  path, the query string and the body bytes.
- Same key, same fingerprint, answered → the stored answer again (``idempotent-replayed:
  true``); still running → wait for it (at most ``idempotency_wait_seconds_max``), then the
  same; same key, other fingerprint → 409 ``conflict`` ``idempotency_key_reused``.
- Only final answers are kept: 2xx and 4xx other than 408 / 429.  A 5xx, 408 or 429 (the
  ``same-request`` errors), a reply larger than ``idempotency_response_bytes_max`` or a client
  that went away forgets the key, so the retry runs the write.
- The window is bounded: ``idempotency_receipts_max`` keys, each kept
  ``idempotency_receipt_seconds``; when every slot holds a write still running, a new key gets
  503 ``capacity_exceeded`` ``receipt_window_full``.
- A key on a read or a stream is 400 ``invalid_request`` ``idempotency_key_not_applicable``.

Trade-off: the window lives in this process's memory (one per app, never module-global), so a
restart forgets it; the session actor's own rules (receipts for inputs, first answer wins for
bridges, idempotent close and interrupt) still hold across restarts.

Why memory is enough for the SDK (tansr-sdk 0.1.0, ``api/client.py``): it resends a write only
through ``Client.retry_same_request``, which demands the evidence of an *error answer* whose
``retryAction`` is ``same-request`` (and refuses ``result_unknown`` / ``commit_unknown``), from
the same ``Client`` object, within the original absolute deadline.  Those answers (5xx, 408,
429) are exactly the ones this window never keeps, so a retry runs the write whether or not the
process restarted in between.  A success whose reply was lost (a restart, a cut connection) is
never retried by the SDK: it reports ``network`` / ``timeout`` and the caller reconciles by
reading (``integration/session_loss.py`` checks that it does not retry).  A durable table would
only replay answers the SDK never asks for again.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

idempotency_receipts_max = 1024
"""Keys remembered at once (all principals together)."""
idempotency_receipt_seconds = 24 * 3600.0
"""How long an answer is replayed."""
idempotency_response_bytes_max = 256 * 1024
"""Answers larger than this are not kept (a retry runs the write again)."""
idempotency_wait_seconds_max = 60.0
"""How long a duplicate waits for the first arrival of its key to finish."""

assert idempotency_receipts_max > 0 and idempotency_wait_seconds_max < idempotency_receipt_seconds

Decision = Literal["run", "replay", "wait", "reused", "full"]


@dataclass
class Receipt:
    """One key's entry: the request's fingerprint and, once answered, the answer."""

    fingerprint: str
    stored_at: float
    done: trio.Event = field(default_factory=trio.Event)
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


def request_fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode("utf-8"), query, body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def retained_status(status: int) -> bool:
    """Final answers only (see the module docstring)."""
    return 200 <= status < 500 and status not in (408, 429)


class ReplayWindow:
    """The bounded window; ``clock`` is the Env's monotonic clock (trio's, under the simulator)."""

    def __init__(self, clock: Callable[[], float], *, receipts_max: int = idempotency_receipts_max,
                 receipt_seconds: float = idempotency_receipt_seconds) -> None:
        assert receipts_max > 0 and receipt_seconds > 0
        self._clock = clock
        self._receipts_max = receipts_max
        self._receipt_seconds = receipt_seconds
        self._receipts: OrderedDict[tuple[str, str], Receipt] = OrderedDict()

    def __len__(self) -> int:
        return len(self._receipts)

    def begin(self, owner: str, key: str, fingerprint: str) -> tuple[Decision, Receipt | None]:
        """What to do with a keyed write: ``run`` it (the receipt is now in flight),
        ``replay`` or ``wait`` for the receipt, or refuse it (``reused``, ``full``)."""
        now = self._clock()
        self._expire(now)
        found = self._receipts.get((owner, key))
        if found is not None:
            if found.fingerprint != fingerprint:
                return "reused", None
            return ("replay" if found.status is not None else "wait"), found
        if len(self._receipts) >= self._receipts_max and not self._evict_one_answered():
            return "full", None
        receipt = Receipt(fingerprint, now)
        self._receipts[(owner, key)] = receipt
        return "run", receipt

    def finish(self, owner: str, key: str, receipt: Receipt, status: int | None,
               headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Keep the answer when it is final and small enough, else forget the key.  True if kept."""
        keep = status is not None and retained_status(status) and len(body) <= idempotency_response_bytes_max
        if keep:
            assert status is not None
            receipt.status, receipt.headers, receipt.body = status, list(headers), bytes(body)
            receipt.stored_at = self._clock()
        elif self._receipts.get((owner, key)) is receipt:
            del self._receipts[(owner, key)]
        receipt.done.set()
        return keep

    def _expire(self, now: float) -> None:
        for identity, receipt in list(self._receipts.items()):
            if receipt.status is None or now - receipt.stored_at < self._receipt_seconds:
                continue
            del self._receipts[identity]

    def _evict_one_answered(self) -> bool:
        for identity, receipt in self._receipts.items():
            if receipt.status is not None:
                del self._receipts[identity]
                return True
        return False


async def read_body(receive: Callable[[], Any], bytes_max: int) -> tuple[bytes, bool, bool]:
    """(body, over the cap, client gone): the whole request body, read before the write runs."""
    chunks, total = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks), False, True
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > bytes_max:
            return b"", True, False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False, False


def replaying_receive(body: bytes, receive: Callable[[], Any]) -> Callable[[], Any]:
    """A ``receive`` that hands the app the buffered body once, then the client's own events."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


__all__ = [
    "Receipt",
    "ReplayWindow",
    "idempotency_receipt_seconds",
    "idempotency_receipts_max",
    "idempotency_response_bytes_max",
    "idempotency_wait_seconds_max",
    "read_body",
    "replaying_receive",
    "request_fingerprint",
    "retained_status",
]
