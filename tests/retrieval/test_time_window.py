import datetime

import pytest

from troupe.retrieval import InvalidTimeWindow, parse_time_window


def d(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts)


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        ("2026-05-01T14", d(2026, 5, 1, 14), d(2026, 5, 1, 15)),
        ("2026-05-01T14:37:12", d(2026, 5, 1, 14), d(2026, 5, 1, 15)),
        ("2026-05-01T14:37:12.5+08:00", d(2026, 5, 1, 14), d(2026, 5, 1, 15)),
        ("2026-05-01T23:59Z", d(2026, 5, 1, 23), d(2026, 5, 2, 0)),
        ("2026-05-01", d(2026, 5, 1), d(2026, 5, 2)),
        ("2026-12", d(2026, 12, 1), d(2027, 1, 1)),
        ("2026", d(2026, 1, 1), d(2027, 1, 1)),
        ("2026-05-01/2026-05-07", d(2026, 5, 1), d(2026, 5, 8)),
        ("2026-05-01..2026-05-07", d(2026, 5, 1), d(2026, 5, 8)),
        ("2025..2026-02", d(2025, 1, 1), d(2026, 3, 1)),
        ("2026-05-01T10/2026-05-01T12", d(2026, 5, 1, 10), d(2026, 5, 1, 13)),
        ("2026-05-01/2026-05-01", d(2026, 5, 1), d(2026, 5, 2)),
    ],
)
def test_valid_windows(text, start, end):
    window = parse_time_window(text)
    assert (window.start, window.end) == (start, end)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "yesterday",
        "2026-13",
        "2026-02-30",
        "2026-05-01T24",
        "2026-05-01T14:61",
        "26-05-01",
        "2026-05-07/2026-05-01",
        "2026-05-01/",
        "/2026",
        "2026-05-01/2026-05-02/2026-05-03",
        "2026-05-01 .. tomorrow",
        "2026" * 40,
    ],
)
def test_invalid_windows(text):
    with pytest.raises(InvalidTimeWindow):
        parse_time_window(text)
