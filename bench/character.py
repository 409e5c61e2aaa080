"""Character surface benchmark: prints one JSON line of figures (not a test; nothing here asserts time).

Why: issue 9 sets two targets on the N.E.K.O memory server surface: at least 1,000 ``/cache``
turns per second across 100 characters, and ``/query_memory`` p99 at most 20 ms with 100k
facts per character (embedding excluded).  This script measures both in one run, on 127.0.0.1
with an ephemeral port.

In this process, hypercorn (trio) serves the real character app as ``troupe serve`` builds it:
``new_character_surface()`` over a real ``Engine`` (default settings, so ``synchronous=FULL``)
in a temporary directory and the real ``ActorSystem`` with every surface's kinds and services,
the configured model (offline ``LocalModel`` by default, so the post-turn fact extraction that
every ``/cache`` registers runs in the background during the phase, as it would in production)
and the embedder chosen by ``--embedder`` (default ``hashed``, the offline default of
``troupe serve``; ``none`` makes recall BM25 only).

A load generator in a *separate process* (so that it does not share the server's interpreter
lock; the two processes still share the machine's cores, reported as ``cpu_count``) drives the
server over raw keep-alive HTTP/1.1 connections (a minimal client: httpx's own per-request cost
would be measured otherwise):

1. ``/cache``: ``--connections`` connections spread over ``--characters`` characters (each
   request goes to the next character of its connection's round: connection ``c``'s request
   ``n`` names character ``(c + n * connections) % characters``), each request one turn of two
   messages (user, assistant) as an ``input_history`` JSON string: turns/s, p50/p99, the
   server's CPU per turn (``cpu_ms_per_turn``: every thread, the background post-turn work
   done during the phase included; the figure the machine's other load changes least), the
   outbox backlog (post-turn tasks not yet run) at the end of the phase, the CPU per turn
   once that backlog is done too (``cpu_ms_per_turn_drained``) and the post-turn tasks per
   turn (``cache_outbox_tasks_per_turn``: below 1 when turns coalesced);
2. ``/query_memory``: ``--facts`` facts (100k by default) for each of ``--fact-characters``
   characters, loaded in bulk through the character store (``ensure_character`` +
   ``add_facts`` in write jobs of ``facts_per_add_max`` facts), the recall index opened in
   the background by a first query (timed separately: ``index_build_seconds``; the queries
   meanwhile answer 503, counted, and ``index_build_max_turn_ms`` is their longest turn),
   then ``--query-requests`` text
   queries over HTTP from ``--query-connections`` connections: p50/p99 as the client saw them,
   and the server's own ``elapsed_ms`` (the recall, which the route runs outside the actor's
   turn on a ``RecallLease``) p50/p99, so HTTP and actor overhead can be told from recall
   time.  ``query_concurrency`` says whether the queries ran side by side: the server's CPU
   share (every thread; 2.0 is two cores busy) and the trio loop's, and the leases' figures
   (``reading_max``: most recalls in flight at once, ``in_flight_mean``: the time-weighted
   mean over the phase, ``busy``/``revoked``: 503s).  ``--query-in-turn`` runs the recall
   inside the actor's turn instead, as before leases (one query of a character at a time), to
   compare in one run.  Then the same queries at two other loads: ``query_sequential``, one
   connection asking one query after another (a companion's model asks its tool calls one at
   a time), and ``query_open_loop``, one entry per ``--query-rates`` rate (50, 100, 150/s by
   default, each ``--query-rate-seconds`` after a warm-up): queries due at a fixed pace
   whatever the earlier ones did, from a pool of 64 connections, the latency running from
   each query's due time (``_load.open_loop``: late sends count against the figure and are
   counted, as are unsent and unanswered queries).  The closed loop of
   ``--query-connections`` measures capacity more than latency: its connections always wait,
   so its mean latency is connections / throughput (Little's law).  Smaller extra figures:
   the same queries with a ``time`` window (hybrid recall filtered to a month) and time-only
   recall.

"Embedding excluded": with the hashed embedder the query's embedding is a few tens of
microseconds of CPU and is included in the figures; ``--embedder none`` excludes it entirely.

Targets (issue 9): >= 1,000 ``/cache`` turns/s; ``/query_memory`` p99 <= 20 ms at 100k facts
(``targets_met`` judges it per load: one caller, each open-loop rate, the closed loop).

Usage: python bench/character.py [--characters 100] [--connections 32] [--seconds 10]
       [--facts 100000] [--fact-characters 1] [--query-requests 400] [--query-connections 4]
       [--query-rates 50,100,150] [--query-rate-seconds 5]
       [--phase all|cache|query] [--query-in-turn] [--embedder hashed|none] [--job-times]
       [--switch-interval S]
       [--profile cache|query|query_time|time_only|in_process]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.parse
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--tree" in sys.argv:  # another checkout's ``troupe`` (e.g. before a change), for A/B runs
    sys.path.insert(0, sys.argv[sys.argv.index("--tree") + 1])
from _load import (  # noqa: E402  (bench/ is first on sys.path)
    PhaseMeter,
    RawConnection,
    open_loop,
    open_loop_series,
    p99_targets_per_load,
    percentile,
    print_job_times,
    profiled_phase,
    rates_argument,
    rounded_ms,
    start_runtime,
    start_server,
    time_write_jobs,
)

bench_character_prefix = "bench-"
fact_character_prefix = "facts-"
warm_up_seconds = 1.5
index_build_seconds_max = 1800.0
"""The first query builds the character's recall index (100k items); it is asked in-process
with this timeout rather than over HTTP (whose handler gives up after 120 s)."""
backlog_wait_seconds_max = 60.0
query_rates_default = [50.0, 100.0, 150.0]
"""Open-loop query rates (per second, to one 100k-fact character).  One installation's main
server asks a character's memory a few times a minute (a tool call of its model, a new
dialog); 50-150/s is the load of dozens of such callers on one character."""
query_open_loop_connections = 64
"""The open loop's connection pool: at 150/s one connection is busy for one query's latency,
so 64 leave one idle unless queries take 400 ms (then sends are late, counted)."""
time_query_requests = 100
"""Requests of each extra query figure (with a time window; time only)."""


# ---------------------------------------------------------------------------- load generator
# Runs in a child process: ``character.py --client SPEC_JSON``; prints one JSON line.


def _request(method: str, path: str, port: int, body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


def character_name(prefix: str, number: int) -> str:
    return f"{prefix}{number}"


def _path(route: str, name: str) -> str:
    return f"/{route}/{urllib.parse.quote(name, safe='')}"


turn_lines = [
    ("今晚八点一起去天台看星星吧，记得带上望远镜", "好呀，我会准备热可可"),
    ("我周末想去吃寿司，你有推荐吗", "车站旁边那家回转寿司不错"),
    ("最近考试复习好累", "辛苦啦，要记得休息"),
    ("I went hiking with my sister yesterday", "That sounds lovely, where did you go?"),
    ("猫咪今天不太吃东西", "要不要带它去看看医生"),
]

query_texts = [
    "看星星", "寿司", "望远镜", "猫咪生病了", "考试复习计划", "生日礼物",
    "hiking trip", "新的工作", "演唱会门票", "下雨天的心情", "主人喜欢什么", "coffee",
]


def _turn_body(connection: int, sequence: int) -> bytes:
    user, assistant = turn_lines[(connection + sequence) % len(turn_lines)]
    history = [
        {"role": "user", "content": f"{user}（{connection}-{sequence}）"},
        {"role": "assistant", "content": assistant},
    ]
    document = {"input_history": json.dumps(history, ensure_ascii=False)}
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def _build(spec: dict[str, Any], connection: int, sequence: int) -> bytes:
    mode, port = spec["mode"], spec["port"]
    if mode == "cache":
        characters, connections = spec["characters"], spec["connections"]
        name = character_name(spec["prefix"], (connection + sequence * connections) % characters)
        return _request("POST", _path("cache", name), port, _turn_body(connection, sequence))
    if mode == "query":
        names = spec["names"]
        name = names[(connection + sequence) % len(names)]
        document: dict[str, Any] = {}
        if spec.get("with_query", True):
            document["query"] = query_texts[(connection * 7 + sequence) % len(query_texts)]
        if spec.get("time"):
            document["time"] = spec["time"]
        body = json.dumps(document, ensure_ascii=False).encode("utf-8")
        return _request("POST", _path("query_memory", name), port, body)
    raise SystemExit(f"unknown mode {mode}")


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    connections = spec["connections"]
    latencies: list[float] = []
    server_elapsed: list[float] = []
    candidates: list[int] = []
    errors: list[str] = []
    error_count = 0
    completed = 0
    answered = 0
    measuring = False
    deadline = spec.get("seconds")
    requests_max = spec.get("requests")
    started_requests = 0
    read_bodies = spec["mode"] == "query"

    async def worker(index: int) -> None:
        nonlocal completed, started_requests, error_count, answered
        stream = await trio.open_tcp_stream("127.0.0.1", spec["port"])
        connection = RawConnection(stream)
        sequence = 0
        async with stream:
            while True:
                if requests_max is not None:
                    if started_requests >= requests_max:
                        return
                    started_requests += 1
                request = _build(spec, index, sequence)
                sequence += 1
                began = time.perf_counter()
                status, body = await connection.exchange(request)
                elapsed = time.perf_counter() - began
                if status != 200:
                    error_count += 1
                    if len(errors) < 5:
                        errors.append(f"{status} {body[:300]!r}")
                    continue
                if read_bodies:
                    document = json.loads(body)
                    if document.get("error_code"):
                        error_count += 1
                        if len(errors) < 5:
                            errors.append(f"degraded {body[:300]!r}")
                        continue
                answered += 1
                if measuring or requests_max is not None:
                    latencies.append(elapsed)
                    completed += 1
                    if read_bodies:
                        server_elapsed.append(float(document["elapsed_ms"]))
                        candidates.append(int(document["candidates_total"]))

    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(worker, index)
        if deadline is not None:
            await trio.sleep(warm_up_seconds)
            measuring = True
            began = time.perf_counter()
            await trio.sleep(deadline)
            measuring = False
            elapsed = time.perf_counter() - began
            nursery.cancel_scope.cancel()
        else:
            began = time.perf_counter()
    if deadline is None:
        elapsed = time.perf_counter() - began
    result: dict[str, Any] = {
        "requests": completed,
        "answered_total": answered,
        "seconds": round(elapsed, 3),
        "requests_per_second": round(completed / elapsed, 1),
        "p50_ms": rounded_ms(percentile(latencies, 0.5)),
        "p99_ms": rounded_ms(percentile(latencies, 0.99)),
        "max_ms": rounded_ms(max(latencies, default=None)),
        "errors": errors,
        "error_count": error_count,
    }
    if read_bodies:
        result["server_p50_ms"] = percentile(server_elapsed, 0.5)
        result["server_p99_ms"] = percentile(server_elapsed, 0.99)
        result["candidates_median"] = percentile([float(value) for value in candidates], 0.5)
    return result


async def _open_loop_client(spec: dict[str, Any]) -> dict[str, Any]:
    """``_load.open_loop`` over the query requests: request ``n`` is ``_build``'s request
    ``n`` of connection 0 (the same names and queries as the closed loop); a degraded answer
    (``error_code``) counts as an error, as in ``_client``."""

    def refusal(status: int, body: bytes) -> str | None:
        if status != 200:
            return str(status)
        return "degraded" if json.loads(body).get("error_code") else None

    query_spec = {**spec, "mode": "query"}
    return await open_loop(
        port=spec["port"], rate=float(spec["rate"]), connections=spec["connections"],
        warm_up_seconds=warm_up_seconds, seconds=spec["seconds"],
        request_for=lambda number: _build(query_spec, 0, number), refusal=refusal,
    )


def client_main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    client = _open_loop_client if spec["mode"] == "query_open_loop" else _client
    print(json.dumps(trio.run(client, spec)), flush=True)


async def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the load generator in a child process (off this process's interpreter lock)."""
    command = [sys.executable, os.path.abspath(__file__), "--client", json.dumps(spec)]
    completed = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"load generator failed: {completed.stderr.decode()[-2000:]}")
    result = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    if result["errors"]:
        print(f"character bench: {spec['mode']} errors ({result['error_count']}): {result['errors']}",
              file=sys.stderr)
    return result


