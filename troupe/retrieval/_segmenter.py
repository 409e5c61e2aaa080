"""Chinese word segmentation and character folding, loaded once per process on first use.

Why it exists: CJK bigrams alone cannot find a one-character word inside a longer query (in
用户的猫叫什么名字 the word 猫 only exists as the bigram 猫叫, which never meets 橘猫).  The
query side needs to know where its words are, to add each content word's characters as
terms of their own; this module holds the segmenter that tells it (``rjieba``, the Rust port of
jieba, whose dictionary ships inside the wheel: nothing is downloaded) and the folding that
makes 貓 and 猫, ｆｕｌｌ and full, the same text at index and query time.

Trade-offs: the segmenter is only used on the query side (and to read aliases): the index
emits every character as a token colocated with its bigram, which is a superset of anything a
segmentation could yield and immune to segmentation ambiguity (我家的橘猫叫小橘 segments as
橘/猫叫, so a segmented index would never hold 猫 there).  Importing rjieba costs ~0.25 s and
~20 MB, paid on the first Chinese query of the process, not at import of troupe; a cut costs
a few microseconds.  Traditional characters are folded one to one from OpenCC's table (the
``opencc-python-reimplemented`` package ships it): phrase-level conversions (乾 → 干 or 乾)
are ambiguous and left alone, and a one-to-one map keeps the tokenizer's offsets exact.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path

_load_lock = threading.Lock()


def _table_lines() -> list[str]:
    import opencc  # the package is only the carrier of the table

    path = Path(opencc.__file__).parent / "dictionary" / "TSCharacters.txt"
    return path.read_text(encoding="utf-8").splitlines()


@functools.cache
def _traditional_table() -> dict[int, int]:
    """Traditional -> simplified, character to character, unambiguous entries only."""
    with _load_lock:
        table: dict[int, int] = {}
        for line in _table_lines():
            traditional, _, candidates = line.partition("\t")
            choices = candidates.split()
            if len(traditional) != 1 or not choices or traditional in choices:
                continue
            if len(choices[0]) == 1:
                table[ord(traditional)] = ord(choices[0])
        return table


def fold_characters(run: str) -> str:
    """A CJK run with traditional characters made simplified (same length, same offsets)."""
    return run.translate(_traditional_table())


@functools.cache
def _cut() -> Callable[[str], list[str]]:
    with _load_lock:
        import rjieba

        return rjieba.cut


def segment(run: str) -> list[str]:
    """The words of a folded CJK run, in order (their lengths add up to the run's)."""
    return _cut()(run)
