"""SimServer starts serve's surfaces in-process; the admin workload probes them and stays clean.

The harness below is one simulated process lifetime, as ``_simulation`` runs it: engine,
system, ``SimServer.start``, drivers in ``world.apps``, clients, quiescence checks.
"""

from __future__ import annotations

import random

import trio

from troupe.runtime import ActorSystem, Tracer
from troupe.sim import World, sim_env
from troupe.sim._admin_workload import AdminWorkload, parse_exposition
from troupe.sim._asgi import AsgiResponse
from troupe.sim._bank import BankWorkload
from troupe.sim._server import SimServer
from troupe.storage import Engine, StorageError


async def _lifetime(tmp_path, seed: int, steps: int, *, break_actors: bool = False):
    env = sim_env(seed, str(tmp_path / f"data-{seed}"))
    tracer = Tracer(time_source=trio.current_time, keep_in_memory=True)
    world = World(env=env, random=env.random, tracer=tracer, planted_bugs=frozenset())
    world.generation = 1
    server, bank, admin = SimServer(), BankWorkload(), AdminWorkload()
    violations = []
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, migrations=[*server.migrations(), *bank.migrations()], nursery=nursery, readers_max=1)
        system = ActorSystem(
            env,
            [*server.kinds(), *bank.actor_kinds(world)],
            storage=engine,
            tracer=tracer,
            services=server.services(),
            transient_errors=(StorageError,),
        )
        world.engine, world.system = engine, system
        await nursery.start(system.run)
        world.apps = await server.start(world, engine, system, nursery)
        if break_actors:
            _lie_about_turns(world.apps["admin"])
        steps_left = [steps]

        async def client(number: int) -> None:
            while steps_left[0] > 0:
                steps_left[0] -= 1
                workload = admin if random.Random(seed * 31 + steps_left[0]).random() < 0.7 else bank
                await workload.client_step(world, number)

        async with trio.open_nursery() as clients:
            for number in range(3):
                clients.start_soon(client, number)
        await trio.sleep(30)
        violations += await admin.at_quiescence(world)
        violations += await bank.at_quiescence(world)
        await server.stop()
        await system.drain()
        await engine.aclose()
        nursery.cancel_scope.cancel()
    return admin, violations


def _lie_about_turns(driver) -> None:
    """A planted surface bug: ``/actors`` reports one turn more than the system has run."""
    inner = driver.app

    async def app(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/actors":
            await inner(scope, receive, send)
            return
        body = bytearray()

        async def capture(message):
            if message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    text = body.decode().replace('"turns": ', '"turns": 9', 1)  # 0 -> 90, 12 -> 912
                    await send({"type": "http.response.body", "body": text.encode(), "more_body": False})
            else:
                await send({**message, "headers": [h for h in message["headers"] if h[0] != b"content-length"]})

        await inner(scope, receive, capture)

    driver.app = app


async def test_sim_server_builds_serves_surfaces_and_answers_healthz(tmp_path, autojump_clock):
    env = sim_env(1, str(tmp_path))
    world = World(env=env, random=env.random, tracer=Tracer(enabled=False), planted_bugs=frozenset())
    server = SimServer()
    assert [surface.name for surface in server.surfaces] == ["admin", "host", "sessions", "character", "knowledge"]
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, migrations=server.migrations(), nursery=nursery, readers_max=1)
        system = ActorSystem(env, server.kinds(), storage=engine, services=server.services())
        await nursery.start(system.run)
        drivers = await server.start(world, engine, system, nursery)
        assert set(drivers) == {"admin", "host", "sessions", "character", "knowledge"}
        health = await drivers["admin"].request("GET", "/healthz")
        assert (health.status, health.json()) == (200, {"status": "ok"})
        ready = await drivers["admin"].request("GET", "/readyz")
        assert ready.status == 200
        await server.stop()
        not_ready = await drivers["admin"].request("GET", "/readyz")
        assert not_ready.status == 503 and not_ready.json()["not_ready"] == ["accepting", "storage"]
        await engine.aclose()
        nursery.cancel_scope.cancel()


async def test_admin_workload_runs_clean_for_a_few_seeds(tmp_path, autojump_clock):
    for seed in (1, 2, 3):
        admin, violations = await _lifetime(tmp_path, seed, 150)
        assert [str(violation) for violation in violations] == []
        assert admin.responses > 60


async def test_admin_workload_catches_a_surface_that_misreports_turns(tmp_path, autojump_clock):
    _, violations = await _lifetime(tmp_path, 4, 150, break_actors=True)
    texts = [violation.text for violation in violations]
    assert any("/actors says troupe_actor_turns_total" in text for text in texts), texts
    assert all(violation.sequences for violation in violations)


def test_exposition_parser_flags_samples_without_a_family():
    samples, types, problems = parse_exposition("# TYPE a counter\na 1\nb{kind=\"x\"} 2\n")
    assert samples == {"a": 1.0, 'b{kind="x"}': 2.0}
    assert types == {"a": "counter"}
    assert problems == ["sample b has no TYPE line before it"]


def test_error_envelope_check():
    from troupe.sim._admin_workload import _envelope_problem

    good = AsgiResponse(400, (("content-type", "application/json"),), b'{"error": {"code": "bad_host", "message": "no"}}')
    assert _envelope_problem(good, "bad_host") is None
    assert "expected 'not_found'" in _envelope_problem(good, "not_found")
    html = AsgiResponse(404, (("content-type", "text/html"),), b"<p>nope</p>")
    assert "not JSON" in _envelope_problem(html, "not_found")
