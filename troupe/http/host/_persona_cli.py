"""``troupe persona set|show|time-zone``: the character's persona and time zone from the
command line.

Why a command and not a host route: the persona is who the character is; host tokens may read
it (prepare's ``persona`` section) but only an operator with the data directory may change it.
Like ``troupe token``, the commands open the same database as ``troupe serve`` through the
storage engine, so they work while the server runs (WAL), and the next prepare shows the new
version.

``set`` writes a new version only when the text or name differs from the current one (setting
the same persona twice prints the same version).  ``time-zone NAME`` sets the character's IANA
time zone (goal deadlines given as dates end that day there, and every goal and notification
time is shown in it); ``time-zone`` alone prints it.  The zone is read from storage on every
goal or notification request, so a running server uses the new zone at once.  Exit codes:
0 done, 1 refused (blank or too long text, unreadable file, unknown time zone, storage
error), 2 configuration error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from troupe._cli_storage import (
    StorageJob,
    add_data_dir_arguments,
    run_storage_command,
    utc_timestamp_text,
)
from troupe.actors.host import (
    PersonaRefused,
    character_time_zone_name,
    current_persona,
    persona_history,
    set_character_time_zone,
    set_persona,
)

operator_source = "operator"
"""The source recorded on versions set from the command line."""


def add_persona_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``persona set|show`` to an argparse ``add_subparsers()`` object."""
    persona = subparsers.add_parser("persona", help="set or show the character's persona (prepare's persona section)")
    commands = persona.add_subparsers(dest="persona_command", required=True)

    setting = commands.add_parser("set", help="store a new persona version (same text again: no new version)")
    add_data_dir_arguments(setting)
    text = setting.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the persona description")
    text.add_argument("--file", help="read the description from this UTF-8 file")
    setting.add_argument("--name", default=None, help="the character's name (optional)")

    show = commands.add_parser("show", help="print the current persona (or every version with --history)")
    add_data_dir_arguments(show)
    show.add_argument("--history", action="store_true", help="every version, oldest first")

    zone = commands.add_parser("time-zone", help="set (or with no name, print) the character's IANA time zone")
    add_data_dir_arguments(zone)
    zone.add_argument("name", nargs="?", default=None, help="an IANA name such as Asia/Shanghai")
    return persona


async def _set(env: Any, engine: Any, text: str, name: str | None) -> list[str]:
    now = env.clock.wall()
    persona = await engine.write(lambda connection: set_persona(
        connection, text=text, name=name, updated_at=now, source=operator_source))
    return [f"persona version {persona.version} (updated {utc_timestamp_text(persona.updated_at)})"]


async def _show(env: Any, engine: Any, history: bool) -> list[str]:
    del env
    if history:
        versions = await engine.read(persona_history)
    else:
        current = await engine.read(current_persona)
        versions = [] if current is None else [current]
    if not versions:
        return ["no persona set (prepare's persona section has null fields)"]
    lines: list[str] = []
    for persona in versions:
        lines.append(f"version {persona.version}\tname {persona.name or '-'}\t"
                     f"updated {utc_timestamp_text(persona.updated_at)}\tsource {persona.source}")
        lines.append(persona.text)
    return lines


async def _time_zone(env: Any, engine: Any, name: str | None) -> list[str]:
    del env
    if name is not None:
        def write(connection: Any) -> None:
            try:
                set_character_time_zone(connection, name)
            except ValueError as exc:
                raise PersonaRefused(str(exc)) from exc

        await engine.write(write)
    return [f"character time zone {await engine.read(character_time_zone_name)}"]


def _read_text(arguments: Any) -> str:
    if arguments.text is not None:
        return arguments.text
    try:
        return Path(arguments.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PersonaRefused(f"cannot read {arguments.file}: {exc}") from exc


def run_persona_command(arguments: Any) -> int:
    """Run ``troupe persona ...`` with parsed ``arguments``; returns the exit code.

    Must not be called from inside a running trio loop (it runs its own)."""
    from ._surface import host_surface

    return run_storage_command(
        arguments,
        command_name="persona",
        migrations=host_surface.migrations,
        refusals=(PersonaRefused,),
        prepare_job=lambda: _persona_job(arguments),
    )


def _persona_job(arguments: Any) -> StorageJob:
    if arguments.persona_command == "set":
        text = _read_text(arguments)
        return lambda env, engine: _set(env, engine, text, arguments.name)
    if arguments.persona_command == "show":
        return lambda env, engine: _show(env, engine, arguments.history)
    if arguments.persona_command == "time-zone":
        return lambda env, engine: _time_zone(env, engine, arguments.name)
    raise AssertionError(f"unknown persona command {arguments.persona_command!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m troupe.http.host persona ...``: the same commands before ``troupe`` wires them."""
    parser = argparse.ArgumentParser(prog="troupe")
    add_persona_commands(parser.add_subparsers(dest="command", required=True))
    return run_persona_command(parser.parse_args(argv))


__all__ = ["add_persona_commands", "main", "run_persona_command"]
