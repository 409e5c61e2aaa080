"""The ``time`` grammar of ``/query_memory``: each token form, closed ranges, full ISO
timestamps falling into their hour, and what is invalid (→ ``None``)."""

from __future__ import annotations

import datetime

import pytest

from troupe.actors.character._time_tokens import (
    TimeInterval,
    format_wall_time,
    naive_utc,
    parse_time_tokens,
    seconds_from_naive,
    time_text_characters_max,
)


def utc(*parts: int) -> float:
    return datetime.datetime(*parts, tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("2026-05-01T14", utc(2026, 5, 1, 14), utc(2026, 5, 1, 15)),
        ("2026-05-01", utc(2026, 5, 1), utc(2026, 5, 2)),
        ("2026-05", utc(2026, 5, 1), utc(2026, 6, 1)),
        ("2026-12", utc(2026, 12, 1), utc(2027, 1, 1)),
        ("2026", utc(2026, 1, 1), utc(2027, 1, 1)),
        ("2026-05-01/2026-05-07", utc(2026, 5, 1), utc(2026, 5, 8)),
        ("2026-05-01..2026-05-07", utc(2026, 5, 1), utc(2026, 5, 8)),
        ("2026-05..2026-06", utc(2026, 5, 1), utc(2026, 7, 1)),
        ("2025/2026", utc(2025, 1, 1), utc(2027, 1, 1)),
        ("2026-05-01T14/2026-05-01T14", utc(2026, 5, 1, 14), utc(2026, 5, 1, 15)),
        # Full ISO timestamps mean their hour; an offset keeps the wall-clock reading.
        ("2026-05-01T14:37:12", utc(2026, 5, 1, 14), utc(2026, 5, 1, 15)),
        ("2026-05-01T14:37:12.123Z", utc(2026, 5, 1, 14), utc(2026, 5, 1, 15)),
        ("2026-05-01T14:37+08:00", utc(2026, 5, 1, 14), utc(2026, 5, 1, 15)),
        (" 2026-05-01 ", utc(2026, 5, 1), utc(2026, 5, 2)),
    ],
)
def test_valid_forms(text: str, start: float, end: float) -> None:
    assert parse_time_tokens(text) == TimeInterval(start, end)


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "   ",
        "yesterday",
        "2026-5-1",
        "2026-13",
        "2026-02-30",
        "2026-05-01T24",
        "2026-05-01T14:61",
        "2026-05-07/2026-05-01",  # ends before it starts
        "2026-05-01/",
        "/2026-05-01",
        "2026-05-01/2026-05-02/2026-05-03",
        "26-05-01",
    ],
)
def test_invalid_forms_are_none(text: str | None) -> None:
    assert parse_time_tokens(text) is None


def test_length_limit_at_and_over_the_boundary() -> None:
    at_limit = "2026-05-01" + " " * (time_text_characters_max - len("2026-05-01"))
    assert len(at_limit) == time_text_characters_max
    assert parse_time_tokens(at_limit) is not None
    assert parse_time_tokens(at_limit + " ") is None


def test_interval_distance() -> None:
    interval = TimeInterval(100.0, 200.0)
    assert interval.distance_seconds(150.0) == 0.0
    assert interval.distance_seconds(50.0) == 50.0
    assert interval.distance_seconds(250.0) == 50.0
    assert interval.distance_seconds(50.0, 120.0) == 0.0
    assert interval.distance_seconds(200.0) == 0.0  # half-open: the end touches
    assert interval.contains(100.0) and not interval.contains(200.0)


def test_formatting_round_trips_in_utc() -> None:
    seconds = utc(2026, 5, 2, 10, 0, 0)
    assert format_wall_time(seconds) == "2026-05-02T10:00:00"
    assert format_wall_time(None) is None
    assert seconds_from_naive(naive_utc(seconds)) == seconds
