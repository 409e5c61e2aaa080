"""The lifecycle actor through a real ActorSystem and Engine: limited mode from configuration,
switched by continue/block and kept across the actor's restart within one process (a new
process starts from configuration); shutdown flag; reload swaps the components, releases
exactly the listed claims and publishes generations; reset_confirmed_at."""

from __future__ import annotations

import pytest

from troupe.actors.character import (
    CharacterFailed,
    CharacterStatus,
    Health,
    ReleaseCharacter,
    Reload,
    Reloaded,
    RequestShutdown,
    ResetConfirmedAt,
    ResetDone,
    StartupBlock,
    StartupContinue,
    StartupSwitched,
)
from troupe.actors.character._character import CharacterSettings, character_actor_kind
from troupe.actors.character._lifecycle import (
    CharacterComponents,
    CharacterLifecycleSettings,
    character_lifecycle_kind,
    new_instance_id,
)
from troupe.actors.character._schema import character_migrations
from troupe.actors.character._store import NewReflection, add_reflection, transition_reflection
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine

from .test_character_actor import ScriptedMemory


@pytest.fixture
async def engine(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*character_migrations])
    engine.test_env = env
    return engine


async def start(nursery, engine, **options):
    system, memory, _ = await start_with_settings(nursery, engine, **options)
    return system, memory


async def start_with_settings(nursery, engine, **options):
    """The system, the characters' scripted memory and the lifecycle's settings."""
    components = CharacterComponents()
    settings = CharacterLifecycleSettings(instance_id=options.pop("instance_id", "mem_1"), components=components, **options)
    memory = ScriptedMemory()
    kinds = [character_lifecycle_kind(settings), character_actor_kind(CharacterSettings(memory=memory, components=components))]
    system = ActorSystem(engine.test_env, kinds, storage=engine)
    await nursery.start(system.run)
    return system, memory, settings


async def test_health_and_limited_mode(nursery, engine):
    system, _ = await start(nursery, engine, start_blocked=True, blocking_reason="migrating")
    lifecycle = system.ref("character_lifecycle", "main")
    state = await lifecycle.ask(Health())
    assert state.health() == {"app": "N.E.K.O", "service": "memory", "status": "ok", "instance_id": "mem_1"}
    assert state.limited_mode and state.blocked_body() == {
        "ok": False,
        "error_code": "storage_startup_blocked",
        "blocking_reason": "migrating",
        "limited_mode": True,
        "error": "memory server is in limited mode: migrating",
    }
    switched = await lifecycle.ask(StartupContinue(reason="ready"))
    assert switched.encode() == {"ok": True, "initialized": True, "limited_mode": False, "reason": "ready"}
    # Kept across the actor's restart in this process.
    await system.drain()
    assert not (await lifecycle.ask(Health())).limited_mode
    blocked = await lifecycle.ask(StartupBlock(reason="upstream failed"))
    assert blocked == StartupSwitched(True, "upstream failed")
    assert blocked.encode() == {"ok": True, "limited_mode": True, "reason": "upstream failed"}
    assert (await lifecycle.ask(Health())).blocking_reason == "upstream failed"


async def test_a_new_process_starts_from_configuration(nursery, engine):
    system, _ = await start(nursery, engine, start_blocked=True, instance_id="mem_1")
    await system.ref("character_lifecycle", "main").ask(StartupContinue())
    other, _ = await start(nursery, engine, start_blocked=True, instance_id="mem_2")
    assert (await other.ref("character_lifecycle", "main").ask(Health())).limited_mode


async def test_shutdown_flag_and_instance_ids(nursery, engine):
    system, _ = await start(nursery, engine)
    lifecycle = system.ref("character_lifecycle", "main")
    assert (await lifecycle.ask(RequestShutdown())).encode() == {"status": "shutdown_disabled"}
    enabled, _ = await start(nursery, engine, shutdown_enabled=True)
    assert (await enabled.ref("character_lifecycle", "main").ask(RequestShutdown())).encode() == {
        "status": "shutdown_signal_received"
    }
    env = engine.test_env
    assert new_instance_id(env).startswith("mem_") and new_instance_id(env) != new_instance_id(env)


