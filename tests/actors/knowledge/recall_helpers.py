"""A real engine with the knowledge and retrieval migrations on a temp dir, the offline model
and hashed embedder, and a way to write evidence and structure it: shared by the recall
slice's tests (structuring, query, agent context, conflicts, forget, preferences, delivery)."""

from __future__ import annotations

from typing import Any

from troupe.actors.knowledge._query import KnowledgeIndexes
from troupe.actors.knowledge._schema import knowledge_migrations
from troupe.actors.knowledge._store import EvidenceDraft, evidence_quality_score, insert_evidence
from troupe.actors.knowledge._structuring import StructuringResult, structure_evidence
from troupe.models import HashedEmbedder, LocalModel
from troupe.retrieval import retrieval_migrations
from troupe.runtime._env import Env
from troupe.sim import SimIds, SimRandom
from troupe.sim._sim_env import SimStorageOpener
from troupe.storage import Engine, InlineExecutor

base_time = 1_788_393_600.0


class ManualClock:
    """Wall time set by the test; monotonic time advancing 1 ms per reading."""

    def __init__(self, now: float = base_time) -> None:
        self.now = now
        self.ticks = 0.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        self.ticks += 0.001
        return self.ticks


class KnowledgeBench:
    """An engine, an Env and the engine's knowledge index."""

    def __init__(self, engine: Engine, env: Env, index: Any) -> None:
        self.engine = engine
        self.env = env
        self.index = index

    @property
    def clock(self) -> ManualClock:
        return self.env.clock  # type: ignore[return-value]

    async def evidence(self, raw: dict[str, Any], *, scope: str = "user:alice",
                       source_type: str = "MANUAL_CONFIG", sensitivity: int = 0,
                       quality_score: float | None = None) -> str:
        """Writes one evidence row with its structuring task; returns its id."""
        evidence_id = self.env.ids.new_id("evd_")
        draft = EvidenceDraft(
            scope=scope, source_type=source_type, raw=raw, sensitivity=sensitivity,
            quality_score=evidence_quality_score(source_type, raw) if quality_score is None
            else quality_score,
        )
        now = self.clock.wall()
        await self.engine.write(lambda connection: insert_evidence(
            connection, draft, evidence_id=evidence_id, now=now, structure=True))
        return evidence_id

    async def remember(self, raw: dict[str, Any], **options: Any) -> StructuringResult:
        """Writes evidence and structures it at once."""
        evidence_id = await self.evidence(raw, **options)
        return await structure_evidence(self.engine, self.index, self.env, evidence_id)

    async def rows(self, sql: str, *parameters: Any) -> list[tuple]:
        return await self.engine.read(lambda connection: connection.execute(sql, parameters).fetchall())


def knowledge_env(tmp_path, *, model: Any = None, embedder: Any = None) -> Env:
    return Env(clock=ManualClock(), random=SimRandom(1), ids=SimIds(),
               storage=SimStorageOpener(str(tmp_path / "data"), None), executor=InlineExecutor(),
               model=LocalModel() if model is None else model,
               embedder=HashedEmbedder(64) if embedder is None else embedder)


async def open_bench(nursery, tmp_path, **options: Any) -> KnowledgeBench:
    env = knowledge_env(tmp_path, **options)
    engine = await Engine.open(env, nursery=nursery,
                               migrations=[*knowledge_migrations, *retrieval_migrations()])
    index = await KnowledgeIndexes().open(engine, env.embedder)
    return KnowledgeBench(engine, env, index)
