"""CPU per recall at scale, split by stage: prints one JSON line (not a test; nothing asserts).

Why: on the 2 shared cores wall-clock latencies are mostly other people's work; what a change to
``troupe.retrieval`` can move is the CPU one recall costs.  This script runs the recalls of the
two surfaces whose 100k targets depend on it, in process and one at a time, and reports
process CPU per recall (every thread: ``time.process_time``) and, per stage, the worker
thread's CPU (``time.thread_time``) inside the storage read:

- ``text``: ``_store.text_search_lists`` (the BM25 lists, every weighting), ``newest``:
  ``_store.newest_matches``, ``counts``: ``_store.matching_items`` (term counts, cached),
  ``vector``: ``VectorIndex.search``, ``fusion``: ``fuse_candidates``, ``fetch``:
  ``_store.fetch_items``.

Corpora:

- ``--corpus host``: the store ``bench/host_intake.py --phase prepare --data-dir DIR`` leaves
  (100k memories in one entry); the recall prepare runs (``RecallFilter("host",
  viewer=entry)``, limit 8, the index's default settings) for ``prepare_queries``.  Copy the
  directory first if it must stay pristine (opening it runs migrations and may re-index).
- ``--corpus character``: one character with ``--facts`` facts written the way
  ``bench/character.py`` loads them (built into ``--data-dir`` when it holds fewer), queried
  through ``CharacterRecall.recall`` with ``bench/character.py``'s ``query_texts``; also the
  same queries with a month window and time-only recall.

Query embedding is excluded (each query's vector is computed once, before timing).

    python bench/recall_cpu.py --corpus host --data-dir /tmp/hostbench-copy [--runs 3]
    python bench/recall_cpu.py --corpus character --data-dir /tmp/characterbench [--facts 100000]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if "--tree" in sys.argv:  # another checkout's ``troupe`` (e.g. before a change), for A/B runs
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])

from troupe.retrieval import _memory_index, _store, _vector_index  # noqa: E402

stage_seconds: dict[str, float] = defaultdict(float)


def _timed_stage(name: str, function: Any) -> Any:
    @functools.wraps(function)
    def wrapper(*arguments: Any, **keywords: Any) -> Any:
        began = time.thread_time()
        try:
            return function(*arguments, **keywords)
        finally:
            stage_seconds[name] += time.thread_time() - began

    return wrapper


def instrument() -> None:
    """Wraps the stages where ``_memory_index`` looks them up (module attributes)."""
    for name, attribute in (
        ("text", "text_search_lists"),
        ("newest", "newest_matches"),
        ("counts", "matching_items"),
        ("fetch", "fetch_items"),
    ):
        setattr(_store, attribute, _timed_stage(name, getattr(_store, attribute)))
    _memory_index.fuse_candidates = _timed_stage("fusion", _memory_index.fuse_candidates)
    _vector_index.VectorIndex.search = _timed_stage("vector", _vector_index.VectorIndex.search)


def percentiles(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(numpy.percentile(values, 50)), 3),
        "p99": round(float(numpy.percentile(values, 99)), 3),
        "mean": round(float(numpy.mean(values)), 3),
    }


async def measure(calls: list[Any], runs: int) -> dict[str, Any]:
    """Each call timed ``runs`` times (after one warm-up pass); medians across runs."""
    for call in calls:
        await call()
    per_run = []
    for _ in range(runs):
        cpu: list[float] = []
        stages: dict[str, list[float]] = defaultdict(list)
        for call in calls:
            stage_seconds.clear()
            began = time.process_time()
            await call()
            cpu.append((time.process_time() - began) * 1000)
            for name in ("text", "newest", "counts", "vector", "fusion", "fetch"):
                stages[name].append(stage_seconds.get(name, 0.0) * 1000)
        per_run.append({"cpu": percentiles(cpu), **{name: percentiles(v) for name, v in stages.items()}})
    merged: dict[str, Any] = {}
    for name in per_run[0]:
        merged[name] = {
            key: round(statistics.median(run[name][key] for run in per_run), 3) for key in ("p50", "p99", "mean")
        }
    merged["cpu_p99_runs"] = [run["cpu"]["p99"] for run in per_run]
    return merged


async def host_figures(arguments: argparse.Namespace, nursery: trio.Nursery) -> dict[str, Any]:
    from host_intake import memory_entry_id, prepare_queries

    from troupe.actors.host._memories import host_memory_indexes, memory_tenant
    from troupe.models import embedder_from_environment
    from troupe.retrieval import RecallFilter
    from troupe.runtime import real_env
    from troupe.server import default_surfaces, surface_migrations
    from troupe.storage import Engine

    env = real_env(arguments.data_dir)
    env.embedder = embedder_from_environment({**os.environ, "TROUPE_EMBEDDER": "hashed"})
    engine = await Engine.open(env, nursery=nursery, migrations=surface_migrations(default_surfaces()))
    began = time.perf_counter()
    index = await host_memory_indexes.index_for(engine, env.embedder)
    open_seconds = time.perf_counter() - began
    recall_filter = RecallFilter(memory_tenant, viewer=memory_entry_id)
    vectors = {text: await index.embed_query(text, recall_filter_tenant=memory_tenant) for text in prepare_queries}

    def call(text: str) -> Any:
        async def run() -> None:
            await index.recall(text, recall_filter=recall_filter, limit=8, query_vector=vectors[text])

        return run

    calls = [call(prepare_queries[number % len(prepare_queries)]) for number in range(arguments.requests)]
    figures = {"items": index._live_items(), "open_seconds": round(open_seconds, 1)}  # noqa: SLF001
    figures["recall"] = await measure(calls, arguments.runs)
    figures["per_query_cpu_ms"] = await per_query(prepare_queries, call)
    return figures


async def per_query(texts: list[str], call: Any) -> dict[str, float]:
    found = {}
    for text in texts:
        cpu = []
        for _ in range(5):
            began = time.process_time()
            await call(text)()
            cpu.append((time.process_time() - began) * 1000)
        found[text] = round(statistics.median(cpu), 2)
    return found


async def character_figures(arguments: argparse.Namespace, nursery: trio.Nursery) -> dict[str, Any]:
    import character as character_bench

    from troupe.actors.character._recall import CharacterRecallIndexes
    from troupe.models import embedder_from_environment
    from troupe.runtime import real_env
    from troupe.server import default_surfaces, surface_migrations
    from troupe.storage import Engine

    env = real_env(arguments.data_dir)
    env.embedder = embedder_from_environment({**os.environ, "TROUPE_EMBEDDER": "hashed"})
    engine = await Engine.open(env, nursery=nursery, migrations=surface_migrations(default_surfaces()))
    name = character_bench.character_name(character_bench.fact_character_prefix, 0)
    stored = await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'character_facts'").fetchone()[0])
    figures: dict[str, Any] = {}
    if stored:
        stored = await engine.read(lambda connection: connection.execute(
            "SELECT count(*) FROM character_facts").fetchone()[0])
    if stored < arguments.facts:
        figures.update(await character_bench.load_facts(env, engine, [name], arguments.facts))
    began = time.perf_counter()
    recall = await CharacterRecallIndexes().open_character(engine, name, embedder=env.embedder)
    figures["open_seconds"] = round(time.perf_counter() - began, 1)
    index = recall.index
    figures["items"] = index._live_items()  # noqa: SLF001
    texts = character_bench.query_texts
    vectors = {text: await index.embed_query(text, recall_filter_tenant=recall.tenant) for text in texts}
    original_embed = index.embed_query

    async def cached_embed(query: str, *, recall_filter_tenant: str) -> Any:
        if query in vectors:
            return vectors[query]
        return await original_embed(query, recall_filter_tenant=recall_filter_tenant)

    index.embed_query = cached_embed  # type: ignore[method-assign]

    def call(text: str | None, window: str | None = None) -> Any:
        async def run() -> None:
            await recall.recall(text, window, limit=10)

        return run

    calls = [call(texts[number % len(texts)]) for number in range(arguments.requests)]
    figures["recall"] = await measure(calls, arguments.runs)
    figures["per_query_cpu_ms"] = await per_query(texts, call)
    windowed = [call(texts[number % len(texts)], "2026-03") for number in range(arguments.requests // 4)]
    figures["with_time"] = await measure(windowed, arguments.runs)
    time_only = [call(None, "2026-03-01/2026-03-07") for _ in range(arguments.requests // 4)]
    figures["time_only"] = await measure(time_only, arguments.runs)
    return figures


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    instrument()
    async with trio.open_nursery() as nursery:
        if arguments.corpus == "host":
            figures = await host_figures(arguments, nursery)
        else:
            figures = await character_figures(arguments, nursery)
        nursery.cancel_scope.cancel()
    return {
        "bench": "recall_cpu",
        "corpus": arguments.corpus,
        "requests": arguments.requests,
        "runs": arguments.runs,
        "tree": arguments.tree or "working tree",
        "load_average": [round(value, 2) for value in os.getloadavg()],
        **figures,
    }


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", choices=["host", "character"], required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--facts", type=int, default=100_000, help="character corpus: facts to load")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", default=None, help="import troupe from this directory instead")
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse_arguments()), ensure_ascii=False))
