"""Per-token rate buckets: a sustained rate with a burst, independent between tokens.

A classic token bucket per key (the token's id): ``rate_per_second`` refills continuously up
to ``burst``; a request takes one.  Time comes from the ``Env`` clock (monotonic), so the
simulator and the tests drive it without sleeping.  The buckets live in the surface's app
instance, not in a module global, and are bounded: past ``buckets_max`` keys the least recently
used bucket is dropped (a dropped bucket comes back full, which only ever favours a token that
has been idle longest).  Trade-off: limits are per process, which is all troupe has.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

rate_per_second_default = 20.0
burst_default = 60
buckets_max_default = 10_000

assert rate_per_second_default > 0
assert burst_default >= 1


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateBuckets:
    """``take(key)`` -> 0.0 when allowed, else the seconds until one request would be."""

    def __init__(
        self,
        monotonic: Callable[[], float],
        *,
        rate_per_second: float = rate_per_second_default,
        burst: int = burst_default,
        buckets_max: int = buckets_max_default,
    ) -> None:
        assert rate_per_second > 0 and burst >= 1 and buckets_max >= 1
        self._monotonic = monotonic
        self.rate_per_second = rate_per_second
        self.burst = burst
        self.buckets_max = buckets_max
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def take(self, key: Hashable) -> float:
        now = self._monotonic()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self.burst), now)
            self._buckets[key] = bucket
            while len(self._buckets) > self.buckets_max:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            elapsed = max(0.0, now - bucket.updated)
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate_per_second)
            bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_second

    def __len__(self) -> int:
        return len(self._buckets)


def retry_after_whole_seconds(wait_seconds: float) -> int:
    """Retry-After is a positive integer: round the wait up, at least 1."""
    return max(1, math.ceil(wait_seconds))


__all__ = [
    "RateBuckets",
    "buckets_max_default",
    "burst_default",
    "rate_per_second_default",
    "retry_after_whole_seconds",
]
