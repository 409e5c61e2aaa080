"""Knowledge surface benchmark: prints one JSON line of figures (not a test; nothing here asserts time).

Why: issue 10 sets three targets on the knowledge surface (the PIXIU memory API): at least
1,000 ``/memory/write`` CONVERSATION writes per second with idempotency receipts, write p99 at
most 20 ms, and ``/agent/context`` p99 at most 50 ms with 100k knowledge items; and it asks
that replayed writes create nothing.  This script measures all of it in one run, on 127.0.0.1
with an ephemeral port.

In this process, hypercorn (trio) serves the real knowledge app as ``troupe serve`` builds it:
``new_knowledge_surface()`` over a real ``Engine`` (default settings, so ``synchronous=FULL``)
in a temporary directory and the real ``ActorSystem`` with every surface's kinds and services,
the configured model (offline ``LocalModel`` by default) and the embedder chosen by
``--embedder`` (default ``hashed``, the offline default of ``troupe serve``).  Structuring runs
as in production: every fresh write queues it and the scope actor's background task turns it
into knowledge (entities, relations, index entry) during the phase.

A load generator in a *separate process* (so that it does not share the server's interpreter
lock; the two processes still share the machine's cores, reported as ``cpu_count`` and the
load average) drives the server over raw keep-alive HTTP/1.1 connections (a minimal client:
httpx's own per-request cost would be measured otherwise):

1. ``write`` is two phases, both writing CONVERSATION turns (Chinese or English, from a pool
   of generated turns) with full provenance and their own idempotency keys, spread over
   ``--scopes`` user scopes (one scope actor serialises its scope's writes, so the spread is
   what lets group commit batch them):

   a. ``capacity`` (closed loop): ``--connections`` connections each send their next write as
      soon as the last one is answered (connection ``c``'s request ``n`` goes to scope
      ``(c + n * connections) % scopes``): writes/s (the target's throughput), p50/p99 of that
      loop, the server's CPU per write (every thread, the background structuring during the
      phase included), the structuring backlog at the end of the phase and the CPU per write
      once it is done.  Its latencies are NOT the latency target's: with 32 writers always
      waiting, Little's law makes the mean latency 32 / throughput (32 ms at 1,000/s), so a
      closed loop cannot show a p99 of 20 ms whatever the server does;
   b. ``latency`` (open loop, after the capacity phase's structuring drained): writes are
      DUE at a fixed pace, ``--latency-rate`` per second (1,000 by default: the throughput
      target) for ``--seconds`` after the same warm-up, whatever happened to the earlier ones;
      each goes out on an idle connection of a pool of ``--latency-connections`` (256, enough
      that one is idle unless writes take 256 ms), request ``n`` to scope ``n % scopes``.  A
      latency runs from the write's due time to its answer, so a send that left late (no idle
      connection, or the generator woke late) counts against the figure instead of hiding
      (no coordinated omission); ``latency_late_sends`` counts the sends that left more than
      ``_load.late_send_seconds`` (2 ms) after their due time and ``latency_waited_for_connection`` the ones
      that found no idle connection; writes not answered within ``_load.open_loop_drain_seconds_max``
      of the last send are ``latency_unanswered``, and writes still unsent that long after the
      phase's planned end (an overloaded server) ``latency_unsent``.  ``latency_p50_ms``/``latency_p99_ms``/
      ``latency_max_ms`` are this phase's, and ``targets_met.write_p99_at_most_20_ms`` is
      ``latency_p99_ms <= 20`` with nothing unsent or unanswered and no error;
   c. ``actor`` (no HTTP): ``--actor-writes`` validated requests asked of the scope actors
      directly by ``--connections`` tasks in the server process: the server's CPU per write
      in the phase and drained (``actor_server``), to split the capacity phase's between
      HTTP and the actors, receipts, storage and structuring;
2. ``replay``: ``--replay-writes`` (5,000) writes with distinct keys, then the same requests
   twice more; the evidence, knowledge and receipt rows are counted before and after the two
   replays (after the first pass's structuring finished): ``replay_new_evidence`` and
   ``replay_new_knowledge`` must be 0, and ``replay_same_answers`` says whether every replay
   answered the first pass's ``evidence_id``;
3. ``context``: ``--items`` knowledge items (100k) loaded in bulk through the store functions
   the real path uses (``write_evidence`` with its receipt for keyed sources, the local
   sensitivity detector's verdict, ``extract_structure`` — what structuring computes with the
   offline model — then ``create_knowledge`` with those entities and relations), in write jobs
   of ``load_items_per_job`` items, created over the past year; 90% of them in the main scope
   ``user:local``, the rest in other user and shared scopes; then the knowledge index opened
   in-process (its reconciliation indexes every ACTIVE item exactly as ``refresh`` after
   structuring would: same keys, text and vectors; timed as ``index_build_seconds``); then
   ``--context-requests`` ``/agent/context`` requests over HTTP from ``--context-connections``
   connections (a closed loop: its connections always wait, so its latency is connections /
   throughput, a capacity figure): p50/p99 as the client saw them and the server's
   ``latency_ms`` p50/p99; then the same requests from one caller at a time
   (``context_sequential``: an agent asks once per turn) and open loops at ``--context-rates``
   (20 and 50/s, ``--context-rate-seconds`` each: ``context_open_loop``, latency from each
   request's due time); and the same queries asked of ``agent_context`` in-process (no HTTP)
   to split a miss: wall time, the event loop thread's CPU and every thread's CPU
   (``cpu_p50_ms``/``cpu_p99_ms``).  ``targets_met`` judges the 50 ms p99 per load.

The corpus: conversation turns, tool results and manual notes built from templates over pools
of real Chinese and English words, people, places and projects, plus Zipf-distributed topic
words (a few thousand, like real text: a few common, most rare); 2% of the turns carry a phone
number (sensitive: never in an agent context).  Queries: entity names, topic words in Chinese
and English, short questions, and one in ten that matches nothing.

Targets (issue 10): >= 1,000 writes/s with receipts; write p99 <= 20 ms; agent context p99
<= 50 ms at 100k items.

The server process freezes its start-up heap as ``troupe serve`` does once ready
(``freeze_startup_heap``) and keeps Python's switch interval (``troupe serve`` does not change
it; ``--switch-interval`` is an experiment, reported as ``switch_interval_seconds``).

Usage: python bench/knowledge.py [--connections 32] [--scopes 64] [--seconds 10]
       [--latency-rate 1000] [--latency-connections 256]
       [--replay-writes 5000] [--items 100000] [--context-requests 400]
       [--actor-writes 6400] [--context-connections 4] [--context-rates 20,50]
       [--phase all|write|capacity|latency|actor|replay|context]
       [--embedder hashed|none] [--job-times] [--profile write|latency|context|in_process]
       [--switch-interval SECONDS] [--data DIR (with --phase context: keep the corpus and reuse it)]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
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

warm_up_seconds = 1.5
backlog_wait_seconds_max = 300.0
backlog_poll_seconds = 0.5
index_build_seconds_max = 3600.0
load_items_per_job = 2_000
"""Items per bulk-load write job (evidence, receipt, knowledge, links, entities, relations)."""
turn_pool_size = 512
"""Distinct conversation turns the write phases draw from (the keys are always distinct)."""
main_scope = "user:local"
main_scope_share = 0.9
sensitive_share = 0.02
corpus_seed = 7
year_seconds = 365 * 86_400.0
context_top_k = 5
context_max_chars = 2_000
context_rates_default = [20.0, 50.0]
"""Open-loop agent-context rates (per second, at 100k items): an agent asks once per turn,
so 20-50/s is the load of dozens of agents working at once on one device."""
context_open_loop_connections = 64
"""The context open loop's connection pool (one is idle unless requests take over 1 s)."""
latency_rate_default = 1_000
"""Writes per second the latency phase offers (issue 10's throughput target)."""
latency_connections_default = 256
"""Connections of the latency phase's pool: at 1,000/s a connection is busy for one write's
latency, so 256 leave one idle unless a write takes over 256 ms (then sends are late, counted)."""


