"""The HTTP plumbing every workload shares: one traced request, its decoded body, bounded retries.

Why one module: each workload speaks HTTP to its surface through the simulator's ASGI driver
(``_asgi.AsgiDriver``) and needs the same four things around every request — an
``http_invoke`` trace record before it and an ``http_ok`` / ``http_fail`` record after it (so a
violation can name the exchange), a check that the app did not raise while answering, the body
decoded as JSON when it is JSON, and, for the surfaces whose clients retry, a bounded resend
loop that honours ``Retry-After``.  These were written once per workload; the copies drifted
only in their names.  What stays in each workload is what differs by contract: the headers it
sends, its error envelope, and which statuses it treats as transient.

Determinism is the constraint that shapes this module: the trace records, the order of the
driver calls and the draws from ``world.random`` are exactly those the workloads made before
(the simulator's trace digest per seed did not change when they moved here), because a replay
file recorded earlier must replay byte for byte.

Trade-off: the helpers take the workload's ``violate`` callback rather than returning findings,
so each workload keeps its own violation prefix, checker name and actors.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import trio

from ._asgi import AsgiDriver, AsgiError, AsgiResponse
from ._workload import World

retry_sleep_seconds_max_default = 3.0
"""The longest a workload waits before resending, whatever ``Retry-After`` says."""

retry_after_seconds_default = 1.0
"""The wait a response with no ``Retry-After`` header asks for."""

retry_jitter_base_seconds = 0.5
"""Without a response to read a wait from, a client waits this plus up to one random second."""

assert 0 < retry_after_seconds_default <= retry_sleep_seconds_max_default
assert 0 < retry_jitter_base_seconds

Violate = Callable[[str, tuple[int, ...]], None]
"""A workload's way to report a finding: ``violate(text, trace sequences)``."""

EnvelopeCheck = Callable[[AsgiResponse, Any], "str | None"]
"""Why an error response (and its decoded body) is not the contract's error envelope; None
when it is."""


@dataclass
class HttpExchange:
    """One request and what came of it.  ``response`` is None when the exchange failed
    (timeout, cut short): an unknown outcome, and ``error`` says why."""

    response: AsgiResponse | None
    invoke_seq: int
    complete_seq: int
    """The ``http_ok`` or ``http_fail`` record's sequence."""
    error: AsgiError | None = None
    earlier_sequences: tuple[int, ...] = ()
    """The trace sequences of earlier attempts, when ``send_retrying`` resent the request."""

    @cached_property
    def document(self) -> Any:
        """The body decoded as JSON; None without a response or when it is not JSON."""
        return None if self.response is None else json_or_none(self.response.body)

    @property
    def status(self) -> int:
        return 0 if self.response is None else self.response.status

    @property
    def sequences(self) -> tuple[int, ...]:
        """Every trace sequence of the exchange, earlier attempts first (0s, from a disabled
        tracer, left out)."""
        return self.earlier_sequences + tuple(number for number in (self.invoke_seq, self.complete_seq) if number)


async def send_traced(world: World, driver: AsgiDriver, surface: str, method: str, path: str, *,
                      violate: Violate | None = None, envelope: EnvelopeCheck | None = None,
                      labels: Mapping[str, Any] | None = None, invoke_labels: Mapping[str, Any] | None = None,
                      **request: Any) -> HttpExchange:
    """Send one request through ``driver`` and trace it as ``http_invoke`` then ``http_ok``
    (with the status) or ``http_fail`` (with the error's type), all under ``("http",
    surface)``.

    ``labels`` go on all three records (the admin workload's client number), ``invoke_labels``
    on the invocation only (the host's token name); ``request`` goes to ``driver.request``
    (``headers``, ``body``, ``host``, ``seconds_max``).  With ``violate``, an app that raised
    while answering is reported as ``the app raised on METHOD PATH: ERROR``, and, with
    ``envelope`` too, an error status whose body it finds wrong as ``METHOD PATH answered
    STATUS: PROBLEM``."""
    labels = labels or {}
    invoked = world.tracer.record("http_invoke", "http", surface, **labels, method=method, path=path,
                                  **(invoke_labels or {}))
    errors_before = len(driver.app_errors)
    try:
        response = await driver.request(method, path, **request)
    except AsgiError as error:
        failed = world.tracer.record("http_fail", "http", surface, **labels, error=type(error).__name__)
        return HttpExchange(None, invoked, failed, error)
    completed = world.tracer.record("http_ok", "http", surface, **labels, status=response.status)
    exchange = HttpExchange(response, invoked, completed)
    if violate is None:
        return exchange
    if len(driver.app_errors) > errors_before:
        violate(f"the app raised on {method} {path}: {driver.app_errors[-1]}", exchange.sequences)
    if envelope is not None and response.status >= 400:
        problem = envelope(response, exchange.document)
        if problem:
            violate(f"{method} {path} answered {response.status}: {problem}", exchange.sequences)
    return exchange


async def send_retrying(world: World, send: Callable[[], Awaitable[HttpExchange]], *, attempts_max: int,
                        transient_statuses: Collection[int],
                        sleep_seconds_max: float = retry_sleep_seconds_max_default) -> HttpExchange:
    """Call ``send`` (the same request each time) until an answer is not transient or
    ``attempts_max`` attempts were made, waiting ``retry_seconds`` between attempts.  The last
    exchange is returned, carrying the trace sequences of all attempts."""
    assert attempts_max >= 1
    earlier: tuple[int, ...] = ()
    exchange = await send()
    for _attempt in range(1, attempts_max):
        response = exchange.response
        if response is not None and response.status not in transient_statuses:
            break
        await trio.sleep(retry_seconds(response, world, sleep_seconds_max))
        earlier += exchange.sequences
        exchange = await send()
    exchange.earlier_sequences = earlier + exchange.earlier_sequences
    return exchange


def retry_seconds(response: AsgiResponse | None, world: World,
                  seconds_max: float = retry_sleep_seconds_max_default) -> float:
    """How long to wait before resending: the response's ``Retry-After`` (capped at
    ``seconds_max``), or, without a response or with a header that is not a number, a short
    random wait drawn from ``world.random``."""
    if response is not None:
        try:
            return min(float(response.header("retry-after") or retry_after_seconds_default), seconds_max)
        except ValueError:
            pass
    return retry_jitter_base_seconds + world.random.random()


def json_or_none(body: bytes) -> Any:
    """``body`` decoded as JSON, or None when it is empty or not JSON."""
    try:
        return json.loads(body)
    except ValueError:
        return None


__all__ = [
    "EnvelopeCheck",
    "HttpExchange",
    "Violate",
    "json_or_none",
    "retry_seconds",
    "send_retrying",
    "send_traced",
]
