"""Host surface benchmark: prints one JSON line of figures (not a test; nothing here asserts time).

In one run, on 127.0.0.1 with ephemeral ports, this process serves with hypercorn (trio):

- a bare quart-trio hello world (``GET /`` -> ``{"ok":true}``), the yardstick;
- the real host app as ``troupe serve`` builds it: a real ``Engine`` (default settings, so
  ``synchronous=FULL``) in a temporary directory, the real ``ActorSystem`` with every surface's
  kinds and services (the learning worker included, so learning runs during intake as it would
  in production), the configured model and embedder (offline defaults), and a real token.  The
  one difference: the per-token rate bucket (20/s, burst 60 by default) would turn a load test
  into a 429 test, so its limits are raised; the bucket is still taken on every request.

A load generator in a *separate process* (so that it does not share the server's interpreter
lock; the two processes still share the machine's cores, reported as ``cpu_count``) drives each
server over raw keep-alive HTTP/1.1 connections (a minimal client: httpx's own per-request cost
would be measured otherwise) and reports requests/s and latency percentiles:

- hello-world requests/s;
- single-message intake (one message per request, each connection posting to its own entry, as
  hosts post every group's messages), messages/s and the ratio to hello world;
- batched intake (arrays of 100 messages), messages/s;
- prepare p50/p99 with ``--memories`` memories (100k by default) in the entry's scope, loaded in
  bulk through the host memory store with the offline hashed embedder, queried over HTTP with
  text.

Targets (issue 7): single-message intake >= 50% of hello world; batched >= 20,000 messages/s;
prepare p99 <= 50 ms at 100k memories.

Usage: python bench/host_intake.py [--connections 32] [--seconds 10] [--memories 100000]
       [--prepare-requests 400] [--phase all|prepare] [--rounds N] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _load import (  # noqa: E402  (bench/ is first on sys.path)
    PhaseMeter,
    RawConnection,
    create_tokens,
    profiled_phase,
    start_runtime,
    start_server,
    time_write_jobs,
)

bench_entry_prefix = "bench:"
memory_entry_id = "bench:memories"
batch_messages = 100
warm_up_seconds = 1.5
rate_per_second_bench = 1e9
rate_burst_bench = 1_000_000_000
memory_store_chunk = 1000


# ---------------------------------------------------------------------------- load generator
# Runs in a child process: ``host_intake.py --client SPEC_JSON``; prints one JSON line.


def _request(method: str, path: str, port: int, token: str | None, body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


def _message(dedupe_key: str, index: int) -> dict[str, Any]:
    return {
        "sender": f"成员{index % 7}",
        "account_id": f"u{index % 7}",
        "content": f"今晚八点一起去天台看星星吧，记得带上望远镜和热可可 #{index}",
        "occurred_at": "2026-10-10T20:00:00+08:00",
        "dedupe_key": dedupe_key,
    }


prepare_queries = [
    "看星星", "周末去哪里吃寿司", "望远镜", "猫咪生病了", "考试复习计划", "生日礼物",
    "hiking trip", "新的工作", "演唱会门票", "下雨天的心情",
]


def _build(spec: dict[str, Any], connection: int, sequence: int) -> bytes:
    mode, port, token = spec["mode"], spec["port"], spec.get("token")
    run = spec["run_id"]
    if mode == "hello":
        return _request("GET", "/", port, None, None)
    if mode == "single":
        entry = f"{bench_entry_prefix}{run}-{connection}"
        document = _message(f"{run}-{connection}-{sequence}", sequence)
        if spec.get("pace"):
            document["pace"] = spec["pace"]
        body = json.dumps(document, ensure_ascii=False)
        return _request("POST", f"/api/v1/entries/{entry}/messages", port, token, body.encode("utf-8"))
    if mode == "batch":
        entry = f"{bench_entry_prefix}{run}-{connection}"
        messages = [_message(f"{run}-{connection}-{sequence}-{i}", i) for i in range(batch_messages)]
        if spec.get("pace"):
            messages[0]["pace"] = spec["pace"]
        body = json.dumps(messages, ensure_ascii=False)
        return _request("POST", f"/api/v1/entries/{entry}/messages", port, token, body.encode("utf-8"))
    if mode == "prepare":
        text = prepare_queries[(connection + sequence) % len(prepare_queries)]
        body = json.dumps({"text": text}, ensure_ascii=False).encode("utf-8")
        return _request("POST", f"/api/v1/entries/{memory_entry_id}/prepare", port, token, body)
    raise SystemExit(f"unknown mode {mode}")


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    connections = spec["connections"]
    latencies: list[float] = []
    errors: list[str] = []
    completed = 0
    measuring = False
    deadline = spec.get("seconds")
    requests_max = spec.get("requests")
    started_requests = 0

    async def worker(index: int) -> None:
        nonlocal completed, started_requests
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
                    if len(errors) < 5:
                        errors.append(f"{status} {body[:300]!r}")
                    continue
                if measuring or requests_max is not None:
                    latencies.append(elapsed)
                    completed += 1

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
    latencies.sort()
    return {
        "requests": completed,
        "seconds": round(elapsed, 3),
        "requests_per_second": round(completed / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2) if latencies else None,
        "errors": errors,
    }


def client_main(spec_text: str) -> None:
    spec = json.loads(spec_text)
    print(json.dumps(trio.run(_client, spec)), flush=True)


async def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the load generator in a child process (off this process's interpreter lock)."""
    command = [sys.executable, os.path.abspath(__file__), "--client", json.dumps(spec)]
    completed = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"load generator failed: {completed.stderr.decode()[-2000:]}")
    result = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    if result["errors"]:
        print(f"host_intake: {spec['mode']} errors: {result['errors']}", file=sys.stderr)
    return result