# ---------------------------------------------------------------------------- corpus

people = [
    "张伟", "王芳", "李娜", "刘洋", "陈静", "杨帆", "赵磊", "黄丽", "周杰", "吴敏", "徐明", "孙悦",
    "马超", "朱琳", "胡斌", "郭涛", "林晓", "何平", "高远", "罗佳",
    "Alice", "Bob Chen", "Carol", "David Li", "Emma Wang", "Frank", "Grace Zhou", "Henry", "Iris", "Jack Sun",
]
places = [
    "北京", "上海", "深圳", "杭州", "成都", "西安", "南京", "武汉", "长沙", "青岛", "厦门", "苏州",
    "天台", "公司楼下", "会议室三", "图书馆", "健身房", "火车站", "机场", "Shenzhen office", "Room 402",
]
foods = ["寿司", "火锅", "拉面", "咖啡", "奶茶", "烤鸭", "饺子", "沙拉", "牛排", "pizza", "ramen", "tacos"]
things = [
    "望远镜", "笔记本电脑", "机械键盘", "耳机", "显示器", "护照", "钥匙", "雨伞", "生日礼物", "演唱会门票",
    "电影票", "体检报告", "合同", "发票", "快递", "laptop charger", "train ticket", "umbrella",
]
projects = [
    "麒麟助手", "知识库迁移", "季度汇报", "年度预算", "新版官网", "移动端重构", "数据看板", "客服机器人",
    "Project Atlas", "Project Nova", "Orion release", "billing service", "search ranking", "onboarding flow",
]
tools = ["calendar.create", "mail.send", "file.search", "weather.get", "map.route", "todo.add", "notes.append"]
relation_types = ["WORKS_ON", "KNOWS", "OWNS", "VISITED", "MENTIONS", "REPORTS_TO", "LIKES"]

common_characters = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行"
    "学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外"
    "天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情"
    "者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角")

chinese_turns = [
    ("明天{time}和{person}在{place}开会，讨论{project}的进度", "好的，我已经记下了，会提前提醒你准备{topic}的材料。"),
    ("我最近很喜欢吃{food}，周末想和{person}一起去{place}", "听起来不错，{place}那边有几家评价很高的店，可以提前订位。"),
    ("帮我记一下，{thing}放在{place}的柜子里了", "记住了：{thing}在{place}的柜子里。"),
    ("{person}说{project}下周要交付，{topic}这部分还没做完", "要不要我把{topic}拆成几个小任务，排进这周的日程？"),
    ("我对{food}过敏，以后推荐餐厅的时候注意一下", "明白，以后推荐时会避开含{food}的菜。"),
    ("今天{topic}的问题终于解决了，{person}帮了很大的忙", "太好了，要不要给{person}发条消息表示感谢？"),
    ("请保持回答简洁，不要超过三句话", "好的，我之后会尽量简短地回答。"),
    ("下个月要去{place}出差，帮我看看{thing}准备好了没有", "我查了一下，{thing}还需要确认，出发前一周再提醒你。"),
]
english_turns = [
    ("Remind me to call {person} about {project} {time}", "Sure, I will remind you to call {person} {time}."),
    ("I left my {thing} at {place} yesterday", "Noted: your {thing} is at {place}."),
    ("{person} prefers meetings in the morning, usually at {place}", "Got it, I will suggest morning slots at {place}."),
    ("We decided to move {project} to the new {topic} pipeline", "Understood, {project} now uses the {topic} pipeline."),
    ("I want to try {food} near {place} this weekend", "There are a few well reviewed places near {place}; want a booking?"),
    ("Keep answers short and in English please", "Okay, I will keep my answers short and in English."),
]
times = ["上午十点", "下午三点", "今晚八点", "周五", "next Monday", "tomorrow morning", "this afternoon"]


