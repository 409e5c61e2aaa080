"""The ``/sync/*`` routes of the knowledge surface (seeds/004 §3.11–3.16, §3.21–3.23) and the
peer-to-peer routes replication needs (``/sync/peer/join``, ``/sync/peer/ops``,
``/sync/peer/digest``).

A thin adapter like the rest of the app: parse strictly (400 ``INVALID_REQUEST`` naming the
field), ask the sync actor ``("knowledge_sync", "main")``, answer the reply's ``encode()``.
The user's routes are loopback-only like every other route (the gate's Host check).  The peer
routes are not the user's: each request is signed by the sending device
(``X-Troupe-Device``, ``X-Troupe-Signed-At``, ``X-Troupe-Signature``) and the actor verifies it
against the key exchanged at pairing; an unknown, revoked or badly signed sender is 403
``PEER_REFUSED``, a paused or disabled runtime 503 ``SYNC_PAUSED`` with ``Retry-After``.

The address a token advertises (and a joiner gives) is the listener the request came in on
(``http://HOST:PORT`` of the ASGI ``server``), so no configuration is needed on loopback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart import Response, request

from troupe.actors.knowledge.sync import (
    ConfirmPairing,
    CreatePairingToken,
    DigestAnswer,
    ExchangeDigest,
    GetKnowledgeSyncState,
    GetSyncStatus,
    JoinDomain,
    ListPeers,
    PairWithToken,
    PeerRefused,
    PushOperations,
    RequestPairing,
    RevokePeer,
    SignedEnvelope,
    SyncPaused,
    UpdateSyncSettings,
    device_id_characters_max,
    device_name_characters_max,
    domain_records_max,
    header_device,
    header_signature,
    header_signed_at,
    inbound_key,
    pairing_methods,
    pairing_token_characters_max,
    pairing_token_ttl_seconds_default,
    push_operations_max,
    records_valid,
    seq_unbounded,
    sync_key,
    sync_kind_name,
    valid_knowledge_id,
)

from ._app import answered, json_content_type, json_response
from ._errors import KnowledgeError, code_invalid_request, request_id_of
from ._gate import route_of
from ._schemas import parse_json_body

sync_ask_timeout_seconds = 30.0
"""A pairing waits for the other device (one peer request of at most 10 s) inside the ask."""
paused_retry_after_seconds = 5


def _field_error(name: str, what: str) -> KnowledgeError:
    return KnowledgeError(code_invalid_request, f"field '{name}' {what}")


def _object(document: Any) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise KnowledgeError(code_invalid_request, "the request body must be a JSON object")
    return document


def _text(document: dict[str, Any], name: str, *, required: bool = True, characters_max: int = 256) -> str | None:
    value = document.get(name)
    if value is None:
        if required:
            raise _field_error(name, "is required")
        return None
    if not isinstance(value, str) or not value or len(value) > characters_max:
        raise _field_error(name, f"must be a non-empty string of at most {characters_max} characters")
    return value


def _boolean(document: dict[str, Any], name: str, *, required: bool) -> bool | None:
    value = document.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, bool):
        raise _field_error(name, "must be true or false")
    return value


def _method(document: dict[str, Any]) -> str:
    method = document.get("method")
    if method not in pairing_methods:
        raise _field_error("method", "must be one of: QR, PIN")
    return method


def _pin(document: dict[str, Any], method: str) -> str | None:
    pin = document.get("pin")
    if method == "PIN":
        if not (isinstance(pin, str) and len(pin) == 6 and pin.isascii() and pin.isdigit()):
            raise _field_error("pin", "must be exactly 6 digits when method is PIN")
        return pin
    if pin is not None and not isinstance(pin, str):
        raise _field_error("pin", "must be a string")
    return None


def own_address() -> str:
    """The base URL of the listener this request came in on."""
    server = request.scope.get("server") or ("127.0.0.1", 0)
    host, port = server[0], server[1]
    host = f"[{host}]" if ":" in str(host) else host
    return f"http://{host}:{port}"


def _envelope(body: bytes) -> SignedEnvelope | PeerRefused:
    device_id = request.headers.get(header_device, "")
    signed_at = request.headers.get(header_signed_at, "")
    signature = request.headers.get(header_signature, "")
    if not device_id or len(device_id) > device_id_characters_max or not signed_at.isdigit() \
            or len(signed_at) > 20 or not signature:
        return PeerRefused("the request is not signed by a device")
    return SignedEnvelope(device_id, int(signed_at), signature, request.method, request.path, body)


def _peer_answer(reply: Any) -> Response:
    if isinstance(reply, PeerRefused):
        return json_response(reply.encode() | {"request_id": request_id_of(request.scope)}, 403)
    if isinstance(reply, SyncPaused):
        return json_response(reply.encode(), 503, {"Retry-After": str(paused_retry_after_seconds)})
    if isinstance(reply, DigestAnswer):
        return Response(reply.body(), status=200, content_type=json_content_type)
    return answered(reply)


def install_sync_routes(app: Any, ask: Callable[..., Any], register: Callable[[Any, str], Any]) -> None:
    """Add the sync routes to the knowledge app (``register`` is the app's ``_register``)."""

    async def sync(message: Any) -> Any:
        return await ask(sync_kind_name, sync_key, message, timeout=sync_ask_timeout_seconds)

    async def inbound(message: Any) -> Any:
        # Peers' operations go to the inbound actor: the main one may be in a round that
        # waits on this very peer (see ``inbound_key``).
        return await ask(sync_kind_name, inbound_key, message, timeout=sync_ask_timeout_seconds)

    async def body() -> dict[str, Any]:
        return _object(parse_json_body(await request.get_data(cache=True, as_text=False)))

    @register(app, "sync_token")
    async def sync_token() -> Response:
        document = await body()
        method = _method(document)
        pin = _pin(document, method)
        ttl = document.get("ttl_seconds", pairing_token_ttl_seconds_default)
        if isinstance(ttl, bool) or not isinstance(ttl, int):
            raise _field_error("ttl_seconds", "must be an integer")
        return answered(await sync(CreatePairingToken(method=method, pin=pin, ttl_seconds=ttl,
                                                      address=own_address())))

    @register(app, "sync_pair")
    async def sync_pair() -> Response:
        document = await body()
        method = _method(document)
        token = _text(document, "token", characters_max=pairing_token_characters_max)
        assert token is not None
        return answered(await sync(PairWithToken(method=method, token=token, pin=_pin(document, method),
                                                 address=own_address())))

    @register(app, "sync_peers")
    async def sync_peers() -> Response:
        return answered(await sync(ListPeers()))

    @register(app, "sync_pair_request")
    async def sync_pair_request() -> Response:
        document = await body()
        target = _text(document, "target_device_id", characters_max=device_id_characters_max)
        assert target is not None
        return answered(await sync(RequestPairing(target_device_id=target)))

    @register(app, "sync_pair_confirm")
    async def sync_pair_confirm() -> Response:
        document = await body()
        request_id = _text(document, "request_id", characters_max=128)
        accept = _boolean(document, "accept", required=True)
        assert request_id is not None and accept is not None
        return answered(await sync(ConfirmPairing(request_id=request_id, accept=accept)))

    @register(app, "sync_status")
    async def sync_status() -> Response:
        return answered(await sync(GetSyncStatus()))

    @register(app, "sync_settings")
    async def sync_settings() -> Response:
        document = await body()
        enabled = _boolean(document, "enabled", required=False)
        paused = _boolean(document, "paused", required=False)
        return answered(await sync(UpdateSyncSettings(enabled=enabled, paused=paused)))

    @register(app, "sync_state")
    async def sync_state() -> Response:
        knowledge_id = route_of(request.scope).path_id
        if not valid_knowledge_id(knowledge_id):
            raise KnowledgeError(code_invalid_request, "the path must name a knowledge id (knw_...)")
        return answered(await sync(GetKnowledgeSyncState(knowledge_id=knowledge_id)))

    @register(app, "sync_revoke")
    async def sync_revoke() -> Response:
        peer_id = route_of(request.scope).path_id or ""
        if len(peer_id) > device_id_characters_max:
            raise KnowledgeError("PEER_NOT_FOUND", "no paired device has this id", status=404)
        return answered(await sync(RevokePeer(peer_id=peer_id)))

    @register(app, "sync_peer_join")
    async def sync_peer_join() -> Response:
        raw = await request.get_data(cache=True, as_text=False)
        document = _object(parse_json_body(raw))
        envelope = _envelope(raw)
        if isinstance(envelope, PeerRefused):
            return _peer_answer(envelope)
        values = {name: _text(document, name, characters_max=limit) for name, limit in (
            ("nonce", 128), ("device_id", device_id_characters_max), ("device_name", device_name_characters_max),
            ("public_key", 128), ("address", 512))}
        pin = document.get("pin")
        return _peer_answer(await sync(JoinDomain(envelope=envelope, pin=pin if isinstance(pin, str) else None,
                                                  **values)))  # type: ignore[arg-type]

    @register(app, "sync_peer_ops")
    async def sync_peer_ops() -> Response:
        raw = await request.get_data(cache=True, as_text=False)
        document = _object(parse_json_body(raw))
        envelope = _envelope(raw)
        if isinstance(envelope, PeerRefused):
            return _peer_answer(envelope)
        operations = document.get("operations")
        if not isinstance(operations, list) or len(operations) > push_operations_max:
            raise _field_error("operations", f"must be a list of at most {push_operations_max} operations")
        return _peer_answer(await inbound(PushOperations(envelope=envelope, operations=operations)))

    @register(app, "sync_peer_digest")
    async def sync_peer_digest() -> Response:
        raw = await request.get_data(cache=True, as_text=False)
        document = _object(parse_json_body(raw))
        envelope = _envelope(raw)
        if isinstance(envelope, PeerRefused):
            return _peer_answer(envelope)
        vector = document.get("version_vector")
        operations = document.get("operations") or []
        members = document.get("members") or []
        if not isinstance(vector, dict) or not isinstance(operations, list) or len(operations) > push_operations_max:
            raise _field_error("version_vector", "must be an object (with at most "
                               f"{push_operations_max} operations beside it)")
        members_digest = document.get("members_digest") or ""
        if not records_valid(members):
            raise _field_error("members", f"must be a list of at most {domain_records_max} records")
        if not isinstance(members_digest, str) or len(members_digest) > 64:
            raise _field_error("members_digest", "must be a SHA-256 hex digest")
        until_seq = document.get("until_seq")
        if until_seq is not None and (not isinstance(until_seq, int) or isinstance(until_seq, bool)
                                      or not 0 <= until_seq <= seq_unbounded):
            raise _field_error("until_seq", f"must be an integer from 0 to {seq_unbounded}")
        return _peer_answer(await inbound(ExchangeDigest(envelope=envelope, version_vector=vector,
                                                      operations=operations, members=members,
                                                      members_digest=members_digest, until_seq=until_seq)))


__all__ = [
    "install_sync_routes",
    "own_address",
    "paused_retry_after_seconds",
    "sync_ask_timeout_seconds",
]
