"""Signed domain membership: pairing with one member joins the shared domain (§3.12 "设备配对，
加入共享域"), so a device accepts the operations of every member, not only of the devices it
paired with itself, and a revocation anywhere is honoured everywhere.

Why records rather than a pairing per pair of devices: a household pairs the living-room box
with the study desktop and the laptop with the living-room box; the contract calls that one
domain, and the laptop's edits must reach the study (relayed by anti-entropy) although the two
never met.  A device that pairs vouches for the other with a ``MembershipRecord`` it signs
(``admit``: the member's id, key and name); unpairing signs a ``revoke`` record.  Records
travel with every anti-entropy exchange (a few hundred bytes each, at most
``domain_records_max``), are verified against the voucher's key (bound to its id: the id is a
hash of the key) and stored once per ``(member, voucher)``, the newer replacing the older.

Trust is computed from the stored records whenever it is needed (``domain_trust``), as a
fixpoint: this device and its ACTIVE direct peers are trusted; a member whose newest record is
an ``admit`` by a trusted voucher becomes trusted too, and so on.  A member whose newest
record (by time, ``revoke`` winning ties) is a ``revoke`` by a trusted voucher is revoked:
its operations are refused from then on, also when relayed, and it is advertised as fully held
so nobody resends them (as for a direct revocation).  When a revocation arrives for one of
this device's own ACTIVE peers, that peer is revoked locally as well (``apply_records``): its
requests are refused too.  A later pairing of the same device (the user chose to) signs a
newer ``admit``, which lifts the revocation everywhere.  Records about this device itself are
kept and passed on but never make it distrust itself.

What it trades off: a member can revoke any other member (the household is one trust domain,
as the contract's single shared domain is), and trust is only as reachable as the records: in
a chain A–B–C where B is revoked, A's later records can no longer reach C through B.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from ._crdt import canonical_json
from ._identity import DeviceIdentity, device_id_for, verify_signature
from ._pairing import peer_revoke, peer_status_active
from ._protocol import device_name_characters_max, valid_device_id

record_kind_admit = "admit"
record_kind_revoke = "revoke"
record_kinds: tuple[str, ...] = (record_kind_admit, record_kind_revoke)
_kind_rank = {record_kind_admit: 0, record_kind_revoke: 1}
domain_records_max = 256
"""Membership records a device keeps and sends (one per member and voucher); beyond it new
records from peers are ignored (the household's devices are far fewer: ``peers_max`` is 32)."""
domain_record_bytes_max = 2_048
"""One record as canonical JSON (ids, keys, a name, the time and a signature)."""

domain_members_sql = """
    CREATE TABLE sync_domain_records (
        member TEXT NOT NULL,
        voucher TEXT NOT NULL,
        kind TEXT NOT NULL,
        at REAL NOT NULL,
        document TEXT NOT NULL,
        PRIMARY KEY (member, voucher)
    ) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class MembershipRecord:
    """``voucher`` says ``member`` (with ``member_key``) is admitted to, or revoked from, the
    domain at ``at``; signed by the voucher."""

    kind: str
    member: str
    member_key: str
    member_name: str
    voucher: str
    voucher_key: str
    at: float
    signature: str = ""

    def unsigned(self) -> dict[str, Any]:
        return {"kind": self.kind, "member": self.member, "member_key": self.member_key,
                "member_name": self.member_name, "voucher": self.voucher, "voucher_key": self.voucher_key,
                "at": self.at}

    def encode(self) -> dict[str, Any]:
        return {**self.unsigned(), "signature": self.signature}

    @property
    def rank(self) -> tuple[float, int, str]:
        """Newest first: later ``at``, then ``revoke`` over ``admit``, then the voucher."""
        return (self.at, _kind_rank[self.kind], self.voucher)

    @classmethod
    def decode(cls, document: Any) -> MembershipRecord | None:
        """A record whose fields, ids, keys and signature check out; None otherwise."""
        if not isinstance(document, Mapping) or len(canonical_json(document)) > domain_record_bytes_max:
            return None
        try:
            record = cls(**{name: document[name] for name in (
                "kind", "member", "member_key", "member_name", "voucher", "voucher_key", "at", "signature")})
        except (KeyError, TypeError):
            return None
        texts = (record.kind, record.member, record.member_key, record.member_name, record.voucher,
                 record.voucher_key, record.signature)
        if not all(isinstance(text, str) for text in texts) or isinstance(record.at, bool) \
                or not isinstance(record.at, (int, float)):
            return None
        if record.kind not in record_kinds or len(record.member_name) > device_name_characters_max:
            return None
        if not (valid_device_id(record.member) and valid_device_id(record.voucher)):
            return None
        try:
            if device_id_for(record.member_key) != record.member or device_id_for(record.voucher_key) != record.voucher:
                return None
        except ValueError:
            return None
        if not verify_signature(record.voucher_key, canonical_json(record.unsigned()), record.signature):
            return None
        return record


def sign_record(identity: DeviceIdentity, kind: str, member: str, member_key: str, member_name: str,
                now: float) -> MembershipRecord:
    unsigned = MembershipRecord(kind, member, member_key, member_name[:device_name_characters_max],
                                identity.device_id, identity.public_key, now)
    return MembershipRecord(**{**unsigned.__dict__, "signature": identity.sign(canonical_json(unsigned.unsigned()))})


def _stored(connection: apsw.Connection) -> list[MembershipRecord]:
    records = []
    for (document,) in connection.execute("SELECT document FROM sync_domain_records ORDER BY member, voucher"):
        encoded = json.loads(document)
        records.append(MembershipRecord(**encoded))
    return records


def domain_records(connection: apsw.Connection) -> list[dict[str, Any]]:
    """Every stored record, encoded (what an anti-entropy exchange carries)."""
    return [record.encode() for record in _stored(connection)]


def domain_records_digest(connection: apsw.Connection) -> str:
    """SHA-256 over the stored records: an exchange carries the records themselves only when
    the two sides' digests differ, so an idle anti-entropy round stays a few hundred bytes."""
    hasher = hashlib.sha256()
    for (document,) in connection.execute("SELECT document FROM sync_domain_records ORDER BY member, voucher"):
        hasher.update(document.encode())
    return hasher.hexdigest()


def store_record(connection: apsw.Connection, record: MembershipRecord) -> bool:
    """Keep ``record`` unless a newer one of the same member and voucher is held, or the table
    is full; whether it was stored."""
    row = connection.execute("SELECT document FROM sync_domain_records WHERE member = ? AND voucher = ?",
                             (record.member, record.voucher)).fetchone()
    if row is not None:
        if MembershipRecord(**json.loads(row[0])).rank >= record.rank:
            return False
    elif connection.execute("SELECT COUNT(*) FROM sync_domain_records").fetchone()[0] >= domain_records_max:
        return False
    connection.execute("INSERT OR REPLACE INTO sync_domain_records (member, voucher, kind, at, document) "
                       "VALUES (?, ?, ?, ?, ?)", (record.member, record.voucher, record.kind, record.at,
                                                  canonical_json(record.encode()).decode()))
    return True


@dataclass(frozen=True)
class DomainTrust:
    """Who this device accepts operations from (``keys``: device → public key, itself
    included) and who is revoked (refused, advertised as fully held)."""

    keys: Mapping[str, str]
    revoked: frozenset[str]


def domain_trust(connection: apsw.Connection, identity: DeviceIdentity) -> DomainTrust:
    """See the module docstring: direct peers, then the fixpoint over the records."""
    keys = {identity.device_id: identity.public_key}
    revoked: set[str] = set()
    direct_revoked_at: dict[str, float] = {}
    for device_id, public_key, status, revoked_at in connection.execute(
            "SELECT device_id, public_key, status, revoked_at FROM sync_peers"):
        if status == peer_status_active:
            keys[device_id] = public_key
        else:
            revoked.add(device_id)
            direct_revoked_at[device_id] = float(revoked_at or 0.0)
    newest: dict[str, MembershipRecord] = {}
    for record in _stored(connection):
        if record.member not in newest or record.rank > newest[record.member].rank:
            newest[record.member] = record
    changed = True
    while changed:
        changed = False
        for member, record in newest.items():
            if member == identity.device_id or record.voucher not in keys:
                continue
            if record.kind == record_kind_revoke and member not in revoked:
                revoked.add(member)
                keys.pop(member, None)
                changed = True
            elif record.kind == record_kind_admit and member not in keys and (
                    member not in direct_revoked_at or record.at > direct_revoked_at[member]):
                revoked.discard(member)
                keys[member] = record.member_key
                changed = True
    return DomainTrust(keys, frozenset(revoked))


def apply_records(connection: apsw.Connection, identity: DeviceIdentity, documents: Iterable[Any],
                  now: float) -> list[str]:
    """Verify and store a peer's records (one job); revoke locally the ACTIVE direct peers the
    domain now says are revoked; the ids revoked here."""
    stored = False
    for document in list(documents)[:domain_records_max]:
        record = MembershipRecord.decode(document)
        if record is not None:
            stored = store_record(connection, record) or stored
    if not stored:
        return []
    trust = domain_trust(connection, identity)
    revoked_here = []
    for (device_id,) in connection.execute("SELECT device_id FROM sync_peers WHERE status = ?",
                                           (peer_status_active,)).fetchall():
        if device_id in trust.revoked and peer_revoke(connection, device_id, now):
            revoked_here.append(device_id)
    return revoked_here


def domain_member_known(connection: apsw.Connection, device_id: str) -> MembershipRecord | None:
    """The newest record about ``device_id`` (a member this device can revoke without having
    paired with it)."""
    records = [record for record in _stored(connection) if record.member == device_id]
    return max(records, key=lambda record: record.rank) if records else None


def records_valid(documents: Sequence[Any]) -> bool:
    return isinstance(documents, list) and len(documents) <= domain_records_max


__all__ = [
    "DomainTrust",
    "MembershipRecord",
    "apply_records",
    "domain_member_known",
    "domain_members_sql",
    "domain_record_bytes_max",
    "domain_records",
    "domain_records_digest",
    "domain_records_max",
    "domain_trust",
    "record_kind_admit",
    "record_kind_revoke",
    "record_kinds",
    "records_valid",
    "sign_record",
    "store_record",
]
