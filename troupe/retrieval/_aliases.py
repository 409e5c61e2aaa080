"""Cross-script aliases that a tenant's own memories show: 特斯拉 ↔ Tesla.

Why it exists: a user writes a name in Latin letters one day and in Chinese the next, and
neither the text index nor the offline hashed vectors can tell that Tesla is 特斯拉.  No
dictionary of transliterations is shipped; the tenant's data says it when a memory writes the
two side by side — in brackets (特斯拉（Tesla）, Tesla (特斯拉)), with a slash (特斯拉/Tesla), or
with a linking phrase (特斯拉也叫Tesla, Tesla就是特斯拉).  Those pairs are gathered per tenant
as items are added (and from every live item at open), and a query that names one side gets
the other side's term added (``expand``).

Trade-offs: only explicit pairings count, not mere co-occurrence in one memory ("我在Starbucks
喝了咖啡" must not make 咖啡 an alias of Starbucks); the Chinese side is the segmenter's last
word before the Latin name (or the whole bracketed Chinese text after it), so 我买了一辆特斯拉（Tesla）
pairs 特斯拉, not the whole clause.  The table lives in memory (rebuilt at open by reading the
items that contain a bracket, a slash or a linking phrase); a deleted item's pairs stay until
the next open — an alias is a fact about names, not a memory to forget.  Bounded per tenant.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from ._segmenter import fold_characters, segment
from ._tokenizer import cjk_ranges

aliases_per_tenant_max = 10_000
alias_latin_words_max = 3
alias_chinese_characters_max = 8
alias_terms_added_max = 8

_latin = r"[A-Za-z][A-Za-z0-9'’.\-]*(?: [A-Za-z0-9][A-Za-z0-9'’.\-]*){0,2}"
_chinese = rf"[{cjk_ranges}](?:[{cjk_ranges}·・]*[{cjk_ranges}])?"
# A Chinese side with one of these is a pronoun phrase (他的英文名叫David), not a name.
non_name_characters = frozenset("的了我你他她它们这那")
_linking = r"(?:也叫|又叫|又名|也就是|就是|即|英文名叫|英文叫|中文名叫|中文叫)"
# (chinese first?, pattern): the Chinese group is 1, the Latin group is 2.
_patterns = (
    re.compile(rf"({_chinese})\s*[（(]\s*({_latin})\s*[)）]"),
    re.compile(rf"({_chinese})\s*/\s*({_latin})"),
    re.compile(rf"({_chinese})\s*[，,]?\s*{_linking}\s*({_latin})"),
)
_reversed_patterns = (
    re.compile(rf"({_latin})\s*[（(]\s*({_chinese})\s*[)）]"),
    re.compile(rf"({_latin})\s*/\s*({_chinese})"),
    re.compile(rf"({_latin})\s*[，,]?\s*{_linking}\s*({_chinese})"),
)
# What a text must contain to be worth reading for aliases (also the SQL pre-filter at open).
alias_markers = ("(", "（", "/", "也叫", "又叫", "又名", "就是", "即", "英文", "中文")


def _latin_name(text: str) -> str | None:
    words = unicodedata.normalize("NFKC", text).casefold().split()
    if not words or len(words) > alias_latin_words_max:
        return None
    return " ".join(word.strip(".-'’") for word in words)


def _chinese_name(run: str, *, last_word: bool) -> str | None:
    run = fold_characters(unicodedata.normalize("NFKC", run)).replace("・", "·")
    words = segment(run) if "·" not in run else [run]
    if last_word:
        # The last word, joined with the one before when it is a single character (特斯/拉).
        name = words[-1]
        if len(name) == 1 and len(words) > 1:
            name = words[-2] + name
    else:
        name = run
    if not 2 <= len(name) <= alias_chinese_characters_max:
        return None
    if any(character in non_name_characters for character in name):
        return None
    return name


def alias_pairs(text: str) -> list[tuple[str, str]]:
    """``(chinese, latin)`` pairs that ``text`` writes side by side."""
    if not any(marker in text for marker in alias_markers):
        return []
    pairs = []
    for pattern in _patterns:
        for match in pattern.finditer(text):
            chinese = _chinese_name(match.group(1), last_word=True)
            latin = _latin_name(match.group(2))
            if chinese and latin:
                pairs.append((chinese, latin))
    for pattern in _reversed_patterns:
        for match in pattern.finditer(text):
            latin = _latin_name(match.group(1))
            chinese = _chinese_name(match.group(2), last_word=False)
            if chinese and latin:
                pairs.append((chinese, latin))
    return pairs


class AliasTable:
    """Per-tenant name pairs across scripts, and the query expansion they allow."""

    def __init__(self) -> None:
        # tenant -> name -> the names it is paired with (both directions).
        self._by_tenant: dict[str, dict[str, set[str]]] = {}

    def observe(self, tenant: str, text: str) -> None:
        """Records the pairs ``text`` shows for ``tenant``."""
        for chinese, latin in alias_pairs(text):
            names = self._by_tenant.setdefault(tenant, {})
            if len(names) >= aliases_per_tenant_max:
                return
            names.setdefault(chinese, set()).add(latin)
            names.setdefault(latin, set()).add(chinese)

    def observe_all(self, rows: Iterable[tuple[str, str]]) -> None:
        for tenant, text in rows:
            self.observe(tenant, text)

    def aliases(self, tenant: str) -> dict[str, frozenset[str]]:
        return {name: frozenset(paired) for name, paired in self._by_tenant.get(tenant, {}).items()}

    def expand(self, tenant: str, query: str, terms: tuple[str, ...]) -> tuple[str, ...]:
        """``terms`` plus the aliases of the names ``query`` contains (at most
        ``alias_terms_added_max`` added).  A Chinese name counts when it is in the folded
        query text; a Latin one when all its words are query terms."""
        names = self._by_tenant.get(tenant)
        if not names:
            return terms
        folded = fold_characters(unicodedata.normalize("NFKC", query)).casefold()
        words = set(re.findall(r"[a-z0-9'’.\-]+", folded))
        added: list[str] = []
        for name, paired in names.items():
            present = name in folded if _is_chinese(name) else set(name.split()) <= words
            if not present:
                continue
            for alias in sorted(paired):
                for term in alias.split() if not _is_chinese(alias) else (alias,):
                    if term not in terms and term not in added:
                        added.append(term)
        return terms + tuple(added[:alias_terms_added_max])


def _is_chinese(name: str) -> bool:
    return bool(re.match(_chinese, name))
