"""``/query_memory`` at scale: one character with ``--n`` facts, per-query cost of the
character's recall path (``StoreMemory.query_memory``: the recall handle, the routing, the
hybrid recall, the answer's hits), and of the same query through the character actor.  The
query mix: Chinese questions (every fact says 主人, the common term), a fixed food question,
English questions, a time window on every third, time-only on every eleventh, and every
thirteenth about a topic no fact mentions.

Why CPU time: the machine is shared; ``time.process_time`` counts this process's CPU (every
thread) and not the time it waited for a core.  Wall time is reported beside it.  Query
embedding is excluded: the embedder is the offline hashed one behind a cache that the warm-up
pass fills, so the timed passes embed nothing.  Prints one JSON line.

    python bench/character_recall.py --n 100000 [--queries 300] [--runs 3] [--no-embedder]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from troupe.actors.character import (  # noqa: E402
    CharacterSettings,
    QueryMemory,
    StoreMemory,
    character_actor_kind,
    character_surface_migrations,
)
from troupe.actors.character._character import CharacterPort  # noqa: E402
from troupe.actors.character._recall import CharacterRecallIndexes  # noqa: E402
from troupe.actors.character._store import NewFact, add_facts, facts_per_add_max  # noqa: E402
from troupe.models._hashed_embedder import HashedEmbedder  # noqa: E402
from troupe.runtime import ActorSystem  # noqa: E402
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine  # noqa: E402

character_name = "小天"
start_seconds = 1_735_689_600.0  # 2025-01-01T00:00:00Z
span_seconds = 2 * 365 * 24 * 3600.0

subjects = "主人 主人的妹妹 主人的朋友 主人的妈妈 主人的同事".split()
verbs = "喜欢 讨厌 做了 去了 画了 看了 买了 计划 讨论 想念 学习 修好 预订 跑了 写了".split()
objects = (
    "寿司 拉面 披萨 日落 博物馆 小说 吉他课 花园 马拉松 海边 音乐会 拼图 菜谱 山里 播客 "
    "新工作 钢琴 陶艺课 露营 生日派对 牙医 预算表 象棋 老桥 电影节 瑜伽 图书馆 星星 火锅 咖啡"
).split()
tails = "昨天 上周末 今天早上 和全家一起 下班后 在雨中 第一次 一遍又一遍 旅行前 周日".split()
absent = "冲绳 北极 火星 撒哈拉".split()
english = "the user loves sushi|the user plays guitar on Sundays|the user visited Kyoto with a friend".split("|")


def fact_text(generator: random.Random) -> str:
    if generator.random() < 0.2:
        return f"{generator.choice(english)} {generator.choice(('again', 'last year', 'often'))}"
    return (f"{generator.choice(subjects)}{generator.choice(tails)}{generator.choice(verbs)}"
            f"{generator.choice(objects)}，还{generator.choice(verbs)}{generator.choice(objects)}")


def query_set(count: int, seed: int) -> list[tuple[str | None, str | None]]:
    generator = random.Random(seed + 1)
    queries: list[tuple[str | None, str | None]] = []
    for number in range(count):
        text = f"主人什么时候{generator.choice(verbs)}{generator.choice(objects)}？"
        if number % 5 == 0:
            text = "用户喜欢什么食物？"
        if number % 7 == 0:
            text = f"does the user like {generator.choice(('sushi', 'guitar', 'Kyoto'))}"
        time_text = None
        if number % 3 == 0:
            time_text = f"2025-{1 + number % 12:02d}"
        if number % 13 == 0:
            text = f"主人什么时候去了{generator.choice(absent)}？"  # a topic no fact mentions
        if number % 11 == 0:
            text, time_text = None, f"2026-{1 + number % 12:02d}-0{1 + number % 9}"
        queries.append((text, time_text))
    return queries


class CachedEmbedder:
    """The hashed embedder behind a cache: the timed passes embed nothing (excluded)."""

    def __init__(self) -> None:
        self.inner = HashedEmbedder()
        self.name, self.dimensions, self.fingerprint = self.inner.name, self.inner.dimensions, self.inner.fingerprint
        self.embed_sync = self.inner.embed_sync
        self.cache: dict[str, numpy.ndarray] = {}

    def ready(self) -> bool:
        return True

    async def embed(self, texts, *, purpose):
        if purpose != "query":
            return await self.inner.embed(texts, purpose=purpose)
        missing = [text for text in texts if text not in self.cache]
        if missing:
            for text, vector in zip(missing, await self.inner.embed(missing, purpose=purpose), strict=True):
                self.cache[text] = vector
        return numpy.stack([self.cache[text] for text in texts])


def percentile(values: list[float], share: float) -> float:
    return round(float(numpy.percentile(values, share)), 3)


async def timed(function, passes: int) -> dict:
    runs = []
    for _ in range(passes):
        cpu, wall = [], []
        for call in function:
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            await call()
            cpu.append((time.process_time() - started_cpu) * 1000)
            wall.append((time.perf_counter() - started_wall) * 1000)
        runs.append({"cpu_p50": percentile(cpu, 50), "cpu_p99": percentile(cpu, 99),
                     "wall_p50": percentile(wall, 50), "wall_p99": percentile(wall, 99)})
    return {
        "cpu_p50_ms": statistics.median(run["cpu_p50"] for run in runs),
        "cpu_p99_ms": statistics.median(run["cpu_p99"] for run in runs),
        "wall_p50_ms": statistics.median(run["wall_p50"] for run in runs),
        "wall_p99_ms": statistics.median(run["wall_p99"] for run in runs),
        "runs": runs,
    }


async def run(arguments) -> dict:
    generator = random.Random(arguments.seed)
    with tempfile.TemporaryDirectory() as directory:
        env = real_env(directory)
        if not arguments.no_embedder:
            env = dataclasses.replace(env, embedder=CachedEmbedder())
        async with trio.open_nursery() as nursery:
            engine = await Engine.open(env, nursery=nursery, migrations=list(character_surface_migrations))
            started = time.perf_counter()
            for first in range(0, arguments.n, facts_per_add_max):
                batch = [
                    NewFact(f"fact_{number:07d}", fact_text(generator),
                            event_start_at=start_seconds + generator.random() * span_seconds)
                    for number in range(first, min(arguments.n, first + facts_per_add_max))
                ]
                await engine.write(lambda connection, batch=batch: add_facts(
                    connection, character_name, batch, start_seconds + span_seconds))
            store_seconds = time.perf_counter() - started
            memory = StoreMemory(recall_indexes=CharacterRecallIndexes())
            port = CharacterPort(character_name, 0, env, engine)
            started = time.perf_counter()
            await memory.query_memory(port, "寿司", None)  # opens and reconciles the handle
            open_seconds = time.perf_counter() - started
            queries = query_set(arguments.queries, arguments.seed)
            hits = []

            def direct(query, time_text):
                async def call():
                    result = await memory.query_memory(port, query, time_text)
                    hits.append(len(result.results))
                return call

            calls = [direct(query, time_text) for query, time_text in queries]
            for call in calls:  # warm-up: fills the query-embedding cache
                await call()
            hits.clear()
            direct_figures = await timed(calls, arguments.runs)

            system = ActorSystem(env, [character_actor_kind(CharacterSettings(memory=memory))], storage=engine)
            await nursery.start(system.run)
            character = system.ref("character", character_name)

            def through_actor(query, time_text):
                async def call():
                    await character.ask(QueryMemory(query=query, time=time_text))
                return call

            actor_calls = [through_actor(query, time_text) for query, time_text in queries]
            for call in actor_calls[:10]:
                await call()
            actor_figures = await timed(actor_calls, arguments.runs)
            nursery.cancel_scope.cancel()
    return {
        "bench": "character_recall",
        "n": arguments.n,
        "queries": arguments.queries,
        "embedder": "none" if arguments.no_embedder else "hashed (query embedding excluded)",
        "store_seconds": round(store_seconds, 1),
        "open_seconds": round(open_seconds, 1),
        "mean_hits": round(sum(hits) / max(len(hits), 1), 2),
        "query_memory": direct_figures,
        "through_actor": actor_figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-embedder", action="store_true")
    arguments = parser.parse_args()
    print(json.dumps(trio.run(run, arguments), ensure_ascii=False))


if __name__ == "__main__":
    main()