class Corpus:
    """Seeded pools of words; everything built from it is deterministic."""

    def __init__(self, seed: int = corpus_seed, topic_words: int = 3_000) -> None:
        self.chooser = random.Random(seed)
        chooser = self.chooser
        chinese: set[str] = set()
        while len(chinese) < topic_words:
            chinese.add(chooser.choice(common_characters) + chooser.choice(common_characters))
        english: set[str] = set()
        onsets, vowels, codas = "b c d f g h k l m n p r s t v w br cl dr gr pl sh st tr".split(), "aeiou", "nrstlmkd"
        while len(english) < topic_words:
            english.add("".join(chooser.choice(onsets) + chooser.choice(vowels)
                                for _ in range(chooser.randint(1, 3))) + chooser.choice(codas))
        self.chinese_topics = sorted(chinese)
        self.english_topics = sorted(english)
        self.weights = [1.0 / (rank + 10) for rank in range(topic_words)]

    def topic(self, chooser: random.Random, chinese: bool) -> str:
        pool = self.chinese_topics if chinese else self.english_topics
        return chooser.choices(pool, self.weights, k=1)[0]

    def slots(self, chooser: random.Random, chinese: bool) -> dict[str, str]:
        return {"person": chooser.choice(people), "place": chooser.choice(places), "food": chooser.choice(foods),
                "thing": chooser.choice(things), "project": chooser.choice(projects),
                "time": chooser.choice(times), "topic": self.topic(chooser, chinese)}

    def turn(self, chooser: random.Random, *, sensitive: bool = False) -> tuple[str, str]:
        chinese = chooser.random() < 0.6
        user, assistant = chooser.choice(chinese_turns if chinese else english_turns)
        slots = self.slots(chooser, chinese)
        user, assistant = user.format(**slots), assistant.format(**slots)
        extra = [self.topic(chooser, chinese) for _ in range(chooser.randint(1, 4))]
        user += ("，还有" + "、".join(extra)) if chinese else (", also " + ", ".join(extra))
        if sensitive:
            user += f"，我的手机号是13{chooser.randint(100_000_000, 999_999_999)}"
        return user, assistant

    def note(self, chooser: random.Random, used_titles: set[str]) -> dict[str, Any]:
        """A MANUAL_CONFIG or TOOL_RESULT raw: title, body, entities, relations."""
        chinese = chooser.random() < 0.6
        slots = self.slots(chooser, chinese)
        person, other = slots["person"], chooser.choice(people)
        if chinese:
            title = f"{slots['project']}：{slots['topic']}与{self.topic(chooser, True)}"
            text = (f"{person}负责{slots['project']}的{slots['topic']}部分，计划在{slots['place']}和{other}对齐，"
                    f"需要{slots['thing']}。" + "".join(self.topic(chooser, True) for _ in range(chooser.randint(4, 12))))
        else:
            title = f"{slots['project']}: {slots['topic']} and {self.topic(chooser, False)}"
            text = (f"{person} owns the {slots['topic']} part of {slots['project']}, syncing with {other} at "
                    f"{slots['place']}. " + " ".join(self.topic(chooser, False) for _ in range(chooser.randint(4, 12))))
        base, number = title, 2
        while title in used_titles:  # distinct subjects: the real path would merge equal titles
            title, number = f"{base} ({number})", number + 1
        used_titles.add(title)
        return {"title": title, "body": {"text": text, "owner": person, "place": slots["place"]},
                "entities": [person, other, slots["project"]],
                "relations": [{"from": person, "to": slots["project"], "type": chooser.choice(relation_types)},
                              {"from": person, "to": other, "type": "KNOWS"}]}

    def query(self, chooser: random.Random, number: int) -> str:
        if number % 10 == 0:
            return "火星上的独角兽 unicorn on mars"  # matches nothing
        if number % 5 == 1:
            return f"{chooser.choice(people)} 最近在忙什么"
        if number % 5 == 2:
            return f"{chooser.choice(projects)} {self.topic(chooser, chooser.random() < 0.5)}"
        if number % 5 == 3:
            return "".join(self.topic(chooser, True) for _ in range(chooser.randint(1, 3)))
        if number % 5 == 4:
            return " ".join(self.topic(chooser, False) for _ in range(chooser.randint(1, 3)))
        return chooser.choice(["回答风格", "我的东西放在哪里", "过敏", "出差准备", "what do I prefer", "meeting time"])


def turn_pool(count: int) -> list[list[str]]:
    chooser = random.Random(corpus_seed + 1)
    corpus = Corpus()
    return [list(corpus.turn(chooser)) for _ in range(count)]


# ---------------------------------------------------------------------------- load generator
# Runs in a child process: ``knowledge.py --client`` with the spec as JSON on stdin; prints one
# JSON line.


def _request(path: str, port: int, document: dict[str, Any]) -> bytes:
    body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


def write_document(spec: dict[str, Any], key: str, scope: str, turn: list[str], sequence: int) -> dict[str, Any]:
    user, assistant = turn
    return {
        "source_type": "CONVERSATION", "scope": scope, "raw": {"user": user, "assistant": assistant},
        "idempotency_key": key,
        "provenance": {"session_id": f"session-{key.rsplit('-', 1)[0]}", "run_id": "run-bench",
                       "turn_id": f"turn-{sequence}", "occurred_at": spec["occurred_at"] + sequence},
    }


