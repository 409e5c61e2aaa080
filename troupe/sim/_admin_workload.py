"""The ``admin`` workload: operators' probes against the admin surface, through HTTP, under faults.

The admin surface is what an orchestrator trusts to decide whether to restart or route to the
process, so its answers must stay true while actors crash, restart and storage fails around
them.  Every operation goes through the ``AsgiDriver`` the simulator put where the admin
listener would be (``world.apps["admin"]``), never through the system directly: the
routes, the middleware and the error envelopes are what is under test.  The system is read
directly only as the oracle, right before the request is sent and right after the response
arrived, so that a figure the surface reports must lie between the two (it was read at some
moment in between: the same bracketing a linearizability checker uses).

Invariants, each checked on every response (documented in ``docs/operations.md`` and
``troupe/http/_admin.py``):

- ``GET /healthz`` is ``200 {"status": "ok"}``;
- ``GET /readyz`` is 200 with every component true while the system runs and the server
  accepts; a 503 names exactly the components that are false;
- ``GET /metrics`` is well-formed Prometheus text (every sample belongs to a declared
  family); counters (and histogram/summary ``_count``/``_sum``/``_bucket``) never decrease
  within one process lifetime; per-kind, supervisor and storage counters agree with the
  system's own figures (bracketed);
- ``GET /actors`` names exactly the system's kinds and its counters agree (bracketed);
- a forbidden Host is ``400 bad_host``; an unsupported method ``405 method_not_allowed``; an
  unknown path ``404 not_found``; a declared body over the limit ``413 payload_too_large``
  (a chunked one may also be answered by the route first: 405, or 413); every error body is
  troupe's envelope ``{"error": {"code", "message"}}``;
- no request times out, and the app never raises (the driver counts what would be a 500).

Violations found during client steps are handed out by the next ``after_restart`` or
``at_quiescence`` call.  Without ``world.apps`` (a simulation that does not start the
server), steps only pause.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import trio

from troupe.server import ServeOptions

from ._asgi import AsgiDriver, AsgiResponse, IncompleteResponse
from ._violation import Violation
from ._workload import World, register_workload
from ._workload_http import json_or_none, send_traced

checker_name = "admin"
client_pause_seconds_max = 0.05
oversized_chunk_bytes = 64 * 1024
request_body_bytes_max = ServeOptions().request_body_bytes_max
"""The admin surface's limit as the simulator starts it (``ServeOptions`` defaults)."""

readiness_components = frozenset({"storage", "actor_system", "accepting"})
forbidden_hosts = ("evil.example", "127.0.0.1.evil.example", "localhost.attacker:8700", "")
unsupported_methods = (("POST", "/healthz"), ("DELETE", "/metrics"), ("PUT", "/actors"), ("PATCH", "/readyz"))
unknown_paths = ("/nope", "/actors/x", "/metricsz")
kind_counter_fields = ("activations", "passivations", "turns", "crashes", "restarts", "escalations", "poison", "overloaded")

_sample_pattern = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def _admin_driver(world: World) -> AsgiDriver | None:
    apps = world.apps or world.notes.get("apps") or {}
    return apps.get("admin")


# ---------------------------------------------------------------------------- the oracle


def _system_counters(world: World) -> dict[str, float]:
    """The system's counters, named as ``/metrics`` names its samples."""
    counters: dict[str, float] = {}
    system = world.system
    if system is None:
        return counters
    for kind, statistics in system.statistics().items():
        figures = asdict(statistics)
        for field_name in kind_counter_fields:
            counters[f'troupe_actor_{field_name}_total{{kind="{kind}"}}'] = figures[field_name]
        counters[f'troupe_actor_turn_seconds_count{{kind="{kind}"}}'] = sum(figures["turn_latency_counts"])
    counters["troupe_supervisor_restarts_total"] = system.root.restarts
    counters["troupe_supervisor_escalations_total"] = system.root.escalations
    engine = world.engine
    if engine is not None:
        storage = engine.statistics()
        counters["troupe_storage_commits_total"] = storage.commits
        counters["troupe_storage_write_jobs_total"] = storage.jobs
        counters["troupe_storage_faults_total"] = storage.faults_seen
    return counters


