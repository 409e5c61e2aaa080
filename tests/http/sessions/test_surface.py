"""``sessions_surface`` under ``troupe serve`` (in-process, real hypercorn): probes without a
token, a token made by ``troupe token create --surface sessions`` (another "process" sharing
the database file) opening a session, and revocation on the next request."""

from __future__ import annotations

import httpx
import trio

import troupe.http.sessions
from tests.auth.test_tokens import run_cli
from troupe.http.sessions import sessions_listen_default, sessions_surface
from troupe.server import ListenAddress, ServeOptions, admin_surface, serve


def test_exports():
    for name in troupe.http.sessions.__all__:
        assert getattr(troupe.http.sessions, name) is not None, name
    assert troupe.http.sessions.__all__ == sorted(troupe.http.sessions.__all__)
    assert sessions_listen_default == ListenAddress("127.0.0.1", 8787)
    assert sessions_surface.name == "sessions"


async def test_serve_mounts_the_sessions_surface(tmp_path):
    data = str(tmp_path / "data")
    options = ServeOptions(data_dir=data, listen={"admin": None, "sessions": ListenAddress("127.0.0.1", 0)})
    printed: list[str] = []
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(
            options, surfaces=[admin_surface, sessions_surface], handle_signals=False,
            print_line=printed.append, task_status=task_status))
        assert printed[0].startswith("listening sessions http://127.0.0.1:")
        code, lines = await trio.to_thread.run_sync(
            run_cli, "token", "create", "--data-dir", data, "--surface", "sessions", "--name", "phone",
            "--end-user", "u_123")
        assert code == 0
        secret = lines[-1]
        async with httpx.AsyncClient(base_url=handle.urls["sessions"]) as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).json() == {"status": "ready"}
            assert (await client.get("/v2/sessions")).status_code == 401
            client.headers["Authorization"] = f"Bearer {secret}"
            created = await client.post("/v2/sessions", json={"endUser": {"id": "u_123"}})
            assert created.status_code == 201, created.text
            meta = await client.get(f"/api/sessions/{created.json()['sessionId']}")
            assert meta.json()["endUserId"] == "u_123"
            code, _ = await trio.to_thread.run_sync(
                run_cli, "token", "revoke", "--data-dir", data, "--surface", "sessions", "phone")
            assert code == 0
            assert (await client.get("/v2/sessions")).status_code == 401
        handle.request_shutdown()
