"""What the common-query rule costs in recall quality at scale: prints one JSON line.

Why: ``RecallSettings.common_query_scored_rows`` (see "Common queries" in
``troupe/retrieval/_memory_index.py``) is approximate from ``common_query_items_min`` items on:
a query's terms in more than ``common_query_term_share_min`` of the items leave it when rarer
terms match, and a query whose matching terms are all common is ranked among its newest
matches only.  Small stores never meet it, so LoCoMo alone (``bench/recall_locomo.py``, a few
thousand turns) cannot measure it.  Here every LoCoMo conversation of ``--data`` goes into one
store first (the oldest items: the rule's window of newest matches is then least likely to
hold them) and ``--distractors`` items after it, in the same tenant and scope, so every
question searches the whole store: English and Chinese sentences from
``bench/recall_scale.py`` (their English words overlap LoCoMo's: paint, sister, beach,
concert ...), the host bench's memories and the character bench's facts.  Each question is
recalled twice on the same index, with the rule (the defaults) and without it
(``common_query_scored_rows=None``): recall@k per category (the share of a question's evidence
turns in the top k, as ``recall_locomo.py`` computes it), how many questions' top 10 changed,
and the process CPU per recall of each.

    python bench/recall_common_queries.py --data ../shared/bench-data/locomo-dev.json
        [--distractors 90000] [--embedder hashed|none] [--order first|last]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import recall_scale  # noqa: E402
from recall_locomo import conversation_turns, normalise_evidence, recall_share, resolve_embedder  # noqa: E402

from troupe.retrieval import (  # noqa: E402
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    RecallSettings,
    _memory_index,  # noqa: E402
    connection_setup,
    conversation_items,
    retrieval_migrations,
)
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

tenant = "mixed"
add_batch_items = 5000
host_words = ["看星星", "寿司", "望远镜", "猫咪", "考试", "生日", "礼物", "火锅", "电影", "演唱会", "旅行",
              "下雨", "咖啡", "游戏", "工作", "搬家", "跑步", "钢琴", "hiking", "coffee", "concert"]


def distractor_text(generator: random.Random, number: int) -> str:
    """Half ``recall_scale`` sentences, a quarter host memories, a quarter character facts."""
    draw = generator.random()
    if draw < 0.5:
        return recall_scale.memory_text(generator)
    words = generator.sample(host_words, 3)
    if draw < 0.75:
        return f"成员{number % 50}说{words[0]}和{words[1]}，还提到{words[2]}（第{number}条）"
    return f"主人说起{words[0]}和{words[1]}，还提到{words[2]}（第{number}条）"


def distractors(count: int, seed: int, start: datetime.datetime) -> list[MemoryItem]:
    generator = random.Random(seed)
    return [
        MemoryItem(key=f"distractor-{number}", text=distractor_text(generator, number), tenant=tenant,
                   created_at=start + datetime.timedelta(minutes=number))
        for number in range(count)
    ]


def summarise(rows: list[tuple[int, dict[int, float]]], ks: list[int]) -> dict:
    headline = [row for category, row in rows if category in (1, 2, 3, 4)]
    report = {f"r@{k}": round(statistics.mean(row[k] for row in headline), 4) for k in ks}
    for category in (1, 2, 3, 4, 5):
        chosen = [row for number, row in rows if number == category]
        if chosen:
            report[f"cat{category}_r@10"] = round(statistics.mean(row[10] for row in chosen), 4)
    return report


async def run(arguments: argparse.Namespace) -> dict:
    data = json.loads(Path(arguments.data).read_text())
    ks = [5, 10]
    embedder = resolve_embedder(arguments.embedder)
    with_rule = RecallSettings()
    without_rule = dataclasses.replace(with_rule, common_query_scored_rows=None)
    conversations = []
    for number, sample in enumerate(data):
        turns = conversation_turns(sample["conversation"])
        items = [dataclasses.replace(item, key=f"c{number}:{item.key}")
                 for item in conversation_items(turns, tenant=tenant)]
        conversations.append((number, sample, {turn.key for turn in turns}, items))
    turn_items = [item for _, _, _, items in conversations for item in items]
    start = max(item.created_at for item in turn_items) + datetime.timedelta(days=1)
    if arguments.order == "last":
        start = min(item.created_at for item in turn_items) - datetime.timedelta(days=400)
    filler = distractors(arguments.distractors, arguments.seed, start)
    ordered = turn_items + filler if arguments.order == "first" else filler + turn_items
    with tempfile.TemporaryDirectory() as directory:
        engine = await Engine.open(real_env(directory), migrations=retrieval_migrations(),
                                   connection_setup=connection_setup)
        try:
            index = await MemoryIndex.open(engine, embedder=embedder, settings=with_rule)
            began = time.perf_counter()
            for first in range(0, len(ordered), add_batch_items):
                await index.add(ordered[first:first + add_batch_items])
            build_seconds = time.perf_counter() - began
            recall_filter = RecallFilter(tenant=tenant)
            rows: dict[str, list[tuple[int, dict[int, float]]]] = {"with_rule": [], "without_rule": []}
            cpu_ms: dict[str, list[float]] = {"with_rule": [], "without_rule": []}
            changed = 0
            for number, sample, known, _ in conversations:
                for question in sample["qa"]:
                    evidence, _ = normalise_evidence(question.get("evidence", []), known)
                    if not evidence:
                        continue
                    evidence = [f"c{number}:{key}" for key in evidence]
                    text = question["question"]
                    vector = await index.embed_query(text, recall_filter_tenant=tenant)
                    ranked = {}
                    for name, settings in (("with_rule", with_rule), ("without_rule", without_rule)):
                        began_cpu = time.process_time()
                        result = await index.recall(text, recall_filter=recall_filter, limit=max(ks),
                                                    settings=settings, query_vector=vector)
                        cpu_ms[name].append((time.process_time() - began_cpu) * 1000)
                        ranked[name] = [hit.key for hit in result.hits]
                        rows[name].append((int(question["category"]),
                                           {k: recall_share(ranked[name], evidence, k) for k in ks}))
                    changed += ranked["with_rule"] != ranked["without_rule"]
        finally:
            await engine.aclose()
    return {
        "bench": "recall_common_queries",
        "data": Path(arguments.data).name,
        "embedder": getattr(embedder, "fingerprint", None),
        "order": arguments.order,
        "items": len(ordered),
        "conversation_turns": len(turn_items),
        "distractors": arguments.distractors,
        "common_query_items_min": _memory_index.common_query_items_min,
        "common_query_term_share_min": with_rule.common_query_term_share_min,
        "common_query_scored_rows": with_rule.common_query_scored_rows,
        "build_seconds": round(build_seconds, 1),
        "questions": len(rows["with_rule"]),
        "top10_changed": changed,
        "with_rule": summarise(rows["with_rule"], ks),
        "without_rule": summarise(rows["without_rule"], ks),
        "cpu_ms": {name: {"p50": round(float(numpy.percentile(values, 50)), 2),
                          "p99": round(float(numpy.percentile(values, 99)), 2)}
                   for name, values in cpu_ms.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--distractors", type=int, default=90_000)
    parser.add_argument("--embedder", default="hashed")
    parser.add_argument("--order", choices=["first", "last"], default="first",
                        help="where the conversations go: before the distractors (oldest) or after")
    parser.add_argument("--seed", type=int, default=11)
    print(json.dumps(trio.run(run, parser.parse_args()), ensure_ascii=False))


if __name__ == "__main__":
    main()