# ---------------------------------------------------------------------------- the server


async def start_character(nursery: trio.Nursery, data_dir: str, embedder_name: str,
                          outbox_batch_seconds: float | None = None) -> tuple[Any, Any, Any, int]:
    """The character app over the parts ``troupe serve`` starts (``bench/_load.start_runtime``)."""
    from troupe._config import ServeOptions
    from troupe.http import ShutdownSignal
    from troupe.server import SurfaceContext

    if outbox_batch_seconds is not None:
        import functools

        import troupe.http.character._surface as character_surface_module
        from troupe.actors.character import CharacterSettings

        character_surface_module.CharacterSettings = functools.partial(  # type: ignore[misc]
            CharacterSettings, outbox_batch_seconds=outbox_batch_seconds)
    runtime = await start_runtime(nursery, data_dir, {**os.environ, "TROUPE_EMBEDDER": embedder_name})
    env, engine, system = runtime.env, runtime.engine, runtime.system
    character = next(surface for surface in runtime.surfaces if surface.name == "character")
    context = SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)
    port = await start_server(nursery, character.create_app(context))
    from troupe.server._process import freeze_startup_heap

    freeze_startup_heap()  # as the ``troupe serve`` process does once it is ready
    return env, engine, system, port


fact_words = [
    "看星星", "寿司", "望远镜", "猫咪", "考试", "生日", "礼物", "火锅", "电影", "演唱会", "旅行",
    "下雨", "咖啡", "游戏", "工作", "搬家", "跑步", "钢琴", "hiking", "coffee", "concert",
]
fact_entities = ("master", "neko", "relationship")
fact_day_seconds = 86_400.0
fact_epoch_seconds = 1_767_225_600.0  # 2026-01-01T00:00:00Z: facts' events spread over 2026


