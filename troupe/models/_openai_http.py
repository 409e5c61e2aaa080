"""One attempt at an OpenAI-compatible endpoint, with every httpx failure made typed.

The chat model and the embeddings provider share this: the same base URL convention
(``http://host/v1`` + ``/chat/completions``), the same bearer auth, and the same mapping from
transport failures and HTTP statuses to ``troupe.models`` errors, which ``RetryPolicy`` then
classifies.  The ``httpx.AsyncClient`` is injected so that tests and the simulator can swap the
transport; when none is given we create one and own it (``aclose()`` closes only what we own).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._exceptions import (
    ModelConfigurationError,
    ModelResponseInvalid,
    ModelTimeout,
    ModelUnavailable,
    ProviderError,
)

if TYPE_CHECKING:
    import httpx

# Reading an error body is diagnostics; never let a misbehaving server feed us megabytes.
error_body_bytes_max = 16_384
response_body_bytes_max = 64 * 1024 * 1024


def parse_retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in delta-seconds; HTTP-date forms are ignored (we hold no wall clock
    here) and fall back to computed backoff."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class OpenAIEndpoint:
    """Base URL, key and client for one OpenAI-compatible server."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        client: httpx.AsyncClient | None,
        request_timeout_seconds: float,
    ) -> None:
        if not base_url:
            raise ModelConfigurationError("an OpenAI-compatible provider needs a base URL")
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        httpx = _import_httpx()
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient()
        self._timeout = httpx.Timeout(request_timeout_seconds)

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One POST; returns the decoded JSON object or raises a typed error."""
        async with self.open(path, body) as response:
            content = await _read_limited(response, response_body_bytes_max)
        try:
            decoded = json.loads(content)
        except ValueError as exc:
            raise ModelResponseInvalid(f"{path}: the body is not JSON") from exc
        if not isinstance(decoded, dict):
            raise ModelResponseInvalid(f"{path}: expected a JSON object")
        return decoded

    @asynccontextmanager
    async def open(self, path: str, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """Send a POST and yield the response once its status is known to be 2xx.

        The body is not read yet, so a stream can be consumed incrementally; the response is
        closed when the context exits.
        """
        httpx = _import_httpx()
        request = self._client.build_request(
            "POST", self.base_url + path, json=body, headers=self._headers(), timeout=self._timeout
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise ModelTimeout(f"{path}: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise ModelUnavailable(f"{path}: {type(exc).__name__}: {exc}") from exc
        try:
            if response.status_code >= 400:
                raise await _provider_error(response)
            yield response
        except httpx.TimeoutException as exc:
            raise ModelTimeout(f"{path}: {type(exc).__name__} while reading") from exc
        except httpx.TransportError as exc:
            raise ModelUnavailable(f"{path}: {type(exc).__name__} while reading") from exc
        finally:
            await response.aclose()


def _import_httpx() -> Any:
    """httpx is imported when a provider is built, so that ``import troupe.models`` (and the
    offline defaults) work on an install without it."""
    try:
        import httpx
    except ImportError as exc:
        raise ModelConfigurationError(
            "OpenAI-compatible providers need httpx (a core dependency of troupe): reinstall troupe"
        ) from exc
    return httpx


async def _read_limited(response: httpx.Response, bytes_max: int) -> bytes:
    pieces: list[bytes] = []
    size = 0
    async for piece in response.aiter_bytes():
        size += len(piece)
        if size > bytes_max:
            raise ModelResponseInvalid(f"response body larger than {bytes_max} bytes")
        pieces.append(piece)
    return b"".join(pieces)


async def _provider_error(response: httpx.Response) -> ProviderError:
    try:
        content = await _read_limited(response, error_body_bytes_max)
    except ModelResponseInvalid:
        content = b"<error body too large>"
    return ProviderError(
        response.status_code,
        content.decode("utf-8", errors="replace"),
        retry_after_seconds=parse_retry_after_seconds(response.headers.get("retry-after")),
    )
