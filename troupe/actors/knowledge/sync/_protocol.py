"""The sync vocabulary: the requests the HTTP layer (and the simulator's workload) sends to the
sync actor ``("knowledge_sync", "main")``, their replies, the ``sync_event`` and
``pair_request`` WebSocket events, and the contract's limits (seeds/004 §3.11–3.17, §3.21–3.23,
§4.4, §4.6).

Why one module: the routes, the actor and the simulator workload are written in parallel;
each request and reply is a frozen dataclass whose ``encode()`` is exactly the contract's JSON
body.  Domain failures are ``KnowledgeRefused`` values (``PAIRING_FAILED`` 422,
``PEER_NOT_FOUND`` 404, ``REQUEST_NOT_FOUND`` 404, ``INVALID_REQUEST`` 400), never exceptions.

Two kinds of requests:

- the user's (loopback, the contract's routes): ``CreatePairingToken``, ``PairWithToken``,
  ``RequestPairing``, ``ConfirmPairing``, ``ListPeers``, ``RevokePeer``, ``GetSyncStatus``,
  ``UpdateSyncSettings``, ``GetKnowledgeSyncState``, plus ``RunSyncRound`` (push and
  anti-entropy now: tests, the bench and the simulator use it instead of waiting);
- a peer's (``/sync/peer/*``), each carrying ``SignedEnvelope`` (the sender's device id, the
  time it signed, its Ed25519 signature over method, path, time and body digest): ``JoinDomain``
  (the second half of pairing), ``PushOperations`` (gossip) and ``ExchangeDigest``
  (anti-entropy).  The actor verifies the envelope against the peer's stored key; an unknown
  or revoked sender is ``PeerRefused`` (HTTP 403).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

sync_kind_name = "knowledge_sync"
sync_key = "main"

# -- limits (units last) ---------------------------------------------------------------------

pin_digits = 6
"""A PIN is exactly six ASCII digits (§3.11, §3.21)."""
pairing_token_ttl_seconds_default = 300
pairing_token_ttl_seconds_min = 10
pairing_token_ttl_seconds_max = 3_600
pair_request_ttl_seconds = 60
"""A confirm-style pairing request lives 60 s (§3.21)."""
pairing_tokens_pending_max = 64
"""Unused, unexpired tokens kept at once; the oldest is dropped beyond it."""
pair_requests_pending_max = 64
peers_max = 32
device_id_characters_max = 64
device_name_characters_max = 128
pairing_token_characters_max = 4_096
push_operations_max = 1_000
"""Operations in one gossip push or one anti-entropy page (the rest follow in the next page)."""
push_body_bytes_max = 4 * 1024 * 1024
"""The operations of one push or page, in bytes (at least one operation is always sent)."""
operation_bytes_max = 4 * 1024 * 1024
"""One operation as canonical JSON: an item's title, body and a few evidence rows."""
peer_body_bytes_max = 16 * 1024 * 1024
"""A peer request's body (a batch of operations); operations over ``operation_bytes_max`` are
never made, so a batch is cut to fit this."""
signature_skew_seconds_max = 300
"""A peer request signed further than this from our clock is refused (replay window)."""
assert pairing_token_ttl_seconds_min <= pairing_token_ttl_seconds_default <= pairing_token_ttl_seconds_max
assert operation_bytes_max < peer_body_bytes_max
assert push_body_bytes_max + operation_bytes_max + 64 * 1024 <= peer_body_bytes_max

sync_domain_default = "shared:home"
"""The shared domain a pairing joins (§3.12's ``domain``); every ``shared:*`` scope replicates."""

device_id_pattern = re.compile(r"^dev_[A-Za-z0-9_-]{1,60}$")
knowledge_id_pattern = re.compile(r"^knw_[A-Za-z0-9_-]{1,124}$")
pin_pattern = re.compile(r"^[0-9]{6}$")
request_id_pattern = re.compile(r"^req_[A-Za-z0-9_-]{1,124}$")
assert device_id_characters_max >= 4 + 60

PairingMethod = Literal["QR", "PIN"]
pairing_methods: tuple[str, ...] = ("QR", "PIN")
PeerStatus = Literal["ONLINE", "OFFLINE"]
SyncEventType = Literal["PEER_ONLINE", "PEER_OFFLINE", "SYNC_COMPLETE", "ANTI_ENTROPY_DONE"]
sync_event_types: tuple[str, ...] = ("PEER_ONLINE", "PEER_OFFLINE", "SYNC_COMPLETE", "ANTI_ENTROPY_DONE")
PairConfirmStatus = Literal["accepted", "rejected", "expired"]


