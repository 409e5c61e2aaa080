"""``troupe token create|list|revoke``: host and sessions tokens from the command line.

``--surface host`` (the default) makes host tokens with an entry scope (``--scope all``,
``--entries``, ``--prefix``); ``--surface sessions`` makes sessions tokens bound to one end
user (``--end-user u_123``): that end user is who every request with the token acts for.
``list`` and ``revoke`` take ``--surface`` too; names are unique per surface.

The commands open the same database file as ``troupe serve`` (same data-directory rules:
``--data-dir`` > ``TROUPE_DATA_DIR`` > ``troupe.toml`` > ``./troupe-data``) through the storage
engine, so they work while the server runs: SQLite's WAL lets the CLI commit beside the
server, and the server's next token lookup sees the commit.  That plumbing is
``troupe._cli_storage``, shared with ``troupe persona``.

``create`` prints the secret once, alone on the last line of its output (scripts read it from
there; keep this stable).  Exit codes: 0 done, 1 refused (name taken, unknown name, bad scope,
storage error), 2 configuration error.
"""

from __future__ import annotations

import argparse
from typing import Any

from troupe._cli_storage import (
    StorageJob,
    add_data_dir_arguments,
    run_storage_command,
    utc_timestamp_text,
)

from ._exceptions import AuthError, InvalidScope
from ._schema import auth_migrations
from ._scope import TokenScope
from ._tokens import (
    host_audience,
    new_token_secret,
    sessions_audience,
    token_create,
    token_list,
    token_revoke,
)

token_surfaces = {"host": host_audience, "sessions": sessions_audience}
"""``--surface`` choices and the token audience each one means."""


def _add_surface_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--surface", choices=sorted(token_surfaces), default="host",
                        help="which surface the token opens (default host)")


def add_token_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``token create|list|revoke`` to an argparse ``add_subparsers()`` object."""
    token = subparsers.add_parser("token", help="manage host and sessions bearer tokens")
    commands = token.add_subparsers(dest="token_command", required=True)

    create = commands.add_parser("create", help="create a token; prints the secret once, on the last line")
    add_data_dir_arguments(create)
    _add_surface_argument(create)
    create.add_argument("--name", required=True, help="the token's name (recorded as the source of its operations)")
    scope = create.add_mutually_exclusive_group(required=True)
    scope.add_argument("--scope", choices=["all"], help="host: grant every entry")
    scope.add_argument("--entries", metavar="A,B", help="host: grant these entry ids (comma-separated)")
    scope.add_argument("--prefix", metavar="PREFIX", help="host: grant entry ids starting with PREFIX (%% and _ are literal)")
    scope.add_argument("--end-user", metavar="ID", help="sessions: the end user the token acts for (e.g. u_123)")

    listing = commands.add_parser("list", help="list tokens (never their secrets)")
    add_data_dir_arguments(listing)
    _add_surface_argument(listing)

    revoke = commands.add_parser("revoke", help="revoke a token by name (effective on its next request)")
    add_data_dir_arguments(revoke)
    _add_surface_argument(revoke)
    revoke.add_argument("name")
    return token


def _scope_of(arguments: Any) -> TokenScope:
    """The scope the arguments ask for; raises ``InvalidScope`` when it does not fit the
    surface (a sessions token needs ``--end-user`` and nothing else, a host token an entry
    scope)."""
    end_user = getattr(arguments, "end_user", None)
    if _surface_of(arguments) == "sessions":
        if end_user is None:
            raise InvalidScope("a sessions token needs --end-user ID (not an entry scope)")
        return TokenScope.of_end_user(end_user)
    if end_user is not None:
        raise InvalidScope("--end-user is for sessions tokens (add --surface sessions)")
    if getattr(arguments, "entries", None) is not None:
        return TokenScope.of_entries(part for part in arguments.entries.split(",") if part != "")
    if getattr(arguments, "prefix", None) is not None:
        return TokenScope.of_prefix(arguments.prefix)
    return TokenScope.all()


def _surface_of(arguments: Any) -> str:
    return getattr(arguments, "surface", None) or "host"


async def _create(env: Any, engine: Any, arguments: Any, scope: TokenScope) -> list[str]:
    secret = new_token_secret(env.random)
    now = env.clock.wall()
    surface = _surface_of(arguments)
    audience = token_surfaces[surface]
    await engine.write(lambda connection: token_create(
        connection, name=arguments.name, scope=scope, secret=secret, created_at=now, audience=audience))
    return [
        f"created {surface} token {arguments.name} (scope: {scope.describe()})",
        "the secret follows on the last line; it is shown only once, store it now:",
        secret,
    ]


async def _list(env: Any, engine: Any, audience: str) -> list[str]:
    del env
    records = await engine.read(lambda connection: token_list(connection, audience=audience))
    lines = ["name\tstate\tcreated_at\tscope"]
    for record in records:
        state = "active" if record.active else f"revoked {utc_timestamp_text(record.revoked_at or 0)}"
        lines.append(f"{record.name}\t{state}\t{utc_timestamp_text(record.created_at)}\t{record.scope.describe()}")
    return lines


async def _revoke(env: Any, engine: Any, name: str, surface: str) -> list[str]:
    now = env.clock.wall()
    audience = token_surfaces[surface]
    await engine.write(lambda connection: token_revoke(connection, name=name, revoked_at=now, audience=audience))
    return [f"revoked {surface} token {name}"]


def run_token_command(arguments: Any) -> int:
    """Run ``troupe token ...`` with parsed ``arguments``; returns the exit code.

    Must not be called from inside a running trio loop (it runs its own)."""
    return run_storage_command(
        arguments,
        command_name="token",
        migrations=auth_migrations,
        refusals=(AuthError,),
        prepare_job=lambda: _token_job(arguments),
    )


def _token_job(arguments: Any) -> StorageJob:
    command = arguments.token_command
    if command == "create":
        scope = _scope_of(arguments)
        return lambda env, engine: _create(env, engine, arguments, scope)
    surface = _surface_of(arguments)
    if command == "list":
        return lambda env, engine: _list(env, engine, token_surfaces[surface])
    if command == "revoke":
        return lambda env, engine: _revoke(env, engine, arguments.name, surface)
    raise AssertionError(f"unknown token command {command!r}")


def main(argv: list[str] | None = None) -> int:
    """``python -m troupe.auth token ...``: the same commands before ``troupe`` wires them."""
    parser = argparse.ArgumentParser(prog="troupe")
    add_token_commands(parser.add_subparsers(dest="command", required=True))
    return run_token_command(parser.parse_args(argv))


__all__ = ["add_token_commands", "main", "run_token_command", "token_surfaces"]
