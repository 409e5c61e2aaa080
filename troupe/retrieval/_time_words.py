"""A memory's time, written as words the text index can match.

Why it exists: people ask "what did we do in May 2023?" or "上周五说了什么" and remember
dates by month, weekday and part of day, while items carry timestamps.  Indexing the date in
words (English and Chinese) lets a query that names a date find the items of that date
through ordinary BM25, with no date parser in the query path.  Hard time filtering is the job
of ``TimeWindow``; this is only a soft, lexical signal in its own low-weight column.
"""

from __future__ import annotations

import datetime

_months = (
    "January February March April May June July August September October November December"
).split()
_weekdays = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
_chinese_weekdays = "一二三四五六日"


def _part_of_day(hour: int) -> tuple[str, str]:
    if hour < 5:
        return "night", "凌晨"
    if hour < 12:
        return "morning", "上午"
    if hour < 18:
        return "afternoon", "下午"
    return "evening", "晚上"


def time_words(moment: datetime.datetime | None) -> str:
    """``"Monday 8 May 2023 afternoon 2023年5月8日 星期一 下午"`` (empty for ``None``)."""
    if moment is None:
        return ""
    english_part, chinese_part = _part_of_day(moment.hour)
    return (
        f"{_weekdays[moment.weekday()]} {moment.day} {_months[moment.month - 1]} {moment.year}"
        f" {english_part} {moment.year}年{moment.month}月{moment.day}日"
        f" 星期{_chinese_weekdays[moment.weekday()]} {chinese_part}"
    )