async def load_facts(env: Any, engine: Any, names: list[str], count: int) -> dict[str, Any]:
    """``count`` active facts for each of ``names``, in bulk through the character store."""
    from troupe.actors.character import NewFact, add_facts, ensure_character
    from troupe.actors.character._store import facts_per_add_max

    chooser = random.Random(7)
    began = time.perf_counter()
    for name in names:
        await engine.write(lambda connection, name=name: ensure_character(connection, name, env.clock.wall()))
        for start in range(0, count, facts_per_add_max):
            facts = []
            for number in range(start, min(count, start + facts_per_add_max)):
                words = chooser.sample(fact_words, 3)
                event_start = fact_epoch_seconds + (number % 365) * fact_day_seconds
                facts.append(NewFact(
                    id=env.ids.new_id("fact_"),
                    text=f"主人说起{words[0]}和{words[1]}，还提到{words[2]}（第{number}条）",
                    entity=fact_entities[number % len(fact_entities)],
                    event_start_at=event_start if number % 2 == 0 else None,
                    event_end_at=event_start + 3600.0 if number % 2 == 0 else None,
                ))
            now = env.clock.wall()
            await engine.write(lambda connection, name=name, facts=facts, now=now: add_facts(connection, name, facts, now))
    return {"facts_per_character": count, "fact_characters": len(names),
            "fact_load_seconds": round(time.perf_counter() - began, 1)}


