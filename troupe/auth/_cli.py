"""``troupe token create|list|revoke``: host tokens from the command line.

The commands open the same database file as ``troupe serve`` (same data-directory rules:
``--data-dir`` > ``TROUPE_DATA_DIR`` > ``troupe.toml`` > ``./troupe-data``) through the storage
engine, so they work while the server runs: SQLite's WAL lets the CLI commit beside the
server, and the server's next token lookup sees the commit.

``create`` prints the secret once, alone on the last line of its output (scripts read it from
there; keep this stable).  Exit codes: 0 done, 1 refused (name taken, unknown name, bad scope,
storage error), 2 configuration error.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable
from typing import Any

import trio

from troupe._config import ConfigError, load_serve_options
from troupe.runtime import real_env
from troupe.storage import StorageError, open_engine

from ._exceptions import AuthError
from ._schema import auth_migrations
from ._scope import TokenScope
from ._tokens import new_token_secret, token_create, token_list, token_revoke

exit_code_ok = 0
exit_code_refused = 1
exit_code_config = 2


def add_token_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``token create|list|revoke`` to an argparse ``add_subparsers()`` object."""
    token = subparsers.add_parser("token", help="manage host bearer tokens")
    commands = token.add_subparsers(dest="token_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--data-dir", default=None, help="data directory (default ./troupe-data)")
        parser.add_argument("--config", default=None, help="troupe.toml to read")

    create = commands.add_parser("create", help="create a token; prints the secret once, on the last line")
    common(create)
    create.add_argument("--name", required=True, help="the token's name (recorded as the source of its operations)")
    scope = create.add_mutually_exclusive_group(required=True)
    scope.add_argument("--scope", choices=["all"], help="grant every entry")
    scope.add_argument("--entries", metavar="A,B", help="grant these entry ids (comma-separated)")
    scope.add_argument("--prefix", metavar="PREFIX", help="grant entry ids starting with PREFIX (%% and _ are literal)")

    listing = commands.add_parser("list", help="list tokens (never their secrets)")
    common(listing)

    revoke = commands.add_parser("revoke", help="revoke a token by name (effective on its next request)")
    common(revoke)
    revoke.add_argument("name")
    return token


def _scope_of(arguments: Any) -> TokenScope:
    if getattr(arguments, "entries", None) is not None:
        return TokenScope.of_entries(part for part in arguments.entries.split(",") if part != "")
    if getattr(arguments, "prefix", None) is not None:
        return TokenScope.of_prefix(arguments.prefix)
    return TokenScope.all()


def _timestamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="seconds")


async def _with_engine(data_dir: str, job: Callable[[Any, Any], Any]) -> Any:
    """Run ``job(env, engine)``; a refusal is returned (not raised) so that it does not come
    out of the engine's nursery wrapped in an exception group."""
    env = real_env(data_dir)
    async with open_engine(env, migrations=auth_migrations) as engine:
        try:
            return await job(env, engine)
        except (AuthError, StorageError) as exc:
            return exc


def _refusal(error: BaseException) -> BaseException | None:
    """The refusal inside ``error`` (possibly an exception group), or None if it is a bug."""
    if isinstance(error, AuthError | StorageError):
        return error
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _refusal(error.exceptions[0])
    return None


async def _create(env: Any, engine: Any, arguments: Any, scope: TokenScope) -> list[str]:
    secret = new_token_secret(env.random)
    now = env.clock.wall()
    await engine.write(lambda connection: token_create(
        connection, name=arguments.name, scope=scope, secret=secret, created_at=now))
    return [
        f"created host token {arguments.name} (scope: {scope.describe()})",
        "the secret follows on the last line; it is shown only once, store it now:",
        secret,
    ]


async def _list(env: Any, engine: Any) -> list[str]:
    del env
    records = await engine.read(lambda connection: token_list(connection))
    lines = ["name\tstate\tcreated_at\tscope"]
    for record in records:
        state = "active" if record.active else f"revoked {_timestamp(record.revoked_at or 0)}"
        lines.append(f"{record.name}\t{state}\t{_timestamp(record.created_at)}\t{record.scope.describe()}")
    return lines


async def _revoke(env: Any, engine: Any, name: str) -> list[str]:
    now = env.clock.wall()
    await engine.write(lambda connection: token_revoke(connection, name=name, revoked_at=now))
    return [f"revoked host token {name}"]


def run_token_command(arguments: Any) -> int:
    """Run ``troupe token ...`` with parsed ``arguments``; returns the exit code.

    Must not be called from inside a running trio loop (it runs its own)."""
    try:
        data_dir = load_serve_options(arguments).data_dir
    except ConfigError as exc:
        _note(str(exc))
        return exit_code_config
    command = arguments.token_command
    try:
        if command == "create":
            scope = _scope_of(arguments)
            lines = trio.run(_with_engine, data_dir, lambda env, engine: _create(env, engine, arguments, scope))
        elif command == "list":
            lines = trio.run(_with_engine, data_dir, _list)
        elif command == "revoke":
            lines = trio.run(_with_engine, data_dir, lambda env, engine: _revoke(env, engine, arguments.name))
        else:
            raise AssertionError(f"unknown token command {command!r}")
    except (AuthError, StorageError, BaseExceptionGroup) as exc:
        refusal = _refusal(exc)
        if refusal is None:
            raise
        lines = refusal
    if isinstance(lines, BaseException):
        _note(str(lines))
        return exit_code_refused
    for line in lines:
        print(line, flush=True)
    return exit_code_ok


def _note(line: str) -> None:
    print(f"troupe token: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m troupe.auth token ...``: the same commands before ``troupe`` wires them."""
    parser = argparse.ArgumentParser(prog="troupe")
    add_token_commands(parser.add_subparsers(dest="command", required=True))
    return run_token_command(parser.parse_args(argv))


__all__ = ["add_token_commands", "main", "run_token_command"]
