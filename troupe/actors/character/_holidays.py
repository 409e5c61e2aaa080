"""Chinese public holidays and observances by date: the holiday line of ``/new_dialog``.

Why a static table: the context must render offline and deterministically (the simulator
replays it byte for byte), so there is no calendar service and no lunar-calendar computation.
Fixed-date days are listed once; days that follow the lunar calendar (春节, 元宵节, 端午节,
七夕, 中秋节, 重阳节, 除夕) and 清明节 (a solar term) are listed per year for
``lunar_table_years``.  Outside those years only the fixed-date days are known, which is the
honest degradation: a missing holiday line, never a wrong one.

Dates are local dates in China (UTC+8, ``china_utc_offset_seconds``): "today" for a Chinese
holiday is the Beijing date, whatever zone the stored times use.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

china_utc_offset_seconds = 8 * 3600
"""China Standard Time: the zone holiday dates are reckoned in."""
upcoming_days_max = 3
"""A holiday this many days ahead (or fewer) is mentioned as upcoming."""

_fixed: dict[tuple[int, int], str] = {
    (1, 1): "元旦",
    (2, 14): "情人节",
    (3, 8): "妇女节",
    (3, 12): "植树节",
    (4, 1): "愚人节",
    (5, 1): "劳动节",
    (5, 4): "青年节",
    (6, 1): "儿童节",
    (7, 1): "建党节",
    (8, 1): "建军节",
    (9, 10): "教师节",
    (10, 1): "国庆节",
    (12, 24): "平安夜",
    (12, 25): "圣诞节",
}

# (month, day) per year of the lunar-calendar festivals and 清明 (a solar term).
_by_year: dict[int, dict[str, tuple[int, int]]] = {
    2024: {"除夕": (2, 9), "春节": (2, 10), "元宵节": (2, 24), "清明节": (4, 4),
           "端午节": (6, 10), "七夕节": (8, 10), "中秋节": (9, 17), "重阳节": (10, 11)},
    2025: {"除夕": (1, 28), "春节": (1, 29), "元宵节": (2, 12), "清明节": (4, 4),
           "端午节": (5, 31), "七夕节": (8, 29), "中秋节": (10, 6), "重阳节": (10, 29)},
    2026: {"除夕": (2, 16), "春节": (2, 17), "元宵节": (3, 3), "清明节": (4, 5),
           "端午节": (6, 19), "七夕节": (8, 19), "中秋节": (9, 25), "重阳节": (10, 18)},
    2027: {"除夕": (2, 5), "春节": (2, 6), "元宵节": (2, 20), "清明节": (4, 5),
           "端午节": (6, 9), "七夕节": (8, 8), "中秋节": (9, 15), "重阳节": (10, 8)},
    2028: {"除夕": (1, 25), "春节": (1, 26), "元宵节": (2, 9), "清明节": (4, 4),
           "端午节": (5, 28), "七夕节": (8, 26), "中秋节": (10, 3), "重阳节": (10, 26)},
    2029: {"除夕": (2, 12), "春节": (2, 13), "元宵节": (2, 27), "清明节": (4, 4),
           "端午节": (6, 16), "七夕节": (8, 16), "中秋节": (9, 22), "重阳节": (10, 16)},
    2030: {"除夕": (2, 2), "春节": (2, 3), "元宵节": (2, 17), "清明节": (4, 5),
           "端午节": (6, 5), "七夕节": (8, 5), "中秋节": (9, 12), "重阳节": (10, 5)},
}
lunar_table_years = (min(_by_year), max(_by_year))


@dataclass(frozen=True)
class Holiday:
    name: str
    date: datetime.date


def holidays_on(date: datetime.date) -> list[str]:
    """The holidays and observances falling on ``date`` (fixed ones first)."""
    names = []
    fixed = _fixed.get((date.month, date.day))
    if fixed is not None:
        names.append(fixed)
    for name, (month, day) in _by_year.get(date.year, {}).items():
        if (month, day) == (date.month, date.day):
            names.append(name)
    return names


def china_date(wall_seconds: float) -> datetime.date:
    """The Beijing calendar date at ``wall_seconds``."""
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(
        seconds=wall_seconds + china_utc_offset_seconds
    )
    return moment.date()


def upcoming_holidays(today: datetime.date, days: int = upcoming_days_max) -> list[Holiday]:
    """Holidays after ``today`` up to ``days`` ahead, nearest first."""
    found = []
    for offset in range(1, days + 1):
        date = today + datetime.timedelta(days=offset)
        found.extend(Holiday(name, date) for name in holidays_on(date))
    return found


def holiday_context(wall_seconds: float) -> str:
    """The ``/new_dialog`` holiday line (``""`` when nothing is near)."""
    today = china_date(wall_seconds)
    parts = []
    names = holidays_on(today)
    if names:
        parts.append(f"今天是{'、'.join(names)}。")
    for holiday in upcoming_holidays(today):
        days = (holiday.date - today).days
        when = "明天" if days == 1 else ("后天" if days == 2 else f"{days}天后")
        parts.append(f"{when}（{holiday.date.month}月{holiday.date.day}日）是{holiday.name}。")
    return "".join(parts)


__all__ = [
    "Holiday",
    "china_date",
    "china_utc_offset_seconds",
    "holiday_context",
    "holidays_on",
    "lunar_table_years",
    "upcoming_days_max",
    "upcoming_holidays",
]
