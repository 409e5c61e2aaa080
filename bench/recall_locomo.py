"""Recall quality on LoCoMo-format conversations: troupe.retrieval against plain BM25.

Per conversation, every turn is indexed (``speaker: text`` at its session's date, with its
neighbouring turns as context) through the real ``MemoryIndex`` on a real storage ``Engine``,
then every question with resolvable evidence is asked.  recall@k is the share of a question's
evidence turns found in the top k, averaged over questions.  Categories 1-4 are the headline;
category 5 (adversarial) is reported separately.  A ``rank_bm25`` baseline over the same
turns runs in the same process.  Prints one JSON line.

    python bench/recall_locomo.py --data ../shared/bench-data/locomo-dev.json [--embedder hashed] [--k 5,10]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
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
    MemoryIndex,
    RecallFilter,
    RecallSettings,
    connection_setup,
    conversation_items,
    retrieval_migrations,
)
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--embedder", default="hashed")
    parser.add_argument("--k", default="5,10")
    parser.add_argument("--settings", default="{}", help="RecallSettings overrides as JSON")
    parser.add_argument("--context", default="2,2", help="turns before,after folded in")
    parser.add_argument("--embedding-cache", default=None, metavar="FILE.npz",
                        help="bench only: reuse embeddings across runs (query latency then excludes the model)")
    arguments = parser.parse_args()
    print(json.dumps(trio.run(run, arguments), ensure_ascii=False))


if __name__ == "__main__":
    main()
