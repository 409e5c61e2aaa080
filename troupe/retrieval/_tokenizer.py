"""One tokenizer for Chinese and English in the same FTS5 corpus.

Why it exists: SQLite's ``unicode61`` treats a run of Chinese characters as one token and
``trigram`` never matches two-character queries (星星, 寿司).  Chinese has no spaces and
segmentation needs a dictionary, so CJK runs become overlapping character bigrams: every
two-character word is a token, longer words are phrases of bigrams, and no dictionary is
needed.  Latin-script words are NFKC-normalised and case-folded here; stemming is left to
SQLite's C ``porter`` tokenizer, which wraps this one (``tokenize='porter troupe_mixed'``)
and only touches ASCII words.

Trade-offs: bigrams that straddle two words (``喜欢什么`` yields ``欢什``) are noise that
BM25's IDF mostly discounts; the index is about one token per CJK character.  A CJK run's
last character is also emitted alone, so that a one-character query can be answered with a
prefix query (``星*`` matches every bigram that starts with 星 plus the final unigrams)
without indexing every character twice.

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

import apsw
import apsw._unicode

tokenizer_name = "troupe_mixed"
# Inputs up to this many UTF-8 bytes are memoised, in an LRU of this many entries.
tokenizer_cache_input_bytes_max = 160
tokenizer_cache_entries_max = 16_384
fts5_tokenize_spec = f"porter {tokenizer_name}"

cjk_ranges = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_token_pattern = re.compile(rf"[{cjk_ranges}]+|[^\W_{cjk_ranges}]+(?:['’][^\W_{cjk_ranges}]+)*")
_cjk_pattern = re.compile(rf"[{cjk_ranges}]")


def _normalise_word(word: str) -> str:
    word = unicodedata.normalize("NFKC", word).casefold()
    # Possessives and contractions index as their stem: "caroline's" -> "caroline".
    for apostrophe in ("'", "’"):
        if apostrophe in word:
            word = word.split(apostrophe, 1)[0]
    return word


def document_tokens(text: str, *, query: bool = False) -> Iterator[tuple[int, int, str]]:
    """``(start, end, token)`` in string offsets, as FTS5 indexes them (before porter).

    With ``query`` (FTS5 tokenizing a MATCH string) a CJK run of two or more characters yields
    only its bigrams, so that a quoted run is a phrase of consecutive document bigrams.
    """
    for match in _token_pattern.finditer(text):
        start, end = match.span()
        token = match.group()
        if _cjk_pattern.match(token):
            run = unicodedata.normalize("NFKC", token)
            if len(run) != len(token):  # compatibility forms: keep offsets honest
                run = token
            for index in range(len(run) - 1):
                yield start + index, start + index + 2, run[index : index + 2]
            if len(run) == 1 or not query:
                yield end - 1, end, run[-1]
            continue
        word = _normalise_word(token)
        if word:
            yield start, end, word


def _utf8_tokens(utf8: bytes, query: bool) -> list[tuple[int, int, str]]:
    """``document_tokens`` with UTF-8 byte offsets, as FTS5 wants them."""
    if utf8.isascii():
        return list(document_tokens(utf8.decode("ascii"), query=query))
    mapper = apsw._unicode.to_utf8_position_mapper(utf8)
    return [
        (mapper(start), mapper(end), token)
        for start, end, token in document_tokens(mapper.str, query=query)
    ]


@functools.lru_cache(maxsize=tokenizer_cache_entries_max)
def _utf8_tokens_memoised(utf8: bytes, query: bool) -> tuple[tuple[int, int, str], ...]:
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


def query_terms(text: str) -> list[str]:
    """Query-side terms (before stemming): words, CJK bigrams, lone CJK characters.

    Unlike ``document_tokens`` a CJK run of two or more characters yields only its bigrams (a
    trailing unigram would match far too much); a one-character run is kept as the single
    character and searched as a prefix.
    """
    terms: list[str] = []
    for match in _token_pattern.finditer(text):
        token = match.group()
        if _cjk_pattern.match(token):
            run = unicodedata.normalize("NFKC", token)
            if len(run) == 1:
                terms.append(run)
            else:
                terms.extend(run[index : index + 2] for index in range(len(run) - 1))
            continue
        word = _normalise_word(token)
        if word:
            terms.append(word)
    return terms


def is_cjk(term: str) -> bool:
    return bool(_cjk_pattern.match(term))
