"""Device sync benchmark: prints one JSON line of figures (not a test; nothing here asserts time).

Why: issue 13 asks how fast knowledge in ``shared:*`` scopes converges across three paired
devices (target: 10,000 operations in at most 10 s on loopback), how many bytes that costs,
and what anti-entropy costs when there is nothing to repair.

In this process, three instances of the knowledge surface run as ``troupe serve`` builds it
(``new_knowledge_surface()`` over a real ``Engine`` with ``synchronous=FULL`` in its own
temporary directory, the real ``ActorSystem``, the real Env with the offline hashed embedder),
each behind its own hypercorn listener on 127.0.0.1 (an ephemeral port).  Each instance's
outbound ``env.http`` is an ``httpx.AsyncClient`` whose transport counts the bytes of every
peer request and answer (bodies and headers).

Two modes, each on three fresh instances (``--mode both``, the default, runs online then
offline and prints both in the one JSON line, under the keys ``online`` and ``offline``):

- ``online``: replication runs during the load, as it would in production; "time to converge"
  then overlaps the load, so it is counted from the load's end (``converge_seconds``) and from
  its start (``total_seconds``);
- ``offline``: the devices are apart during the load (airplane mode, in the product's own
  terms): before it, every instance is paused with ``PUT /sync/settings {"paused": true}``,
  the user's switch (nothing is sent or accepted, edits are still captured and signed); after
  it, once every outbox is drained (``captured_seconds``), all three are resumed at once
  (``{"paused": false}``, three requests in flight together) and ``converge_seconds`` and
  ``index_settled_seconds`` count from the resume.  ``peer_requests_while_apart`` shows the
  pause held (0).

Each mode:

1. pairing over HTTP, as a user would: instance 0 makes a QR token and 1 pairs with it; 0 makes
   a PIN token and 2 pairs; 1 makes a token and 2 pairs (a full mesh);
2. load: ``--operations`` (10,000) knowledge items created in ``shared:*`` scopes, a third on
   each instance, in bulk through the store functions the write path and structuring use
   (``write_evidence`` then ``create_knowledge``, jobs of ``load_items_per_job``, then the
   recall index refreshed with the new items, as structuring does after its commit): each
   item is one operation its device captures, signs and replicates;
3. convergence: the operation and item counts polled every ``poll_seconds`` until every
   instance holds every operation (``sync_ops`` + ``sync_covered``) and every item
   (``knowledge_items``), then the three operation-set digests compared: ``converge_seconds``,
   bytes and requests exchanged, operations per second, and ``cpu_seconds`` for the load and
   the convergence (the process, its event loop thread, and each instance's storage threads);
   then ``index_settled_seconds``: until every instance's recall index holds every item
   (remote winners are re-indexed beside replication, after their commit);
4. anti-entropy with nothing to repair: one forced round (``RunSyncRound``, gossip and
   version-vector exchange with both peers) on each instance, timed, with its bytes.

``--profile DIR`` writes cProfile statistics per mode and phase (``offline-converge-loop.pstats``
for the event loop thread, ``offline-converge-storage.pstats`` for every instance's storage
threads), timed by thread CPU so waits for the GIL are not counted; profiling slows the run
about threefold, so its wall figures are not the bench's.

Usage: python bench/sync.py [--mode online|offline|both] [--operations 10000]
       [--gossip-seconds 0.5] [--profile DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from typing import Any

import httpx
import trio
from _load import start_server

instances_count = 3
load_items_per_job = 500
poll_seconds = 0.1
progress_seconds = 5.0
converge_seconds_max = 300.0
shared_scopes = ("shared:home", "shared:family", "shared:work")
modes_all = ("online", "offline")
"""``--mode both`` (the default) runs both, each on three fresh instances, online first."""
topics = ("客厅", "厨房", "孩子的钢琴课", "周末采购", "boiler service", "garden", "体检预约", "车辆保险")


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting what goes over the wire (bodies plus header lines)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests = 0
        self.bytes_sent = 0
        self.bytes_received = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        self.requests += 1
        self.bytes_sent += len(body) + sum(len(name) + len(value) + 4 for name, value in request.headers.raw)
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        self.bytes_received += len(content) + sum(len(name) + len(value) + 4 for name, value in response.headers.raw)
        return httpx.Response(response.status_code, headers=response.headers, content=content,
                              extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


class MeteredExecutor:
    """The real executor, adding up the CPU (``time.thread_time`` in the worker thread) of
    every storage job batch and read it runs: the instance's share of the process's CPU that
    is not the event loop's (the three instances share one trio loop and one GIL, so the loop's
    CPU is only known for the process as a whole)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.cpu_seconds = 0.0
        self.lock = threading.Lock()
        self.profiles: dict[int, cProfile.Profile] | None = None
        """``--profile``: one profiler per worker thread (a profiler belongs to one thread)."""

    def start_profiles(self) -> None:
        self.profiles = {}

    def stop_profiles(self) -> list[cProfile.Profile]:
        with self.lock:
            profiles, self.profiles = list((self.profiles or {}).values()), None
        return profiles

    def _profile(self) -> cProfile.Profile | None:
        with self.lock:
            if self.profiles is None:
                return None
            return self.profiles.setdefault(threading.get_ident(), cProfile.Profile(time.thread_time))

    async def run_sync(self, function: Any, *args: Any) -> Any:
        def metered(*inner_args: Any) -> Any:
            profile = self._profile()
            if profile is not None:
                profile.enable()
            began = time.thread_time()
            try:
                return function(*inner_args)
            finally:
                spent = time.thread_time() - began
                if profile is not None:
                    profile.disable()
                with self.lock:  # readers and the writer run in several threads at once
                    self.cpu_seconds += spent

        return await self.inner.run_sync(metered, *args)


