"""Tokens, scopes and rate buckets as units, and ``troupe token create|list|revoke`` against a
running ``troupe serve`` (in-process, real hypercorn) sharing its database file."""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stdout

import httpx
import pytest
import trio

import troupe.auth
from troupe.auth import (
    AuthError,
    InvalidScope,
    InvalidTokenName,
    RateBuckets,
    TokenNameTaken,
    TokenScope,
    UnknownToken,
    add_token_commands,
    bearer_secret,
    run_token_command,
)
from troupe.http.host import host_surface
from troupe.server import ListenAddress, ServeOptions, admin_surface, serve


def test_exports_and_hierarchy():
    for name in troupe.auth.__all__:
        assert getattr(troupe.auth, name) is not None, name
    for error in (InvalidScope, InvalidTokenName, TokenNameTaken, UnknownToken):
        assert issubclass(error, AuthError)


def test_scopes_and_their_stored_form():
    assert TokenScope.all().allows("anything")
    listed = TokenScope.of_entries(["a", "b:c"])
    assert listed.allows("b:c") and not listed.allows("B:c") and not listed.allows("a:")
    prefix = TokenScope.of_prefix("as_%")
    assert prefix.allows("as_%1") and not prefix.allows("asx%1") and not prefix.allows("as_")
    for scope in (TokenScope.all(), listed, prefix):
        assert TokenScope.decode(*scope.encode()) == scope
    for bad in (lambda: TokenScope.of_entries(["a?b"]), lambda: TokenScope.of_entries([]),
                lambda: TokenScope.of_prefix("x#"), lambda: TokenScope.of_entries(["  "])):
        with pytest.raises(InvalidScope):
            bad()
    assert TokenScope.decode("entries", "not json").problem() is not None
    assert TokenScope.decode("entries", '["ok", "no\\u0000"]').problem() is not None


def test_bearer_header_parsing():
    assert bearer_secret([b"Bearer abc"]) == "abc"
    assert bearer_secret([b"bearer abc"]) == "abc"
    for values in ([], [b"Bearer"], [b"Basic abc"], [b"Bearer a b"], [b"Bearer a", b"Bearer a"], [b"Bearer \xff"]):
        assert bearer_secret(values) is None


def test_rate_buckets_refill_at_the_rate_up_to_the_burst_per_key():
    now = [0.0]
    buckets = RateBuckets(lambda: now[0], rate_per_second=20, burst=60)
    assert [buckets.take("a") for _ in range(60)] == [0.0] * 60
    assert buckets.take("a") == pytest.approx(0.05)
    assert buckets.take("b") == 0.0
    now[0] = 1.0
    assert [buckets.take("a") for _ in range(20)] == [0.0] * 20
    assert buckets.take("a") > 0
    now[0] = 100.0
    assert sum(buckets.take("a") == 0.0 for _ in range(100)) == 60


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="troupe")
    add_token_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def run_cli(*argv: str) -> tuple[int, list[str]]:
    output = io.StringIO()
    with redirect_stdout(output):
        code = run_token_command(parse(*argv))
    return code, output.getvalue().splitlines()


def test_cli_refusals_and_argument_rules(tmp_path, capsys):
    data = str(tmp_path)
    assert run_cli("token", "create", "--data-dir", data, "--name", "a", "--scope", "all")[0] == 0
    assert run_cli("token", "create", "--data-dir", data, "--name", "a", "--scope", "all")[0] == 1
    assert run_cli("token", "create", "--data-dir", data, "--name", "b", "--entries", "x?y")[0] == 1
    assert run_cli("token", "revoke", "--data-dir", data, "nobody")[0] == 1
    assert "troupe token:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("token", "create", "--name", "c")  # a scope is required
    with pytest.raises(SystemExit):
        parse("token", "create", "--name", "c", "--scope", "all", "--prefix", "p")


async def test_cli_create_list_revoke_against_a_running_server(tmp_path):
    data = str(tmp_path / "data")
    options = ServeOptions(data_dir=data, listen={"admin": None, "host": ListenAddress("127.0.0.1", 0)})
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(
            options, surfaces=[admin_surface, host_surface], handle_signals=False,
            print_line=lambda line: None, task_status=task_status))
        code, lines = await trio.to_thread.run_sync(
            run_cli, "token", "create", "--data-dir", data, "--name", "astrbot", "--prefix", "astrbot:")
        assert code == 0
        secret = lines[-1]
        assert secret.startswith("troupe_") and " " not in secret and len(secret) >= 40
        assert secret not in "\n".join(lines[:-1])
        message = {"sender": "小林", "content": "hi", "occurred_at": "2026-10-10T20:00:00+08:00", "dedupe_key": "k"}
        async with httpx.AsyncClient(base_url=handle.urls["host"], headers={"Authorization": f"Bearer {secret}"}) as client:
            accepted = await client.post("/api/v1/entries/astrbot:g/messages", json=message)
            assert accepted.status_code == 200, accepted.text
            assert (await client.post("/api/v1/entries/qq:g/messages", json=message)).status_code == 403
            code, listing = await trio.to_thread.run_sync(run_cli, "token", "list", "--data-dir", data)
            assert code == 0 and secret not in "\n".join(listing)
            assert listing[1].startswith("astrbot\tactive\t") and listing[1].endswith("prefix astrbot:")
            code, _ = await trio.to_thread.run_sync(run_cli, "token", "revoke", "--data-dir", data, "astrbot")
            assert code == 0
            revoked = await client.post("/api/v1/entries/astrbot:g/messages", json=message)
            assert revoked.status_code == 401
            assert revoked.headers["www-authenticate"] == "Bearer"
            code, listing = await trio.to_thread.run_sync(run_cli, "token", "list", "--data-dir", data)
            assert "\trevoked " in listing[1]
        handle.request_shutdown()
