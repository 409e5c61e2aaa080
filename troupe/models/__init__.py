"""troupe.models: the Model and Embedder ports and their implementations.

Everything that generates text or embeds it goes through these ports, so that the local
offline defaults, the OpenAI-compatible providers and the simulator's fakes are
interchangeable.  See ``docs/models.md``.
"""

from ._exceptions import (
    ModelBudgetExceeded,
    ModelConfigurationError,
    ModelError,
    ModelResponseInvalid,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
)
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
from ._model import Model
from ._openai_chat import OpenAIChatModel, model_from_environment
from ._openai_embedder import OpenAIEmbedder
from ._retry import Backoff, CallBudget, RetryPolicy

__all__ = [
    "Backoff",
    "CallBudget",
    "ChatMessage",
    "Completion",
    "CompletionChunk",
    "CompletionRequest",
    "Model",
    "ModelBudgetExceeded",
    "ModelConfigurationError",
    "ModelError",
    "ModelResponseInvalid",
    "ModelTimeout",
    "ModelUnavailable",
    "OpenAIChatModel",
    "OpenAIEmbedder",
    "ProviderError",
    "RetryPolicy",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "model_from_environment",
    "user_request",
]
