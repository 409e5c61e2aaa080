"""Bounded retries with exponential backoff and jitter, inside a per-call budget.

Remote models fail transiently (429 rate limits, 5xx, resets, a hung socket) and callers would
rather wait a little than fail a turn, but never without bound: an actor's turn holds its
mailbox, so every call has a budget of total seconds across all attempts and sleeps, and a
retry whose sleep would overrun that budget is not attempted at all (``ModelBudgetExceeded``
at once, rather than sleeping only to fail).

Time and randomness are injected (a clock with ``monotonic()``, a source with ``random()``), so
the simulator reproduces every backoff exactly.  The clock must share trio's timeline (the
Env's clock does): attempts are bounded with trio cancel scopes and sleeps use ``trio.sleep``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import trio

from ._exceptions import (
    ModelBudgetExceeded,
    ModelError,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
)

Result = TypeVar("Result")

retries_max_default = 3
request_timeout_seconds_default = 30.0
call_seconds_max_default = 120.0
call_output_tokens_max_default = 4_096
retries_max_limit = 20


class MonotonicClock(Protocol):
    def monotonic(self) -> float: ...


class JitterSource(Protocol):
    def random(self) -> float: ...


def default_clock() -> MonotonicClock:
    """The production clock (trio's), imported late so that ``troupe.models`` does not pull
    the runtime in at import time."""
    from troupe.runtime._real_env import RealClock

    return RealClock()


def default_jitter() -> JitterSource:
    """The production random source; the simulator passes a seeded one instead."""
    from troupe.runtime._real_env import RealRandom

    return RealRandom()


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (0-based): ``initial * multiplier**n``, capped, then jittered.

    ``jitter_ratio`` is the randomised fraction of each delay ("equal jitter" at 0.5): enough to
    spread a thundering herd, while never retrying sooner than half the nominal delay.  A
    provider's ``Retry-After`` replaces the computed delay (capped by
    ``retry_after_seconds_max``) and is not jittered: the provider asked for that wait.
    """

    initial_seconds: float = 0.5
    multiplier: float = 2.0
    delay_seconds_max: float = 8.0
    jitter_ratio: float = 0.5
    retry_after_seconds_max: float = 60.0

    def __post_init__(self) -> None:
        assert self.initial_seconds >= 0, self.initial_seconds
        assert self.multiplier >= 1, self.multiplier
        assert self.delay_seconds_max >= self.initial_seconds, self.delay_seconds_max
        assert 0 <= self.jitter_ratio <= 1, self.jitter_ratio

    def delay_seconds(
        self, retry_index: int, jitter: float, retry_after_seconds: float | None = None
    ) -> float:
        if retry_after_seconds is not None:
            return min(max(retry_after_seconds, 0.0), self.retry_after_seconds_max)
        nominal = min(self.initial_seconds * self.multiplier**retry_index, self.delay_seconds_max)
        return nominal * (1.0 - self.jitter_ratio * jitter)


@dataclass(frozen=True)
class CallBudget:
    """What one logical call (all its retries included) may spend."""

    total_seconds_max: float = call_seconds_max_default
    output_tokens_max: int = call_output_tokens_max_default

    def __post_init__(self) -> None:
        assert self.total_seconds_max > 0, self.total_seconds_max
        assert self.output_tokens_max > 0, self.output_tokens_max


def is_retryable(error: ModelError) -> bool:
    if isinstance(error, ProviderError):
        return error.retryable
    return isinstance(error, ModelUnavailable | ModelTimeout)


@dataclass
class RetryPolicy:
    """How a provider retries: shared by the chat model and the embeddings provider."""

    request_timeout_seconds: float = request_timeout_seconds_default
    retries_max: int = retries_max_default
    backoff: Backoff = Backoff()
    budget: CallBudget = CallBudget()

    def __post_init__(self) -> None:
        assert self.request_timeout_seconds > 0, self.request_timeout_seconds
        assert 0 <= self.retries_max <= retries_max_limit, self.retries_max

    async def run(
        self,
        attempt: Callable[[], Awaitable[Result]],
        *,
        clock: MonotonicClock,
        jitter: JitterSource,
        deadline: float | None = None,
    ) -> Result:
        """Run ``attempt`` until it succeeds, fails for good, or the retries or budget run out.

        ``attempt`` raises ``ModelError`` subclasses only (it wraps foreign errors itself);
        ``is_retryable`` decides which are worth another try.  ``deadline`` (on ``clock``)
        defaults to now plus ``budget.total_seconds_max``; a stream passes its own so that the
        budget spans opening and reading.
        """
        if deadline is None:
            deadline = clock.monotonic() + self.budget.total_seconds_max
        retry_index = 0
        while True:
            remaining_seconds = deadline - clock.monotonic()
            if remaining_seconds <= 0:
                raise ModelBudgetExceeded("call budget spent before the attempt could start")
            attempt_seconds = min(self.request_timeout_seconds, remaining_seconds)
            try:
                with trio.move_on_after(attempt_seconds):
                    return await attempt()
                if attempt_seconds < self.request_timeout_seconds:
                    raise ModelBudgetExceeded(
                        f"call budget of {self.budget.total_seconds_max}s ran out during an attempt"
                    )
                raise ModelTimeout(f"no answer within {self.request_timeout_seconds}s")
            except ModelBudgetExceeded:
                raise
            except ModelError as error:
                if not is_retryable(error) or retry_index >= self.retries_max:
                    raise
                retry_after = getattr(error, "retry_after_seconds", None)
                delay = self.backoff.delay_seconds(retry_index, jitter.random(), retry_after)
                if clock.monotonic() + delay >= deadline:
                    raise ModelBudgetExceeded(
                        f"retrying after {delay:.3f}s would overrun the call budget"
                    ) from error
            await trio.sleep(delay)
            retry_index += 1
