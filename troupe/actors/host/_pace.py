"""Paces: when an entry's pending messages become a learning batch.

A pace is ``count`` messages, or ``idle_seconds`` without a new message, or at most
``max_wait_seconds`` after the oldest pending message, whichever comes first (all measured
on receive time).  Named paces cover the usual chat rhythms; a custom pace is the contract's
``{"count","idle_seconds","max_wait_seconds"}``.  A pace is fixed when its entry is created
(the first message) and kept afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

pace_count_max = 1000
pace_idle_seconds_min = 1.0
pace_idle_seconds_max = 86_400.0
pace_max_wait_seconds_max = 7 * 86_400.0


@dataclass(frozen=True)
class Pace:
    count: int
    idle_seconds: float
    max_wait_seconds: float
    name: str | None = None
    """The named pace this came from (None for a custom pace)."""

    def __post_init__(self) -> None:
        assert 1 <= self.count <= pace_count_max
        assert pace_idle_seconds_min <= self.idle_seconds <= pace_idle_seconds_max
        assert self.idle_seconds <= self.max_wait_seconds <= pace_max_wait_seconds_max


named_paces: dict[str, Pace] = {
    "realtime": Pace(1, 1.0, 1.0, "realtime"),
    "quick": Pace(5, 30.0, 120.0, "quick"),
    "standard": Pace(10, 120.0, 600.0, "standard"),
    "relaxed": Pace(30, 600.0, 3600.0, "relaxed"),
}
pace_name_default = "standard"

assert pace_name_default in named_paces

__all__ = [
    "Pace",
    "named_paces",
    "pace_count_max",
    "pace_idle_seconds_max",
    "pace_idle_seconds_min",
    "pace_max_wait_seconds_max",
    "pace_name_default",
]