def valid_device_id(text: Any) -> bool:
    return isinstance(text, str) and device_id_pattern.fullmatch(text) is not None


def valid_knowledge_id(text: Any) -> bool:
    return isinstance(text, str) and knowledge_id_pattern.fullmatch(text) is not None


def valid_pin(text: Any) -> bool:
    return isinstance(text, str) and pin_pattern.fullmatch(text) is not None


# -- the user's requests and replies ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CreatePairingToken:
    """§3.11 → ``PairingToken``.  ``address`` is where peers reach this device (the base URL
    of the listener the request came in on)."""

    method: str
    pin: str | None = None
    ttl_seconds: int = pairing_token_ttl_seconds_default
    address: str = ""


@dataclass(frozen=True)
class PairingToken:
    token: str
    method: str
    ttl_seconds: int

    def encode(self) -> dict[str, Any]:
        return {"token": self.token, "method": self.method, "ttl_seconds": self.ttl_seconds}


@dataclass(frozen=True, kw_only=True)
class PairWithToken:
    """§3.12 → ``Paired`` or 422 ``PAIRING_FAILED``.  ``address``: this device's base URL."""

    method: str
    token: str
    pin: str | None = None
    address: str = ""


@dataclass(frozen=True)
class Paired:
    peer_id: str
    device_name: str
    domain: str
    status: str = "paired"

    def encode(self) -> dict[str, Any]:
        return {"peer_id": self.peer_id, "device_name": self.device_name, "domain": self.domain,
                "status": self.status}


@dataclass(frozen=True, kw_only=True)
class RequestPairing:
    """§3.21 → ``PairingRequested``; a malformed target or this device's own id is 400."""

    target_device_id: str


@dataclass(frozen=True)
class PairingRequested:
    request_id: str
    pin: str
    target_device_id: str
    expires_at: int

    def encode(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "pin": self.pin, "target_device_id": self.target_device_id,
                "expires_at": self.expires_at}


@dataclass(frozen=True, kw_only=True)
class ConfirmPairing:
    """§3.22 → ``PairingConfirmed`` or 404 ``REQUEST_NOT_FOUND``."""

    request_id: str
    accept: bool


@dataclass(frozen=True)
class PairingConfirmed:
    status: str

    def encode(self) -> dict[str, Any]:
        return {"status": self.status}


@dataclass(frozen=True, kw_only=True)
class ListPeers:
    """§3.13 → ``PeerList`` (this device first, ``is_self`` true; then active peers)."""


@dataclass(frozen=True)
class PeerView:
    id: str
    name: str
    is_self: bool
    status: str
    last_sync_ts: int | None
    pending_ops: int
    address: str = ""

    def encode(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "is_self": self.is_self, "status": self.status,
                "last_sync_ts": self.last_sync_ts, "pending_ops": self.pending_ops}


@dataclass(frozen=True)
class PeerList:
    peers: tuple[PeerView, ...]
    enabled: bool = True

    def encode(self) -> dict[str, Any]:
        return {"peers": [peer.encode() for peer in self.peers]}


@dataclass(frozen=True, kw_only=True)
class RevokePeer:
    """§3.16 → ``PeerRevoked`` or 404 ``PEER_NOT_FOUND``."""

    peer_id: str


@dataclass(frozen=True)
class PeerRevoked:
    peer_id: str
    domain: str
    status: str = "revoked"

    def encode(self) -> dict[str, Any]:
        return {"status": self.status, "peer_id": self.peer_id, "domain": self.domain}


@dataclass(frozen=True, kw_only=True)
class GetSyncStatus:
    """§3.14 → ``SyncStatus``."""


@dataclass(frozen=True)
class SyncStatus:
    domain: str
    peers_online: int
    peers_total: int
    pending_outgoing_ops: int
    last_anti_entropy_ts: int | None
    total_ops_synced: int
    enabled: bool
    paused: bool

    def encode(self) -> dict[str, Any]:
        return {"domain": self.domain, "peers_online": self.peers_online, "peers_total": self.peers_total,
                "pending_outgoing_ops": self.pending_outgoing_ops,
                "last_anti_entropy_ts": self.last_anti_entropy_ts, "total_ops_synced": self.total_ops_synced,
                "enabled": self.enabled, "paused": self.paused}


@dataclass(frozen=True, kw_only=True)
class UpdateSyncSettings:
    """§3.23: only the keys given change (``None`` = not given) → ``SyncSettingsReply``."""

    enabled: bool | None = None
    paused: bool | None = None


@dataclass(frozen=True)
class SyncSettingsReply:
    enabled: bool
    paused: bool

    def encode(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "paused": self.paused}