class Instance:
    def __init__(self, index: int, env: Any, engine: Any, system: Any, port: int, meter: CountingTransport,
                 executor: MeteredExecutor) -> None:
        self.index, self.env, self.engine, self.system, self.port, self.meter = index, env, engine, system, port, meter
        self.executor = executor

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def start_instance(nursery: trio.Nursery, index: int, data_dir: str, gossip_seconds: float) -> Instance:
    from troupe._config import ServeOptions
    from troupe.actors.knowledge.sync import SyncSettings
    from troupe.http import ShutdownSignal
    from troupe.http.knowledge import new_knowledge_surface
    from troupe.models import HashedEmbedder, LocalModel
    from troupe.runtime import ActorSystem, real_env
    from troupe.server import (
        SurfaceContext,
        surface_actor_kinds,
        surface_migrations,
        surface_services,
    )
    from troupe.storage import Engine, StorageError

    surface = new_knowledge_surface({}, os_release_text="", sync_settings=SyncSettings(
        device_name=f"bench-{index}", gossip_interval_seconds=gossip_seconds))
    env = real_env(data_dir)
    env.model, env.embedder = LocalModel(), HashedEmbedder()
    executor = MeteredExecutor(env.executor)
    env.executor = executor
    meter = CountingTransport()
    env.http = httpx.AsyncClient(transport=meter, timeout=30)
    engine = await Engine.open(env, nursery=nursery, migrations=surface_migrations([surface]))
    system = ActorSystem(env, surface_actor_kinds([surface]), storage=engine, services=surface_services([surface]),
                         transient_errors=(StorageError,))
    await nursery.start(system.run)
    context = SurfaceContext(ServeOptions(), env, engine, system, ShutdownSignal(), None)
    port = await start_server(nursery, surface.create_app(context))
    return Instance(index, env, engine, system, port, meter, executor)


async def pair(client: httpx.AsyncClient, issuer: Instance, joiner: Instance, method: str) -> None:
    request: dict[str, Any] = {"method": method}
    if method == "PIN":
        request["pin"] = "246810"
    token = (await client.post(f"{issuer.base}/sync/token", json=request)).raise_for_status().json()
    answer = await client.post(f"{joiner.base}/sync/pair", json={**request, "token": token["token"]})
    answer.raise_for_status()
    assert answer.json()["status"] == "paired", answer.text


def _load_job(connection: Any, plan: list[tuple[Any, ...]]) -> int:
    from troupe.actors.knowledge import create_knowledge, write_evidence

    for draft, structure, evidence_id, knowledge_id, now in plan:
        outcome = write_evidence(connection, draft, evidence_id=evidence_id, now=now, latency_ms=1)
        assert outcome.evidence is not None, outcome
        item, _ = create_knowledge(connection, knowledge_id=knowledge_id, evidence_id=evidence_id,
                                   title=structure.title, body=structure.body, entities=structure.entities,
                                   relations=list(structure.relations), now=now)
        assert item is not None
    return len(plan)


