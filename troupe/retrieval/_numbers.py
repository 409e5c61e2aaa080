"""Numbers written as words, read as the digits they mean: 三 ↔ 3, 二十 ↔ 20, three ↔ 3.

Why it exists: people write the same number three ways ("我有三只猫", "I have 3 cats",
"three cats"), and a text index that keeps only what was typed misses two of them.  The
tokenizer emits the digits as a token colocated with the numeral (index side) and the query
gains the digits as an extra term, so each form meets the others through the digits.

Trade-offs: a lone 一 is left alone (一起, 一下, 一直 are not the number one) and so is any
run that does not parse as a whole number (万一); 十分 ("very") still reads as 10, a little
noise that IDF discounts.  English covers zero to ninety-nine written as one word or as
"twenty three"/"twenty-three"; larger spelled-out numbers are rare in chat and left as words.
"""

from __future__ import annotations

import re

chinese_digit_values = {
    "零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4,
    "五": 5, "六": 6, "七": 7, "八": 8, "九": 9,
}
chinese_unit_values = {"十": 10, "百": 100, "千": 1000}
chinese_numeral_characters = "".join(chinese_digit_values) + "".join(chinese_unit_values) + "万"
chinese_numeral_pattern = re.compile(f"[{chinese_numeral_characters}]+")
# Longer numeral runs are not numbers people say (and would cost a parse per run).
chinese_numeral_characters_max = 12

english_number_values = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
}
english_tens_values = {
    "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
}
english_number_values.update(english_tens_values)


def _below_ten_thousand(run: str) -> int | None:
    """Parses 三, 二十, 十五, 一百零五, 三千二百 (no 万); ``None`` when it is not one number."""
    if all(character in chinese_digit_values for character in run):
        if len(run) == 1:
            return chinese_digit_values[run]
        # Digit by digit, as in years: 二〇二三 -> 2023.  两 is never read this way.
        if "两" in run:
            return None
        return int("".join(str(chinese_digit_values[character]) for character in run))
    total = 0
    pending: int | None = None
    last_unit = 10_000
    for character in run:
        if character in chinese_digit_values:
            if pending is not None and chinese_digit_values[character] != 0:
                return None  # two digits in a row inside a unit number: not a number
            pending = chinese_digit_values[character] or pending
            continue
        unit = chinese_unit_values[character]
        if unit >= last_unit:
            return None
        total += (1 if pending is None else pending) * unit
        pending = None
        last_unit = unit
    return total + (pending or 0)


def chinese_number_value(run: str) -> int | None:
    """The value of a Chinese numeral run, or ``None`` (see the module docstring)."""
    if not run or len(run) > chinese_numeral_characters_max or run in ("一", "万", "千", "百"):
        return None
    if run.count("万") > 1:
        return None
    if "万" in run:
        high, _, low = run.partition("万")
        high_value = _below_ten_thousand(high) if high else None
        low_value = _below_ten_thousand(low) if low else 0
        if high_value is None or low_value is None:
            return None
        return high_value * 10_000 + low_value
    return _below_ten_thousand(run)


def chinese_numbers(run: str) -> list[tuple[int, str]]:
    """``(offset in run, digits)`` for each numeral inside a CJK run."""
    found = []
    for match in chinese_numeral_pattern.finditer(run):
        value = chinese_number_value(match.group())
        if value is not None:
            found.append((match.start(), str(value)))
    return found


def english_number(word: str) -> str | None:
    """Digits for a case-folded English number word ("three", "twenty-three"), else ``None``."""
    value = english_number_values.get(word)
    if value is not None:
        return str(value)
    tens, hyphen, unit = word.partition("-")
    if hyphen and tens in english_tens_values and unit in english_number_values:
        unit_value = english_number_values[unit]
        if 0 < unit_value < 10:
            return str(english_tens_values[tens] + unit_value)
    return None