@dataclass(frozen=True, kw_only=True)
class GetSyncSettings:
    """→ ``SyncSettingsReply`` (the discovery slice reads ``enabled``)."""


@dataclass(frozen=True, kw_only=True)
class GetKnowledgeSyncState:
    """§3.15 → ``KnowledgeSyncState``; the route refuses ids that are not ``knw_*`` (400)."""

    knowledge_id: str


@dataclass(frozen=True)
class KnowledgeSyncState:
    present: bool
    tombstone: bool = False
    clock_entries: int = 0
    clock_total: int = 0
    operation_digest: str | None = None
    updated_at: int | None = None

    def encode(self) -> dict[str, Any]:
        return {"present": self.present, "tombstone": self.tombstone, "clock_entries": self.clock_entries,
                "clock_total": self.clock_total, "operation_digest": self.operation_digest,
                "updated_at": self.updated_at}


@dataclass(frozen=True, kw_only=True)
class RunSyncRound:
    """Capture local changes, push to every online peer and run anti-entropy with each, now;
    → ``SyncRoundDone``.  Not a contract route: tests, the bench and the simulator use it."""

    anti_entropy: bool = True


@dataclass(frozen=True)
class SyncRoundDone:
    captured: int
    pushed: int
    pulled: int
    peers_reached: int

    def encode(self) -> dict[str, Any]:
        return {"captured": self.captured, "pushed": self.pushed, "pulled": self.pulled,
                "peers_reached": self.peers_reached}


# -- peer requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SignedEnvelope:
    """Who sent a peer request and its proof: ``signature`` (base64) signs
    ``method \\n path \\n signed_at \\n sha256(body)`` with the sender's device key."""

    device_id: str
    signed_at: int
    signature: str
    method: str
    path: str
    body: bytes


@dataclass(frozen=True, kw_only=True)
class JoinDomain:
    """The joiner's half of pairing, sent to the token's issuer: the token's nonce, the PIN,
    and the joiner's identity.  Self-authenticating: ``envelope`` is signed with
    ``public_key`` (the issuer does not know the joiner yet).  → ``DomainJoined`` or
    ``KnowledgeRefused(PAIRING_FAILED)``."""

    envelope: SignedEnvelope
    nonce: str
    pin: str | None
    device_id: str
    device_name: str
    public_key: str
    address: str


@dataclass(frozen=True)
class DomainJoined:
    device_id: str
    device_name: str
    public_key: str
    domain: str

    def encode(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "device_name": self.device_name, "public_key": self.public_key,
                "domain": self.domain}


@dataclass(frozen=True, kw_only=True)
class PushOperations:
    """Gossip: signed operations from a peer → ``OperationsAccepted`` | ``PeerRefused`` |
    ``SyncPaused``."""

    envelope: SignedEnvelope
    operations: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class OperationsAccepted:
    applied: int
    duplicates: int
    refused: int
    version_vector: Mapping[str, int] = field(default_factory=dict)
    """The receiver's version vector after the push: the sender's next push starts there."""

    def encode(self) -> dict[str, Any]:
        return {"applied": self.applied, "duplicates": self.duplicates, "refused": self.refused,
                "version_vector": dict(self.version_vector)}


@dataclass(frozen=True, kw_only=True)
class ExchangeDigest:
    """Anti-entropy: the peer's version vector (and the operations it sends along) →
    ``DigestAnswer`` with ours and the operations it misses (at most ``push_operations_max``;
    ``more`` when there are others)."""

    envelope: SignedEnvelope
    version_vector: Mapping[str, int]
    operations: Sequence[Mapping[str, Any]] = ()
    members: Sequence[Mapping[str, Any]] = ()
    """The sender's signed domain membership records (``_domain``), sent when the digests of
    the two sides' records differed."""
    members_digest: str = ""
    """The digest of the sender's records: the answer carries ours when it differs."""
    until_seq: int | None = None
    """``as_of`` of the answer to the exchange's first page: the answer carries only operations
    that had arrived by then (an exchange repairs what was missing when it began; what arrived
    since is gossip's to deliver, and relaying it too sent a busy stream twice).  None: no
    bound (a first page, or an older peer)."""