async def load(instance: Instance, first: int, count: int) -> None:
    from troupe.actors.knowledge import (
        EvidenceDraft,
        evidence_quality_score,
        extract_structure,
        knowledge_indexes,
    )

    index = await knowledge_indexes.open(instance.engine, instance.env.embedder)

    for start in range(first, first + count, load_items_per_job):
        plan = []
        for number in range(start, min(start + load_items_per_job, first + count)):
            raw = {"user": f"记一下：{topics[number % len(topics)]} 第 {number} 条家庭笔记",
                   "assistant": f"好的，已记下 note-{number}"}
            scope = shared_scopes[number % len(shared_scopes)]
            draft = EvidenceDraft(scope=scope, source_type="CONVERSATION", raw=raw, context=None, provenance=None,
                                  quality_score=evidence_quality_score("CONVERSATION", raw))
            plan.append((draft, extract_structure("CONVERSATION", raw), instance.env.ids.new_id("evd_"),
                         instance.env.ids.new_id("knw_"), instance.env.clock.wall()))
        await instance.engine.write(lambda connection, plan=plan: _load_job(connection, plan))
        # As structuring does after its commit: the new items go into the recall index.
        await index.refresh([knowledge_id for _, _, _, knowledge_id, _ in plan])


_held_digests = "SELECT digest FROM sync_ops UNION ALL SELECT digest FROM sync_covered"
"""Every operation a replica holds: compaction moves covered upserts from ``sync_ops`` to
``sync_covered`` (digest kept), so a replica's operation set is the union of both."""


def _replica_counts(connection: Any) -> tuple[int, int]:
    """How many operations and shared items a replica holds: two counts, cheap enough to poll
    (the digest of every operation is taken only once the counts are complete; hashing 10,000
    digests on three replicas every poll was a tenth of the run's CPU, taken from the devices)."""
    operations = connection.execute("SELECT (SELECT count(*) FROM sync_ops) + (SELECT count(*) FROM sync_covered)"
                                    ).fetchone()[0]
    items = connection.execute("SELECT count(*) FROM knowledge_items WHERE scope LIKE 'shared:%'").fetchone()[0]
    return operations, items


def _replica_state(connection: Any) -> tuple[int, int, str]:
    operations, items = _replica_counts(connection)
    digest = hashlib.sha256()
    for (value,) in connection.execute(f"SELECT digest FROM ({_held_digests}) ORDER BY digest"):
        digest.update(value.encode())
    return operations, items, digest.hexdigest()


async def _index_settled(instances: list[Instance], operations: int, loaded: float) -> float | None:
    """Seconds from ``loaded`` (the end of the load, or the resume) until every instance's recall index holds every item
    (the sync actor refreshes it beside replication, after each batch's commit); None when it
    does not within ``converge_seconds_max``."""
    from troupe.actors.knowledge import knowledge_indexes

    indexes = [await knowledge_indexes.open(instance.engine, instance.env.embedder) for instance in instances]
    while time.perf_counter() - loaded < converge_seconds_max:
        if all(index.indexed_count >= operations for index in indexes):
            return round(time.perf_counter() - loaded, 3)
        await trio.sleep(poll_seconds)
    return None


def _traffic(instances: list[Instance]) -> tuple[int, int]:
    return (sum(instance.meter.requests for instance in instances),
            sum(instance.meter.bytes_sent + instance.meter.bytes_received for instance in instances))


class Phase:
    """The meters of one phase: wall, process CPU, the event loop thread's CPU, each instance's
    storage CPU, and (``--profile``) cProfile of the loop thread and of the storage threads."""

    def __init__(self, instances: list[Instance], name: str, profile_dir: str | None) -> None:
        self.instances, self.name, self.profile_dir = instances, name, profile_dir
        self.loop_profile: cProfile.Profile | None = None

    def __enter__(self) -> Phase:
        if self.profile_dir is not None:
            self.loop_profile = cProfile.Profile(time.thread_time)
            for instance in self.instances:
                instance.executor.start_profiles()
            self.loop_profile.enable()
        self.began, self.cpu_began, self.loop_began = time.perf_counter(), time.process_time(), time.thread_time()
        self.storage_began = [instance.executor.cpu_seconds for instance in self.instances]
        return self

    def __exit__(self, *_: Any) -> None:
        self.ended, self.cpu_ended, self.loop_ended = time.perf_counter(), time.process_time(), time.thread_time()
        self.storage_ended = [instance.executor.cpu_seconds for instance in self.instances]
        if self.loop_profile is not None and self.profile_dir is not None:
            self.loop_profile.disable()
            loop_path = os.path.join(self.profile_dir, f"{self.name}-loop.pstats")
            pstats.Stats(self.loop_profile).dump_stats(loop_path)
            storage = [profile for instance in self.instances for profile in instance.executor.stop_profiles()]
            storage_path = os.path.join(self.profile_dir, f"{self.name}-storage.pstats")
            if storage:
                pstats.Stats(*storage).dump_stats(storage_path)
            print(f"profiles: {loop_path} {storage_path}", file=sys.stderr)

    @property
    def seconds(self) -> float:
        return round(self.ended - self.began, 3)

    def cpu(self) -> dict[str, Any]:
        # One process: the three instances share its event loop and its GIL.  "storage" is each
        # instance's own reads and writer jobs (its worker threads); "loop" is the event loop's
        # thread (HTTP, signing, checks, actors: all three instances).
        return {"process": round(self.cpu_ended - self.cpu_began, 2),
                "loop": round(self.loop_ended - self.loop_began, 2),
                "storage_per_instance": [round(after - before, 2) for before, after
                                         in zip(self.storage_began, self.storage_ended, strict=True)]}