index_poll_seconds = 0.5


async def build_indexes(system: Any, names: list[str]) -> dict[str, Any]:
    """The first query of each character starts opening its recall index in the background
    (every fact is indexed or reconciled then) and answers 503 (``MemoryUnavailable`` with a
    retry delay) until it is ready; asked in-process, polled every ``index_poll_seconds``.
    ``index_build_unavailable_answers`` counts those 503s; ``index_build_max_turn_ms`` is the
    longest of those turns (no turn indexes anything itself any more)."""
    from troupe.actors.character import (
        MemoryResults,
        MemoryUnavailable,
        QueryMemory,
        character_kind_name,
    )

    began = time.perf_counter()
    unavailable = 0
    longest_turn = 0.0
    for name in names:
        while True:
            if time.perf_counter() - began > index_build_seconds_max:
                raise RuntimeError(f"the recall index of {name!r} was not built in {index_build_seconds_max} s")
            asked = time.perf_counter()
            reply = await system.ref(character_kind_name, name).ask(QueryMemory(query=query_texts[0]), timeout=60)
            longest_turn = max(longest_turn, time.perf_counter() - asked)
            if isinstance(reply, MemoryUnavailable):
                unavailable += 1
                await trio.sleep(index_poll_seconds)
                continue
            if not isinstance(reply, MemoryResults) or reply.error_code:
                raise RuntimeError(f"the first query of {name!r} failed: {reply!r}")
            break
    return {"index_build_seconds": round(time.perf_counter() - began, 1),
            "index_build_unavailable_answers": unavailable,
            "index_build_max_turn_ms": rounded_ms(longest_turn)}


