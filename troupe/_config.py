"""Configuration of ``troupe serve``: defaults < ``troupe.toml`` < environment < flags.

Why one module: a server started by hand, by a script, by a test and by a service manager
must end up with the same options for the same inputs, so the merge rules live in one place
and are tested without starting anything.  ``load_serve_options`` only reads; nothing here
opens sockets or files other than the configuration file.

Sources, later ones overriding earlier ones key by key:

1. built-in defaults (``data_dir`` ``./troupe-data``; each surface's own default listener);
2. the ``[serve]`` table of ``troupe.toml`` (``--config FILE``, ``TROUPE_CONFIG``, or
   ``./troupe.toml`` when it exists); relative paths in the file are relative to the file;
   other tables belong to other components and are ignored here;
3. ``TROUPE_DATA_DIR``, ``TROUPE_LISTEN_<SURFACE>=HOST:PORT``, ``TROUPE_TRACE_FILE``,
   ``TROUPE_ALLOWED_HOSTS`` (comma-separated);
4. flags: ``--data-dir``, ``--listen SURFACE=HOST:PORT`` (repeatable), ``--trace``.

A listen value of ``off`` disables that surface's listener.  Binding a non-loopback address
needs ``TROUPE_ALLOW_NON_LOOPBACK=1`` (or the host contract's ``IRIS_CONTAINER=1``) in the environment; deliberately not a file or flag
option, so that opening the server to the network is always an explicit act of whoever
starts the process.  Trade-off: unknown keys in ``[serve]`` are errors (typos must not be
silently ignored), which means an older binary refuses a newer file's new keys.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

data_dir_default = "./troupe-data"
config_file_default = "troupe.toml"
request_body_bytes_max_default = 1024 * 1024
shutdown_grace_seconds_default = 3.0
drain_seconds_max_default = 30.0
listen_off = "off"

assert shutdown_grace_seconds_default > 0
assert drain_seconds_max_default > 0


class ConfigError(Exception):
    """The configuration (file, environment or flags) is invalid; the message says where.

    Lives here rather than in an ``_exceptions`` module because ``troupe`` itself is not a
    package of implementation modules; ``troupe.server`` re-exports it.
    """


@dataclass(frozen=True)
class ListenAddress:
    """``HOST:PORT`` for one surface; ``port`` 0 asks the OS for a free port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, where: str) -> ListenAddress:
        text = text.strip()
        if text.startswith("["):
            end = text.find("]")
            host, separator, port_text = text[1:end], text[end + 1 : end + 2], text[end + 2 :]
            if end < 0 or separator != ":":
                raise ConfigError(f"{where}: expected [IPV6]:PORT, got {text!r}")
        else:
            host, separator, port_text = text.rpartition(":")
            if not separator or ":" in host:
                raise ConfigError(f"{where}: expected HOST:PORT (IPv6 as [ADDR]:PORT), got {text!r}")
        if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ConfigError(f"{where}: expected HOST:PORT with a port in 0..65535, got {text!r}")
        return cls(host, int(port_text))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``troupe.server.serve`` needs; build it with ``load_serve_options``.

    ``listen`` holds only the surfaces whose address was configured (``None`` = ``off``);
    the others use their surface's default.
    """

    data_dir: str = data_dir_default
    listen: Mapping[str, ListenAddress | None] = field(default_factory=dict)
    trace_file: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    allow_non_loopback: bool = False
    request_body_bytes_max: int = request_body_bytes_max_default
    shutdown_grace_seconds: float = shutdown_grace_seconds_default
    drain_seconds_max: float = drain_seconds_max_default
    config_file: str | None = None


_file_keys = {
    "data_dir",
    "listen",
    "trace_file",
    "allowed_hosts",
    "request_body_bytes_max",
    "shutdown_grace_seconds",
    "drain_seconds_max",
}


def _parse_listen_value(surface: str, text: str, *, where: str) -> ListenAddress | None:
    if not surface or not surface.replace("_", "").isalnum() or surface.lower() != surface:
        raise ConfigError(f"{where}: surface names are lower-case words, got {surface!r}")
    if text.strip().lower() == listen_off:
        return None
    return ListenAddress.parse(text, where=where)


def parse_listen_flag(text: str) -> tuple[str, ListenAddress | None]:
    """``"admin=127.0.0.1:0"`` -> ``("admin", ListenAddress("127.0.0.1", 0))``."""
    surface, separator, address = text.partition("=")
    if not separator:
        raise ConfigError(f"--listen: expected SURFACE=HOST:PORT, got {text!r}")
    surface = surface.strip()
    return surface, _parse_listen_value(surface, address, where=f"--listen {text}")


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    table = document.get("serve", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [serve] must be a table")
    unknown = sorted(set(table) - _file_keys)
    if unknown:
        raise ConfigError(f"{path}: unknown keys in [serve]: {', '.join(unknown)}")
    return table


def _typed(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"{where}: [serve] {key} has the wrong type ({type(value).__name__})")
    return value


def _apply_file(settings: dict[str, Any], path: str) -> None:
    table = _read_file(path)
    base = os.path.dirname(os.path.abspath(path))
    for key in ("data_dir", "trace_file"):
        if key in table:
            settings[key] = os.path.join(base, _typed(table, key, str, path))
    if "listen" in table:
        listen = _typed(table, "listen", dict, path)
        for surface, text in listen.items():
            if not isinstance(text, str):
                raise ConfigError(f"{path}: [serve.listen] {surface} must be a string")
            settings["listen"][surface] = _parse_listen_value(surface, text, where=f"{path} [serve.listen] {surface}")
    if "allowed_hosts" in table:
        hosts = _typed(table, "allowed_hosts", list, path)
        if not all(isinstance(host, str) and host for host in hosts):
            raise ConfigError(f"{path}: [serve] allowed_hosts must be a list of names")
        settings["allowed_hosts"] = tuple(hosts)
    if "request_body_bytes_max" in table:
        value = _typed(table, "request_body_bytes_max", int, path)
        if value < 0:
            raise ConfigError(f"{path}: [serve] request_body_bytes_max must be >= 0")
        settings["request_body_bytes_max"] = value
    for key in ("shutdown_grace_seconds", "drain_seconds_max"):
        if key in table:
            value = float(_typed(table, key, (int, float), path))
            if not value > 0:
                raise ConfigError(f"{path}: [serve] {key} must be > 0")
            settings[key] = value


def _apply_environment(settings: dict[str, Any], environ: Mapping[str, str]) -> None:
    if environ.get("TROUPE_DATA_DIR"):
        settings["data_dir"] = environ["TROUPE_DATA_DIR"]
    if environ.get("TROUPE_TRACE_FILE"):
        settings["trace_file"] = environ["TROUPE_TRACE_FILE"]
    if environ.get("TROUPE_ALLOWED_HOSTS"):
        hosts = [name.strip() for name in environ["TROUPE_ALLOWED_HOSTS"].split(",")]
        settings["allowed_hosts"] = tuple(name for name in hosts if name)
    prefix = "TROUPE_LISTEN_"
    for name in sorted(environ):
        if name.startswith(prefix) and environ[name]:
            surface = name[len(prefix) :].lower()
            settings["listen"][surface] = _parse_listen_value(surface, environ[name], where=name)
    # IRIS_CONTAINER=1 is the host contract's own switch for the same thing (port mapping or a
    # trusted Docker network); either one opens every listener to non-loopback addresses.
    settings["allow_non_loopback"] = (
        environ.get("TROUPE_ALLOW_NON_LOOPBACK", "") == "1" or environ.get("IRIS_CONTAINER", "") == "1"
    )


def _flag(arguments: Any, name: str) -> Any:
    return getattr(arguments, name, None)


def load_serve_options(
    arguments: Any = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> ServeOptions:
    """Merge defaults, the config file, the environment and ``arguments`` (an argparse
    namespace or anything with ``data_dir``, ``config``, ``listen`` and ``trace``; missing or
    ``None`` attributes mean "not given")."""
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {"data_dir": data_dir_default, "listen": {}}
    config_file = _flag(arguments, "config") or environ.get("TROUPE_CONFIG") or None
    if config_file is None and os.path.isfile(config_file_default):
        config_file = config_file_default
    if config_file is not None:
        _apply_file(settings, config_file)
        settings["config_file"] = os.path.abspath(config_file)
    _apply_environment(settings, environ)
    if _flag(arguments, "data_dir"):
        settings["data_dir"] = arguments.data_dir
    if _flag(arguments, "trace"):
        settings["trace_file"] = arguments.trace
    listen_flags: Sequence[str] = _flag(arguments, "listen") or ()
    if isinstance(listen_flags, str):
        listen_flags = [listen_flags]
    for text in listen_flags:
        surface, address = parse_listen_flag(text)
        settings["listen"][surface] = address
    return ServeOptions(**settings)


__all__ = [
    "ConfigError",
    "ListenAddress",
    "ServeOptions",
    "load_serve_options",
    "parse_listen_flag",
]
