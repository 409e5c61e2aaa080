"""The turn-end webhook end to end over real HTTP: the sessions app (under ``troupe serve``
itself, configured by ``TANSR_SERVE_NOTIFY_URL`` / ``TANSR_SERVE_NOTIFY_SECRET``) POSTs to a
real receiver on 127.0.0.1 (hypercorn, ephemeral port), and the receiver checks
``x-tansr-signature`` with a verifier written here from the contract alone (hmac + hashlib,
nothing imported from troupe's signing module).

- a turn that ends with no subscriber → exactly one signed POST, v2 and v1 both valid;
- a turn that ends while a subscriber is attached → none (also after the 2 s recheck, which
  the test shortens through ``SessionSettings.webhook_recheck_seconds``);
- a turn that fails (``turn.error``) → one POST with ``status: "aborted"`` and the error code
  as ``reason``: the contract's statuses are completed | aborted only and its reasons include
  ``internal_error``, so a failed turn is reported as an aborted one, never dropped.
"""

from __future__ import annotations

import hashlib
import hmac
import json

import httpx
import pytest
import trio

from tests.auth.test_tokens import run_cli
from tests.http._harness import start_hypercorn
from troupe.actors.sessions import (
    SessionSettings,
    WebhookDeliveries,
    WebhookSecret,
    WebhookSettings,
)
from troupe.http.sessions import sessions_surface
from troupe.server import ListenAddress, ServeOptions, serve

from ._sessions_harness import start_sessions_server
from ._streams import follow, is_turn_end

secret_text = "hush-秘密"
hook_path = "/hooks/turn-end"


