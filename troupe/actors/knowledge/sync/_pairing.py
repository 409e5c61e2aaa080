"""Pairing: signed, expiring, single-use tokens (QR or PIN), confirm-style pairing requests,
and the peer table.

Why the token is self-signed and the issuer keeps its nonce: the token travels through a
person (a QR code shown on one screen, scanned on another; or typed), so it carries everything
the joiner needs to reach and recognise the issuer (device id, name, public key, address, the
domain, the expiry and a random nonce), signed with the issuer's key so a changed token is
refused.  The issuer stores only the nonce (and the PIN for the PIN method) with the expiry:
the joiner's ``JoinDomain`` must name an unused, unexpired nonce, and the PIN, and is marked
used in the same job (single use).  Both sides then hold each other's public key and address
(``sync_peers``); every later peer request is signed with those keys.

Pairing requests (§3.21) are local records: a 6-digit PIN drawn from the Env's random source,
kept 60 s, announced as ``pair_request``; ``confirm`` answers accepted / rejected / expired and
the client then pairs with ``/sync/pair`` as usual.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import apsw

from ._crdt import canonical_json
from ._identity import DeviceIdentity, decode_base64, device_id_for, encode_base64, verify_signature
from ._protocol import (
    pair_requests_pending_max,
    pairing_methods,
    pairing_token_characters_max,
    pairing_tokens_pending_max,
    valid_device_id,
    valid_pin,
)

token_version = 1
peer_status_active = "ACTIVE"
peer_status_revoked = "REVOKED"
request_state_pending = "PENDING"
request_state_accepted = "accepted"
request_state_rejected = "rejected"
request_state_expired = "expired"


class PairingError(Exception):
    """Why a token or a join was refused (the reason goes into ``PAIRING_FAILED``'s message)."""


@dataclass(frozen=True)
class TokenClaims:
    device_id: str
    device_name: str
    public_key: str
    address: str
    domain: str
    nonce: str
    method: str
    expires_at: int

    def encode(self) -> dict[str, Any]:
        return {"v": token_version, "device_id": self.device_id, "device_name": self.device_name,
                "public_key": self.public_key, "address": self.address, "domain": self.domain,
                "nonce": self.nonce, "method": self.method, "expires_at": self.expires_at}


def issue_token(identity: DeviceIdentity, claims: TokenClaims) -> str:
    signature = identity.sign(canonical_json(claims.encode()))
    return encode_base64(canonical_json({"claims": claims.encode(), "signature": signature}))


def read_token(token: str, now: float) -> TokenClaims:
    """Decode and verify a token (signature, the id matching the key, expiry); raises
    ``PairingError``."""
    if not isinstance(token, str) or not token or len(token) > pairing_token_characters_max:
        raise PairingError("the token is malformed")
    try:
        document = json.loads(decode_base64(token))
        claims_document, signature = document["claims"], document["signature"]
        claims = TokenClaims(**{key: claims_document[key] for key in (
            "device_id", "device_name", "public_key", "address", "domain", "nonce", "method", "expires_at")})
        version = claims_document["v"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PairingError("the token is malformed") from exc
    if version != token_version or claims.method not in pairing_methods or not isinstance(claims.expires_at, int):
        raise PairingError("the token is malformed")
    if not valid_device_id(claims.device_id) or device_id_for(claims.public_key) != claims.device_id:
        raise PairingError("the token's device id does not match its key")
    if not verify_signature(claims.public_key, canonical_json(claims_document), signature):
        raise PairingError("the token's signature is invalid")
    if claims.expires_at <= now:
        raise PairingError("the token has expired")
    return claims


# -- pending tokens --------------------------------------------------------------------------


def token_put(connection: apsw.Connection, *, nonce: str, method: str, pin: str | None, now: float,
              expires_at: float) -> None:
    connection.execute("DELETE FROM sync_pairing_tokens WHERE expires_at <= ? OR used_at IS NOT NULL", (now,))
    connection.execute(
        "DELETE FROM sync_pairing_tokens WHERE nonce IN (SELECT nonce FROM sync_pairing_tokens "
        "ORDER BY created_at DESC, nonce LIMIT -1 OFFSET ?)", (pairing_tokens_pending_max - 1,))
    connection.execute("INSERT INTO sync_pairing_tokens (nonce, method, pin, created_at, expires_at) "
                       "VALUES (?, ?, ?, ?, ?)", (nonce, method, pin, now, expires_at))


def token_consume(connection: apsw.Connection, *, nonce: str, pin: str | None, now: float) -> str | None:
    """Mark the token used; the reason it is refused (unknown, used, expired, wrong PIN), or
    None.  A wrong PIN burns the token too (no guessing on one token): the caller commits."""
    row = connection.execute("SELECT method, pin, expires_at, used_at FROM sync_pairing_tokens WHERE nonce = ?",
                             (nonce,)).fetchone()
    if row is None:
        return "the token is unknown"
    method, stored_pin, expires_at, used_at = row
    if used_at is not None:
        return "the token was already used"
    connection.execute("UPDATE sync_pairing_tokens SET used_at = ? WHERE nonce = ?", (now, nonce))
    if expires_at <= now:
        return "the token has expired"
    if method == "PIN" and (not valid_pin(pin) or pin != stored_pin):
        return "the PIN does not match"
    return None


# -- peers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    device_id: str
    device_name: str
    public_key: str
    address: str
    status: str
    last_sync_at: float | None
    sent_seq: int
    online: bool
    failures: int
    retry_at: float
    known: Mapping[str, int] = field(default_factory=dict)
    """The peer's version vector as it last told us (what it holds of each origin)."""

    @property
    def active(self) -> bool:
        return self.status == peer_status_active


_peer_columns = ("device_id, device_name, public_key, address, status, last_sync_at, sent_seq, online, "
                 "failures, retry_at, known_json")


def _peer(row: tuple) -> Peer:
    known = {str(origin): int(counter) for origin, counter in json.loads(row[10] or "{}").items()}
    return Peer(row[0], row[1], row[2], row[3], row[4], row[5], int(row[6]), bool(row[7]), int(row[8]),
                float(row[9]), known)


def peer_known(connection: apsw.Connection, device_id: str, vector: Mapping[str, int]) -> None:
    """Record the version vector ``device_id`` answered (what it holds of each origin)."""
    connection.execute("UPDATE sync_peers SET known_json = ? WHERE device_id = ?",
                       (json.dumps(dict(sorted(vector.items()))), device_id))


def peer_get(connection: apsw.Connection, device_id: str) -> Peer | None:
    row = connection.execute(f"SELECT {_peer_columns} FROM sync_peers WHERE device_id = ?", (device_id,)).fetchone()
    return None if row is None else _peer(row)


def peers_active(connection: apsw.Connection) -> list[Peer]:
    return [_peer(row) for row in connection.execute(
        f"SELECT {_peer_columns} FROM sync_peers WHERE status = ? ORDER BY paired_at, device_id",
        (peer_status_active,))]


def peers_revoked(connection: apsw.Connection) -> list[str]:
    return [row[0] for row in connection.execute("SELECT device_id FROM sync_peers WHERE status = ?",
                                                 (peer_status_revoked,))]


def peer_put(connection: apsw.Connection, *, device_id: str, device_name: str, public_key: str, address: str,
             now: float) -> None:
    """Pair (or pair again after a revocation: the user chose to)."""
    connection.execute(
        "INSERT INTO sync_peers (device_id, device_name, public_key, address, status, paired_at, online) "
        "VALUES (?, ?, ?, ?, ?, ?, 1) ON CONFLICT (device_id) DO UPDATE SET device_name = excluded.device_name, "
        "public_key = excluded.public_key, address = excluded.address, status = excluded.status, "
        "paired_at = excluded.paired_at, revoked_at = NULL, online = 1, failures = 0, retry_at = 0",
        (device_id, device_name, public_key, address, peer_status_active, now))


def peer_revoke(connection: apsw.Connection, device_id: str, now: float) -> bool:
    connection.execute("UPDATE sync_peers SET status = ?, revoked_at = ?, online = 0 "
                       "WHERE device_id = ? AND status = ?", (peer_status_revoked, now, device_id, peer_status_active))
    return connection.changes() > 0


def peer_reached(connection: apsw.Connection, device_id: str, *, sent_seq: int | None, now: float) -> None:
    if sent_seq is None:
        connection.execute("UPDATE sync_peers SET online = 1, failures = 0, retry_at = 0, last_sync_at = ? "
                           "WHERE device_id = ?", (now, device_id))
    else:
        connection.execute("UPDATE sync_peers SET online = 1, failures = 0, retry_at = 0, last_sync_at = ?, "
                           "sent_seq = MAX(sent_seq, ?) WHERE device_id = ?", (now, sent_seq, device_id))


def peer_missed(connection: apsw.Connection, device_id: str, *, retry_at: float) -> None:
    connection.execute("UPDATE sync_peers SET online = 0, failures = failures + 1, retry_at = ? "
                       "WHERE device_id = ?", (retry_at, device_id))


# -- confirm-style pairing requests ----------------------------------------------------------


def pair_request_put(connection: apsw.Connection, *, request_id: str, target_device_id: str, pin: str,
                     now: float, expires_at: float) -> None:
    connection.execute("DELETE FROM sync_pair_requests WHERE expires_at <= ? - 3600", (now,))
    connection.execute(
        "DELETE FROM sync_pair_requests WHERE request_id IN (SELECT request_id FROM sync_pair_requests "
        "ORDER BY created_at DESC, request_id LIMIT -1 OFFSET ?)", (pair_requests_pending_max - 1,))
    connection.execute("INSERT INTO sync_pair_requests (request_id, target_device_id, pin, state, created_at, "
                       "expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                       (request_id, target_device_id, pin, request_state_pending, now, expires_at))


def pair_request_confirm(connection: apsw.Connection, request_id: str, accept: bool, now: float) -> str | None:
    """accepted | rejected | expired, or None when the request does not exist.  A decided
    request answers its decision again."""
    row = connection.execute("SELECT state, expires_at FROM sync_pair_requests WHERE request_id = ?",
                             (request_id,)).fetchone()
    if row is None:
        return None
    state, expires_at = row
    if state != request_state_pending:
        return state
    decided = (request_state_expired if expires_at <= now
               else request_state_accepted if accept else request_state_rejected)
    connection.execute("UPDATE sync_pair_requests SET state = ? WHERE request_id = ?", (decided, request_id))
    return decided


__all__ = [
    "PairingError",
    "Peer",
    "TokenClaims",
    "issue_token",
    "pair_request_confirm",
    "pair_request_put",
    "peer_get",
    "peer_known",
    "peer_missed",
    "peer_put",
    "peer_reached",
    "peer_revoke",
    "peer_status_active",
    "peer_status_revoked",
    "peers_active",
    "peers_revoked",
    "read_token",
    "request_state_accepted",
    "request_state_expired",
    "request_state_pending",
    "request_state_rejected",
    "token_consume",
    "token_put",
    "token_version",
]