def _document_counters(document: dict[str, Any]) -> dict[str, float]:
    """``/actors``'s figures, named as ``/metrics`` names them."""
    counters: dict[str, float] = {}
    for kind, figures in document["kinds"].items():
        for field_name in kind_counter_fields:
            counters[f'troupe_actor_{field_name}_total{{kind="{kind}"}}'] = figures[field_name]
        counters[f'troupe_actor_turn_seconds_count{{kind="{kind}"}}'] = sum(figures["turn_latency"]["counts"])
    counters["troupe_supervisor_restarts_total"] = document["supervisor"]["restarts"]
    counters["troupe_supervisor_escalations_total"] = document["supervisor"]["escalations"]
    storage = document.get("storage")
    if storage is not None:
        counters["troupe_storage_commits_total"] = storage["commits"]
        counters["troupe_storage_write_jobs_total"] = storage["jobs"]
        counters["troupe_storage_faults_total"] = storage["faults_seen"]
    return counters


def parse_exposition(text: str) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Prometheus text -> (samples by ``name{labels}``, family types, format problems)."""
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    problems: list[str] = []
    for line in text.splitlines():
        if not line or line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, metric_type = line.split(" ", 3)
            types[name] = metric_type
            continue
        match = _sample_pattern.match(line)
        if match is None:
            problems.append(f"unparseable line {line!r}")
            continue
        name = match.group(1)
        if _family(name, types) is None:
            problems.append(f"sample {name} has no TYPE line before it")
        try:
            samples[name + (match.group(2) or "")] = float(match.group(3))
        except ValueError:
            problems.append(f"bad value in {line!r}")
    return samples, types, problems


def _family(name: str, types: dict[str, str]) -> str | None:
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)]
    return None


def _is_monotonic(sample: str, types: dict[str, str]) -> bool:
    """Counters, and the ``_bucket``/``_sum``/``_count`` series of histograms and summaries."""
    name = sample.split("{", 1)[0]
    family = _family(name, types)
    if family is None:
        return False
    return types[family] == "counter" or (types[family] in ("histogram", "summary") and name != family)


# ---------------------------------------------------------------------------- the workload


class AdminWorkload:
    name = "admin"

    def __init__(self) -> None:
        self._pending: list[Violation] = []
        self._counters_seen: dict[str, tuple[float, int]] = {}
        self._counters_generation = 0
        self.responses = 0

    def actor_kinds(self, world: World) -> list[Any]:
        return []

    def migrations(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = _admin_driver(world)
        if driver is None:
            return
        operation = _operations[world.random.randrange(0, len(_operations))]
        await operation(self, world, driver, client)

    async def _send(
        self,
        world: World,
        driver: AsgiDriver,
        client: int,
        method: str,
        path: str,
        *,
        cut_short_ok: bool = False,
        **request: Any,
    ) -> tuple[AsgiResponse | None, tuple[int, ...]]:
        """One request, traced as an invocation and a completion; None if it failed.
        ``cut_short_ok``: a response cut off mid-body is a correct answer (see ``BodyLimit``)."""
        exchange = await send_traced(world, driver, "admin", method, path, labels={"client": client},
                                     violate=lambda text, sequences: self._violate(f"admin: {text}", sequences),
                                     **request)
        if exchange.response is None:
            if not (cut_short_ok and isinstance(exchange.error, IncompleteResponse)):
                self._violate(f"admin: {method} {path} failed: {exchange.error}", exchange.sequences)
            return None, exchange.sequences
        self.responses += 1
        return exchange.response, exchange.sequences

    def _violate(self, text: str, sequences: tuple[int, ...] = ()) -> None:
        self._pending.append(Violation(text, sequences=sequences, actors=(("http", "admin"),), checker=checker_name))

    def _expect_error(self, response: AsgiResponse, sequences, statuses: dict[int, str], what: str) -> None:
        code = statuses.get(response.status)
        if code is None:
            self._violate(f"admin: {what} answered {response.status}, expected one of {sorted(statuses)}", sequences)
            return
        problem = _envelope_problem(response, code)
        if problem:
            self._violate(f"admin: {what} ({response.status}): {problem}", sequences)

    async def healthz(self, world: World, driver: AsgiDriver, client: int) -> None:
        response, sequences = await self._send(world, driver, client, "GET", "/healthz")
        if response is not None and (response.status, json_or_none(response.body)) != (200, {"status": "ok"}):
            self._violate(f"admin: /healthz answered {response.status} {response.body[:200]!r}", sequences)

    async def readyz(self, world: World, driver: AsgiDriver, client: int) -> None:
        ready_before = _ready(world)
        response, sequences = await self._send(world, driver, client, "GET", "/readyz")
        if response is None:
            return
        ready_after = _ready(world)
        document = json_or_none(response.body)
        components = document.get("components") if isinstance(document, dict) else None
        if not isinstance(components, dict) or set(components) != readiness_components:
            self._violate(f"admin: /readyz components malformed: {response.body[:200]!r}", sequences)
            return
        not_ready = sorted(name for name, ready in components.items() if not ready)
        if response.status == 200:
            if not_ready or document.get("status") != "ready":
                self._violate(f"admin: /readyz 200 but not ready: {document}", sequences)
        elif response.status == 503:
            if ready_before and ready_after:
                self._violate(f"admin: /readyz 503 while the system runs: not_ready={not_ready}", sequences)
            if document.get("status") != "not_ready" or document.get("not_ready") != not_ready or not not_ready:
                self._violate(f"admin: /readyz 503 body inconsistent: {document}", sequences)
        else:
            self._violate(f"admin: /readyz answered {response.status}", sequences)

    async def metrics(self, world: World, driver: AsgiDriver, client: int) -> None:
        before = _system_counters(world)
        response, sequences = await self._send(world, driver, client, "GET", "/metrics")
        if response is None:
            return
        after = _system_counters(world)
        if response.status != 200 or not (response.header("content-type") or "").startswith("text/plain; version=0.0.4"):
            self._violate(f"admin: /metrics answered {response.status} {response.header('content-type')}", sequences)
            return
        samples, types, problems = parse_exposition(response.body.decode("utf-8"))
        for problem in problems[:3]:
            self._violate(f"admin: /metrics malformed: {problem}", sequences)
        self._check_monotonic(world, samples, types, sequences)
        self._check_bracketed("/metrics", samples, before, after, sequences)

    async def actors(self, world: World, driver: AsgiDriver, client: int) -> None:
        before = _system_counters(world)
        kinds = sorted(world.system.kinds) if world.system is not None else []
        response, sequences = await self._send(world, driver, client, "GET", "/actors")
        if response is None:
            return
        after = _system_counters(world)
        document = json_or_none(response.body)
        if response.status != 200 or not isinstance(document, dict):
            self._violate(f"admin: /actors answered {response.status} {response.body[:200]!r}", sequences)
            return
        try:
            reported = _document_counters(document)
        except (KeyError, TypeError, AttributeError) as error:
            self._violate(f"admin: /actors document malformed: missing {error}", sequences)
            return
        if sorted(document["kinds"]) != kinds:
            self._violate(f"admin: /actors kinds {sorted(document['kinds'])} != system kinds {kinds}", sequences)
        self._check_bracketed("/actors", reported, before, after, sequences)

    async def forbidden_host(self, world: World, driver: AsgiDriver, client: int) -> None:
        host = forbidden_hosts[world.random.randrange(0, len(forbidden_hosts))]
        path = ("/healthz", "/readyz", "/metrics", "/actors")[world.random.randrange(0, 4)]
        response, sequences = await self._send(world, driver, client, "GET", path, host=host)
        if response is not None:
            self._expect_error(response, sequences, {400: "bad_host"}, f"GET {path} with Host {host!r}")

    async def unsupported_method(self, world: World, driver: AsgiDriver, client: int) -> None:
        method, path = unsupported_methods[world.random.randrange(0, len(unsupported_methods))]
        response, sequences = await self._send(world, driver, client, method, path)
        if response is not None:
            self._expect_error(response, sequences, {405: "method_not_allowed"}, f"{method} {path}")

    async def unknown_path(self, world: World, driver: AsgiDriver, client: int) -> None:
        path = unknown_paths[world.random.randrange(0, len(unknown_paths))]
        response, sequences = await self._send(world, driver, client, "GET", path)
        if response is not None:
            self._expect_error(response, sequences, {404: "not_found"}, f"GET {path}")

    async def oversized_body(self, world: World, driver: AsgiDriver, client: int) -> None:
        size = request_body_bytes_max + 1 + world.random.randrange(0, oversized_chunk_bytes)
        if world.random.random() < 0.5:
            response, sequences = await self._send(world, driver, client, "GET", "/healthz", body=b"x" * size)
            expected = {413: "payload_too_large"}
            what = f"a declared {size}-byte body"
        else:
            chunks = [b"x" * oversized_chunk_bytes] * (size // oversized_chunk_bytes + 1)
            response, sequences = await self._send(world, driver, client, "POST", "/metrics", body=chunks, cut_short_ok=True)
            # The route may answer (405) before the body limit is reached, and a response
            # already started when the limit is crossed is cut short: all three are correct.
            expected = {413: "payload_too_large", 405: "method_not_allowed"}
            what = f"a chunked {len(chunks) * oversized_chunk_bytes}-byte body"
        if response is not None:
            self._expect_error(response, sequences, expected, what)

    # ------------------------------------------------------------------ invariants
    def _check_monotonic(self, world: World, samples: dict[str, float], types: dict[str, str], sequences) -> None:
        if self._counters_generation != world.generation:
            self._counters_generation = world.generation  # a new process: counters start again
            self._counters_seen.clear()
        for name, value in samples.items():
            if not _is_monotonic(name, types):
                continue
            seen = self._counters_seen.get(name)
            if seen is not None and value < seen[0]:
                self._violate(
                    f"admin: counter {name} decreased from {seen[0]} to {value} within one process lifetime",
                    (seen[1], *sequences),
                )
            self._counters_seen[name] = (value, sequences[-1])

    def _check_bracketed(self, route: str, reported: dict[str, float], before: dict[str, float], after: dict[str, float], sequences) -> None:
        for name in sorted(set(before) | set(after)):
            if name not in reported:
                self._violate(f"admin: {route} lacks {name}", sequences)
                continue
            low, high = before.get(name, 0), after.get(name, before.get(name, 0))
            if not low <= reported[name] <= high:
                self._violate(f"admin: {route} says {name} = {reported[name]}, the system said {low} before and {high} after", sequences)

    async def after_restart(self, world: World) -> list[Violation]:
        return self._take_pending()

    async def at_quiescence(self, world: World) -> list[Violation]:
        driver = _admin_driver(world)
        if driver is not None and world.system is not None and world.system.running:
            # The system is quiet: one last round of every probe.
            for operation in (AdminWorkload.healthz, AdminWorkload.readyz, AdminWorkload.metrics, AdminWorkload.actors):
                await operation(self, world, driver, -1)
        return self._take_pending()

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending


Operation = Callable[[AdminWorkload, World, AsgiDriver, int], Awaitable[None]]
_operations: tuple[Operation, ...] = (
    AdminWorkload.healthz,
    AdminWorkload.readyz,
    AdminWorkload.metrics,
    AdminWorkload.actors,
    AdminWorkload.forbidden_host,
    AdminWorkload.unsupported_method,
    AdminWorkload.unknown_path,
    AdminWorkload.oversized_body,
)


def _ready(world: World) -> bool:
    return world.system is not None and world.system.running


def _envelope_problem(response: AsgiResponse, code: str) -> str | None:
    """Why ``response`` is not troupe's error envelope with ``code`` (None when it is)."""
    if not (response.header("content-type") or "").startswith("application/json"):
        return f"content-type {response.header('content-type')!r} is not JSON"
    document = json_or_none(response.body)
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or set(document) != {"error"} or set(error) != {"code", "message"}:
        return f"not the error envelope: {response.body[:200]!r}"
    if error["code"] != code or not isinstance(error["message"], str):
        return f"error code {error['code']!r}, expected {code!r}"
    return None


register_workload("admin", AdminWorkload)

__all__ = ["AdminWorkload", "parse_exposition"]
