"""troupe.retrieval: hybrid recall (BM25 + vectors + RRF + time windows) for every surface."""

from ._background import EmbeddingService
from ._conversation import ConversationTurn, conversation_items
from ._exceptions import DuplicateItem, EmbedderMismatch, InvalidTimeWindow, RetrievalError
from ._expansion import CandidateLists, FusionWeights, fuse_candidates
from ._filters import RecallFilter
from ._fusion import RankedList, reciprocal_rank_fusion
from ._memory_index import (
    Database,
    MemoryIndex,
    MemoryItem,
    RecallHit,
    RecallResult,
    RecallSettings,
)
from ._query import text_query
from ._schema import (
    apply_schema,
    connection_setup,
    retrieval_migration,
    retrieval_migration_steps,
    retrieval_migrations,
)
from ._shared import SharedMemoryIndexes, TokenizedDatabase, shared_memory_indexes
from ._time_window import TimeWindow, parse_time_window
from ._tokenizer import register_tokenizer

__all__ = [
    "CandidateLists",
    "ConversationTurn",
    "Database",
    "DuplicateItem",
    "EmbedderMismatch",
    "EmbeddingService",
    "FusionWeights",
    "InvalidTimeWindow",
    "MemoryIndex",
    "MemoryItem",
    "RankedList",
    "RecallFilter",
    "RecallHit",
    "RecallResult",
    "RecallSettings",
    "RetrievalError",
    "SharedMemoryIndexes",
    "TimeWindow",
    "TokenizedDatabase",
    "apply_schema",
    "connection_setup",
    "conversation_items",
    "fuse_candidates",
    "parse_time_window",
    "reciprocal_rank_fusion",
    "register_tokenizer",
    "retrieval_migration",
    "retrieval_migration_steps",
    "retrieval_migrations",
    "shared_memory_indexes",
    "text_query",
]