# ---------------------------------------------------------------------------- servers


def hello_app() -> Any:
    from quart_trio import QuartTrio

    app = QuartTrio("hello")

    @app.get("/")
    async def hello() -> Any:
        return {"ok": True}

    return app


async def start_host(nursery: trio.Nursery, data_dir: str) -> tuple[Any, Any, Any, int, str]:
    """The host app over the parts ``troupe serve`` starts (see ``troupe.server._serve``)."""
    from troupe.auth import TokenScope
    from troupe.http.host import HostAppDependencies, create_host_app

    runtime = await start_runtime(nursery, data_dir)
    env, engine, system = runtime.env, runtime.engine, runtime.system
    [secret] = await create_tokens(runtime, [f"bench-{os.getpid()}"], TokenScope.all())
    dependencies = HostAppDependencies(
        env=env, engine=engine, system=system, readiness=lambda: system.running,
        rate_per_second=rate_per_second_bench, rate_burst=rate_burst_bench,
    )
    port = await start_server(nursery, create_host_app(dependencies))
    from troupe.server._process import freeze_startup_heap

    freeze_startup_heap()  # as the ``troupe serve`` process does once it is ready
    return env, engine, system, port, secret


memory_words = [
    "看星星", "寿司", "望远镜", "猫咪", "考试", "生日", "礼物", "火锅", "电影", "演唱会", "旅行",
    "下雨", "咖啡", "游戏", "工作", "搬家", "跑步", "钢琴", "hiking", "coffee", "concert",
]


async def load_memories(env: Any, engine: Any, count: int) -> dict[str, Any]:
    """``count`` memories in ``memory_entry_id``'s scope, in bulk through the host store."""
    from troupe.actors.host import NewMemory, host_memory_indexes
    from troupe.actors.host._memories import TokenizedDatabase, store_memories

    chooser = random.Random(7)
    index = await host_memory_indexes.index_for(engine, env.embedder)
    database = TokenizedDatabase(engine)
    occurred = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    began = time.perf_counter()
    for start in range(0, count, memory_store_chunk):
        memories = []
        for number in range(start, min(count, start + memory_store_chunk)):
            words = chooser.sample(memory_words, 3)
            content = f"成员{number % 50}说{words[0]}和{words[1]}，还提到{words[2]}（第{number}条）"
            memories.append(NewMemory(
                content=content, kind="event", stance="neutral", lifecycle="active", belief=0.8,
                people=[f"u{number % 50}"], sources=[], entry_id=memory_entry_id,
                occurred_at=occurred + datetime.timedelta(minutes=number),
            ))
        await store_memories(database, index, memories, created_at=env.clock.wall())
    return {"memories": count, "memory_load_seconds": round(time.perf_counter() - began, 1)}


learning_wait_seconds_max = 120.0


async def stored_memories(engine: Any) -> int:
    """Memories already in the bench entry (``--data-dir`` reused from an earlier run)."""
    return await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM host_memories WHERE entry_id = ?", (memory_entry_id,)).fetchone()[0])