@dataclass(frozen=True)
class DigestAnswer:
    """``documents``: the operations as their stored canonical JSON; ``body()`` splices them
    into the answer as they are (decoding and encoding up to a page of operations again was a
    good share of an anti-entropy answer's cost); ``encode()`` gives the same JSON as a dict."""

    version_vector: Mapping[str, int]
    documents: tuple[bytes, ...]
    more: bool
    applied: int = 0
    members: tuple[Mapping[str, Any], ...] = ()
    """This device's signed domain membership records (``_domain``), when the requester's
    digest of its records differed from ours."""
    members_digest: str = ""
    as_of: int = 0
    """The answerer's arrival number (``operations_arrived``) when it answered: the requester
    sends it back as ``until_seq`` on the exchange's later pages."""

    def _head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"version_vector": dict(self.version_vector), "more": self.more,
                                "applied": self.applied, "members_digest": self.members_digest,
                                "as_of": self.as_of}
        if self.members:
            head["members"] = [dict(record) for record in self.members]
        return head

    def encode(self) -> dict[str, Any]:
        return {**self._head(), "operations": [json.loads(document) for document in self.documents]}

    def body(self) -> bytes:
        head = json.dumps(self._head(), ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
        return head[:-1] + b',"operations":[' + b",".join(self.documents) + b"]}"


@dataclass(frozen=True)
class PeerRefused:
    """A peer request from an unknown or revoked device, or with a bad signature: HTTP 403."""

    reason: str

    def encode(self) -> dict[str, Any]:
        return {"error": "PEER_REFUSED", "message": self.reason}


@dataclass(frozen=True)
class SyncPaused:
    """Sync is disabled or paused: HTTP 503, the sender retries later."""

    reason: str = "sync is paused"

    def encode(self) -> dict[str, Any]:
        return {"error": "SYNC_PAUSED", "message": self.reason}


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncEvent:
    """§4.4 ``sync_event``."""

    type: str
    peer_id: str
    peer_name: str
    timestamp: int

    def __post_init__(self) -> None:
        assert self.type in sync_event_types, self.type

    def encode(self) -> dict[str, Any]:
        return {"event": "sync_event", "data": {"type": self.type, "peer_id": self.peer_id,
                                                 "peer_name": self.peer_name, "timestamp": self.timestamp}}


@dataclass(frozen=True)
class PairRequestEvent:
    """§4.6 ``pair_request`` (``from_device_id`` is the request's target, ``from_name`` empty)."""

    request_id: str
    from_device_id: str
    pin: str
    expires_at: int
    from_name: str = ""
    type: str = "INCOMING"

    def encode(self) -> dict[str, Any]:
        return {"event": "pair_request", "data": {"type": self.type, "request_id": self.request_id,
                                                   "from_device_id": self.from_device_id,
                                                   "from_name": self.from_name, "pin": self.pin,
                                                   "expires_at": self.expires_at}}


@dataclass(frozen=True)
class DeviceAnnouncement:
    """What discovery announces for this device (``announce_device``)."""

    device_id: str
    device_name: str
    port: int
    pairable: bool = True
    extra: Mapping[str, str] = field(default_factory=dict)


__all__ = [
    "ConfirmPairing",
    "CreatePairingToken",
    "DeviceAnnouncement",
    "DigestAnswer",
    "DomainJoined",
    "ExchangeDigest",
    "GetKnowledgeSyncState",
    "GetSyncSettings",
    "GetSyncStatus",
    "JoinDomain",
    "KnowledgeSyncState",
    "ListPeers",
    "OperationsAccepted",
    "PairConfirmStatus",
    "PairRequestEvent",
    "PairWithToken",
    "Paired",
    "PairingConfirmed",
    "PairingMethod",
    "PairingRequested",
    "PairingToken",
    "PeerList",
    "PeerRefused",
    "PeerRevoked",
    "PeerStatus",
    "PeerView",
    "PushOperations",
    "RequestPairing",
    "RevokePeer",
    "RunSyncRound",
    "SignedEnvelope",
    "SyncEvent",
    "SyncEventType",
    "SyncPaused",
    "SyncRoundDone",
    "SyncSettingsReply",
    "SyncStatus",
    "UpdateSyncSettings",
    "device_id_characters_max",
    "device_id_pattern",
    "device_name_characters_max",
    "knowledge_id_pattern",
    "operation_bytes_max",
    "pair_request_ttl_seconds",
    "pair_requests_pending_max",
    "pairing_methods",
    "pairing_token_characters_max",
    "pairing_token_ttl_seconds_default",
    "pairing_token_ttl_seconds_max",
    "pairing_token_ttl_seconds_min",
    "pairing_tokens_pending_max",
    "peer_body_bytes_max",
    "peers_max",
    "pin_digits",
    "pin_pattern",
    "push_body_bytes_max",
    "push_operations_max",
    "request_id_pattern",
    "signature_skew_seconds_max",
    "sync_domain_default",
    "sync_event_types",
    "sync_key",
    "sync_kind_name",
    "valid_device_id",
    "valid_knowledge_id",
    "valid_pin",
]
