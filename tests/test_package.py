"""Package-wide rules: exports resolve, the simulator stays out of production code, no
top-level ``http`` package, and the determinism lint is wired."""

import importlib
import pathlib
import re
import tomllib

import pytest

root = pathlib.Path(__file__).resolve().parent.parent
packages = ["troupe.runtime", "troupe.storage", "troupe.retrieval", "troupe.models", "troupe.http", "troupe.sim"]


@pytest.mark.parametrize("name", packages)
def test_every_exported_name_resolves(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ has duplicates"
    for attribute in exported:
        assert hasattr(module, attribute), f"{name}.__all__ names {attribute!r} but it does not exist"


def test_production_code_never_imports_the_simulator():
    offenders = []
    for path in (root / "troupe").rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("troupe/sim/") or relative == "troupe/cli.py":
            continue
        if re.search(r"^\s*(from|import)\s+troupe\.sim\b|from\s+\.+sim\b", path.read_text(), re.MULTILINE):
            offenders.append(relative)
    assert offenders == []


def test_no_top_level_http_package_shadows_the_standard_library():
    assert not (root / "http").exists()
    import http.client  # the standard library's, not ours

    assert pathlib.Path(http.__file__).parent.name == "http" and "troupe" not in http.__file__


def test_banned_apis_are_configured_for_ruff():
    configuration = tomllib.loads((root / "pyproject.toml").read_text())
    banned = configuration["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"]
    for name in ("time.time", "time.monotonic", "datetime.datetime.now", "random", "uuid.uuid4", "os.urandom"):
        assert name in banned
    assert "TID" in configuration["tool"]["ruff"]["lint"]["select"]
