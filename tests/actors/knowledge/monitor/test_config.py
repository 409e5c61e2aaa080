"""The monitor configuration's parse and normalisation, and the new packages' exports."""

import importlib

import pytest

from troupe.actors.knowledge.monitor import (
    MonitorConfigInvalid,
    monitor_directories_max,
    monitor_directory_characters_max,
    parse_monitor_config,
)

sources = {"directory": True, "clipboard": False, "behavior": False, "screenshot": False}


def test_normalises_and_keeps_order():
    config = parse_monitor_config({"enabled": True, "sources": sources,
                                   "directories": ["/b/", "/a//x/../", "/b", "/a"]})
    assert config.directories == ("/b", "/a")
    assert config.watched_directories == ("/b", "/a")
    assert parse_monitor_config({**config.encode(), "enabled": False}).watched_directories == ()


def test_path_length_at_and_over_the_limit():
    at = "/" + "a" * (monitor_directory_characters_max - 1)
    assert parse_monitor_config({"enabled": True, "sources": sources, "directories": [at]}).directories == (at,)
    with pytest.raises(MonitorConfigInvalid):
        parse_monitor_config({"enabled": True, "sources": sources, "directories": [at + "a"]})
    with pytest.raises(MonitorConfigInvalid):
        parse_monitor_config({"enabled": True, "sources": sources,
                              "directories": [f"/{n}" for n in range(monitor_directories_max + 1)]})


@pytest.mark.parametrize("name", ["troupe.actors.knowledge.monitor", "troupe.actors.knowledge.ocr",
                                  "troupe.actors.knowledge.discovery", "troupe.dbus"])
def test_exports(name):
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(set(module.__all__))
    for exported in module.__all__:
        assert hasattr(module, exported), exported
