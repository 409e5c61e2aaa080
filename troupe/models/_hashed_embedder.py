"""The offline default embedder: signed feature hashing of words, word pairs and n-grams.

Why it exists: recall must work on a fresh install with no network and no model download,
for Chinese and English alike.  A hashed bag of features is deterministic, needs no weights,
costs microseconds per text and still adds what BM25 lacks: partial word matches through
character n-grams (``paint``/``painting``/``painter``), a little word order through word
pairs, and Chinese matching that does not depend on word segmentation (character unigrams
and bigrams).

What it trades off: it knows no synonyms and no meaning; two texts are close only when they
share surface features.  It is a lexical similarity in a fixed vector space, which is
exactly what makes it a safe default next to BM25 and a poor substitute for a neural model.
Features are weighted with sublinear term frequency and no corpus statistics (IDF would make
the vector of a text change when other texts are added); a short stop-word list stands in
for IDF on the most frequent English words.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
import zlib
from collections.abc import Sequence

import numpy

from ._embedder import EmbeddingPurpose

hashed_dimensions_default = 384
hashed_feature_cache_entries_max = 1 << 18

_cjk_ranges = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_token_pattern = re.compile(rf"[{_cjk_ranges}]+|[^\W_{_cjk_ranges}]+")
_cjk_pattern = re.compile(rf"[{_cjk_ranges}]")

# The most frequent English function words and question words: without IDF they would
# dominate every vector.  Kept short on purpose; content words are never listed.
_stop_words = frozenset(
    """a about after again all also am an and any are as at be been before being both but by
    can could did do does doing done for from had has have having he her here hers him his how
    i if in into is it its itself just me my myself no nor not of off on once only or other our
    ours out over own same she should so some such than that the their theirs them then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours s t d ll m re ve""".split()
)

_word_weight = 1.0
_word_pair_weight = 0.6
_trigram_weight = 0.3
_cjk_unigram_weight = 0.5
_cjk_bigram_weight = 1.0


def _light_stem(word: str) -> str:
    """Strips the commonest English inflections so ``paints``/``painted`` share a feature.

    Deliberately crude (no Porter): trigrams already catch most of what stemming misses.
    """
    if len(word) <= 4 or not word.isascii():
        return word
    for suffix in ("ing", "ed", "es", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


@functools.lru_cache(maxsize=hashed_feature_cache_entries_max)
def _hashed_feature(feature: str, dimensions: int) -> int:
    """Maps a feature to a signed bucket: ``+(index+1)`` or ``-(index+1)``."""
    digest = zlib.crc32(feature.encode("utf-8"))
    index = (digest >> 1) % dimensions
    return index + 1 if digest & 1 else -(index + 1)


def text_features(text: str) -> dict[str, float]:
    """The weighted features of one text (weights before term-frequency damping)."""
    counts: dict[str, float] = {}

    def count(feature: str, weight: float) -> None:
        counts[feature] = counts.get(feature, 0.0) + weight

    normalised = unicodedata.normalize("NFKC", text).casefold()
    previous_word: str | None = None
    for match in _token_pattern.finditer(normalised):
        token = match.group()
        if _cjk_pattern.match(token):
            previous_word = None
            for index, character in enumerate(token):
                count("c" + character, _cjk_unigram_weight)
                if index + 1 < len(token):
                    count("C" + token[index : index + 2], _cjk_bigram_weight)
            continue
        if token in _stop_words:
            previous_word = None
            continue
        stem = _light_stem(token)
        count("w" + stem, _word_weight)
        if previous_word is not None:
            count("b" + previous_word + " " + stem, _word_pair_weight)
        previous_word = stem
        if len(token) >= 4 and not token.isdigit():
            padded = "<" + token + ">"
            for index in range(len(padded) - 2):
                count("t" + padded[index : index + 3], _trigram_weight)
    return counts


class HashedEmbedder:
    """Deterministic, offline, always ready; see the module docstring for what it is worth."""

    def __init__(self, dimensions: int = hashed_dimensions_default) -> None:
        assert dimensions >= 16
        self.dimensions = dimensions
        self.name = "hashed"
        self.fingerprint = f"hashed-ngrams-v1-d{dimensions}"

    def ready(self) -> bool:
        return True

    def embed_sync(self, texts: Sequence[str]) -> numpy.ndarray:
        """The synchronous core of ``embed`` (cheap enough to run on the caller's thread)."""
        matrix = numpy.zeros((len(texts), self.dimensions), dtype=numpy.float32)
        for row, text in enumerate(texts):
            vector = matrix[row]
            for feature, weight in text_features(text).items():
                bucket = _hashed_feature(feature, self.dimensions)
                # Sublinear damping: a word said five times is not five times as relevant.
                value = (1.0 + math.log(weight)) if weight >= 1.0 else weight
                if bucket > 0:
                    vector[bucket - 1] += value
                else:
                    vector[-bucket - 1] -= value
            norm = float(numpy.linalg.norm(vector))
            if norm > 0.0:
                vector /= norm
        return matrix

    async def embed(self, texts: Sequence[str], *, purpose: EmbeddingPurpose) -> numpy.ndarray:
        del purpose  # symmetric: queries and documents share one space
        return self.embed_sync(texts)
