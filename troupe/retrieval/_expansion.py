"""Fusing one recall's candidate lists, and the expansions that reach past the first pass.

Why it exists: a recall gathers several ranked lists (the message text, the message in its
conversation, the vectors, the named speaker's items, and the optional expansions below);
how they are weighed is the whole of "which memory comes first".  Keeping that step a pure
function over plain lists lets ``MemoryIndex`` run it inside its storage read and lets
``bench/recall_locomo.py --folds`` run it again offline over cached lists, for many weight
sets, without querying the index once per weight set: what is tuned is exactly what ships.

The expansions (each off when its weight is 0; ``RecallSettings`` says which are on):

- **neighbours**: the turns around the strongest first-pass hits (the same sitting, within
  ``neighbour_gap_seconds_max``) get a list of their own.  A multi-hop answer is often the
  turn after the one that names the topic.
- **feedback** (pseudo-relevance feedback): the content terms that several of the first-pass
  hits share, and the query lacks, form a second text query.  An open-domain question names
  a topic; the hits name the words the conversation used for it.
- **entities**: the query's names that are not speakers (capitalised words past the first,
  or words the tenant's speakers never own) form a text query of their own, so items in any
  session that mention the same entity rise together (linking mentions across sessions).

Trade-off: every list is fused by rank (``reciprocal_rank_fusion``), so a list only adds
credit; a weak expansion can still push a good first-pass hit past the cut, which is why each
is kept on by default only if held-out folds show it helps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ._fusion import RankedList, reciprocal_rank_fusion
from ._query import content_terms

# Turns are neighbours only within one sitting, as in ``conversation_items``.
neighbour_gap_seconds_max = 6 * 3600
neighbour_turns_max = 8
neighbour_hits_max = 20
feedback_hits_max = 20
feedback_terms_max = 16
# A feedback term must appear in at least this many of the first-pass hits: a word in one
# hit only is that hit's own, not the topic's.
feedback_hits_sharing_min = 2
entity_terms_max = 8


@dataclass(frozen=True)
class CandidateLists:
    """One recall's candidate lists, best first (item ids), before fusion.

    ``said`` holds the ids said by the speakers the query names (``None``: names none).
    ``feedback`` and ``entity`` are empty when their expansions are off or found nothing.
    """

    text: Sequence[int] = ()
    context: Sequence[int] = ()
    vector: Sequence[int] | None = None
    said: frozenset[int] | None = None
    feedback: Sequence[int] = ()
    entity: Sequence[int] = ()


@dataclass(frozen=True)
class FusionWeights:
    """The list weights of ``fuse_candidates`` (``RecallSettings`` carries the same names)."""

    rank_constant: float = 60.0
    text_weight: float = 1.0
    context_weight: float = 0.7
    vector_weight: float = 0.5
    speaker_weight: float = 0.5
    feedback_weight: float = 0.0
    entity_weight: float = 0.0
    neighbour_weight: float = 0.0
    neighbour_hits: int = 3
    neighbour_turns: int = 1

    def __post_init__(self) -> None:
        assert self.rank_constant >= 0.0
        assert min(
            self.text_weight, self.context_weight, self.vector_weight, self.speaker_weight,
            self.feedback_weight, self.entity_weight, self.neighbour_weight,
        ) >= 0.0
        assert 0 < self.neighbour_hits <= neighbour_hits_max
        assert 0 < self.neighbour_turns <= neighbour_turns_max


@dataclass(frozen=True)
class Fused:
    """The fused ranking, and every list that went into it (for ``RecallHit.ranks``)."""

    ranking: list[tuple[int, float]]
    lists: list[RankedList] = field(default_factory=list)


NeighboursOf = Callable[[int, int], Sequence[int]]
"""``neighbours_of(item_id, turns)``: the allowed items up to ``turns`` before and after
``item_id`` in the same sitting, nearest first."""


def fuse_candidates(
    candidates: CandidateLists,
    weights: FusionWeights,
    neighbours_of: NeighboursOf | None = None,
) -> Fused:
    """Fuses ``candidates`` by reciprocal rank: the base lists, then the named speaker's
    items in that order, then the neighbours of the strongest hits in that order."""
    lists: list[RankedList] = []
    for name, keys, weight in (
        ("text", candidates.text, weights.text_weight),
        ("context", candidates.context, weights.context_weight),
        ("vector", candidates.vector, weights.vector_weight),
        ("feedback", candidates.feedback, weights.feedback_weight),
        ("entity", candidates.entity, weights.entity_weight),
    ):
        # The base lists enter even at weight 0 (their ranks still explain a hit, as
        # before); an expansion only when it is on.
        if keys and (weight > 0.0 or name in ("text", "context", "vector")):
            lists.append(RankedList(name, keys, weight))
    fused = reciprocal_rank_fusion(lists, rank_constant=weights.rank_constant)
    if candidates.said is not None and weights.speaker_weight > 0.0:
        spoken = [item_id for item_id, _ in fused if item_id in candidates.said]
        lists.append(RankedList("speaker", spoken, weights.speaker_weight))
        fused = reciprocal_rank_fusion(lists, rank_constant=weights.rank_constant)
    if neighbours_of is not None and weights.neighbour_weight > 0.0 and fused:
        around = neighbour_list(
            [item_id for item_id, _ in fused[: weights.neighbour_hits]],
            neighbours_of,
            weights.neighbour_turns,
        )
        if around:
            lists.append(RankedList("neighbour", around, weights.neighbour_weight))
            fused = reciprocal_rank_fusion(lists, rank_constant=weights.rank_constant)
    return Fused(fused, lists)


def neighbour_list(hits: Sequence[int], neighbours_of: NeighboursOf, turns: int) -> list[int]:
    """The neighbours of ``hits`` (best hit first, nearest turn first), hits left out."""
    strong = set(hits)
    found: dict[int, None] = {}
    for hit in hits:
        for item_id in neighbours_of(hit, turns):
            if item_id not in strong:
                found.setdefault(item_id, None)
    return list(found)


def feedback_terms(
    hit_texts: Sequence[str], query_terms: Sequence[str], *, terms_max: int
) -> list[str]:
    """Content terms shared by at least ``feedback_hits_sharing_min`` of ``hit_texts`` and
    absent from the query, most shared first (ties: first seen), at most ``terms_max``."""
    assert 0 <= terms_max <= feedback_terms_max
    asked = set(query_terms)
    counts: Counter[str] = Counter()
    for text in hit_texts:
        counts.update(term for term in set(content_terms(text)) if term not in asked)
    order = {term: index for index, term in enumerate(counts)}
    shared = [term for term, count in counts.items() if count >= feedback_hits_sharing_min]
    shared.sort(key=lambda term: (-counts[term], order[term]))
    return shared[:terms_max]


def entity_terms(query: str, query_terms: Sequence[str], speaker_terms: Sequence[str]) -> list[str]:
    """The query's terms written capitalised past its first word (names: "Sweden", "Nike"),
    speakers' names left out (the speaker list covers them), at most ``entity_terms_max``."""
    words = query.replace("'s", " ").replace("’s", " ").split()
    named = {
        word.strip(".,!?;:\"'()").casefold()
        for position, word in enumerate(words)
        if position > 0 and word[:1].isupper()
    }
    speakers = set(speaker_terms)
    found = [term for term in query_terms if term in named and term not in speakers]
    return found[:entity_terms_max]
