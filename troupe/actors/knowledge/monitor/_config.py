"""The monitor configuration (§3.18/§3.19): parsed strictly, normalised, compared.

Why strict: a PUT is a full replacement that the daemon applies at once, so anything the
server cannot apply exactly as written (an unknown source, a non-boolean switch, a relative or
empty path) is the caller's error (400 ``INVALID_REQUEST``) and changes nothing.  Normalising
(``os.path.normpath``, first occurrence kept, order kept) makes equal configurations compare
equal, so re-sending the same directories does not restart the watcher.

``source_status`` is an addition the contract allows (the GET body is "the daemon's view"):
for each source, whether it is collecting now and, when not, why.  It is read-only: a client
that echoes a GET body back in a PUT may include it, and it is ignored.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

monitor_sources: tuple[str, ...] = ("directory", "clipboard", "behavior", "screenshot")
"""The contract's fixed source keys."""
monitor_directories_max = 64
"""Directories one configuration may watch."""
monitor_directory_characters_max = 4_096
"""One directory path (Linux ``PATH_MAX``)."""
read_only_fields = frozenset({"source_status"})


@dataclass(frozen=True)
class MonitorConfig:
    enabled: bool = False
    sources: Mapping[str, bool] = field(default_factory=lambda: dict.fromkeys(monitor_sources, False))
    directories: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        assert tuple(self.sources) == monitor_sources, self.sources
        assert len(self.directories) <= monitor_directories_max

    def encode(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "sources": dict(self.sources), "directories": list(self.directories)}

    def to_json(self) -> str:
        return json.dumps(self.encode(), ensure_ascii=False, sort_keys=True)

    @property
    def watched_directories(self) -> tuple[str, ...]:
        """What the directory watcher should watch now: nothing unless both switches are on."""
        return self.directories if self.enabled and self.sources["directory"] else ()


default_monitor_config = MonitorConfig()


class MonitorConfigInvalid(ValueError):
    """The document is not a configuration the monitor can apply (400 ``INVALID_REQUEST``)."""


def parse_monitor_config(document: Any) -> MonitorConfig:
    """The normalised configuration, or ``MonitorConfigInvalid`` with a message naming the
    field."""
    if not isinstance(document, Mapping):
        raise MonitorConfigInvalid("the body must be a JSON object")
    expected = {"enabled", "sources", "directories"}
    unknown = sorted(set(document) - expected - read_only_fields)
    if unknown:
        raise MonitorConfigInvalid(f"unknown field '{unknown[0]}'")
    missing = sorted(expected - set(document))
    if missing:
        raise MonitorConfigInvalid(f"field '{missing[0]}' is required (a PUT replaces the whole configuration)")
    enabled = document["enabled"]
    if not isinstance(enabled, bool):
        raise MonitorConfigInvalid("field 'enabled' must be a boolean")
    return MonitorConfig(enabled=enabled, sources=_sources(document["sources"]),
                         directories=_directories(document["directories"]))


def _sources(value: Any) -> dict[str, bool]:
    if not isinstance(value, Mapping):
        raise MonitorConfigInvalid("field 'sources' must be an object")
    for name in value:
        if name not in monitor_sources:
            raise MonitorConfigInvalid(
                f"field 'sources' has unknown source '{name}'; the sources are {', '.join(monitor_sources)}")
    sources = {}
    for name in monitor_sources:
        if name not in value:
            raise MonitorConfigInvalid(f"field 'sources.{name}' is required")
        if not isinstance(value[name], bool):
            raise MonitorConfigInvalid(f"field 'sources.{name}' must be a boolean")
        sources[name] = value[name]
    return sources


def _directories(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise MonitorConfigInvalid("field 'directories' must be an array of absolute paths")
    normalised: dict[str, None] = {}
    for index, item in enumerate(value):
        where = f"field 'directories[{index}]'"
        if not isinstance(item, str):
            raise MonitorConfigInvalid(f"{where} must be a string")
        if not item.strip():
            raise MonitorConfigInvalid(f"{where} must not be empty")
        if len(item) > monitor_directory_characters_max:
            raise MonitorConfigInvalid(f"{where} is longer than {monitor_directory_characters_max} characters")
        if "\x00" in item:
            raise MonitorConfigInvalid(f"{where} must not contain NUL")
        if not item.startswith("/"):
            raise MonitorConfigInvalid(f"{where} must be an absolute path")
        normalised.setdefault(posixpath.normpath(item).replace("//", "/"), None)
    if len(normalised) > monitor_directories_max:
        raise MonitorConfigInvalid(f"field 'directories' holds more than {monitor_directories_max} directories")
    return tuple(normalised)


def decode_stored_config(text: str | None) -> MonitorConfig:
    """The stored row (written by ``MonitorConfig.to_json``); the defaults when absent."""
    if text is None:
        return default_monitor_config
    return parse_monitor_config(json.loads(text))


__all__ = [
    "MonitorConfig",
    "MonitorConfigInvalid",
    "decode_stored_config",
    "default_monitor_config",
    "monitor_directories_max",
    "monitor_directory_characters_max",
    "monitor_sources",
    "parse_monitor_config",
]
