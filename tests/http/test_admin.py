"""The admin surface through quart's test client, with a real actor system behind a fake
AdminSource, and a strict check of the Prometheus text exposition format."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import trio

from troupe.http import create_admin_app
from troupe.runtime import Actor, ActorCrashed, ActorKind, open_actor_system
from troupe.runtime._system import turn_latency_buckets_seconds
from troupe.sim._sim_env import sim_env
from troupe.storage import EngineStatistics


@dataclass(frozen=True)
class Work:
    seconds: float = 0.0
    crash: bool = False


class Worker(Actor):
    async def receive(self, message):
        if message.crash:
            raise RuntimeError("planned crash")
        await trio.sleep(message.seconds)
        return "done"


class FakeSource:
    def __init__(self, system=None, storage=None):
        self.system = system
        self.storage = storage
        self.components = {"storage": True, "actor_system": True, "accepting": True}

    def readiness(self):
        return self.components

    def statistics(self):
        system = self.system
        return {
            "kinds": system.statistics() if system else {},
            "supervisor_restarts": system.root.restarts if system else 0,
            "supervisor_escalations": system.root.escalations if system else 0,
            "storage": self.storage,
        }


# -- a strict parser for the text format 0.0.4 ------------------------------------------------

_name = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_sample_line = re.compile(rf"({_name})(?:\{{((?:{_label})(?:,{_label})*)?\}})? (\S+)")
_help_line = re.compile(rf"# HELP ({_name}) (.*)")
_type_line = re.compile(rf"# TYPE ({_name}) (counter|gauge|histogram|summary|untyped)")
_suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}


def parse_exposition(text: str) -> dict[str, dict]:
    """Family name -> {"type", "help", "samples": [(name, labels, value)]}; asserts on any
    line that is not HELP, TYPE or a sample of the family declared just before it."""
    assert text.endswith("\n")
    families: dict[str, dict] = {}
    current: str | None = None
    for line in text[:-1].split("\n"):
        if match := _help_line.fullmatch(line):
            name = match.group(1)
            assert name not in families, f"family {name} declared twice"
            families[name] = {"help": match.group(2), "type": None, "samples": []}
            current = name
        elif match := _type_line.fullmatch(line):
            assert match.group(1) == current and families[current]["type"] is None, line
            families[current]["type"] = match.group(2)
        elif match := _sample_line.fullmatch(line):
            sample, labels_text, value = match.groups()
            assert current is not None and families[current]["type"] is not None, line
            allowed = [current + suffix for suffix in _suffixes.get(families[current]["type"], ("",))]
            assert sample in allowed, f"{sample} outside its family {current}"
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_text or ""))
            number = float(value)  # raises on anything that is not a Prometheus float
            assert not math.isnan(number)
            families[current]["samples"].append((sample, labels, number))
        else:
            raise AssertionError(f"not a valid exposition line: {line!r}")
    return families


def values(families, family, sample=None, **labels):
    return [v for name, sample_labels, v in families[family]["samples"]
            if (sample is None or name == sample) and all(sample_labels.get(k) == x for k, x in labels.items())]


# -- tests -------------------------------------------------------------------------------------


async def test_healthz_is_ok_even_when_nothing_is_ready():
    source = FakeSource()
    source.components = {"storage": False, "actor_system": False, "accepting": False}
    response = await create_admin_app(source).test_client().get("/healthz")
    assert response.status_code == 200
    assert await response.get_json() == {"status": "ok"}


async def test_readyz_names_what_is_not_ready():
    source = FakeSource()
    client = create_admin_app(source).test_client()
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert (await ready.get_json())["status"] == "ready"
    source.components = {"storage": True, "actor_system": False, "accepting": False}
    not_ready = await client.get("/readyz")
    assert not_ready.status_code == 503
    document = await not_ready.get_json()
    assert document["status"] == "not_ready"
    assert document["not_ready"] == ["accepting", "actor_system"]


async def test_metrics_and_actors_report_a_running_system(tmp_path):
    env = sim_env(1, str(tmp_path))
    kinds = [ActorKind("worker", lambda context: Worker(context)), ActorKind("idle", lambda context: Worker(context))]
    storage = EngineStatistics(commits=3, jobs=5, commit_seconds_last=0.002, commit_seconds_max=0.004, commit_seconds_total=0.007)
    async with open_actor_system(env, kinds) as system:
        for key in ("a", "b"):
            assert await system.ref("worker", key).ask(Work(0.003)) == "done"
        assert await system.ref("worker", "a").ask(Work(0.0)) == "done"
        with pytest.raises(ActorCrashed):
            await system.ref("worker", "c").ask(Work(crash=True))
        client = create_admin_app(FakeSource(system, storage)).test_client()
        metrics = await client.get("/metrics")
        actors = await client.get("/actors")

    assert metrics.status_code == 200
    assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = parse_exposition((await metrics.get_data()).decode())
    for family, family_type in {
        "troupe_actors_live": "gauge", "troupe_mailbox_depth": "gauge", "troupe_actor_turns_total": "counter",
        "troupe_actor_turn_seconds": "histogram", "troupe_actor_crashes_total": "counter",
        "troupe_actor_restarts_total": "counter", "troupe_actor_escalations_total": "counter",
        "troupe_actor_poison_total": "counter", "troupe_supervisor_restarts_total": "counter",
        "troupe_supervisor_escalations_total": "counter", "troupe_storage_commits_total": "counter",
        "troupe_storage_commit_seconds": "summary", "troupe_storage_commit_seconds_last": "gauge",
        "troupe_storage_commit_seconds_max": "gauge", "troupe_kind_available": "gauge",
    }.items():
        assert families[family]["type"] == family_type, family
    assert values(families, "troupe_actors_live", kind="worker") == [3]
    assert values(families, "troupe_actors_live", kind="idle") == [0]
    assert values(families, "troupe_actor_turns_total", kind="worker") == [3]
    assert values(families, "troupe_actor_crashes_total", kind="worker") == [1]
    assert values(families, "troupe_actor_restarts_total", kind="worker") == [1]
    assert values(families, "troupe_kind_available", kind="worker") == [1]
    buckets = [(labels["le"], v) for name, labels, v in families["troupe_actor_turn_seconds"]["samples"]
               if name.endswith("_bucket") and labels["kind"] == "worker"]
    assert [le for le, _ in buckets] == [repr(float(b)) for b in turn_latency_buckets_seconds] + ["+Inf"]
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == 3  # cumulative, all turns under +Inf
    assert values(families, "troupe_actor_turn_seconds", "troupe_actor_turn_seconds_count", kind="worker") == [3]
    assert values(families, "troupe_storage_commits_total") == [3]
    assert values(families, "troupe_storage_commit_seconds", "troupe_storage_commit_seconds_sum") == [0.007]
    assert values(families, "troupe_storage_commit_seconds_max") == [0.004]

    document = await actors.get_json()
    assert document["kinds"]["worker"]["live"] == 3
    assert document["kinds"]["worker"]["turns"] == 3
    assert sum(document["kinds"]["worker"]["turn_latency"]["counts"]) == 3
    assert document["kinds"]["worker"]["turn_latency"]["buckets_seconds"] == list(turn_latency_buckets_seconds)
    assert document["supervisor"] == {"restarts": 0, "escalations": 0}
    assert document["storage"]["commits"] == 3


async def test_label_values_are_escaped(tmp_path):
    env = sim_env(1, str(tmp_path))
    odd = 'we"ird\\kind\nname'
    async with open_actor_system(env, [ActorKind(odd, lambda context: Worker(context))]) as system:
        text = (await (await create_admin_app(FakeSource(system)).test_client().get("/metrics")).get_data()).decode()
    families = parse_exposition(text)
    assert values(families, "troupe_actors_live", kind='we\\"ird\\\\kind\\nname') == [0]


async def test_admin_errors_use_troupes_envelope():
    client = create_admin_app(FakeSource()).test_client()
    missing = await client.get("/nope")
    assert missing.status_code == 404
    assert (await missing.get_json())["error"]["code"] == "not_found"
    bad_host = await client.get("/healthz", headers={"Host": "rebind.example"})
    assert bad_host.status_code == 400
    assert (await bad_host.get_json())["error"]["code"] == "bad_host"
