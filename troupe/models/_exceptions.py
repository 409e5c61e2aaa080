"""Errors raised by the model and embedder ports.

Callers (actors, retrieval, surfaces) decide what to do with a failed model call: degrade to
BM25, fall back to the local model, or answer 503.  They can only decide well if the error says
what went wrong without them knowing which provider or HTTP library sat underneath, so every
foreign error (httpx, JSON decoding, a native engine) is wrapped here with ``raise ... from exc``.

Hierarchy::

    ModelError                      anything the model layer raises on purpose
    ├── ModelConfigurationError     unknown embedder name, missing base URL, extra not installed
    ├── ModelUnavailable            cannot reach the provider (connection refused, reset, DNS),
    │                               or a local model that is not loaded yet
    ├── ModelTimeout                one attempt or the stream went quiet for too long, and the
    │                               retries ran out
    ├── ModelBudgetExceeded         the per-call budget (total seconds, output tokens) ran out
    ├── ModelResponseInvalid        the provider answered 2xx with something we cannot parse
    ├── ModelRefused                the provider explicitly refused on content-safety grounds
    │                               (a content filter or policy violation): never retried
    └── ProviderError(status, body) the provider answered with an HTTP error status

``ProviderError.retryable`` tells whether the status is one we retry (408, 409, 429, 5xx); when
it is raised with ``retryable`` true the retries have already run out.
"""

from __future__ import annotations

# Bodies are kept for diagnostics only; a provider can return megabytes of HTML on a 502.
provider_error_body_chars_max = 2_000


class ModelError(Exception):
    """Base class of every error the model layer raises on purpose."""


class ModelConfigurationError(ModelError):
    """The model or embedder asked for cannot be built from the configuration given."""


class ModelUnavailable(ModelError):
    """The provider cannot be reached, or the local model is not ready."""


class ModelTimeout(ModelError):
    """An attempt (or a stream between two chunks) took longer than its timeout."""


class ModelBudgetExceeded(ModelError):
    """The per-call budget ran out: total seconds across retries, or output tokens."""


class ModelResponseInvalid(ModelError):
    """A successful HTTP answer whose body does not have the expected shape."""


class ModelRefused(ModelError):
    """The provider refused the input or output on content-safety grounds.

    Distinct from ``ProviderError`` because the caller's answer differs: a refusal is final
    (the contract's "敏感信息无法访问"), it is not retried and not tried another way, while an
    error may succeed later.  ``RetryPolicy`` does not retry it (it is neither unavailable, a
    timeout nor a retryable status)."""


class ProviderError(ModelError):
    """The provider answered with an HTTP error status."""

    def __init__(self, status: int, body: str, *, retry_after_seconds: float | None = None) -> None:
        self.status = status
        self.body = body[:provider_error_body_chars_max]
        self.retry_after_seconds = retry_after_seconds
        super().__init__(f"provider answered HTTP {status}: {self.body[:200]}")

    @property
    def retryable(self) -> bool:
        return is_retryable_status(self.status)


def is_retryable_status(status: int) -> bool:
    """408 Request Timeout, 409 Conflict, 429 Too Many Requests and every 5xx are transient."""
    return status in (408, 409, 429) or 500 <= status <= 599