async def in_process_recall(system: Any, name: str, requests: int) -> dict[str, Any]:
    """The same queries asked of the actor directly (no HTTP): the actor round trip and the
    recall's own ``elapsed_ms``, to split a miss between HTTP, the actor and the recall."""
    from troupe.actors.character import QueryMemory, character_kind_name

    reference = system.ref(character_kind_name, name)
    round_trips: list[float] = []
    recalls: list[float] = []
    for number in range(requests):
        began = time.perf_counter()
        reply = await reference.ask(QueryMemory(query=query_texts[number % len(query_texts)]), timeout=60)
        round_trips.append(time.perf_counter() - began)
        recalls.append(reply.elapsed_ms / 1000)
    return {
        "actor_p50_ms": rounded_ms(percentile(round_trips, 0.5)),
        "actor_p99_ms": rounded_ms(percentile(round_trips, 0.99)),
        "recall_p50_ms": rounded_ms(percentile(recalls, 0.5)),
        "recall_p99_ms": rounded_ms(percentile(recalls, 0.99)),
    }


async def outbox_backlog(engine: Any) -> int:
    """Outbox tasks not yet finished (the post-turn signals the phase registered)."""
    return await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM character_outbox WHERE state IN ('pending', 'running')").fetchone()[0])


async def outbox_tasks_per_turn(engine: Any, turns: int) -> float:
    """Post-turn tasks registered per answered turn (warm-up included): below 1 when turns
    coalesced into a pending task."""
    tasks = await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM character_outbox WHERE kind = 'post_turn_signal'").fetchone()[0])
    return round(tasks / max(1, turns), 3)


async def wait_for_backlog(engine: Any) -> tuple[int, float]:
    """Queries are timed in steady state: wait (bounded) until the cache phase's background
    tasks are done, since they compete for the same cores."""
    began = time.perf_counter()
    backlog = await outbox_backlog(engine)
    while backlog and time.perf_counter() - began < backlog_wait_seconds_max:
        await trio.sleep(0.5)
        backlog = await outbox_backlog(engine)
    return backlog, round(time.perf_counter() - began, 1)


async def cache_phase(arguments: argparse.Namespace, engine: Any, port: int, figures: dict[str, Any]) -> None:
    spec = {"mode": "cache", "port": port, "connections": arguments.connections, "seconds": arguments.seconds,
            "characters": arguments.characters, "prefix": f"{bench_character_prefix}{os.getpid()}-"}
    with profiled_phase(arguments, "cache"), PhaseMeter(engine) as meter:
        loop_began = time.thread_time()
        cache = await run_client(spec)
        loop_cpu = time.thread_time() - loop_began
    figures["cache_server"] = meter.figures
    # CPU per turn (warm-up included on both sides): what the machine's load changes least.
    turns = max(1, cache["answered_total"])
    figures["cache_server"]["cpu_ms_per_turn"] = round(meter.cpu_seconds / turns * 1000, 2)
    # The split by thread: the trio loop (HTTP, actor turns, the outbox runners) and the rest
    # (the storage writer and readers: SQL, commits).
    figures["cache_server"]["loop_cpu_ms_per_turn"] = round(loop_cpu / turns * 1000, 3)
    figures["cache_server"]["storage_threads_cpu_ms_per_turn"] = round((meter.cpu_seconds - loop_cpu) / turns * 1000, 3)
    figures["cache_turns_per_second"] = cache["requests_per_second"]
    figures["cache_p50_ms"], figures["cache_p99_ms"] = cache["p50_ms"], cache["p99_ms"]
    figures["cache_errors"] = cache["error_count"]
    figures["cache_outbox_backlog_after"] = await outbox_backlog(engine)
    # The same CPU with the phase's background work finished: what a turn costs in all.
    with PhaseMeter(engine) as drain:
        backlog, _ = await wait_for_backlog(engine)
    figures["cache_server"]["cpu_ms_per_turn_drained"] = round(
        (meter.cpu_seconds + drain.cpu_seconds) / max(1, cache["answered_total"]) * 1000, 2)
    figures["cache_server"]["drain_seconds"] = round(drain.wall_seconds, 2)
    figures["cache_outbox_tasks_per_turn"] = await outbox_tasks_per_turn(engine, cache["answered_total"])


