"""Sessions tokens bound to one end user: the scope's stored form and rules, and
``troupe token create --surface sessions --end-user ID`` / ``list`` / ``revoke --surface``
against the database a server reads."""

from __future__ import annotations

import pytest
import trio

from troupe.auth import (
    InvalidScope,
    TokenScope,
    auth_migrations,
    authenticate,
    end_user_id_characters_max,
    host_audience,
    sessions_audience,
    token_surfaces,
)
from troupe.runtime import real_env
from troupe.storage import open_engine

from .test_tokens import parse, run_cli


def test_end_user_scopes_round_trip_and_grant_no_entry():
    scope = TokenScope.of_end_user("u_123")
    assert scope.end_user_id == "u_123" and scope.describe() == "end user u_123"
    assert TokenScope.decode(*scope.encode()) == scope
    assert not scope.allows("u_123") and not scope.allows("astrbot:g")
    assert TokenScope.of_end_user("x" * end_user_id_characters_max).problem() is None
    for bad in ("", " u", "u\x00", "x" * (end_user_id_characters_max + 1)):
        with pytest.raises(InvalidScope):
            TokenScope.of_end_user(bad)
    assert TokenScope.decode("end_user", "").problem() is not None
    assert token_surfaces == {"host": host_audience, "sessions": sessions_audience}


def test_cli_creates_lists_and_revokes_sessions_tokens(tmp_path, capsys):
    data = str(tmp_path)
    code, lines = run_cli("token", "create", "--data-dir", data, "--surface", "sessions",
                          "--name", "phone", "--end-user", "u_123")
    assert code == 0
    secret = lines[-1]
    assert secret.startswith("troupe_") and " " not in secret and secret not in "\n".join(lines[:-1])
    assert lines[0] == "created sessions token phone (scope: end user u_123)"
    # Names are per surface: a host token may share the name.
    assert run_cli("token", "create", "--data-dir", data, "--name", "phone", "--scope", "all")[0] == 0
    code, listing = run_cli("token", "list", "--data-dir", data, "--surface", "sessions")
    assert code == 0 and len(listing) == 2 and listing[1].startswith("phone\tactive\t")
    assert listing[1].endswith("end user u_123") and secret not in "\n".join(listing)
    code, host_listing = run_cli("token", "list", "--data-dir", data)
    assert len(host_listing) == 2 and host_listing[1].endswith("\tall")

    async def lookup(audience: str):
        async with open_engine(real_env(data), migrations=list(auth_migrations)) as engine:
            return await authenticate(engine, secret, audience=audience)

    grant = trio.run(lookup, sessions_audience)
    assert grant is not None and grant.scope.end_user_id == "u_123"
    assert trio.run(lookup, host_audience) is None  # a sessions token never opens the host surface
    assert run_cli("token", "revoke", "--data-dir", data, "--surface", "sessions", "phone")[0] == 0
    assert trio.run(lookup, sessions_audience) is None
    code, listing = run_cli("token", "list", "--data-dir", data, "--surface", "sessions")
    assert "\trevoked " in listing[1]
    code, host_listing = run_cli("token", "list", "--data-dir", data)
    assert host_listing[1].startswith("phone\tactive\t")
    capsys.readouterr()


def test_cli_refuses_scopes_that_do_not_fit_the_surface(tmp_path, capsys):
    data = str(tmp_path)
    assert run_cli("token", "create", "--data-dir", data, "--surface", "sessions", "--name", "a", "--scope", "all")[0] == 1
    assert run_cli("token", "create", "--data-dir", data, "--name", "a", "--end-user", "u_1")[0] == 1
    assert run_cli("token", "create", "--data-dir", data, "--surface", "sessions", "--name", "a", "--end-user", " ")[0] == 1
    assert run_cli("token", "revoke", "--data-dir", data, "--surface", "sessions", "nobody")[0] == 1
    assert "troupe token:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("token", "create", "--surface", "sessions", "--name", "a")  # --end-user is required
    with pytest.raises(SystemExit):
        parse("token", "create", "--surface", "elsewhere", "--name", "a", "--end-user", "u")