class Receiver:
    """A webhook target: records every request, answers 204."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.port = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        self.requests.append({"method": scope["method"], "path": scope["path"],
                              "query": scope["query_string"], "headers": headers, "body": body})
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def wait_for(self, count: int) -> list[dict]:
        with trio.fail_after(10):
            while len(self.requests) < count:
                await trio.sleep(0.02)
        return self.requests


def verify(request: dict, secret: bytes) -> dict:
    """The contract's verifier: ``x-tansr-signature: v2=<hex>, v1=<hex>``; v2 is HMAC-SHA256
    over ``tansr-webhook-v2\\nPOST\\n<path>\\n<x-tansr-timestamp>\\n<x-tansr-nonce>\\n<sha256 hex
    of the body>``, v1 over the raw body.  Returns the payload."""
    headers = request["headers"]
    signatures = dict(part.strip().split("=", 1) for part in headers["x-tansr-signature"].split(","))
    assert set(signatures) == {"v2", "v1"}
    body = request["body"]
    canonical = "\n".join([
        "tansr-webhook-v2", request["method"], request["path"], headers["x-tansr-timestamp"],
        headers["x-tansr-nonce"], hashlib.sha256(body).hexdigest(),
    ]).encode()
    assert hmac.compare_digest(signatures["v2"], hmac.new(secret, canonical, hashlib.sha256).hexdigest())
    assert hmac.compare_digest(signatures["v1"], hmac.new(secret, body, hashlib.sha256).hexdigest())
    assert not {"authorization", "cookie", "proxy-authorization"} & set(headers)
    payload = json.loads(body)
    assert set(payload) <= {"sessionId", "endUserId", "turnId", "status", "reason", "lastSeq", "ts"}
    assert payload["ts"] == int(headers["x-tansr-timestamp"])
    return payload


@pytest.fixture
async def receiver(nursery):
    target = Receiver()
    target.port = await start_hypercorn(nursery, target)
    return target


async def test_serve_sends_one_signed_post_when_a_turn_ends_unwatched(tmp_path, monkeypatch, receiver):
    monkeypatch.setenv("TANSR_SERVE_NOTIFY_URL", f"http://127.0.0.1:{receiver.port}{hook_path}?tenant=a")
    monkeypatch.setenv("TANSR_SERVE_NOTIFY_SECRET", secret_text)
    data = str(tmp_path / "data")
    options = ServeOptions(data_dir=data, listen={"sessions": ListenAddress("127.0.0.1", 0)})
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(
            options, surfaces=[sessions_surface], handle_signals=False, print_line=lambda line: None,
            task_status=task_status))
        code, lines = await trio.to_thread.run_sync(
            run_cli, "token", "create", "--data-dir", data, "--surface", "sessions", "--name", "phone",
            "--end-user", "u_9")
        assert code == 0
        headers = {"Authorization": f"Bearer {lines[-1]}"}
        async with httpx.AsyncClient(base_url=handle.urls["sessions"], headers=headers) as client:
            created = await client.post("/v2/sessions", json={"prompt": "你好"})
            assert created.status_code == 201, created.text
            session_id = created.json()["sessionId"]
            [request] = await receiver.wait_for(1)
            await trio.sleep(0.3)
            assert len(receiver.requests) == 1  # once per turn
            assert request["method"] == "POST" and request["path"] == hook_path and request["query"] == b"tenant=a"
            payload = verify(request, secret_text.encode())
            meta = (await client.get(f"/v2/sessions/{session_id}")).json()
            assert payload["sessionId"] == session_id and payload["endUserId"] == "u_9"
            assert payload["status"] == "completed" and payload["reason"] == "end_turn"
            assert payload["lastSeq"] == meta["lastSeq"] and payload["turnId"].startswith("t_")
            # A forged signature fails the same verifier (the verifier is not a rubber stamp).
            forged = dict(request, body=request["body"].replace(b"completed", b"aborted__"))
            with pytest.raises(AssertionError):
                verify(forged, secret_text.encode())
        handle.request_shutdown()


@pytest.fixture
async def hooked(nursery, tmp_path, receiver):
    """The harness server with a short webhook recheck and its deliveries to ``receiver``."""
    settings = SessionSettings(webhook_recheck_seconds=0.2)
    server = await start_sessions_server(nursery, str(tmp_path / "hooked"), session_settings=settings)
    server.env.http = httpx.AsyncClient(timeout=5)
    deliveries = WebhookDeliveries(
        WebhookSettings(url=f"http://127.0.0.1:{receiver.port}{hook_path}", secret=WebhookSecret(secret_text)),
        env=server.env, storage=server.engine, tracer=server.system.tracer, shutdown=server.shutdown)
    deliveries.publish()
    nursery.start_soon(deliveries.run)
    yield server
    await server.env.http.aclose()


async def test_no_post_while_a_subscriber_watches_the_turn_end(nursery, hooked, receiver):
    async with hooked.client(await hooked.token("phone")) as client:
        session_id = (await client.post("/v2/sessions", json={})).json()["sessionId"]
        stream = await follow(nursery, client, f"/v2/sessions/{session_id}/events")
        assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "hi"})).status_code == 202
        await stream.wait_for(is_turn_end)
        await trio.sleep(0.6)  # three rechecks' worth
        assert receiver.requests == []
        stream.close()
        with trio.fail_after(5):
            while (await client.get(f"/v2/sessions/{session_id}")).json()["status"] != "idle":
                await trio.sleep(0.02)
        await trio.sleep(0.1)  # the actor has dropped the closed subscriber
        # The same session's next turn, now unwatched, is notified: the "none" above was real.
        assert (await client.post(f"/v2/sessions/{session_id}/messages", json={"prompt": "again"})).status_code == 202
        [request] = await receiver.wait_for(1)
        assert verify(request, secret_text.encode())["sessionId"] == session_id


async def test_a_failed_turn_is_notified_as_aborted_with_its_error_code(hooked, receiver):
    async with hooked.client(await hooked.token("phone")) as client:
        created = await client.post("/v2/sessions", json={"prompt": "/fail boom"})
        assert created.status_code == 201, created.text
        [request] = await receiver.wait_for(1)
        payload = verify(request, secret_text.encode())
        assert payload["sessionId"] == created.json()["sessionId"]
        assert payload["status"] == "aborted" and payload["reason"] == "model_error"
        await trio.sleep(0.3)
        assert len(receiver.requests) == 1