in_process_turns_per_asker = 100
"""``--phase cache_in_process``: turns each of ``--connections`` askers sends."""


async def cache_in_process_phase(arguments: argparse.Namespace, engine: Any, system: Any,
                                 figures: dict[str, Any]) -> None:
    """The ``/cache`` turn without HTTP: ``--connections`` askers send ``CacheHistory`` to
    ``--characters`` characters (the HTTP phase's spread), so the CPU per turn splits into
    the actor turn (this phase, backlog excluded: ``cpu_ms_per_turn``), the post-turn work
    (``drain_cpu_ms_per_turn``, the backlog's CPU once the askers stopped, plus what ran
    meanwhile) and, by difference with the HTTP phase, HTTP."""
    from troupe.actors.character import (
        CacheHistory,
        HistoryCached,
        HistoryMessage,
        character_kind_name,
    )

    prefix = f"{bench_character_prefix}inproc-{os.getpid()}-"
    connections, characters = arguments.connections, arguments.characters

    def message(connection: int, sequence: int) -> Any:
        user, assistant = turn_lines[(connection + sequence) % len(turn_lines)]
        return CacheHistory(messages=(HistoryMessage("user", f"{user}（{connection}-{sequence}）"),
                                      HistoryMessage("assistant", assistant)))

    async def asker(connection: int, turns: int) -> None:
        for sequence in range(turns):
            name = character_name(prefix, (connection + sequence * connections) % characters)
            reply = await system.ref(character_kind_name, name).ask(message(connection, sequence), timeout=120)
            assert isinstance(reply, HistoryCached), reply

    async def run(turns: int) -> None:
        async with trio.open_nursery() as nursery:
            for connection in range(connections):
                nursery.start_soon(asker, connection, turns)

    # With the outbox held back (a long --outbox-batch-seconds) there is no backlog to wait for.
    draining = arguments.outbox_batch_seconds is None or arguments.outbox_batch_seconds < backlog_wait_seconds_max
    await run(max(1, characters // connections + 1))  # activate every character
    if draining:
        await wait_for_backlog(engine)
    turns_per_asker = arguments.in_process_turns or in_process_turns_per_asker
    total = turns_per_asker * connections
    with profiled_phase(arguments, "cache_in_process"), PhaseMeter(engine) as meter:
        loop_began = time.thread_time()
        await run(turns_per_asker)
        loop_cpu = time.thread_time() - loop_began
    with PhaseMeter(engine) as drain:
        drain_loop_began = time.thread_time()
        backlog = (await wait_for_backlog(engine))[0] if draining else await outbox_backlog(engine)
        drain_loop_cpu = time.thread_time() - drain_loop_began
    figures["in_process_cache"] = {
        "turns": total,
        "turns_per_second": round(total / meter.wall_seconds, 1),
        "cpu_ms_per_turn": round(meter.cpu_seconds / total * 1000, 3),
        "loop_cpu_ms_per_turn": round(loop_cpu / total * 1000, 3),
        "drain_cpu_ms_per_turn": round(drain.cpu_seconds / total * 1000, 3),
        "drain_loop_cpu_ms_per_turn": round(drain_loop_cpu / total * 1000, 3),
        "cpu_ms_per_turn_drained": round((meter.cpu_seconds + drain.cpu_seconds) / total * 1000, 3),
        "backlog_left": backlog,
        "server": meter.figures,
    }


async def query_phase(arguments: argparse.Namespace, env: Any, engine: Any, system: Any, port: int,
                      figures: dict[str, Any]) -> None:
    names = [character_name(fact_character_prefix, number) for number in range(arguments.fact_characters)]
    figures.update(await load_facts(env, engine, names, arguments.facts))
    figures.update(await build_indexes(system, names))
    common = {"mode": "query", "port": port, "names": names, "seconds": None,
              "connections": arguments.query_connections}
    await run_client({**common, "requests": 20})  # warm caches
    from troupe.actors.character import character_recall_indexes

    leases = character_recall_indexes.leases_for(engine)
    before = leases.statistics()
    with profiled_phase(arguments, "query"), PhaseMeter(engine) as meter:
        loop_began = time.thread_time()
        query = await run_client({**common, "requests": arguments.query_requests})
        loop_cpu = time.thread_time() - loop_began
    after = leases.statistics()
    figures["query_server"] = meter.figures
    figures["query_concurrency"] = {
        "recall": "in_turn" if arguments.query_in_turn else "leased",
        "connections": arguments.query_connections,
        "server_cpu_share": meter.figures["server_cpu_share"],
        "loop_cpu_share": round(loop_cpu / meter.wall_seconds, 2),
        "leased": after.leased - before.leased,
        "reading_max": after.reading_max,
        "in_flight_mean": round((after.reading_seconds - before.reading_seconds) / meter.wall_seconds, 2),
        "busy": after.busy - before.busy,
        "revoked": after.revoked - before.revoked,
    }
    figures["query_server"]["cpu_ms_per_query"] = round(meter.cpu_seconds / max(1, query["answered_total"]) * 1000, 2)
    # The event loop's part of it (HTTP, the actor turn, recall planning); the rest ran in
    # the read threads (SQLite, the graph search, fusion), mostly outside the interpreter lock.
    figures["query_server"]["loop_cpu_ms_per_query"] = round(loop_cpu / max(1, query["answered_total"]) * 1000, 2)
    figures["query_requests"] = query["requests"]
    figures["query_errors"] = query["error_count"]
    figures["query_p50_ms"], figures["query_p99_ms"] = query["p50_ms"], query["p99_ms"]
    figures["query_max_ms"] = query["max_ms"]
    figures["query_recall_p50_ms"] = query["server_p50_ms"]
    figures["query_recall_p99_ms"] = query["server_p99_ms"]
    figures["query_candidates_median"] = query["candidates_median"]
    # One caller at a time: a companion's model asks its tool calls one after another.
    sequential = await run_client({**common, "connections": 1, "requests": arguments.query_requests})
    figures["query_sequential"] = {key: sequential[key] for key in ("requests", "p50_ms", "p99_ms", "max_ms")}
    figures["query_sequential"]["recall_p50_ms"] = sequential["server_p50_ms"]
    figures["query_sequential"]["recall_p99_ms"] = sequential["server_p99_ms"]
    # Open loop: queries due at a fixed pace whatever the earlier ones did (latency from the
    # due time), the figure a latency target is judged by at a given load; the closed loop
    # above measures capacity (its always-waiting connections make latency = connections /
    # throughput, Little's law).
    figures["query_open_loop"] = await open_loop_series(engine, arguments.query_rates, lambda rate: run_client(
        {"mode": "query_open_loop", "port": port, "names": names, "rate": rate,
         "seconds": arguments.query_rate_seconds, "connections": query_open_loop_connections}))
    with profiled_phase(arguments, "query_time"):
        windowed = await run_client({**common, "requests": time_query_requests, "time": "2026-03"})
    figures["query_with_time_p50_ms"], figures["query_with_time_p99_ms"] = windowed["p50_ms"], windowed["p99_ms"]
    with profiled_phase(arguments, "time_only"):
        time_only = await run_client({**common, "requests": time_query_requests, "time": "2026-03-01/2026-03-07",
                                      "with_query": False})
    figures["time_only_p50_ms"], figures["time_only_p99_ms"] = time_only["p50_ms"], time_only["p99_ms"]
    with profiled_phase(arguments, "in_process"):
        figures["in_process"] = await in_process_recall(system, names[0], arguments.query_requests)


def recall_in_turn() -> None:
    """``--query-in-turn``: the route asks without a lease, so the recall runs inside the
    character's turn (the behaviour before leases), for a before/after comparison."""
    import troupe.http.character._app as character_app
    from troupe.actors.character import QueryMemory

    def in_turn(*, query: Any = None, time: Any = None, leased: bool = False) -> Any:
        return QueryMemory(query=query, time=time)

    character_app.QueryMemory = in_turn  # type: ignore[assignment]


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    if arguments.query_in_turn:
        recall_in_turn()
    figures: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        "note": "client and server processes share these cores",
        "embedder": arguments.embedder,
        "tree": arguments.tree or "working tree",
        "model": os.environ.get("TROUPE_MODEL", "local"),
    }
    job_times = time_write_jobs() if arguments.job_times else None
    with tempfile.TemporaryDirectory(prefix="troupe-bench-character-") as directory:
        async with trio.open_nursery() as nursery:
            env, engine, system, port = await start_character(nursery, directory, arguments.embedder,
                                                              arguments.outbox_batch_seconds)
            if arguments.phase in ("all", "cache"):
                figures.update({"characters": arguments.characters, "connections": arguments.connections,
                                "cache_seconds": arguments.seconds})
                await cache_phase(arguments, engine, port, figures)
            if arguments.phase == "cache_in_process":
                await cache_in_process_phase(arguments, engine, system, figures)
            if arguments.phase in ("all", "query") and arguments.facts > 0:
                if arguments.phase == "all":
                    backlog, waited = await wait_for_backlog(engine)
                    figures["cache_backlog_wait_seconds"] = waited
                    figures["cache_backlog_left"] = backlog
                await query_phase(arguments, env, engine, system, port, figures)
            targets = {}
            if "cache_turns_per_second" in figures:
                targets["cache_at_least_1000_turns_per_second"] = figures["cache_turns_per_second"] >= 1000
            if "query_p99_ms" in figures:
                targets.update(p99_targets_per_load(
                    "query", 20, one_caller_p99=figures["query_sequential"]["p99_ms"],
                    open_loop_runs=figures["query_open_loop"], closed_loop_p99=figures["query_p99_ms"],
                    connections=figures["query_concurrency"]["connections"]))
            figures["targets_met"] = targets
            if job_times is not None:
                print_job_times(job_times)
            with trio.move_on_after(30):
                await system.drain()
            nursery.cancel_scope.cancel()
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--characters", type=int, default=100, help="characters the /cache phase spreads over")
    parser.add_argument("--connections", type=int, default=32, help="/cache connections")
    parser.add_argument("--seconds", type=float, default=10.0, help="/cache phase duration (after a warm-up)")
    parser.add_argument("--facts", type=int, default=100_000, help="facts per query character")
    parser.add_argument("--fact-characters", type=int, default=1, help="characters loaded with --facts facts")
    parser.add_argument("--query-requests", type=int, default=400)
    parser.add_argument("--query-connections", type=int, default=4)
    parser.add_argument("--query-rates", type=rates_argument,
                        default=query_rates_default, help="open-loop queries/s, comma-separated")
    parser.add_argument("--query-rate-seconds", type=float, default=5.0, help="each open-loop rate's duration")
    parser.add_argument("--phase", choices=["all", "cache", "query", "cache_in_process"], default="all")
    parser.add_argument("--query-in-turn", action="store_true",
                        help="run each recall inside the actor's turn (before leases), to compare")
    parser.add_argument("--in-process-turns", type=int, default=None,
                        help=f"cache_in_process: turns per asker (default {in_process_turns_per_asker})")
    parser.add_argument("--outbox-batch-seconds", type=float, default=None,
                        help="the characters' outbox batching wait (experiment; a large value keeps "
                             "the post-turn work out of the phase)")
    parser.add_argument("--embedder", choices=["hashed", "none"], default="hashed",
                        help="hashed: troupe serve's offline default; none: BM25-only recall")
    parser.add_argument("--profile", choices=["cache", "cache_in_process", "query", "query_time", "time_only", "in_process"], default=None,
                        help="cProfile the server during this phase (stderr)")
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument("--job-times", action="store_true",
                        help="print the writer thread's time per kind of storage job (stderr)")
    parser.add_argument("--tree", default=None, help="import troupe from this directory instead (A/B runs)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the server process (experiment)")
    parsed = parser.parse_args()
    if parsed.switch_interval:
        sys.setswitchinterval(parsed.switch_interval)
    print(json.dumps(trio.run(main, parsed)), flush=True)
