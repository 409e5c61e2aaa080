"""A real engine with the character component's migrations on a temp dir, for the store,
outbox and funnel tests."""

from __future__ import annotations

from troupe.actors.character import character_migrations
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor

base_time = 1_777_000_000.0


def character_engine_env(tmp_path) -> Env:
    return Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
               storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())


async def open_character_engine(nursery, tmp_path) -> Engine:
    return await Engine.open(character_engine_env(tmp_path), nursery=nursery,
                             migrations=list(character_migrations))
