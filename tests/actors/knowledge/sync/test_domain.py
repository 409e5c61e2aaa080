"""Membership records: signed by the voucher and bound to the ids (a changed byte, a key that
is not the id's, an unknown kind are refused), newest per member and voucher kept, trust as a
fixpoint from the direct peers, revocation winning ties, and ``domain_records_max`` held at its
boundary."""

from __future__ import annotations

import apsw

from troupe.actors.knowledge.sync import (
    MembershipRecord,
    apply_records,
    domain_records,
    domain_records_digest,
    domain_records_max,
    domain_trust,
    new_identity,
    peer_put,
    record_kind_admit,
    record_kind_revoke,
    sign_record,
    store_record,
)
from troupe.actors.knowledge.sync._domain import domain_members_sql
from troupe.actors.knowledge.sync._schema import sync_known_vectors_sql, sync_tables_sql


def _connection() -> apsw.Connection:
    connection = apsw.Connection(":memory:")
    connection.execute("CREATE TABLE knowledge_items (id TEXT, scope TEXT, updated_at REAL);"
                       "CREATE TABLE knowledge_forgotten (id TEXT, kind TEXT, scope TEXT, forgotten_at REAL);")
    connection.execute(sync_tables_sql)
    connection.execute(sync_known_vectors_sql)
    connection.execute(domain_members_sql)
    return connection


def _device(number: int, name: str = "d"):
    return new_identity(bytes([number]) * 32, f"{name}{number}")


def test_a_record_is_bound_to_its_signature_and_ids():
    voucher, member = _device(1), _device(2)
    record = sign_record(voucher, record_kind_admit, member.device_id, member.public_key, "客厅", 10.0)
    assert MembershipRecord.decode(record.encode()) == record
    assert MembershipRecord.decode({**record.encode(), "member_name": "书房"}) is None
    assert MembershipRecord.decode({**record.encode(), "member_key": _device(3).public_key}) is None
    assert MembershipRecord.decode({**record.encode(), "kind": "promote"}) is None
    assert MembershipRecord.decode({**record.encode(), "at": True}) is None
    assert MembershipRecord.decode("not a record") is None


def test_trust_reaches_members_vouched_by_peers_and_a_revocation_wins():
    connection = _connection()
    me, peer, far, farther = _device(1), _device(2), _device(3), _device(4)
    peer_put(connection, device_id=peer.device_id, device_name="p", public_key=peer.public_key,
             address="http://127.0.0.1:1", now=1.0)
    chain = [sign_record(peer, record_kind_admit, far.device_id, far.public_key, "far", 2.0),
             sign_record(far, record_kind_admit, farther.device_id, farther.public_key, "farther", 3.0)]
    assert apply_records(connection, me, [record.encode() for record in reversed(chain)], 4.0) == []
    trust = domain_trust(connection, me)
    assert set(trust.keys) == {me.device_id, peer.device_id, far.device_id, farther.device_id}
    # a revocation at the same time as an admission wins; an older record changes nothing
    revoke = sign_record(peer, record_kind_revoke, far.device_id, far.public_key, "far", 2.0)
    assert store_record(connection, revoke)
    assert not store_record(connection, sign_record(peer, record_kind_admit, far.device_id, far.public_key, "far", 1.0))
    trust = domain_trust(connection, me)
    assert far.device_id in trust.revoked and far.device_id not in trust.keys
    # a record from nobody we trust is kept but trusts no one
    stranger, other = _device(5), _device(6)
    store_record(connection, sign_record(stranger, record_kind_admit, other.device_id, other.public_key, "x", 9.0))
    assert other.device_id not in domain_trust(connection, me).keys


def test_a_revocation_of_a_direct_peer_revokes_it_here():
    connection = _connection()
    me, peer, other = _device(1), _device(2), _device(3)
    for device in (peer, other):
        peer_put(connection, device_id=device.device_id, device_name="p", public_key=device.public_key,
                 address="http://127.0.0.1:1", now=1.0)
    revoke = sign_record(other, record_kind_revoke, peer.device_id, peer.public_key, "p", 5.0)
    assert apply_records(connection, me, [revoke.encode()], 6.0) == [peer.device_id]
    assert connection.execute("SELECT status FROM sync_peers WHERE device_id = ?",
                              (peer.device_id,)).fetchone()[0] == "REVOKED"
    # a record about this device itself never makes it distrust itself
    store_record(connection, sign_record(other, record_kind_revoke, me.device_id, me.public_key, "me", 7.0))
    assert me.device_id in domain_trust(connection, me).keys


def test_records_are_held_up_to_their_limit():
    connection = _connection()
    voucher = _device(1)
    for number in range(domain_records_max):
        member = new_identity(number.to_bytes(2, "big") * 16, "m")
        assert store_record(connection, sign_record(voucher, record_kind_admit, member.device_id, member.public_key,
                                                    "m", 1.0))
    before = domain_records_digest(connection)
    extra = new_identity(b"\xff" * 32, "m")
    assert not store_record(connection, sign_record(voucher, record_kind_admit, extra.device_id, extra.public_key,
                                                    "m", 1.0))
    assert len(domain_records(connection)) == domain_records_max and domain_records_digest(connection) == before