async def _client(spec: dict[str, Any]) -> dict[str, Any]:
    mode, port, connections = spec["mode"], spec["port"], spec["connections"]
    latencies: list[float] = []
    server_ms: list[float] = []
    item_counts: list[int] = []
    errors: list[str] = []
    answers: dict[int, str] = {}
    state = {"completed": 0, "answered": 0, "errors": 0, "next": 0, "measuring": False}
    pool = spec.get("turns", [])
    deadline = spec.get("seconds")
    requests_max = spec.get("requests")

    def build(connection: int, sequence: int) -> tuple[int, bytes]:
        if mode == "write":
            scopes = spec["scopes"]
            scope = scopes[(connection + sequence * connections) % len(scopes)]
            key = f"{spec['prefix']}{connection}-{sequence}"
            turn = pool[(connection * 31 + sequence) % len(pool)]
            return -1, _request("/memory/write", port, write_document(spec, key, scope, turn, sequence))
        if mode == "replay":
            number = state["next"]
            state["next"] += 1
            scopes = spec["scopes"]
            key = f"{spec['prefix']}{number // 1000}-{number % 1000}"
            document = write_document(spec, key, scopes[number % len(scopes)], pool[number % len(pool)], number)
            return number, _request("/memory/write", port, document)
        if mode == "context":
            number = state["next"]
            state["next"] += 1
            return number, context_request(spec, number, f"session-{connection}")
        raise SystemExit(f"unknown mode {mode}")

    async def worker(connection_number: int) -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        connection = RawConnection(stream)
        sequence = 0
        async with stream:
            while True:
                if requests_max is not None and state["next"] >= requests_max:
                    return
                number, request = build(connection_number, sequence)
                sequence += 1
                began = time.perf_counter()
                status, body = await connection.exchange(request)
                elapsed = time.perf_counter() - began
                if status != 200:
                    state["errors"] += 1
                    if len(errors) < 5:
                        errors.append(f"{status} {body[:300]!r}")
                    continue
                state["answered"] += 1
                if not (state["measuring"] or requests_max is not None):
                    continue
                latencies.append(elapsed)
                state["completed"] += 1
                if mode == "replay":
                    answers[number] = json.loads(body)["evidence_id"]
                elif mode == "context":
                    document = json.loads(body)
                    server_ms.append(float(document["latency_ms"]))
                    item_counts.append(len(document["items"]))
                elif mode == "write" and spec.get("read_bodies"):
                    json.loads(body)

    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for index in range(connections):
            nursery.start_soon(worker, index)
        if deadline is not None:
            await trio.sleep(warm_up_seconds)
            state["measuring"] = True
            began = time.perf_counter()
            await trio.sleep(deadline)
            state["measuring"] = False
            elapsed = time.perf_counter() - began
            nursery.cancel_scope.cancel()
    if deadline is None:
        elapsed = time.perf_counter() - began
    completed = state["completed"]
    result: dict[str, Any] = {
        "requests": completed,
        "answered_total": state["answered"],
        "seconds": round(elapsed, 3),
        "requests_per_second": round(completed / elapsed, 1),
        "p50_ms": rounded_ms(percentile(latencies, 0.5)),
        "p99_ms": rounded_ms(percentile(latencies, 0.99)),
        "max_ms": rounded_ms(max(latencies, default=None)),
        "errors": errors,
        "error_count": state["errors"],
    }
    if mode == "replay":
        ordered = "\n".join(f"{number}={answers.get(number)}" for number in range(requests_max or 0))
        result["answers_digest"] = hashlib.sha256(ordered.encode()).hexdigest()
        result["distinct_evidence_ids"] = len(set(answers.values()))
    if mode == "context":
        result["server_p50_ms"] = percentile(server_ms, 0.5)
        result["server_p99_ms"] = percentile(server_ms, 0.99)
        result["items_mean"] = round(sum(item_counts) / max(1, len(item_counts)), 2)
    return result


def context_request(spec: dict[str, Any], number: int, session_id: str) -> bytes:
    """Request ``number`` of the agent-context phases (the queries in turn)."""
    queries = spec["queries"]
    document = {"query": queries[number % len(queries)], "scope": spec["scope"], "session_id": session_id,
                "turn_id": f"turn-{number}", "top_k": spec["top_k"], "max_chars": spec["max_chars"]}
    return _request("/agent/context", spec["port"], document)


async def _open_loop_client(spec: dict[str, Any]) -> dict[str, Any]:
    """The open-loop generator (``_load.open_loop``: latency from each request's due time,
    late sends counted) over the bench's writes (``latency``) or agent-context requests
    (``context_open_loop``, one session per request number modulo 64)."""
    port = spec["port"]
    if spec["mode"] == "context_open_loop":
        def request_for(number: int) -> bytes:
            return context_request(spec, number, f"session-{number % 64}")
    else:
        scopes, pool = spec["scopes"], spec["turns"]

        def request_for(number: int) -> bytes:
            scope = scopes[number % len(scopes)]
            key = f"{spec['prefix']}{number}"
            return _request("/memory/write", port, write_document(spec, key, scope, pool[number % len(pool)], number))

    return await open_loop(port=port, rate=float(spec["rate"]), connections=spec["connections"],
                           warm_up_seconds=spec["warm_up_seconds"], seconds=spec["seconds"],
                           request_for=request_for)


def client_main() -> None:
    spec = json.loads(sys.stdin.buffer.read())
    client = _open_loop_client if spec["mode"] in ("latency", "context_open_loop") else _client
    print(json.dumps(trio.run(client, spec)), flush=True)


