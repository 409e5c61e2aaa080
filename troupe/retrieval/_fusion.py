"""Reciprocal-rank fusion: merging ranked lists whose scores are not comparable.

Why RRF: BM25 scores, cosine similarities and "message in context" scores live on different
scales that shift with every corpus and query; ranks do not.  Each list contributes
``weight / (rank_constant + rank)`` per item (rank counted from 1), so an item near the top
of several lists beats one that tops a single list.  Weights let a caller trust one list
more (exact words over fuzzy vectors, say).

Trade-off: RRF throws the score gaps away, so a list's very confident first hit counts only
as much as any other first hit.  ``rank_constant`` (60 in the original paper) sets how fast
credit decays down a list; smaller values reward the top ranks more.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

rrf_rank_constant_default = 60.0

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class RankedList:
    """One candidate list, best first, and how much the fusion trusts it."""

    name: str
    keys: Sequence[Hashable]
    weight: float = 1.0


def reciprocal_rank_fusion(
    lists: Sequence[RankedList],
    *,
    rank_constant: float = rrf_rank_constant_default,
    limit: int | None = None,
) -> list[tuple[Hashable, float]]:
    """Fuses ranked lists into ``(key, score)`` pairs, best first.

    Ties are broken by the best rank an item reached in any list, then by the order of the
    lists and of the keys given, so the result is deterministic.  A key repeated inside one
    list counts only at its first rank.
    """
    assert rank_constant >= 0.0
    scores: dict[Hashable, float] = {}
    best_rank: dict[Hashable, tuple[int, int]] = {}
    for list_index, ranked in enumerate(lists):
        assert ranked.weight >= 0.0, ranked
        seen: set[Hashable] = set()
        for rank, key in enumerate(ranked.keys, start=1):
            if key in seen:
                continue
            seen.add(key)
            scores[key] = scores.get(key, 0.0) + ranked.weight / (rank_constant + rank)
            position = (rank, list_index)
            if key not in best_rank or position < best_rank[key]:
                best_rank[key] = position
    ordered = sorted(scores, key=lambda key: (-scores[key], best_rank[key]))
    if limit is not None:
        ordered = ordered[:limit]
    return [(key, scores[key]) for key in ordered]


def fusion_contributions(
    lists: Sequence[RankedList], key: Hashable, *, rank_constant: float = rrf_rank_constant_default
) -> Mapping[str, int]:
    """Where one key ranked in each list (for explanations and tests)."""
    return {ranked.name: list(ranked.keys).index(key) + 1 for ranked in lists if key in ranked.keys}