async def test_reload_releases_exactly_the_listed_claims_and_publishes(nursery, engine):
    system, memory = await start(nursery, engine)
    lifecycle = system.ref("character_lifecycle", "main")
    first, second = system.ref("character", "甲"), system.ref("character", "乙")
    await first.ask(ReleaseCharacter(claim_token="a1", claim_generation=0))
    await first.ask(ReleaseCharacter(claim_token="a2", claim_generation=0))
    await second.ask(ReleaseCharacter(claim_token="b1", claim_generation=0))
    await second.ask(ReleaseCharacter(claim_token="b2", claim_generation=3))
    closed_before = memory.closed
    reloaded = await lifecycle.ask(Reload(
        resume_names=("乙",), resume_generations=(3,), release_claims={"甲": ("a1",)}
    ))
    assert isinstance(reloaded, Reloaded) and reloaded.encode()["status"] == "success"
    assert reloaded.components_generation == 1
    assert (await first.ask(CharacterStatus())).claims == (("a2", 0),)
    second_state = await second.ask(CharacterStatus())
    assert second_state.claims == (("b2", 3),) and second_state.generation == 3
    # Every character rebuilt its in-memory components.
    assert memory.closed >= closed_before + 2
    too_many = Reload(resume_names=tuple(str(index) for index in range(1001)), resume_generations=(0,) * 1001)
    assert isinstance(await lifecycle.ask(too_many), CharacterFailed)


async def test_reset_confirmed_at(nursery, engine):
    system, _ = await start(nursery, engine)
    now = engine.test_env.clock.wall()

    def seed(connection):
        add_reflection(connection, "小天", NewReflection("reflection_1", "主人喜欢猫"), now - 100)
        transition_reflection(connection, "小天", "reflection_1", "confirmed", now - 50)

    await engine.write(seed)
    assert await system.ref("character_lifecycle", "main").ask(ResetConfirmedAt()) == ResetDone(1)



async def test_the_state_is_published_for_the_gate_and_follows_every_switch(nursery, engine):
    system, _, settings = await start_with_settings(nursery, engine, start_blocked=True, blocking_reason="migrating")
    lifecycle = system.ref("character_lifecycle", "main")
    assert settings.published_state() is None  # not activated yet: the gate asks
    await lifecycle.ask(Health())
    assert settings.published_state().limited_mode
    assert settings.published_state().blocking_reason == "migrating"
    await lifecycle.ask(StartupContinue(reason="ready"))
    assert not settings.published_state().limited_mode
    await lifecycle.ask(StartupBlock(reason="upstream failed"))
    assert settings.published_state().blocked_body()["blocking_reason"] == "upstream failed"
    # Kept across the actor's restart: the activation publishes the durable state again.
    await system.drain()
    settings.published = None
    await lifecycle.ask(Health())
    assert settings.published_state().limited_mode
    # A new start (a new process, a simulated restart) never reads the last start's state.
    settings.instance_id = "mem_2"
    assert settings.published_state() is None


async def test_a_switch_unpublishes_while_it_runs_and_when_it_fails(nursery, engine, monkeypatch):
    import troupe.actors.character._lifecycle as lifecycle_module

    system, _, settings = await start_with_settings(nursery, engine)
    lifecycle = system.ref("character_lifecycle", "main")
    await lifecycle.ask(Health())
    assert settings.published_state() is not None
    seen_while_writing = []
    real_state_put = lifecycle_module.state_put

    def observed_state_put(*arguments):
        seen_while_writing.append(settings.published)
        return real_state_put(*arguments)

    monkeypatch.setattr(lifecycle_module, "state_put", observed_state_put)
    await lifecycle.ask(StartupBlock(reason="moving files"))
    assert seen_while_writing == [None]  # a request meanwhile asks Health and waits
    assert settings.published_state().limited_mode

    def failing_state_put(*arguments):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(lifecycle_module, "state_put", failing_state_put)
    with pytest.raises(Exception):  # noqa: B017 - the crash reaches the asker as the runtime's error
        await lifecycle.ask(StartupContinue(reason="ready"))
    assert settings.published_state() is None  # the next request asks; activation re-reads
    monkeypatch.setattr(lifecycle_module, "state_put", real_state_put)
    state = await lifecycle.ask(Health())
    assert state.limited_mode and settings.published_state() == state