async def _converge(instances: list[Instance], operations: int, began: float
                    ) -> tuple[bool, list[tuple[int, int, str]]]:
    """Poll until every instance holds every operation and item and the operation-set digests
    agree (True), or ``converge_seconds_max`` passes (False); the last states seen."""
    states: list[tuple[int, int, str]] = []
    reported = began
    while time.perf_counter() - began < converge_seconds_max:
        states = [(*await instance.engine.read(_replica_counts), "") for instance in instances]
        if all(state[0] >= operations and state[1] >= operations for state in states):
            states = [await instance.engine.read(_replica_state) for instance in instances]
            if len({state[2] for state in states}) == 1:
                return True, states
        if time.perf_counter() - reported >= progress_seconds:
            reported = time.perf_counter()
            print(f"after {reported - began:.0f} s: operations {[state[0] for state in states]}, "
                  f"items {[state[1] for state in states]}", file=sys.stderr)
        await trio.sleep(poll_seconds)
    return False, states


async def _put_settings(client: httpx.AsyncClient, instance: Instance, paused: bool) -> None:
    """``PUT /sync/settings {"paused": ...}``: the user's own switch (the GUI's pause, or what
    airplane mode amounts to for sync: nothing sent, nothing accepted, edits still captured)."""
    answer = (await client.put(f"{instance.base}/sync/settings", json={"paused": paused})).raise_for_status()
    assert answer.json()["paused"] is paused, answer.text


async def _captured(instances: list[Instance], began: float) -> float | None:
    """Seconds from ``began`` until every instance's outbox is drained into signed operations
    (the loop captures while paused, every ``--gossip-seconds``); None past the bound."""
    from troupe.actors.knowledge.sync import outbox_size

    while time.perf_counter() - began < converge_seconds_max:
        if all([await instance.engine.read(outbox_size) == 0 for instance in instances]):
            return round(time.perf_counter() - began, 3)
        await trio.sleep(poll_seconds)
    return None


async def _idle_anti_entropy(instances: list[Instance]) -> dict[str, Any]:
    """One forced round (gossip and version-vector exchange with both peers) on each instance."""
    from troupe.actors.knowledge.sync import RunSyncRound, sync_key, sync_kind_name

    requests_before, bytes_before = _traffic(instances)
    began = time.perf_counter()
    rounds = []
    for instance in instances:
        round_began = time.perf_counter()
        try:
            done_round = await instance.system.ref(sync_kind_name, sync_key).ask(
                RunSyncRound(anti_entropy=True), timeout=120)
        except Exception as error:  # noqa: BLE001 - reported, not fatal: the figures above stand
            rounds.append({"seconds": round(time.perf_counter() - round_began, 4),
                           "error": f"{type(error).__name__}: {error}"[:200]})
            continue
        rounds.append({"seconds": round(time.perf_counter() - round_began, 4), "pulled": done_round.pulled,
                       "pushed": done_round.pushed, "peers": done_round.peers_reached})
    requests_after, bytes_after = _traffic(instances)
    return {"rounds": rounds, "seconds_per_round_mean": round((time.perf_counter() - began) / instances_count, 4),
            "peer_requests": requests_after - requests_before, "bytes_exchanged": bytes_after - bytes_before}


