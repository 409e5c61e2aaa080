"""The plumbing shared by the operator commands that open the server's database
(``troupe token``, ``troupe persona``).

Why one module: each such command must resolve the data directory by the same rules as
``troupe serve`` (``--data-dir`` > ``TROUPE_DATA_DIR`` > ``troupe.toml`` > ``./troupe-data``),
open the storage engine in its own trio run (WAL lets it commit beside a running server), and
turn a refusal into exit code 1 with a note on stderr.  Written once, every command keeps the
same exit codes and the same refusal handling.

Trade-off: a refusal raised inside the engine is returned out of the engine's nursery, not
raised, so that it does not come out wrapped in an exception group; a refusal raised while the
command prepares its job (before the engine opens) is caught the same way, and anything else
(a bug) propagates.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from troupe._config import ConfigError, load_serve_options
from troupe.runtime import real_env
from troupe.storage import Migration, StorageError, open_engine

exit_code_ok = 0
exit_code_refused = 1
exit_code_config = 2

StorageJob = Callable[[Any, Any], Awaitable[list[str]]]
"""``job(env, engine)``: does the command's work and returns the lines to print."""


def add_data_dir_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--data-dir`` and ``--config``, read by the same rules as ``troupe serve``."""
    parser.add_argument("--data-dir", default=None, help="data directory (default ./troupe-data)")
    parser.add_argument("--config", default=None, help="troupe.toml to read")


def utc_timestamp_text(seconds: float) -> str:
    """Wall-clock ``seconds`` as an ISO 8601 UTC time to the second, for command output."""
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="seconds")


async def _run_with_engine(
    data_dir: str,
    migrations: Sequence[Migration],
    refusals: tuple[type[BaseException], ...],
    job: StorageJob,
) -> list[str] | BaseException:
    env = real_env(data_dir)
    async with open_engine(env, migrations=list(migrations)) as engine:
        try:
            return await job(env, engine)
        except refusals as exc:
            return exc


def _refusal_in(error: BaseException, refusals: tuple[type[BaseException], ...]) -> BaseException | None:
    """The refusal inside ``error`` (possibly an exception group), or None if it is a bug."""
    if isinstance(error, refusals):
        return error
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _refusal_in(error.exceptions[0], refusals)
    return None


def run_storage_command(
    arguments: Any,
    *,
    command_name: str,
    migrations: Sequence[Migration],
    refusals: tuple[type[BaseException], ...],
    prepare_job: Callable[[], StorageJob],
) -> int:
    """Run one command against the database of the data directory that ``arguments`` name;
    returns the exit code.

    ``prepare_job()`` checks the arguments (it may raise one of ``refusals``) and returns the
    job to run with the engine open; ``StorageError`` is always a refusal.  Notes go to stderr
    as ``troupe <command_name>: ...``.  Must not be called from inside a running trio loop (it
    runs its own)."""
    try:
        data_dir = load_serve_options(arguments).data_dir
    except ConfigError as exc:
        _note(command_name, str(exc))
        return exit_code_config
    refusals = (*refusals, StorageError)
    try:
        lines = trio.run(_run_with_engine, data_dir, migrations, refusals, prepare_job())
    except (*refusals, BaseExceptionGroup) as exc:
        refusal = _refusal_in(exc, refusals)
        if refusal is None:
            raise
        lines = refusal
    if isinstance(lines, BaseException):
        _note(command_name, str(lines))
        return exit_code_refused
    for line in lines:
        print(line, flush=True)
    return exit_code_ok


def _note(command_name: str, line: str) -> None:
    print(f"troupe {command_name}: {line}", file=sys.stderr, flush=True)
