"""The ``time`` field of ``/query_memory``: tokens and closed intervals as seconds.

Why it exists: the contract lets the model's recall tool say "when" as an hour
(``2026-05-01T14``), a day (``2026-05-01``), a month (``2026-05``), a year (``2026``), or two of
those joined by ``/`` or ``..`` as a closed interval whose end token is included whole
(``2026-05-01/2026-05-07`` ends at the end of 7 May).  A full ISO timestamp means the hour it
falls in.  The character domain keeps every time as float wall seconds (``env.clock.wall()``),
so this module turns the text into one half-open interval ``[start, end)`` of those seconds,
or ``None`` when the text is not a valid time (the router then ignores it).

The grammar itself is ``troupe.retrieval.parse_time_window`` (the recall engine filters by the
same windows), so the two can never disagree on what a token means.

Zone: UTC, deliberately and without a setting.  Stored times are Unix seconds, the recall
engine compares naive wall-clock datetimes, and naive UTC is the one reading under which both
agree without a conversion on every item; the contract's times (``created_at``,
``event_start_at``) are naive ISO strings, which we write in UTC as well.  An offset in a token
(``...+08:00``) is dropped, not applied, as the recall engine does: the token's wall-clock
reading is kept.  A deployment that wants local days would need the items re-indexed in that
zone, so it is not a per-request switch.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from troupe.retrieval import InvalidTimeWindow, parse_time_window
from troupe.retrieval._time_window import time_window_text_characters_max

time_text_characters_max = time_window_text_characters_max
"""A ``time`` longer than this is invalid (two full ISO timestamps and a separator fit)."""

_epoch = datetime.datetime(1970, 1, 1)


@dataclass(frozen=True)
class TimeInterval:
    """``[start, end)`` in wall seconds (UTC)."""

    start: float
    end: float

    def __post_init__(self) -> None:
        assert self.start < self.end, (self.start, self.end)

    def contains(self, seconds: float) -> bool:
        return self.start <= seconds < self.end

    def distance_seconds(self, start: float, end: float | None = None) -> float:
        """How far the closed span ``[start, end]`` (a point when ``end`` is None) lies from
        this interval: 0 when they overlap."""
        end = start if end is None else max(start, end)
        if end < self.start:
            return self.start - end
        if start >= self.end:
            return start - self.end
        return 0.0


def parse_time_tokens(text: str | None) -> TimeInterval | None:
    """The interval ``text`` names, or ``None`` when it is missing, blank or invalid
    (including a range whose end comes before its start)."""
    if text is None or not isinstance(text, str) or not text.strip():
        return None
    try:
        window = parse_time_window(text)
    except InvalidTimeWindow:
        return None
    return TimeInterval(window.start_seconds, window.end_seconds)


def naive_utc(seconds: float) -> datetime.datetime:
    """Wall seconds as the naive UTC datetime the recall engine indexes."""
    return _epoch + datetime.timedelta(seconds=seconds)


def seconds_from_naive(moment: datetime.datetime) -> float:
    """The inverse of ``naive_utc`` (an aware datetime keeps its wall-clock reading)."""
    return (moment.replace(tzinfo=None) - _epoch).total_seconds()


def format_wall_time(seconds: float | None) -> str | None:
    """The contract's time format, ``2026-05-02T10:00:00`` (naive UTC, whole seconds)."""
    if seconds is None:
        return None
    return naive_utc(seconds).isoformat(timespec="seconds")


__all__ = [
    "TimeInterval",
    "format_wall_time",
    "naive_utc",
    "parse_time_tokens",
    "seconds_from_naive",
    "time_text_characters_max",
]
