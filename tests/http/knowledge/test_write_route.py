"""``_write_route``: ``POST /memory/write`` outside quart answers exactly what the quart route
did (the black-box tests in ``test_writes`` and ``test_handshake_and_gate`` run through it);
these pin the dispatch and the crash boundary with a fake actor, no server."""

from __future__ import annotations

import json

from troupe.actors.knowledge import KnowledgeRefused, MemoryWritten
from troupe.http.knowledge._errors import request_id_key
from troupe.http.knowledge._gate import route_key
from troupe.http.knowledge._routes import match_route
from troupe.http.knowledge._write_route import WriteRoute, WriteRouteDispatch
from troupe.storage import StorageIOError

from ._knowledge_harness import conversation


def _scope(method: str, path: str) -> dict:
    return {"type": "http", "method": method, "path": path, "headers": [],
            route_key: match_route(method, path), request_id_key: "req_test"}


async def _exchange(app, scope: dict, body: bytes | None) -> tuple[int | None, dict, bytes]:
    sent: list[dict] = []
    messages = [{"type": "http.disconnect"}] if body is None else [
        {"type": "http.request", "body": body[:10], "more_body": True},
        {"type": "http.request", "body": body[10:], "more_body": False}]

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if not sent:
        return None, {}, b""
    headers = {name.decode(): value.decode() for name, value in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(message.get("body", b"") for message in sent[1:])


class CrashedTurn(Exception):
    pass


def _route(reply) -> WriteRoute:
    async def ask(kind: str, key: str, message):
        assert (kind, key) == ("knowledge_scope", "user:alice") and message.idempotency_key == "session-01:turn-03"
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return WriteRoute(ask, quiet_errors=(CrashedTurn,))


written = MemoryWritten(evidence_id="evd_1", quality_score=0.8, sensitivity=0, latency_ms=3, status="accepted")
body = json.dumps(conversation()).encode()


async def test_a_write_answers_the_actors_reply_as_json():
    status, headers, answer = await _exchange(_route(written), _scope("POST", "/memory/write"), body)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(answer) == written.encode() and headers["content-length"] == str(len(answer))


async def test_refusals_storage_errors_and_crashes_use_the_contracts_envelope():
    cases = [
        (KnowledgeRefused("IDEMPOTENCY_CONFLICT", "bound to another request", 409), 409, "IDEMPOTENCY_CONFLICT"),
        (StorageIOError("disk"), 503, "OVERLOADED"),
        (CrashedTurn(), 500, "INTERNAL_ERROR"),
        (RuntimeError("secret detail"), 500, "INTERNAL_ERROR"),
    ]
    for reply, expected_status, code in cases:
        status, headers, answer = await _exchange(_route(reply), _scope("POST", "/memory/write"), body)
        document = json.loads(answer)
        assert (status, document["error"], document["request_id"]) == (expected_status, code, "req_test")
        assert "secret" not in document["message"]
        assert ("retry-after" in headers) == (expected_status == 503)
    status, _, answer = await _exchange(_route(written), _scope("POST", "/memory/write"), b'{"source_type": "EMAIL"}')
    assert status == 400 and json.loads(answer)["error"] == "INVALID_REQUEST"


async def test_a_client_gone_before_its_body_gets_no_answer():
    assert (await _exchange(_route(written), _scope("POST", "/memory/write"), None))[0] is None


async def test_only_the_write_goes_around_quart():
    seen: list[str] = []

    async def quart(scope, receive, send) -> None:
        seen.append(scope["path"])

    dispatch = WriteRouteDispatch(quart, _route(written))
    assert (await _exchange(dispatch, _scope("POST", "/memory/write"), body))[0] == 200
    for method, path in (("POST", "/memory/update"), ("POST", "/memory/query")):
        await _exchange(dispatch, _scope(method, path), b"{}" * 8)
    await dispatch({"type": "websocket", "path": "/events"}, None, None)
    assert seen == ["/memory/update", "/memory/query", "/events"]