async def run_client(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the load generator in a child process (off this process's interpreter lock)."""
    command = [sys.executable, os.path.abspath(__file__), "--client"]
    completed = await trio.run_process(command, stdin=json.dumps(spec).encode(), capture_stdout=True,
                                       capture_stderr=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"load generator failed: {completed.stderr.decode()[-2000:]}")
    result = json.loads(completed.stdout.decode().strip().splitlines()[-1])
    if result["errors"]:
        print(f"knowledge bench: {spec['mode']} errors ({result['error_count']}): {result['errors']}",
              file=sys.stderr)
    return result


# ---------------------------------------------------------------------------- the server


async def start_knowledge(nursery: trio.Nursery, data_dir: str, embedder_name: str) -> tuple[Any, Any, Any, int]:
    """The knowledge app over the parts ``troupe serve`` starts (``_load.start_runtime``), with
    the embedder ``--embedder`` names."""
    from troupe._config import ServeOptions
    from troupe.http import ShutdownSignal
    from troupe.server import SurfaceContext

    runtime = await start_runtime(nursery, data_dir, {**os.environ, "TROUPE_EMBEDDER": embedder_name})
    env, engine, system = runtime.env, runtime.engine, runtime.system
    knowledge = next(surface for surface in runtime.surfaces if surface.name == "knowledge")
    context = SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)
    port = await start_server(nursery, knowledge.create_app(context))
    from troupe.server._process import freeze_startup_heap

    freeze_startup_heap()  # as the ``troupe serve`` process does once it is ready
    return env, engine, system, port


# ---------------------------------------------------------------------------- measurements


async def row_counts(engine: Any) -> dict[str, int]:
    def read(connection: Any) -> dict[str, int]:
        tables = {"evidence": "knowledge_evidence", "knowledge": "knowledge_items", "receipts": "knowledge_receipts",
                  "structuring_queued": "knowledge_structuring"}
        return {name: connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for name, table in tables.items()}

    return await engine.read(read)


async def structuring_backlog(engine: Any) -> int:
    return (await row_counts(engine))["structuring_queued"]


async def wait_for_backlog(engine: Any) -> tuple[int, float]:
    """Phases are measured in steady state: wait (bounded) until the structuring queued by the
    previous phase is done, since it competes for the same cores."""
    began = time.perf_counter()
    backlog = await structuring_backlog(engine)
    while backlog and time.perf_counter() - began < backlog_wait_seconds_max:
        await trio.sleep(backlog_poll_seconds)
        backlog = await structuring_backlog(engine)
    return backlog, round(time.perf_counter() - began, 1)


def write_scopes(count: int) -> list[str]:
    return [f"user:bench-{number}" for number in range(count)]


async def write_phase(arguments: argparse.Namespace, env: Any, engine: Any, port: int,
                      figures: dict[str, Any]) -> None:
    spec = {"mode": "write", "port": port, "connections": arguments.connections, "seconds": arguments.seconds,
            "scopes": write_scopes(arguments.scopes), "prefix": f"w{os.getpid()}-", "turns": turn_pool(turn_pool_size),
            "occurred_at": int(env.clock.wall()) - 3600}
    with profiled_phase(arguments, "write"), PhaseMeter(engine) as meter:
        written = await run_client(spec)
    figures["write_server"] = meter.figures
    figures["write_server"]["cpu_ms_per_write"] = round(meter.cpu_seconds / max(1, written["answered_total"]) * 1000, 2)
    figures["writes_per_second"] = written["requests_per_second"]
    figures["write_p50_ms"], figures["write_p99_ms"] = written["p50_ms"], written["p99_ms"]
    figures["write_max_ms"] = written["max_ms"]
    figures["write_errors"] = written["error_count"]
    figures["write_structuring_backlog_after"] = await structuring_backlog(engine)
    with PhaseMeter(engine) as drain:
        backlog, _ = await wait_for_backlog(engine)
    figures["write_server"]["cpu_ms_per_write_drained"] = round(
        (meter.cpu_seconds + drain.cpu_seconds) / max(1, written["answered_total"]) * 1000, 2)
    figures["write_server"]["drain_seconds"] = round(drain.wall_seconds, 2)
    figures["write_structuring_backlog_left"] = backlog


async def latency_phase(arguments: argparse.Namespace, env: Any, engine: Any, port: int,
                        figures: dict[str, Any]) -> None:
    """Open loop (see ``_open_loop_client``): ``--latency-rate`` writes/s offered for
    ``--seconds`` after the warm-up, latency from each write's due time to its answer."""
    backlog, _ = await wait_for_backlog(engine)  # steady state: the capacity phase's structuring is done
    spec = {"mode": "latency", "port": port, "connections": arguments.latency_connections,
            "rate": arguments.latency_rate, "seconds": arguments.seconds, "warm_up_seconds": warm_up_seconds,
            "scopes": write_scopes(arguments.scopes), "prefix": f"l{os.getpid()}-",
            "turns": turn_pool(turn_pool_size), "occurred_at": int(env.clock.wall()) - 3600}
    with profiled_phase(arguments, "latency"), PhaseMeter(engine) as meter:
        written = await run_client(spec)
    figures["latency_server"] = meter.figures
    figures["latency_server"]["cpu_ms_per_write"] = round(
        meter.cpu_seconds / max(1, written["answered_total"]) * 1000, 2)
    figures["latency_server"]["structuring_backlog_after"] = await structuring_backlog(engine)
    figures.update({
        "latency_rate": arguments.latency_rate, "latency_connections": arguments.latency_connections,
        "latency_backlog_before": backlog,
        "latency_sent": written["sent"], "latency_offered_per_second": written["offered_per_second"],
        "latency_answered": written["requests"], "latency_unanswered": written["unanswered"],
        "latency_unsent": written["unsent"],
        "latency_errors": written["error_count"], "latency_late_sends": written["late_sends"],
        "latency_waited_for_connection": written["waited_for_connection"],
        "latency_in_flight_max": written["in_flight_max"],
        "latency_p50_ms": written["p50_ms"], "latency_p99_ms": written["p99_ms"],
        "latency_max_ms": written["max_ms"],
    })


async def actor_phase(arguments: argparse.Namespace, env: Any, engine: Any, system: Any,
                      figures: dict[str, Any]) -> None:
    """The write path without HTTP: ``--actor-writes`` validated requests asked of the scope
    actors directly by ``--connections`` tasks in this process (the same documents, scopes and
    pool as the capacity phase), after the structuring of earlier phases drained.  The
    server's CPU per write in the phase and with its structuring drained: subtracted from the
    capacity phase's, what HTTP (hypercorn, the gate, the route) costs per write."""
    from troupe.actors.knowledge import scope_kind_name
    from troupe.http.knowledge._schemas import MemoryWriteIn, validated

    await wait_for_backlog(engine)
    pool, scopes = turn_pool(turn_pool_size), write_scopes(arguments.scopes)
    spec = {"occurred_at": int(env.clock.wall()) - 3600}
    tasks, per_task = arguments.connections, max(1, arguments.actor_writes // arguments.connections)

    async def writer(number: int) -> None:
        for sequence in range(per_task):
            document = write_document(spec, f"a{os.getpid()}-{number}-{sequence}",
                                      scopes[(number + sequence * tasks) % len(scopes)],
                                      pool[(number * 31 + sequence) % len(pool)], sequence)
            request = validated(MemoryWriteIn, document).to_request()
            await system.ref(scope_kind_name, request.scope).ask(request)

    with PhaseMeter(engine) as meter:
        async with trio.open_nursery() as nursery:
            for number in range(tasks):
                nursery.start_soon(writer, number)
    with PhaseMeter(engine) as drain:
        await wait_for_backlog(engine)
    written = tasks * per_task
    figures["actor_writes"] = written
    figures["actor_writes_per_second"] = round(written / meter.wall_seconds, 1)
    figures["actor_server"] = meter.figures
    figures["actor_server"]["cpu_ms_per_write"] = round(meter.cpu_seconds / written * 1000, 3)
    figures["actor_server"]["cpu_ms_per_write_drained"] = round(
        (meter.cpu_seconds + drain.cpu_seconds) / written * 1000, 3)


async def replay_phase(arguments: argparse.Namespace, env: Any, engine: Any, port: int,
                       figures: dict[str, Any]) -> None:
    spec = {"mode": "replay", "port": port, "connections": arguments.connections, "seconds": None,
            "requests": arguments.replay_writes, "scopes": write_scopes(arguments.scopes),
            "prefix": f"r{os.getpid()}-", "turns": turn_pool(turn_pool_size),
            "occurred_at": int(env.clock.wall()) - 3600}
    first = await run_client(spec)
    backlog, waited = await wait_for_backlog(engine)
    before = await row_counts(engine)
    replays = [await run_client(spec) for _ in range(2)]
    after_backlog, _ = await wait_for_backlog(engine)
    after = await row_counts(engine)
    figures.update({
        "replay_writes": arguments.replay_writes,
        "replay_first_pass_per_second": first["requests_per_second"],
        "replay_first_pass_errors": first["error_count"],
        "replay_first_pass_distinct_evidence": first["distinct_evidence_ids"],
        "replay_structuring_wait_seconds": waited,
        "replay_backlog_left": backlog + after_backlog,
        "replay_rows_before": before,
        "replay_new_evidence": after["evidence"] - before["evidence"],
        "replay_new_knowledge": after["knowledge"] - before["knowledge"],
        "replay_new_receipts": after["receipts"] - before["receipts"],
        "replay_same_answers": all(replay["answers_digest"] == first["answers_digest"] for replay in replays),
        "replay_errors": sum(replay["error_count"] for replay in replays),
        "replay_per_second": [replay["requests_per_second"] for replay in replays],
        "replay_p99_ms": [replay["p99_ms"] for replay in replays],
    })


def _load_plan(env: Any, corpus: Corpus, chooser: random.Random, count: int, used_titles: dict[str, set[str]],
               first: int) -> list[tuple[Any, ...]]:
    """``count`` items as the real write path would have received them: the request, its
    sensitivity verdict, its structure, its ids and its creation time."""
    from troupe.actors.knowledge import (
        EvidenceDraft,
        Provenance,
        WriteMemory,
        evidence_quality_score,
        extract_structure,
        local_sensitivity_detector,
        request_hash,
    )

    other_scopes = [f"user:family-{number}" for number in range(5)] + [
        f"shared:{domain}" for domain in ("work", "travel", "health", "finance", "home")]
    now = env.clock.wall()
    plan = []
    for number in range(first, first + count):
        scope = main_scope if chooser.random() < main_scope_share else chooser.choice(other_scopes)
        created = now - chooser.random() * year_seconds
        kind = chooser.random()
        if kind < 0.6:
            sensitive = chooser.random() < sensitive_share and not scope.startswith("shared:")
            user, assistant = corpus.turn(chooser, sensitive=sensitive)
            request = WriteMemory(source_type="CONVERSATION", raw={"user": user, "assistant": assistant}, scope=scope,
                                  provenance=Provenance(session_id=f"session-{number // 20}", run_id="run-load",
                                                        turn_id=f"turn-{number}", occurred_at=int(created)),
                                  idempotency_key=f"load-{number}")
        elif kind < 0.85:
            raw = corpus.note(chooser, used_titles.setdefault(scope, set()))
            request = WriteMemory(source_type="TOOL_RESULT", raw=raw, scope=scope,
                                  provenance=Provenance(session_id=f"session-{number // 20}", run_id="run-load",
                                                        turn_id=f"turn-{number}", occurred_at=int(created),
                                                        tool_call_id=f"call-{number}",
                                                        tool_name=chooser.choice(tools), approved=True),
                                  idempotency_key=f"load-{number}")
        else:
            raw = corpus.note(chooser, used_titles.setdefault(scope, set()))
            request = WriteMemory(source_type="MANUAL_CONFIG", raw=raw, scope=scope)
        verdict = local_sensitivity_detector.detect(request.raw)
        draft = EvidenceDraft(
            scope=scope, source_type=request.source_type, raw=request.raw, context=None,
            provenance=None if request.provenance is None else request.provenance.encode(),
            sensitivity=verdict.sensitivity, sensitivity_categories=verdict.categories,
            quality_score=evidence_quality_score(request.source_type, request.raw),
            idempotency_key=request.idempotency_key)
        hashed = None if request.idempotency_key is None else request_hash(request.operation, request.canonical())
        structure = extract_structure(request.source_type, request.raw)
        plan.append((draft, hashed, structure, env.ids.new_id("evd_"), env.ids.new_id("knw_"), created))
    return plan


def _load_job(connection: Any, plan: list[tuple[Any, ...]]) -> list[str]:
    """One bulk write job: each item's write (receipt, evidence, structuring queued) and its
    structuring (knowledge, link, entities, relations, task done), as the real path does them."""
    from troupe.actors.knowledge import create_knowledge, write_evidence

    created_ids = []
    for draft, hashed, structure, evidence_id, knowledge_id, created in plan:
        outcome = write_evidence(connection, draft, evidence_id=evidence_id, now=created, latency_ms=1,
                                 request_hash=hashed)
        assert outcome.evidence is not None, outcome
        item, created_now = create_knowledge(
            connection, knowledge_id=knowledge_id, evidence_id=evidence_id, title=structure.title,
            body=structure.body, entities=structure.entities, relations=list(structure.relations), now=created)
        assert item is not None and created_now
        created_ids.append(item.id)
    return created_ids


async def load_knowledge(env: Any, engine: Any, count: int) -> tuple[dict[str, Any], list[str]]:
    """``count`` structured knowledge items, in bulk through the store functions; returns the
    figures and the new items' ids."""
    corpus = Corpus()
    chooser = random.Random(corpus_seed + 2)
    used_titles: dict[str, set[str]] = {}
    began = time.perf_counter()
    loaded: list[str] = []
    for first in range(0, count, load_items_per_job):
        plan = _load_plan(env, corpus, chooser, min(load_items_per_job, count - first), used_titles, first)
        loaded += await engine.write(lambda connection, plan=plan: _load_job(connection, plan))
    counts = await row_counts(engine)
    main_items = await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM knowledge_items WHERE scope = ?", (main_scope,)).fetchone()[0])
    sensitive = await engine.read(lambda connection: connection.execute(
        "SELECT count(*) FROM knowledge_evidence WHERE sensitivity > 0").fetchone()[0])
    return {"items_loaded": len(loaded), "knowledge_rows": counts["knowledge"], "main_scope_items": main_items,
            "sensitive_evidence": sensitive, "load_seconds": round(time.perf_counter() - began, 1)}, loaded


async def build_index(env: Any, engine: Any, loaded: list[str]) -> dict[str, Any]:
    """Index the loaded items in-process as structuring does after each commit
    (``KnowledgeIndex.refresh``); when no phase opened the index yet, opening it reconciles
    (indexes every ACTIVE item the same way) and is all it takes."""
    from troupe.actors.knowledge import knowledge_indexes

    began = time.perf_counter()
    with trio.fail_after(index_build_seconds_max):
        was_open = knowledge_indexes.opened(engine) is not None
        index = await knowledge_indexes.open(engine, getattr(env, "embedder", None))
        if was_open:
            await index.refresh(loaded)
    return {"index_build_seconds": round(time.perf_counter() - began, 1), "indexed_items": index.indexed_count}


def context_queries(count: int) -> list[str]:
    corpus, chooser = Corpus(), random.Random(corpus_seed + 3)
    return [corpus.query(chooser, number) for number in range(count)]


async def in_process_context(env: Any, engine: Any, queries: list[str]) -> dict[str, Any]:
    """The same requests answered by ``agent_context`` directly (no HTTP), to split a miss
    between HTTP and the domain."""
    from troupe.actors.knowledge import agent_context, knowledge_indexes

    index = await knowledge_indexes.open(engine, getattr(env, "embedder", None))
    elapsed: list[float] = []
    cpu: list[float] = []
    process_cpu: list[float] = []
    for number, query in enumerate(queries):
        began, began_cpu, began_process = time.perf_counter(), time.thread_time(), time.process_time()
        await agent_context(engine, index, env, query=query, scope=main_scope, session_id="s", turn_id=f"t{number}",
                            top_k=context_top_k, max_chars=context_max_chars)
        elapsed.append(time.perf_counter() - began)
        cpu.append(time.thread_time() - began_cpu)
        process_cpu.append(time.process_time() - began_process)
    # ``loop_cpu``: the event loop's thread only; ``cpu``: every thread of the server process
    # (the storage readers too), one request at a time: what a request costs whatever the load.
    return {"p50_ms": rounded_ms(percentile(elapsed, 0.5)), "p99_ms": rounded_ms(percentile(elapsed, 0.99)),
            "loop_cpu_p50_ms": rounded_ms(percentile(cpu, 0.5)),
            "loop_cpu_p99_ms": rounded_ms(percentile(cpu, 0.99)),
            "cpu_p50_ms": rounded_ms(percentile(process_cpu, 0.5)),
            "cpu_p99_ms": rounded_ms(percentile(process_cpu, 0.99))}


async def context_phase(arguments: argparse.Namespace, env: Any, engine: Any, port: int,
                        figures: dict[str, Any]) -> None:
    marker = os.path.join(arguments.data or "", f"knowledge-loaded-{arguments.items}")
    if arguments.data and os.path.exists(marker):
        loaded, figures["load_skipped"] = [], True  # ``--data``: loaded by an earlier run
    else:
        loaded_figures, loaded = await load_knowledge(env, engine, arguments.items)
        figures.update(loaded_figures)
        if arguments.data:
            open(marker, "w").close()
    figures.update(await build_index(env, engine, loaded))
    queries = context_queries(arguments.context_requests)
    common = {"mode": "context", "port": port, "seconds": None, "connections": arguments.context_connections,
              "queries": queries, "scope": main_scope, "top_k": context_top_k, "max_chars": context_max_chars}
    await run_client({**common, "requests": min(40, len(queries))})  # warm caches
    with profiled_phase(arguments, "context"), PhaseMeter(engine) as meter:
        answered = await run_client({**common, "requests": arguments.context_requests})
    figures["context_server"] = meter.figures
    figures["context_server"]["cpu_ms_per_request"] = round(
        meter.cpu_seconds / max(1, answered["answered_total"]) * 1000, 2)
    figures.update({
        "context_requests": answered["requests"], "context_errors": answered["error_count"],
        "context_p50_ms": answered["p50_ms"], "context_p99_ms": answered["p99_ms"],
        "context_max_ms": answered["max_ms"], "context_server_p50_ms": answered["server_p50_ms"],
        "context_server_p99_ms": answered["server_p99_ms"], "context_items_mean": answered["items_mean"],
    })
    # One caller at a time (an agent asks for its context once per turn), then open loops at
    # ``--context-rates``: the latency target's figures; the closed loop above measures
    # capacity (its connections always wait: latency = connections / throughput).
    sequential = await run_client({**common, "connections": 1, "requests": arguments.context_requests})
    figures["context_sequential"] = {key: sequential[key] for key in ("requests", "p50_ms", "p99_ms", "max_ms")}
    figures["context_open_loop"] = await open_loop_series(engine, arguments.context_rates, lambda rate: run_client(
        {**common, "mode": "context_open_loop", "rate": rate, "seconds": arguments.context_rate_seconds,
         "warm_up_seconds": warm_up_seconds, "connections": context_open_loop_connections}))
    with profiled_phase(arguments, "in_process"):
        figures["context_in_process"] = await in_process_context(env, engine, queries)


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "load_average_at_start": [round(value, 2) for value in os.getloadavg()],
        "note": "client and server processes share these cores",
        "embedder": arguments.embedder,
        "model": os.environ.get("TROUPE_MODEL", "local"),
        "switch_interval_seconds": sys.getswitchinterval(),
    }
    job_times = time_write_jobs() if arguments.job_times else None
    with contextlib.ExitStack() as stack:
        directory = arguments.data or stack.enter_context(tempfile.TemporaryDirectory(prefix="troupe-bench-knowledge-"))
        async with trio.open_nursery() as nursery:
            env, engine, system, port = await start_knowledge(nursery, directory, arguments.embedder)
            figures.update({"scopes": arguments.scopes, "write_seconds": arguments.seconds})
            if arguments.phase in ("all", "write", "capacity"):
                figures["connections"] = arguments.connections
                await write_phase(arguments, env, engine, port, figures)
            if arguments.phase in ("all", "write", "latency"):
                await latency_phase(arguments, env, engine, port, figures)
            if arguments.phase in ("all", "write", "actor"):
                await actor_phase(arguments, env, engine, system, figures)
            if arguments.phase in ("all", "replay"):
                await replay_phase(arguments, env, engine, port, figures)
            if arguments.phase in ("all", "context") and arguments.items > 0:
                await context_phase(arguments, env, engine, port, figures)
            figures["load_average_at_end"] = [round(value, 2) for value in os.getloadavg()]
            targets = {}
            if "writes_per_second" in figures:
                targets["writes_at_least_1000_per_second"] = figures["writes_per_second"] >= 1000
            if "latency_p99_ms" in figures:
                # The open-loop phase at --latency-rate: every write sent on time and answered.
                targets["write_p99_at_most_20_ms"] = ((figures["latency_p99_ms"] or 1e9) <= 20
                                                      and figures["latency_unanswered"] == 0
                                                      and figures["latency_unsent"] == 0
                                                      and figures["latency_errors"] == 0)
            if "replay_new_evidence" in figures:
                targets["replay_creates_nothing"] = (figures["replay_new_evidence"] == 0
                                                     and figures["replay_new_knowledge"] == 0
                                                     and figures["replay_same_answers"])
            if "context_p99_ms" in figures:
                targets.update(p99_targets_per_load(
                    "context", 50, one_caller_p99=figures["context_sequential"]["p99_ms"],
                    open_loop_runs=figures["context_open_loop"], closed_loop_p99=figures["context_p99_ms"],
                    connections=arguments.context_connections))
            figures["targets_met"] = targets
            if job_times is not None:
                print_job_times(job_times)
            with trio.move_on_after(30):
                await system.drain()
            nursery.cancel_scope.cancel()
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--client":
        client_main()
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32, help="write connections")
    parser.add_argument("--scopes", type=int, default=64, help="user scopes the write phases spread over")
    parser.add_argument("--seconds", type=float, default=10.0, help="write phase duration (after a warm-up)")
    parser.add_argument("--replay-writes", type=int, default=5_000)
    parser.add_argument("--items", type=int, default=100_000, help="knowledge items loaded for /agent/context")
    parser.add_argument("--context-requests", type=int, default=400)
    parser.add_argument("--context-connections", type=int, default=4)
    parser.add_argument("--context-rates", type=rates_argument,
                        default=context_rates_default, help="open-loop agent-context requests/s, comma-separated")
    parser.add_argument("--context-rate-seconds", type=float, default=5.0, help="each open-loop rate's duration")
    parser.add_argument("--latency-rate", type=float, default=latency_rate_default,
                        help="writes/s the open-loop latency phase offers")
    parser.add_argument("--latency-connections", type=int, default=latency_connections_default,
                        help="connections of the latency phase's pool")
    parser.add_argument("--actor-writes", type=int, default=6_400,
                        help="writes of the actor phase (the write path without HTTP)")
    parser.add_argument("--phase", choices=["all", "write", "capacity", "latency", "actor", "replay", "context"],
                        default="all",
                        help="write = capacity (closed loop), latency (open loop), actor (no HTTP)")
    parser.add_argument("--embedder", choices=["hashed", "none"], default="hashed",
                        help="hashed: troupe serve's offline default; none: BM25-only recall")
    parser.add_argument("--profile", choices=["write", "latency", "context", "in_process"], default=None,
                        help="cProfile the server's event loop during this phase (stderr)")
    parser.add_argument("--profile-sort", default="tottime")
    parser.add_argument("--profile-lines", type=int, default=40)
    parser.add_argument("--data", default=None,
                        help="keep the data in this directory; with --phase context, a later run with the same "
                             "--items skips the load (diagnostics)")
    parser.add_argument("--job-times", action="store_true",
                        help="print the writer thread's time per kind of storage job (stderr)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the server process (experiment; default: as troupe serve)")
    parsed = parser.parse_args()
    if parsed.switch_interval is not None:
        sys.setswitchinterval(parsed.switch_interval)
    if parsed.data and parsed.phase != "context":
        parser.error("--data is for --phase context only")
    print(json.dumps(trio.run(main, parsed), ensure_ascii=False), flush=True)
