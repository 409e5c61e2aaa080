"""A real engine with the knowledge component's migrations on a temp dir, for the store,
receipt and recall tests; reopening the same directory simulates a restart."""

from __future__ import annotations

from troupe.actors.knowledge import knowledge_migrations
from troupe.runtime._env import Env
from troupe.runtime._real_env import RealClock
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor

base_time = 1_788_393_600.0


def knowledge_engine_env(tmp_path) -> Env:
    return Env(clock=RealClock(), random=SimRandom(1), ids=SimIds(),
               storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor())


async def open_knowledge_engine(nursery, tmp_path) -> Engine:
    return await Engine.open(knowledge_engine_env(tmp_path), nursery=nursery,
                             migrations=list(knowledge_migrations))
