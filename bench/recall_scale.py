"""Filtered hybrid recall at scale: build time, query latency, resident memory.

Generates ``--n`` mixed Chinese/English memories deterministically (seeded), spread over
tenants, scopes, kinds and two years, indexes them through ``MemoryIndex`` on a real storage
``Engine`` with the offline hashed embedder, then runs filtered hybrid recalls (tenant + scope,
some with a time window).  Query embedding is timed separately from recall.  The query set
is run ``--runs`` times on the same index and the reported p50/p99 are the medians over runs
(each run's figures are listed too): a single p99 over 300 queries is three samples, and one
scheduler hiccup moves it.  Prints one JSON line.

    python bench/recall_scale.py --n 100000 [--queries 300] [--runs 3] [--seed 7]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from troupe.models._hashed_embedder import HashedEmbedder  # noqa: E402
from troupe.retrieval import (  # noqa: E402
    MemoryIndex,
    MemoryItem,
    RecallFilter,
    connection_setup,
    retrieval_migrations,
)
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

tenants = 10
scopes_per_tenant = 20
add_batch_items = 10_000

english_subjects = "I we my sister my brother the kids my friend Anna Tom the team my mom".split(" ")
english_verbs = (
    "love hate cooked visited painted watched read bought planned discussed missed found "
    "practised learned fixed booked ran played wrote"
).split()
english_objects = (
    "sushi ramen pizza a sunset the museum a novel guitar lessons the garden a marathon "
    "the beach a concert a puzzle a recipe the mountains a podcast a new job the piano "
    "pottery class a camping trip a birthday party the dentist a budget spreadsheet "
    "a chess match the old bridge a film festival a yoga retreat the city library"
).split(" ")
english_objects = [
    " ".join(english_objects[i : i + 2]) for i in range(0, len(english_objects) - 1, 2)
]
english_tails = (
    "yesterday|last weekend|this morning|with the whole family|after work|in the rain|"
    "for the first time|again and again|before the trip|on Sunday"
).split("|")
chinese_subjects = "我 我们 妹妹 哥哥 孩子们 朋友 小天 妈妈 同事".split()
chinese_verbs = "喜欢 讨厌 做了 去了 画了 看了 买了 计划 讨论 想念 学习 修好 预订 跑了 写了".split()
chinese_objects = (
    "寿司 拉面 披萨 日落 博物馆 小说 吉他课 花园 马拉松 海边 音乐会 拼图 菜谱 山里 播客 "
    "新工作 钢琴 陶艺课 露营 生日派对 牙医 预算表 象棋 老桥 电影节 瑜伽 图书馆 星星 火锅 咖啡"
).split()
chinese_tails = "昨天 上周末 今天早上 和全家一起 下班后 在雨中 第一次 一遍又一遍 旅行前 周日".split()


def memory_text(generator: random.Random) -> str:
    if generator.random() < 0.5:
        return (
            f"{generator.choice(english_subjects)} {generator.choice(english_verbs)} "
            f"{generator.choice(english_objects)} {generator.choice(english_tails)}"
            f" and {generator.choice(english_verbs)} {generator.choice(english_objects)}"
        )
    return (
        f"{generator.choice(chinese_subjects)}{generator.choice(chinese_tails)}"
        f"{generator.choice(chinese_verbs)}{generator.choice(chinese_objects)}，"
        f"还{generator.choice(chinese_verbs)}{generator.choice(chinese_objects)}"
    )


def memory_items(count: int, seed: int):
    generator = random.Random(seed)
    start = datetime.datetime(2024, 1, 1)
    for number in range(count):
        tenant = generator.randrange(tenants)
        yield MemoryItem(
            key=f"m{number}",
            text=memory_text(generator),
            tenant=f"tenant{tenant}",
            scope=f"scope{generator.randrange(scopes_per_tenant)}",
            kind=generator.choice(("fact", "fact", "reflection", "message")),
            created_at=start + datetime.timedelta(minutes=generator.randrange(2 * 365 * 24 * 60)),
        )


def query_texts(count: int, seed: int) -> list[str]:
    generator = random.Random(seed + 1)
    queries = []
    for _ in range(count):
        if generator.random() < 0.5:
            queries.append(
                f"when did {generator.choice(english_subjects)} "
                f"{generator.choice(english_verbs)} {generator.choice(english_objects)}?"
            )
        else:
            queries.append(
                f"{generator.choice(chinese_subjects)}什么时候"
                f"{generator.choice(chinese_verbs)}{generator.choice(chinese_objects)}？"
            )
    return queries


def resident_megabytes() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], share: float) -> float:
    return round(float(numpy.percentile(values, share)), 3)


async def run(arguments) -> dict:
    embedder = HashedEmbedder()
    generator = random.Random(arguments.seed + 2)
    with tempfile.TemporaryDirectory() as directory:
        engine = await Engine.open(
            real_env(directory), migrations=retrieval_migrations(), connection_setup=connection_setup
        )
        try:
            index = await MemoryIndex.open(
                engine, embedder=embedder, vector_path=str(Path(directory) / "vectors.usearch")
            )
            started = time.perf_counter()
            batch: list[MemoryItem] = []
            for entry in memory_items(arguments.n, arguments.seed):
                batch.append(entry)
                if len(batch) >= add_batch_items:
                    await index.add(batch)
                    batch = []
            if batch:
                await index.add(batch)
            build_seconds = time.perf_counter() - started
            started = time.perf_counter()
            index.save_vectors()
            save_seconds = time.perf_counter() - started
            queries = []
            for number, text in enumerate(query_texts(arguments.queries, arguments.seed)):
                tenant = f"tenant{generator.randrange(tenants)}"
                scopes = frozenset(f"scope{generator.randrange(scopes_per_tenant)}" for _ in "ab")
                window = f"{2024 + number % 2}-{1 + number % 12:02d}" if number % 3 == 0 else None
                queries.append((text, RecallFilter(tenant, scopes=scopes), window))
            embedding_ms, hits = [], []
            runs: list[tuple[float, float]] = []
            for _ in range(arguments.runs):
                recall_ms = []
                for text, recall_filter, window in queries:
                    started = time.perf_counter()
                    vector = await index.embed_query(
                        text, recall_filter_tenant=recall_filter.tenant
                    )
                    embedding_ms.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    result = await index.recall(
                        text, time=window, recall_filter=recall_filter, limit=10,
                        query_vector=vector,
                    )
                    recall_ms.append((time.perf_counter() - started) * 1000)
                    hits.append(len(result.hits))
                runs.append((percentile(recall_ms, 50), percentile(recall_ms, 99)))
            started = time.perf_counter()
            await MemoryIndex.open(
                engine, embedder=embedder, vector_path=str(Path(directory) / "vectors.usearch")
            )
            reopen_seconds = time.perf_counter() - started
        finally:
            await engine.aclose()
    return {
        "bench": "recall_scale",
        "n": arguments.n,
        "queries": arguments.queries,
        "embedder": embedder.fingerprint,
        "filter": "tenant (1/10) + 2 scopes (~1/10 of a tenant); every third query also a month",
        "recall_ms": {
            "p50": round(statistics.median(run[0] for run in runs), 3),
            "p99": round(statistics.median(run[1] for run in runs), 3),
            "runs": [{"p50": p50, "p99": p99} for p50, p99 in runs],
        },
        "query_embedding_ms": {
            "p50": percentile(embedding_ms, 50), "p99": percentile(embedding_ms, 99)
        },
        "mean_hits": round(statistics_mean(hits), 2),
        "build_seconds": round(build_seconds, 1),
        "vector_save_seconds": round(save_seconds, 1),
        "reopen_seconds": round(reopen_seconds, 1),
        "resident_mb": round(resident_megabytes(), 1),
        "peak_resident_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def statistics_mean(values: list[int]) -> float:
    return sum(values) / max(len(values), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    arguments = parser.parse_args()
    print(json.dumps(trio.run(run, arguments), ensure_ascii=False))


if __name__ == "__main__":
    main()
