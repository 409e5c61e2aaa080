"""Prepare's ``persona`` section over real HTTP: always well-formed, null until an operator sets
one, versioned (a new version only when the text or name changes), with an update hint for a
day after each change; ``troupe persona set|show`` works against a running server."""

from __future__ import annotations

import contextlib
import io

import pytest
import trio

from troupe.actors.host import PersonaRefused, persona_update_hint_seconds, set_persona
from troupe.http.host._persona_cli import main as persona_main

from ._host_harness import start_host_server

path = "/api/v1/entries/astrbot:group-a/prepare"
persona_keys = {"name", "text", "version", "updated_at", "update_hint"}


async def persona_of(client) -> dict:
    response = await client.post(path, json={"judge": False})
    assert response.status_code == 200, response.text
    return response.json()["persona"]


async def set_text(host, text: str, name: str | None = "小天") -> int:
    now = host.env.clock.wall()
    persona = await host.engine.write(lambda connection: set_persona(
        connection, text=text, name=name, updated_at=now, source="test"))
    return persona.version


async def test_persona_is_null_until_set_then_versioned_with_a_day_long_hint(host):
    secret = await host.token("astrbot")
    host.clock.freeze()
    async with host.client(secret) as client:
        empty = await persona_of(client)
        assert empty == dict.fromkeys(persona_keys)
        assert await set_text(host, "小天是喜欢观星的高中生。") == 1
        first = await persona_of(client)
        assert set(first) == persona_keys
        assert first["name"] == "小天" and first["text"] == "小天是喜欢观星的高中生。" and first["version"] == 1
        assert first["updated_at"].endswith("+00:00")
        assert "第 1 版" in first["update_hint"]
        # The same text again is not a new version; a different one is.
        assert await set_text(host, "小天是喜欢观星的高中生。") == 1
        host.clock.advance(persona_update_hint_seconds)
        settled = await persona_of(client)
        assert settled["version"] == 1 and settled["update_hint"] is None
        assert await set_text(host, "小天是喜欢观星、会弹吉他的高中生。") == 2
        second = await persona_of(client)
        assert second["version"] == 2 and "第 2 版" in second["update_hint"]


async def test_blank_or_too_long_personas_are_refused(host):
    for text, name in (("   ", None), ("x" * 8001, None), ("ok", " "), ("ok", "n" * 201)):
        with pytest.raises(PersonaRefused):
            await set_text(host, text, name)
    assert await host.rows("SELECT COUNT(*) FROM host_persona_versions") == [(0,)]


def run_cli(*argv: str) -> tuple[int, list[str]]:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = persona_main(list(argv))
    return code, output.getvalue().splitlines()


async def test_cli_sets_the_persona_of_a_running_server(nursery, tmp_path):
    data = str(tmp_path / "data")
    host = await start_host_server(nursery, data)
    secret = await host.token("astrbot")
    persona_file = tmp_path / "persona.txt"
    persona_file.write_text("小天是喜欢观星的高中生。\n", encoding="utf-8")
    code, lines = await trio.to_thread.run_sync(
        run_cli, "persona", "set", "--data-dir", data, "--file", str(persona_file), "--name", "小天")
    assert code == 0 and lines[0].startswith("persona version 1 ")
    async with host.client(secret) as client:
        persona = await persona_of(client)
    assert persona["version"] == 1 and persona["text"] == "小天是喜欢观星的高中生。\n" and persona["name"] == "小天"
    code, lines = await trio.to_thread.run_sync(run_cli, "persona", "show", "--data-dir", data)
    assert code == 0 and lines[0].startswith("version 1\tname 小天\t") and lines[1] == "小天是喜欢观星的高中生。"
    code, _ = await trio.to_thread.run_sync(run_cli, "persona", "set", "--data-dir", data, "--text", " ")
    assert code == 1


async def test_cli_time_zone_applies_to_a_running_server_at_once(nursery, tmp_path):
    data = str(tmp_path / "data")
    host = await start_host_server(nursery, data)
    secret = await host.token("astrbot")
    code, lines = await trio.to_thread.run_sync(run_cli, "persona", "time-zone", "--data-dir", data)
    assert (code, lines) == (0, ["character time zone UTC"])
    code, lines = await trio.to_thread.run_sync(run_cli, "persona", "time-zone", "--data-dir", data, "Asia/Shanghai")
    assert (code, lines) == (0, ["character time zone Asia/Shanghai"])
    async with host.client(secret) as client:
        response = await client.post("/api/v1/goals", json={"content": "交报告", "deadline": "2030-05-01"})
        assert response.status_code == 201, response.text
        goal = response.json()["goal"]
    # A date means the end of that day in the character's time zone.
    assert goal["deadline_is_date"] is True
    assert goal["deadline_at"] == "2030-05-01T23:59:59+08:00"
    # An unknown zone is refused and changes nothing.
    code, _ = await trio.to_thread.run_sync(run_cli, "persona", "time-zone", "--data-dir", data, "Mars/Olympus")
    assert code == 1
    code, lines = await trio.to_thread.run_sync(run_cli, "persona", "time-zone", "--data-dir", data)
    assert lines == ["character time zone Asia/Shanghai"]
