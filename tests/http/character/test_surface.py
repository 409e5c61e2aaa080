"""The ``troupe serve`` plug-in: listener default and ``MEMORY_SERVER_PORT``, kinds,
migrations, and the package's exports."""

from __future__ import annotations

import troupe.http.character as package
from troupe.http.character import (
    character_listen_address,
    character_surface,
    new_character_surface,
)
from troupe.server import ListenAddress


def test_listener_default_and_memory_server_port():
    assert character_surface.name == "character"
    assert character_surface.listen_default == ListenAddress("127.0.0.1", 48912)
    assert character_listen_address({"MEMORY_SERVER_PORT": "49000"}) == ListenAddress("127.0.0.1", 49000)
    assert character_listen_address({"MEMORY_SERVER_PORT": "0"}) == ListenAddress("127.0.0.1", 0)
    for bad in ("", "x", "70000", "-1"):
        assert character_listen_address({"MEMORY_SERVER_PORT": bad}) == ListenAddress("127.0.0.1", 48912)
    assert new_character_surface({"MEMORY_SERVER_PORT": "49001"}).listen_default.port == 49001


def test_kinds_and_migrations_are_static():
    first, second = new_character_surface({}), new_character_surface({"TROUPE_CHARACTER_START_BLOCKED": "1"})
    assert [kind.name for kind in first.actor_kinds] == ["character", "character_lifecycle"]
    assert [kind.name for kind in second.actor_kinds] == [kind.name for kind in first.actor_kinds]
    assert first.migrations == second.migrations and first.migrations


def test_exports():
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert sorted(package.__all__) == package.__all__