async def wait_for_learning(engine: Any) -> float:
    """Prepare is timed in steady state: wait (bounded) until the intake phases' learning
    batches are done, since the learner competes for the same cores."""
    from troupe.actors.host._batches import batch_states_open

    marks = ", ".join("?" for _ in batch_states_open)
    began = time.perf_counter()
    while time.perf_counter() - began < learning_wait_seconds_max:
        open_batches = await engine.read(lambda connection: connection.execute(
            f"SELECT count(*) FROM host_batches WHERE state IN ({marks})", tuple(batch_states_open)).fetchone()[0])
        if open_batches == 0:
            break
        await trio.sleep(0.5)
    return round(time.perf_counter() - began, 1)


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "note": "client and server processes share these cores",
        "connections": arguments.connections,
        "seconds_per_phase": arguments.seconds,
    }
    run_id = f"r{os.getpid()}"
    job_times = time_write_jobs() if arguments.job_times else None
    with contextlib.ExitStack() as stack:
        directory = arguments.data_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="troupe-bench-host-"))
        async with trio.open_nursery() as nursery:
            hello_port = await start_server(nursery, hello_app())
            env, engine, system, host_port, secret = await start_host(nursery, directory)
            common = {"connections": arguments.connections, "seconds": arguments.seconds,
                      "token": secret, "run_id": run_id,
                      "pace": json.loads(arguments.pace) if arguments.pace and arguments.pace.startswith("{") else arguments.pace}

            if arguments.phase == "all":
                with PhaseMeter(engine) as meter:
                    hello = await run_client({**common, "mode": "hello", "port": hello_port})
                figures["hello_server"] = {"server_cpu_share": meter.figures["server_cpu_share"]}
                figures["hello_requests_per_second"] = hello["requests_per_second"]
                figures["hello_p50_ms"], figures["hello_p99_ms"] = hello["p50_ms"], hello["p99_ms"]

                with profiled_phase(arguments, "single"), PhaseMeter(engine) as meter:
                    single = await run_client({**common, "mode": "single", "port": host_port, "run_id": run_id + "s"})
                figures["single_server"] = meter.figures
                figures["single_messages_per_second"] = single["requests_per_second"]
                figures["single_ratio_to_hello"] = round(single["requests_per_second"] / hello["requests_per_second"], 3)
                figures["single_p50_ms"], figures["single_p99_ms"] = single["p50_ms"], single["p99_ms"]

                with profiled_phase(arguments, "batch"), PhaseMeter(engine) as meter:
                    batch = await run_client({**common, "mode": "batch", "port": host_port, "run_id": run_id + "b"})
                figures["batch_server"] = meter.figures
                figures["batch_messages_per_second"] = round(batch["requests_per_second"] * batch_messages, 1)
                figures["batch_p50_ms"], figures["batch_p99_ms"] = batch["p50_ms"], batch["p99_ms"]

            if arguments.memories > 0:
                stored = await stored_memories(engine)
                if stored < arguments.memories:
                    figures.update(await load_memories(env, engine, arguments.memories - stored))
                else:
                    figures["memories"] = stored  # a --data-dir loaded by an earlier run
                figures["learning_backlog_wait_seconds"] = await wait_for_learning(engine)
                prepare_spec = {**common, "mode": "prepare", "port": host_port, "seconds": None,
                                "connections": arguments.prepare_connections,
                                "requests": arguments.prepare_requests}
                await run_client({**prepare_spec, "requests": 20})  # warm caches
                rounds = []
                for _ in range(arguments.rounds):
                    with profiled_phase(arguments, "prepare"), PhaseMeter(engine) as meter:
                        prepare = await run_client(prepare_spec)
                    rounds.append({**meter.figures, "p50_ms": prepare["p50_ms"], "p99_ms": prepare["p99_ms"]})
                figures["prepare_server"] = meter.figures
                figures["prepare_requests"] = prepare["requests"]
                figures["prepare_connections"] = arguments.prepare_connections
                figures["prepare_p50_ms"], figures["prepare_p99_ms"] = prepare["p50_ms"], prepare["p99_ms"]
                if arguments.rounds > 1:
                    figures["prepare_rounds"] = rounds
                    figures["prepare_p99_ms"] = max(round_["p99_ms"] for round_ in rounds)

            targets = {"prepare_p99_at_most_50_ms": (figures.get("prepare_p99_ms") or 1e9) <= 50}
            if arguments.phase == "all":
                targets = {
                    "single_ratio_at_least_0.5": figures["single_ratio_to_hello"] >= 0.5,
                    "batch_at_least_20000_per_second": figures["batch_messages_per_second"] >= 20_000,
                    **targets,
                }
            figures["targets_met"] = targets
            if job_times is not None:
                for name, (count, seconds) in sorted(job_times.items(), key=lambda item: -item[1][1]):
                    print(f"job {name}: {count} runs, {seconds:.3f} s, {seconds / count * 1000:.3f} ms each",
                          file=sys.stderr)
            await system.drain()
            nursery.cancel_scope.cancel()
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(sys.argv[2])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--prepare-requests", type=int, default=400)
    parser.add_argument("--prepare-connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1,
                        help="time prepare this many times in a row (each round reported; p99 is the worst)")
    parser.add_argument("--data-dir", default=None,
                        help="keep the data here (default: a temporary directory); memories already "
                             "stored there are not loaded again, so repeated runs skip the load")
    parser.add_argument("--phase", choices=["all", "prepare"], default="all",
                        help="prepare: only load the memories and time prepare (no hello/intake phases)")
    parser.add_argument("--profile", choices=["single", "batch", "prepare"], default=None,
                        help="cProfile the server during this phase (stderr)")
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument("--pace", default=None,
                        help="pace of the bench entries (a name; default: the server's default)")
    parser.add_argument("--job-times", action="store_true",
                        help="print the writer thread's time per kind of storage job (stderr)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the server process (experiment)")
    parsed = parser.parse_args()
    if parsed.switch_interval:
        sys.setswitchinterval(parsed.switch_interval)
    print(json.dumps(trio.run(main, parsed)), flush=True)
