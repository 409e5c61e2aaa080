"""The time-window grammar of recall (the ``character`` contract's ``time`` field).

Why it exists: callers say "when" in coarse, human units — an hour, a day, a month, a year,
or a closed range of two of those — and recall turns that into one half-open interval
``[start, end)`` to filter or order by.  Parsing is strict: anything else is invalid, and the
router decides what invalid means (ignored when a query is present).

Trade-offs: times are naive wall-clock datetimes, as the contract writes them.  A timestamp
with an offset keeps its stated wall-clock time (the offset is dropped, not applied), because
the stored memories carry the user's local time too.  A full ISO timestamp means "the hour it
falls in", so ``2026-05-01T14:37:00`` and ``2026-05-01T14`` select the same window.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

from ._exceptions import InvalidTimeWindow

time_window_text_characters_max = 64

_epoch = datetime.datetime(1970, 1, 1)

_token_pattern = re.compile(
    r"""(?P<year>\d{4})
        (?:-(?P<month>\d{2})
          (?:-(?P<day>\d{2})
            (?:[T ](?P<hour>\d{2})
              (?::(?P<minute>\d{2})(?::(?P<second>\d{2})(?:[.,]\d{1,9})?)?)?
              (?:Z|[+-]\d{2}(?::?\d{2})?)?
            )?
          )?
        )?""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class TimeWindow:
    """A half-open interval ``[start, end)`` of naive wall-clock time."""

    start: datetime.datetime
    end: datetime.datetime

    def __post_init__(self) -> None:
        assert self.start < self.end, (self.start, self.end)

    @property
    def start_seconds(self) -> float:
        return seconds_from_datetime(self.start)

    @property
    def end_seconds(self) -> float:
        return seconds_from_datetime(self.end)


def seconds_from_datetime(moment: datetime.datetime) -> float:
    """Naive wall-clock time as seconds on a fixed axis (aware times keep their wall clock)."""
    return (moment.replace(tzinfo=None) - _epoch).total_seconds()


def datetime_from_seconds(seconds: float) -> datetime.datetime:
    return _epoch + datetime.timedelta(seconds=seconds)


def _add_months(moment: datetime.datetime, months: int) -> datetime.datetime:
    total = moment.year * 12 + (moment.month - 1) + months
    return moment.replace(year=total // 12, month=total % 12 + 1)


def _parse_token(token: str) -> TimeWindow:
    match = _token_pattern.fullmatch(token.strip())
    if match is None:
        raise InvalidTimeWindow(f"not a time: {token!r}")
    parts = match.groupdict()
    try:
        start = datetime.datetime(
            int(parts["year"]),
            int(parts["month"] or 1),
            int(parts["day"] or 1),
            int(parts["hour"] or 0),
        )
        # Validates minute and second even though the window is the whole hour.
        if parts["minute"] is not None:
            datetime.time(int(parts["hour"]), int(parts["minute"]), int(parts["second"] or 0))
    except ValueError as exc:
        raise InvalidTimeWindow(f"not a time: {token!r}") from exc
    if parts["hour"] is not None:
        end = start + datetime.timedelta(hours=1)
    elif parts["day"] is not None:
        end = start + datetime.timedelta(days=1)
    elif parts["month"] is not None:
        end = _add_months(start, 1)
    else:
        end = _add_months(start, 12)
    return TimeWindow(start, end)


def parse_time_window(text: str) -> TimeWindow:
    """Parses hour / day / month / year, or a closed range ``A/B`` or ``A..B``.

    Raises ``InvalidTimeWindow`` for anything else, including a range that ends before it
    starts.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidTimeWindow("empty time")
    if len(text) > time_window_text_characters_max:
        raise InvalidTimeWindow("time too long")
    for separator in ("..", "/"):
        if separator in text:
            first, _, second = text.partition(separator)
            lower, upper = _parse_token(first), _parse_token(second)
            if upper.end <= lower.start or lower.start > upper.start:
                raise InvalidTimeWindow(f"range ends before it starts: {text!r}")
            return TimeWindow(lower.start, upper.end)
    return _parse_token(text)
