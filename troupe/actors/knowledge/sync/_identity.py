"""This device's identity: an Ed25519 key pair kept in storage, and the signatures made with it.

Why Ed25519 (``cryptography``): small keys and signatures that fit in a QR code, fast to verify
(a peer verifies every pushed operation), deterministic signatures, and a well-kept library
that wraps OpenSSL.  The private seed comes from the Env's random source, so the simulator's
devices get seeded, replayable identities; production's Env draws it from the OS.

``device_id`` is ``dev_`` + the first 20 hex characters of SHA-256 over the public key: a peer
that knows the key can check the id, and two devices never pick the same id by accident.  The
key pair is made once, on the first activation of the sync actor, and kept in
``sync_identity`` (one row); it never changes afterwards (revoking a peer does not rotate it).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import apsw
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

private_seed_bytes = 32
public_key_bytes = 32
signature_bytes = 64
device_id_hex_characters = 20


def encode_base64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def decode_base64(text: str) -> bytes:
    """URL-safe base64 with or without padding; raises ``ValueError`` when malformed."""
    if not isinstance(text, str) or len(text) > 65_536:
        raise ValueError("not base64 text")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64 text") from exc


def device_id_for(public_key: str) -> str:
    return "dev_" + hashlib.sha256(decode_base64(public_key)).hexdigest()[:device_id_hex_characters]


@dataclass(frozen=True)
class DeviceIdentity:
    device_id: str
    device_name: str
    public_key: str
    private_seed: bytes

    def sign(self, data: bytes) -> str:
        return encode_base64(_private_key(self.private_seed).sign(data))


@functools.lru_cache(maxsize=8)
def _private_key(seed: bytes) -> Ed25519PrivateKey:
    """Parsing the seed costs as much as a signature: a device signs with one key."""
    return Ed25519PrivateKey.from_private_bytes(seed)


def verify_signature(public_key: str, data: bytes, signature: str) -> bool:
    """Whether ``signature`` (base64) is ``public_key``'s signature of ``data``."""
    try:
        key_bytes, signature_raw = decode_base64(public_key), decode_base64(signature)
        if len(key_bytes) != public_key_bytes or len(signature_raw) != signature_bytes:
            return False
        Ed25519PublicKey.from_public_bytes(key_bytes).verify(signature_raw, data)
    except (ValueError, InvalidSignature):
        return False
    return True


def new_identity(seed: bytes, device_name: str) -> DeviceIdentity:
    assert len(seed) == private_seed_bytes
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    public_key = encode_base64(public)
    return DeviceIdentity(device_id_for(public_key), device_name, public_key, seed)


def load_identity(connection: apsw.Connection) -> DeviceIdentity | None:
    row = connection.execute(
        "SELECT device_id, device_name, public_key, private_seed FROM sync_identity WHERE id = 1").fetchone()
    return None if row is None else DeviceIdentity(row[0], row[1], row[2], bytes(row[3]))


def ensure_identity(connection: apsw.Connection, seed: bytes, device_name: str, now: float) -> DeviceIdentity:
    """The stored identity, or a new one made from ``seed`` and stored (one job)."""
    stored = load_identity(connection)
    if stored is not None:
        return stored
    identity = new_identity(seed, device_name)
    connection.execute(
        "INSERT INTO sync_identity (id, device_id, device_name, public_key, private_seed, created_at) "
        "VALUES (1, ?, ?, ?, ?, ?)",
        (identity.device_id, identity.device_name, identity.public_key, identity.private_seed, now))
    return identity


def default_device_name(extras: Any) -> str:
    """``TROUPE_DEVICE_NAME`` when the server was given one (``env.extras["device_name"]``)."""
    name = extras.get("device_name") if isinstance(extras, dict) else None
    return name if isinstance(name, str) and name else "troupe"


__all__ = [
    "DeviceIdentity",
    "decode_base64",
    "default_device_name",
    "device_id_for",
    "device_id_hex_characters",
    "encode_base64",
    "ensure_identity",
    "load_identity",
    "new_identity",
    "private_seed_bytes",
    "public_key_bytes",
    "signature_bytes",
    "verify_signature",
]
