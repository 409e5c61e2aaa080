"""How a question becomes a full-text query.

Why it exists: people ask recall in sentences ("What did Caroline paint last summer?",
"用户喜欢什么食物？"), and OR-ing every word makes the commonest words — question words,
auxiliaries, particles — decide which rows are scanned and how they are scored.  This module
keeps the content terms, drops function words in both languages, and writes a safe FTS5
MATCH expression (every term quoted, so user text is never FTS5 syntax).

Trade-offs: the stop lists are short and conservative; a query made only of stop words keeps
its words rather than becoming empty.  No synonyms or spelling correction: the vector half of
hybrid recall is where fuzzy matching belongs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._tokenizer import is_cjk, query_numbers, query_terms

query_terms_max = 32

english_stop_words = frozenset(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing done down during each
    either ever few for from further get gets got had has have having he her here hers herself
    him himself his how i if in into is it its itself just kind let likely me might more
    most much must my myself no nor not now of off on once only or other ought our ours
    ourselves out over own per quite rather really same several shall she should so some such
    than that the their theirs them themselves then there these they thing things this those
    though through thus to too under until up upon us very via was way we well were what
    whatever when whenever where whether which while who whoever whom whose why will with
    within without would yet you your yours yourself yourselves s t d ll m re ve""".split()
)

# Question words, particles and pronouns that carry no topic.  Bigrams that contain a
# particle are also dropped: in a bigram index they are mostly word-boundary noise.
chinese_stop_bigrams = frozenset(
    """什么 怎么 怎样 为什 哪里 哪些 哪个 哪儿 是不 不是 是否 有没 没有 多少 几个 如何 请问
    我们 你们 他们 她们 它们 这个 那个 这些 那些 一个 一下 时候 可以 就是 还是 但是 因为
    所以 如果 或者 以及 还有""".split()
)
chinese_particles = frozenset("的了吗呢吧啊呀么嘛哦啦")


def is_stop_term(term: str) -> bool:
    if is_cjk(term):
        if len(term) == 1:
            return term in chinese_particles
        return term in chinese_stop_bigrams or any(c in chinese_particles for c in term)
    return term in english_stop_words


def content_terms(text: str, *, characters: bool = False) -> list[str]:
    """The distinct content terms of a query, in order; stop words only if nothing else.

    ``characters``: also the characters of the query's short Chinese words (see
    ``query_terms``), for recall's text lists; term-share checks (forget) and feedback terms
    keep the plain terms."""
    terms = list(dict.fromkeys(query_terms(text, characters=characters)))
    content = [term for term in terms if not is_stop_term(term)]
    return (content or terms)[:query_terms_max]


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


@dataclass(frozen=True)
class TextQuery:
    """A query's content terms and the FTS5 MATCH expression that ORs them."""

    terms: tuple[str, ...]
    # Terms searched in the message and its context only (besides single CJK characters,
    # which always are): the digits a numeral adds (``query_numbers``).
    content_only: frozenset[str] = frozenset()

    @property
    def is_empty(self) -> bool:
        return not self.terms

    def match_expression(self, columns: tuple[str, ...] | None = None) -> str:
        """``"a" OR "b" OR "星"``, optionally restricted to ``columns``."""
        assert self.terms
        # One character is a token of its own (colocated with its bigrams): no prefix query.
        # It is searched in the message and its context only: in the time words (星期一,
        # 下午, 5月8日) a character is in every item and would make each of them a match.
        expression = " OR ".join(
            "{text context} : " + _quoted(term)
            if (is_cjk(term) and len(term) == 1) or term in self.content_only
            else _quoted(term)
            for term in self.terms
        )
        if columns:
            return "{" + " ".join(columns) + "} : (" + expression + ")"
        return expression


def text_query(text: str, *, characters: bool = False) -> TextQuery:
    terms = tuple(content_terms(text, characters=characters))
    return TextQuery(terms, content_only=query_numbers(text).intersection(terms))