async def run_mode(mode: str, arguments: argparse.Namespace, root: str) -> dict[str, Any]:
    """One run on three fresh instances: ``online`` (replication runs during the load;
    convergence from the load's end) or ``offline`` (every instance paused through
    ``/sync/settings`` before the load, resumed on all three at once after it; convergence
    from the resume)."""
    figures: dict[str, Any] = {"load_average_at_start": round(os.getloadavg()[0], 2)}
    profile_dir = arguments.profile
    operations = arguments.operations
    async with trio.open_nursery() as nursery:
        instances = [await start_instance(nursery, index, os.path.join(root, f"{mode}-{index}"),
                                          arguments.gossip_seconds) for index in range(instances_count)]
        async with httpx.AsyncClient(timeout=60) as client:
            began = time.perf_counter()
            await pair(client, instances[0], instances[1], "QR")
            await pair(client, instances[0], instances[2], "PIN")
            await pair(client, instances[1], instances[2], "QR")
            figures["pairing_seconds"] = round(time.perf_counter() - began, 3)
            if mode == "offline":
                # What pairing started (anti-entropy with nothing to repair) ends first: a round
                # under way when the pause is answered stops before its next send anyway.
                for instance in instances:
                    await _put_settings(client, instance, paused=True)
            share = operations // instances_count
            counts = [share + (1 if index < operations % instances_count else 0) for index in range(instances_count)]
            firsts = [sum(counts[:index]) for index in range(instances_count)]
            requests_before, bytes_before = _traffic(instances)
            with Phase(instances, f"{mode}-load", profile_dir) as load_phase:
                async with trio.open_nursery() as loaders:
                    for instance, first, count in zip(instances, firsts, counts, strict=True):
                        loaders.start_soon(load, instance, first, count)
            figures["load_seconds"] = load_phase.seconds
            cpu = {"load": load_phase.cpu()}
            if mode == "offline":
                # The devices stay apart until each has signed its edits (its loop captures while
                # paused), as when they were apart for a while; then all three resume at once.
                captured = await _captured(instances, load_phase.ended)
                requests_apart, bytes_apart = _traffic(instances)
                figures.update(captured_seconds=captured, peer_requests_while_apart=requests_apart - requests_before,
                               bytes_while_apart=bytes_apart - bytes_before)
                requests_before, bytes_before = requests_apart, bytes_apart
            with Phase(instances, f"{mode}-converge", profile_dir) as converge_phase:
                if mode == "offline":
                    async with trio.open_nursery() as resuming:
                        for instance in instances:
                            resuming.start_soon(lambda instance=instance: _put_settings(client, instance, paused=False))
                    figures["resume_answered_seconds"] = round(time.perf_counter() - converge_phase.began, 3)
                converged, states = await _converge(instances, operations, converge_phase.began)
        requests_after, bytes_after = _traffic(instances)
        cpu["converge"] = converge_phase.cpu()
        figures.update(
            converged=converged,
            converge_seconds=converge_phase.seconds,
            peer_requests=requests_after - requests_before,
            bytes_exchanged=bytes_after - bytes_before,
            bytes_per_operation_per_replica=round((bytes_after - bytes_before) / (operations * (instances_count - 1)), 1),
            replica_operations=[state[0] for state in states],
            replica_items=[state[1] for state in states],
            cpu_seconds=cpu,
        )
        # Online: from the load's start (replication overlaps it); offline: from the resume.
        spent = converge_phase.ended - (load_phase.began if mode == "online" else converge_phase.began)
        if mode == "online":
            figures["total_seconds"] = round(spent, 3)
        figures["operations_per_second"] = round(operations / spent, 1)
        figures["index_settled_seconds"] = await _index_settled(instances, operations, converge_phase.began)
        figures["idle_anti_entropy"] = await _idle_anti_entropy(instances)
        figures["load_average_at_end"] = round(os.getloadavg()[0], 2)
        for instance in instances:
            await instance.env.http.aclose()
        nursery.cancel_scope.cancel()
    return figures


async def main(arguments: argparse.Namespace) -> dict[str, Any]:
    modes = list(modes_all) if arguments.mode == "both" else [arguments.mode]
    figures: dict[str, Any] = {"benchmark": "sync", "instances": instances_count, "operations": arguments.operations,
                               "gossip_seconds": arguments.gossip_seconds, "cpu_count": os.cpu_count(),
                               "load_average": round(os.getloadavg()[0], 2), "modes": modes}
    if arguments.profile is not None:
        os.makedirs(arguments.profile, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="troupe-bench-sync-") as root:
        for mode in modes:
            print(f"mode {mode} ...", file=sys.stderr)
            figures[mode] = await run_mode(mode, arguments, root)
    return figures


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--operations", type=int, default=10_000)
    parser.add_argument("--gossip-seconds", type=float, default=0.5)
    parser.add_argument("--mode", choices=[*modes_all, "both"], default="both")
    parser.add_argument("--profile", metavar="DIR", default=None,
                        help="write cProfile stats (thread CPU, not wall: waits for the GIL are not counted) per mode and phase (event loop thread; storage threads) to DIR")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(trio.run(main, parse_arguments(sys.argv[1:]))))
