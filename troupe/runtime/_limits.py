"""Every limit the runtime enforces, as named constants with units last (TigerStyle).

Relations between limits are asserted at import so that a bad edit fails loudly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

mailbox_messages_max = 1024
"""Queued messages per actor before ``Overloaded``."""

live_actors_max = 100_000
"""Live (activated) actors per system before LRU eviction passivates the oldest."""

idle_seconds = 300.0
"""An actor with no message for this long passivates (found by a sweep every quarter of it)."""

turn_timeout_seconds = 60.0
"""A turn running longer than this is cancelled and counts as a crash."""

restarts_max = 1
period_seconds = 5.0
"""OTP's default restart intensity: at most ``restarts_max`` restarts within ``period_seconds``."""

kind_escalations_max = 10
kind_period_seconds = 5.0
"""A kind supervisor tolerates this many actor escalations per period before it gives up."""

recovery_backoff_seconds_min = 0.5
recovery_backoff_seconds_max = 30.0
"""The root retries an exhausted subtree after a backoff doubling between these bounds."""

poison_fingerprints_max = 4096
"""Crash counts remembered per kind for poison detection (LRU)."""

poison_quarantine_seconds = 60.0
"""How long a message that crashed its actor twice stays refused after its last crash.  Poison
is a message that crashes whenever it runs; requests without fields (a read of a character's
settings, a health check) repeat byte for byte, so a quarantine without end would turn two
unlucky crashes into a route that fails until restart."""

restart_histories_max = 4096
"""Actors per kind whose recent restarts are remembered across passivation (LRU)."""

retry_after_seconds_min = 0.05
retry_after_seconds_max = 30.0
"""Bounds of the Retry-After we report with ``Overloaded``."""

reminder_horizon_seconds = 300.0
"""The reminder service keeps reminders due within this horizon in memory."""

reminder_batch_max = 1024
"""Reminders loaded from storage per scan."""

reminder_retry_seconds = 1.0
"""Delay before a reminder whose turn crashed or was refused is fired again."""

reminder_deliveries_in_flight_max = 64
"""Reminders delivered concurrently; the rest wait their turn."""

trace_records_in_memory_max = 1_000_000
"""Records the tracer keeps in memory when asked to keep them (the simulator)."""


@dataclass(frozen=True)
class RestartIntensity:
    """At most ``restarts_max`` restarts within ``period_seconds`` (OTP semantics)."""

    restarts_max: int = restarts_max
    period_seconds: float = period_seconds

    def __post_init__(self) -> None:
        assert self.restarts_max >= 0
        assert self.period_seconds > 0

    def admits(self, restart_times: deque[float], now: float) -> bool:
        """Records a restart at ``now`` in ``restart_times`` (a sliding window, pruned here)
        and says whether the intensity still allows it."""
        restart_times.append(now)
        while restart_times and now - restart_times[0] > self.period_seconds:
            restart_times.popleft()
        return len(restart_times) <= self.restarts_max


assert mailbox_messages_max >= 1
assert recovery_backoff_seconds_min <= recovery_backoff_seconds_max
assert retry_after_seconds_min <= retry_after_seconds_max
assert reminder_retry_seconds < reminder_horizon_seconds
assert turn_timeout_seconds < idle_seconds
