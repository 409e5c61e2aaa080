"""The sync actor ``("knowledge_sync", "main")``: this device's identity, its peers, pairing,
the operation log and the replication loop.

Why one actor: pairing tokens are single-use, a peer's push cursor and health have one
writer, and the runtime switches (``enabled``/``paused``) must be applied at once to the loop
they govern; all of that is state owned by exactly one actor.  Heavy work does not run in its
turns: the engine's jobs run in the writer thread and the loop (``replicate``, a task beside
the turns) does the network calls, so a slow peer never blocks ``/sync/status``.

The loop, every ``gossip_interval_seconds`` while sync is enabled and a peer is paired (a
round that pushed something is followed by the next at once, ``gossip_rounds_without_pause_max``
times at most; a resume through ``/sync/settings`` ends the pause at once), with every peer at
once (one peer's round trips wait on its writer, not on the other peers'):

1. capture: drain the outbox into signed local operations (``_oplog.capture``), paused or not;
2. unless paused (checked again right before every request: a pause answered during a round
   stops it before its next send), gossip: push each peer this device's operations it misses
   by the version vector it last answered (pages of ``push_operations_max`` / ``push_body_bytes_max``, every
   page until none is left; nothing missing, no request); a peer that fails
   is marked offline (``sync_event`` PEER_OFFLINE) and retried after an exponential backoff
   (``retry_seconds_min`` doubling up to ``retry_seconds_max``); a peer that answers again is
   ONLINE (PEER_ONLINE) and its cursor moves on;
3. unless paused, anti-entropy every ``anti_entropy_interval_seconds`` (and right after a
   pairing): vectors first, then each side sends what the other misses
   (``operations_missing_documents``); idle, that is one small request per peer;
   ``ANTI_ENTROPY_DONE`` is announced.

Peers' requests are taken by a second actor of the kind, ``("knowledge_sync", "inbound")``
(``inbound_key``): a round of the main actor awaits peers, and a peer's round awaits us, so
the answers must not queue behind the main actor's turn.

A durable reminder (``anti_entropy``) re-activates the actor after a restart, so replication
resumes without a user request.  Operations from a peer are checked one by one: the sending
device must be an ACTIVE peer (a revoked one is refused from then on), every operation's
origin must be trusted (this device, a peer, or a member of the domain by signed records:
``_domain``) and not revoked, a relayed operation's signature must verify with its origin's
key, its scope must be ``shared:*`` and its size within ``operation_bytes_max``.  Accepted
operations are stored once, folded into the CRDT (``store_operations``) and each item's final
winner materialised (``_replication.materialise``) in ONE job per batch; the recall index is
refreshed after the commit by a task beside the turns (in a bulk catch-up, once received
batches pause: ``reindex_quiet_seconds``, at most ``reindex_delay_seconds_max``; removals at
once) and ``conflict_detected`` is announced for first materialisations that met another item
of the same subject.  After each anti-entropy round one bounded
compaction batch runs (``_oplog.compact``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from troupe.actors.knowledge._events_hub import publish_event
from troupe.actors.knowledge._protocol import KnowledgeRefused
from troupe.runtime import Actor, ActorContext, ActorError, ActorKind, TaskEnded

from ._crdt import Operation, digest_and_document, digest_characters
from ._domain import (
    apply_records,
    domain_member_known,
    domain_records,
    domain_records_digest,
    domain_trust,
    record_kind_admit,
    record_kind_revoke,
    sign_record,
    store_record,
)
from ._identity import (
    DeviceIdentity,
    default_device_name,
    device_id_for,
    ensure_identity,
    verify_signature,
)
from ._oplog import (
    capture,
    capture_items,
    compact,
    item_sync_state,
    kind_covered_key,
    operations_arrived,
    operations_missing_documents,
    operations_pending,
    outbox_size,
    setting_add,
    setting_enabled,
    setting_get,
    setting_last_anti_entropy,
    setting_paused,
    setting_put,
    setting_total_ops_synced,
    shared_scope_prefix,
    store_covered,
    store_operations,
    version_vector,
)
from ._pairing import (
    PairingError,
    Peer,
    TokenClaims,
    issue_token,
    pair_request_confirm,
    pair_request_put,
    peer_get,
    peer_known,
    peer_missed,
    peer_put,
    peer_reached,
    peer_revoke,
    peers_active,
    peers_revoked,
    read_token,
    token_consume,
    token_put,
)
from ._protocol import (
    ConfirmPairing,
    CreatePairingToken,
    DeviceAnnouncement,
    DigestAnswer,
    DomainJoined,
    ExchangeDigest,
    GetKnowledgeSyncState,
    GetSyncSettings,
    GetSyncStatus,
    JoinDomain,
    ListPeers,
    OperationsAccepted,
    PairConfirmStatus,
    Paired,
    PairingConfirmed,
    PairingRequested,
    PairingToken,
    PairRequestEvent,
    PairWithToken,
    PeerList,
    PeerRefused,
    PeerRevoked,
    PeerView,
    PushOperations,
    RequestPairing,
    RevokePeer,
    RunSyncRound,
    SignedEnvelope,
    SyncEvent,
    SyncPaused,
    SyncRoundDone,
    SyncSettingsReply,
    SyncStatus,
    UpdateSyncSettings,
    operation_bytes_max,
    pair_request_ttl_seconds,
    pairing_methods,
    pairing_token_ttl_seconds_max,
    pairing_token_ttl_seconds_min,
    peers_max,
    push_body_bytes_max,
    push_operations_max,
    signature_skew_seconds_max,
    sync_domain_default,
    sync_key,
    sync_kind_name,
    valid_device_id,
    valid_knowledge_id,
    valid_pin,
)
from ._replication import (
    Materialised,
    PeerUnreachable,
    materialise_many,
    operations_body,
    post_to_peer,
    signing_text,
)

logger = logging.getLogger(__name__)

replicate_task_name = "replicate"
inbound_key = "inbound"
"""The key of the sync kind's second actor, which takes peers' requests (``PushOperations``,
``ExchangeDigest``): the ``main`` actor may be inside a forced round (``RunSyncRound``) that
waits on a peer, and that peer's round waits on us; had both requests queued behind the busy
turns, two devices syncing each other at once would wait for the 10 s peer timeout."""
reindex_task_name = "reindex"
reindex_batch_items_max = 512
"""Items one recall-index refresh takes (the rest follow in the next batch)."""
reindex_quiet_seconds = 0.5
"""In a bulk catch-up (``reindex_bulk_items_min`` upserts waiting or more), re-indexing waits
for received batches to pause this long: embedding holds the GIL and the writer, so the store
(the source of truth) converges first and recall catches up right after.  Fewer are indexed
at once."""
reindex_bulk_items_min = 256
"""Upserts waiting for the index from which a catch-up counts as bulk (see above)."""
reindex_delay_seconds_max = 5.0
"""An upsert waits at most this long for its index entry, however long the stream of batches
lasts (removals of forgotten items never wait)."""
assert 0 < reindex_quiet_seconds <= reindex_delay_seconds_max
anti_entropy_reminder_name = "anti_entropy"
peer_join_path = "/sync/peer/join"
peer_ops_path = "/sync/peer/ops"
peer_digest_path = "/sync/peer/digest"
anti_entropy_pages_max = 64
"""Pages (of ``push_operations_max``) one anti-entropy exchange moves each way, at most."""
gossip_batches_per_round_max = 64
gossip_rounds_without_pause_max = 8
"""Rounds that pushed something may follow each other without the gossip interval between
them, this many at most; then the loop waits the interval (busy devices still yield)."""
sync_mailbox_messages_max = 1_024
nonce_bytes = 16
assert anti_entropy_pages_max >= 1 and gossip_batches_per_round_max >= 1


@dataclass(frozen=True)
class SyncSettings:
    """Configuration of the sync actor (the runtime switches live in storage)."""

    enabled_default: bool = True
    """``enabled`` until ``/sync/settings`` stores a value (``PIXIU_SYNC_NETWORK_ENABLED``)."""
    gossip_interval_seconds: float = 0.5
    anti_entropy_interval_seconds: float = 30.0
    retry_seconds_min: float = 1.0
    retry_seconds_max: float = 60.0
    device_name: str | None = None
    domain: str = sync_domain_default
    index: Any = None
    """Refreshes the recall index after a materialisation (``refresh(context, ids)``); None:
    the engine's ``KnowledgeIndex``."""

    def __post_init__(self) -> None:
        assert 0 < self.gossip_interval_seconds <= self.anti_entropy_interval_seconds
        assert 0 < self.retry_seconds_min <= self.retry_seconds_max


def sync_settings_from_environment(environ: Mapping[str, str], **overrides: Any) -> SyncSettings:
    """``PIXIU_SYNC_NETWORK_ENABLED`` (default true: ``0``/``false``/``no``/``off`` turn it off)
    and ``TROUPE_DEVICE_NAME``."""
    flag = environ.get("PIXIU_SYNC_NETWORK_ENABLED", "true").strip().lower()
    options: dict[str, Any] = {"enabled_default": flag not in ("0", "false", "no", "off")}
    if environ.get("TROUPE_DEVICE_NAME"):
        options["device_name"] = environ["TROUPE_DEVICE_NAME"][:128]
    options.update(overrides)
    return SyncSettings(**options)


revoked_counter_advertised = 2**62
"""A revoked origin is advertised as held up to this: no peer sends its operations again."""


def advertised_vector(connection: Any, revoked: Iterable[str] | None = None) -> dict[str, int]:
    """Our version vector as peers see it (revoked origins marked as held, see above);
    ``revoked``: the domain's revoked devices (``domain_trust``), else the direct ones."""
    vector = version_vector(connection)
    for device_id in peers_revoked(connection) if revoked is None else revoked:
        vector[device_id] = revoked_counter_advertised
    return vector


class RecallIndexSync:
    """The default index port: the engine's ``KnowledgeIndex``, re-indexing what changed."""

    async def refresh(self, context: ActorContext, knowledge_ids: Sequence[str], *, reindex: bool = True) -> None:
        """``reindex=False`` for items materialised for the first time: nothing indexed to
        replace (an item already indexed at its version is then not embedded twice)."""
        from troupe.actors.knowledge._query import knowledge_indexes

        index = await knowledge_indexes.open(context.storage, getattr(context.env, "embedder", None))
        await index.refresh(knowledge_ids, reindex=reindex)


def _vector(value: Any) -> dict[str, int]:
    """A version vector from a peer's JSON (anything else in it is dropped)."""
    if not isinstance(value, dict):
        return {}
    return {str(origin): counter for origin, counter in value.items()
            if isinstance(counter, int) and not isinstance(counter, bool)}


def _held_by_vector(document: Any, held: Mapping[str, int]) -> bool:
    """Whether a peer's operation document is below what we hold of its origin (a duplicate:
    ``store_operations`` would find it held)."""
    if not isinstance(document, dict):
        return False
    origin, counter = document.get("origin"), document.get("counter")
    return (isinstance(origin, str) and isinstance(counter, int) and not isinstance(counter, bool)
            and counter <= held.get(origin, 0))


def _placeholder_valid(document: Mapping[str, Any], keys: Mapping[str, str], own: str) -> bool:
    """A compacted operation's placeholder from a peer: a trusted origin other than us, a
    counter, a ``knw_*`` id and a digest (no payload, no signature: the request's signature
    authenticates the peer that compacted it)."""
    origin, counter = document.get("origin"), document.get("counter")
    digest, knowledge_id = document.get("digest"), document.get("knowledge_id")
    return (isinstance(origin, str) and origin in keys and origin != own and isinstance(counter, int)
            and not isinstance(counter, bool) and counter >= 1 and isinstance(knowledge_id, str)
            and valid_knowledge_id(knowledge_id) and isinstance(digest, str) and len(digest) == digest_characters)


@dataclass
class _Exchange:
    """One peer's part of a round (the peers are reached concurrently)."""

    peer: Peer
    pushed: int = 0
    pulled: int = 0
    reached: bool = False
    stopped: bool = False


class _SendingStopped(Exception):
    """``/sync/settings`` paused or disabled sync while a round was in progress: the round sends
    nothing more (the contract applies settings at once; a round that carried on would push
    operations made after the pause was answered)."""


def _switches_open(connection: Any, enabled_default: bool) -> bool:
    """Whether the persisted switches let operations move (enabled and not paused), read in the
    caller's transaction: a job that stores received operations, or a read that picks what to
    send, then sees the switch and the data of one instant."""
    return bool(setting_get(connection, setting_enabled, enabled_default)) and not bool(
        setting_get(connection, setting_paused, False))


def _refused(message: str) -> KnowledgeRefused:
    return KnowledgeRefused("PAIRING_FAILED", message)


def _invalid(message: str) -> KnowledgeRefused:
    return KnowledgeRefused("INVALID_REQUEST", message)


class SyncActor(Actor):
    """See the module docstring."""

    def __init__(self, context: ActorContext, settings: SyncSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.index = settings.index or RecallIndexSync()
        self.identity: DeviceIdentity | None = None
        self.enabled = settings.enabled_default
        self.paused = False
        self.anti_entropy_due = True
        self.last_anti_entropy = -math.inf
        self.reindex_pending: dict[str, bool] = {}
        """Materialised upserts waiting for the recall index → whether the item existed before
        (its entry must be re-made even at the same version: a concurrent winner)."""
        self.reindex_removed: set[str] = set()
        self.reindex_queued_at = math.inf
        self.last_received_at = -math.inf
        self.reindex_wakeup = trio.Event()
        self.loop_wakeup = trio.Event()
        """Set by a resume: the loop's pause between rounds ends at once, so devices that meet
        again start exchanging when the user switches sync back on, not an interval later."""
        self.round_lock = trio.Lock()
        self.inbound = context.key == inbound_key

    # -- activation ------------------------------------------------------------------------

    async def on_activate(self) -> None:
        env = self.context.env
        seed = env.random.token_bytes(32)
        name = self.settings.device_name or default_device_name(env.extras)
        now = env.clock.wall()
        default = self.settings.enabled_default

        def load(connection: Any) -> tuple[DeviceIdentity, bool, bool]:
            identity = ensure_identity(connection, seed, name, now)
            return (identity, bool(setting_get(connection, setting_enabled, default)),
                    bool(setting_get(connection, setting_paused, False)))

        self.identity, self.enabled, self.paused = await self.context.storage.write(load)
        if not self.inbound:
            await self._ensure_loop()

    async def on_reminder(self, name: str, payload: Any) -> None:
        if name == anti_entropy_reminder_name and not self.inbound:
            self.anti_entropy_due = True
            await self._ensure_loop()

    async def _peers(self) -> list[Peer]:
        return await self.context.storage.read(peers_active)

    async def _ensure_loop(self) -> None:
        running = self.context.task_running(replicate_task_name)
        wanted = self.enabled and bool(await self._peers())
        if wanted and not running:
            self.context.start_task(replicate_task_name, self._replicate)
        elif not wanted and running:
            self.context.cancel_task(replicate_task_name)
        if wanted:
            due = self.context.env.clock.wall() + self.settings.anti_entropy_interval_seconds
            await self.context.set_reminder(anti_entropy_reminder_name, due)
        else:
            await self.context.cancel_reminder(anti_entropy_reminder_name)

    # -- dispatch --------------------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        handlers = {
            CreatePairingToken: self._create_token, PairWithToken: self._pair, RequestPairing: self._request_pairing,
            ConfirmPairing: self._confirm_pairing, ListPeers: self._list_peers, RevokePeer: self._revoke,
            GetSyncStatus: self._status, UpdateSyncSettings: self._update_settings,
            GetSyncSettings: self._settings_reply, GetKnowledgeSyncState: self._item_state,
            RunSyncRound: self._run_round, JoinDomain: self._join, PushOperations: self._push_received,
            ExchangeDigest: self._digest_received, AnnounceDevice: self._announce,
            ApplyOperations: self._apply_pulled,
        }
        if isinstance(message, TaskEnded):
            if message.error is not None:
                logger.error("the sync task %s failed: %s", message.name, message.error)
            if message.name == reindex_task_name:
                self._reindex(())
            return None
        handler = handlers.get(type(message))
        if handler is None:
            raise TypeError(f"the sync actor does not handle {type(message).__name__}")
        return await handler(message)

    # -- pairing ---------------------------------------------------------------------------

    async def _create_token(self, request: CreatePairingToken) -> PairingToken | KnowledgeRefused:
        if request.method not in pairing_methods:
            return _invalid("field 'method' must be one of: QR, PIN")
        if request.method == "PIN" and not valid_pin(request.pin):
            return _invalid("field 'pin' must be exactly 6 digits when method is PIN")
        if not pairing_token_ttl_seconds_min <= request.ttl_seconds <= pairing_token_ttl_seconds_max:
            return _invalid(f"field 'ttl_seconds' must be from {pairing_token_ttl_seconds_min} "
                            f"to {pairing_token_ttl_seconds_max}")
        if not self.enabled:
            return _refused("sync is disabled on this device")
        env, identity = self.context.env, self._identity()
        now = env.clock.wall()
        nonce = env.random.token_bytes(nonce_bytes).hex()
        expires_at = int(now) + request.ttl_seconds
        pin = request.pin if request.method == "PIN" else None
        claims = TokenClaims(identity.device_id, identity.device_name, identity.public_key, request.address,
                             self.settings.domain, nonce, request.method, expires_at)
        await self.context.storage.write(lambda connection: token_put(
            connection, nonce=nonce, method=request.method, pin=pin, now=now, expires_at=expires_at))
        return PairingToken(issue_token(identity, claims), request.method, request.ttl_seconds)

    async def _pair(self, request: PairWithToken) -> Paired | KnowledgeRefused:
        if request.method not in pairing_methods:
            return _invalid("field 'method' must be one of: QR, PIN")
        if request.method == "PIN" and not valid_pin(request.pin):
            return _invalid("field 'pin' must be exactly 6 digits when method is PIN")
        if not self.enabled:
            return _refused("sync is disabled on this device")
        env, identity = self.context.env, self._identity()
        try:
            claims = read_token(request.token, env.clock.wall())
        except PairingError as error:
            return _refused(str(error))
        if claims.method != request.method:
            return _refused("the token was made for another pairing method")
        if claims.device_id == identity.device_id:
            return _refused("a device cannot pair with itself")
        if len(await self._peers()) >= peers_max:
            return _refused(f"this device already has {peers_max} peers")
        document = {"nonce": claims.nonce, "pin": request.pin, "device_id": identity.device_id,
                    "device_name": identity.device_name, "public_key": identity.public_key,
                    "address": request.address}
        try:
            answer = await post_to_peer(env.http, identity, claims.address, peer_join_path, document, env.clock.wall())
        except PeerUnreachable as error:
            reason = "the other device refused the pairing" if error.status in (403, 422) else \
                "the other device could not be reached"
            return _refused(reason)
        if not isinstance(answer, dict) or answer.get("public_key") != claims.public_key:
            return _refused("the other device answered with another key")
        now = env.clock.wall()
        admitted = sign_record(identity, record_kind_admit, claims.device_id, claims.public_key, claims.device_name,
                               now)

        def store(connection: Any) -> None:
            peer_put(connection, device_id=claims.device_id, device_name=claims.device_name,
                     public_key=claims.public_key, address=claims.address, now=now)
            store_record(connection, admitted)

        await self.context.storage.write(store)
        self._announce_event("PEER_ONLINE", claims.device_id, claims.device_name)
        self.anti_entropy_due = True
        await self._ensure_loop()
        return Paired(claims.device_id, claims.device_name, claims.domain)

    async def _join(self, request: JoinDomain) -> DomainJoined | KnowledgeRefused | PeerRefused:
        envelope, identity, env = request.envelope, self._identity(), self.context.env
        now = env.clock.wall()
        if not valid_device_id(request.device_id) or device_id_for(request.public_key) != request.device_id \
                or envelope.device_id != request.device_id:
            return _refused("the joining device's id does not match its key")
        if not self._envelope_valid(envelope, request.public_key, now):
            return PeerRefused("the request's signature is invalid")
        if not self.enabled:
            return _refused("sync is disabled on this device")
        if request.device_id == identity.device_id:
            return _refused("a device cannot pair with itself")
        if not request.address.startswith(("http://", "https://")):
            return _refused("the joining device gave no address")

        def join(connection: Any) -> str | None:
            problem = token_consume(connection, nonce=request.nonce, pin=request.pin, now=now)
            if problem is None:
                if len(peers_active(connection)) >= peers_max:
                    return f"this device already has {peers_max} peers"
                peer_put(connection, device_id=request.device_id, device_name=request.device_name[:128],
                         public_key=request.public_key, address=request.address, now=now)
                store_record(connection, sign_record(identity, record_kind_admit, request.device_id,
                                                     request.public_key, request.device_name, now))
            return problem

        problem = await self.context.storage.write(join)
        if problem is not None:
            return _refused(problem)
        self._announce_event("PEER_ONLINE", request.device_id, request.device_name)
        self.anti_entropy_due = True
        await self._ensure_loop()
        return DomainJoined(identity.device_id, identity.device_name, identity.public_key, self.settings.domain)

    async def _request_pairing(self, request: RequestPairing) -> PairingRequested | KnowledgeRefused:
        if not valid_device_id(request.target_device_id):
            return _invalid("field 'target_device_id' must be a device id (dev_...)")
        if request.target_device_id == self._identity().device_id:
            return _invalid("a device cannot pair with itself")
        env = self.context.env
        now = env.clock.wall()
        pin = f"{env.random.randrange(0, 1_000_000):06d}"
        request_id = env.ids.new_id("req_")
        expires_at = int(now) + pair_request_ttl_seconds
        await self.context.storage.write(lambda connection: pair_request_put(
            connection, request_id=request_id, target_device_id=request.target_device_id, pin=pin, now=now,
            expires_at=expires_at))
        publish_event(self.context.system, PairRequestEvent(request_id, request.target_device_id, pin, expires_at))
        return PairingRequested(request_id, pin, request.target_device_id, expires_at)

    async def _confirm_pairing(self, request: ConfirmPairing) -> PairingConfirmed | KnowledgeRefused:
        now = self.context.env.clock.wall()
        status: PairConfirmStatus | None = await self.context.storage.write(
            lambda connection: pair_request_confirm(connection, request.request_id, request.accept, now))
        if status is None:
            return KnowledgeRefused("REQUEST_NOT_FOUND", "no pairing request has this id")
        return PairingConfirmed(status)

    async def _revoke(self, request: RevokePeer) -> PeerRevoked | KnowledgeRefused:
        """Revoke a paired device, or a member of the domain this device never paired with
        itself; either way a signed ``revoke`` record tells the rest of the domain."""
        now, identity = self.context.env.clock.wall(), self._identity()

        def revoke(connection: Any) -> tuple[str, str] | None:
            peer = peer_get(connection, request.peer_id)
            if peer is not None and peer_revoke(connection, request.peer_id, now):
                found = (peer.device_name, peer.public_key)
            else:
                member = domain_member_known(connection, request.peer_id)
                trust = domain_trust(connection, identity)
                if member is None or peer is not None or request.peer_id not in trust.keys \
                        or request.peer_id == identity.device_id:
                    return None
                found = (member.member_name, member.member_key)
            store_record(connection, sign_record(identity, record_kind_revoke, request.peer_id, found[1], found[0],
                                                 now))
            return found

        found = await self.context.storage.write(revoke)
        if found is None:
            return KnowledgeRefused("PEER_NOT_FOUND", "no paired device has this id")
        self._announce_event("PEER_OFFLINE", request.peer_id, found[0])
        self.anti_entropy_due = True
        await self._ensure_loop()
        return PeerRevoked(request.peer_id, self.settings.domain)

    # -- status, settings, state -----------------------------------------------------------

    async def _list_peers(self, _: ListPeers) -> PeerList:
        identity = self._identity()

        def read(connection: Any) -> list[PeerView]:
            views = [PeerView(identity.device_id, identity.device_name, True, "ONLINE" if self.enabled else "OFFLINE",
                              None, 0)]
            ours = version_vector(connection)
            for peer in peers_active(connection):
                pending = operations_pending(ours, peer.known, identity.device_id)
                views.append(PeerView(peer.device_id, peer.device_name, False,
                                      "ONLINE" if peer.online and self.enabled else "OFFLINE",
                                      None if peer.last_sync_at is None else int(peer.last_sync_at), pending,
                                      peer.address))
            return views

        return PeerList(tuple(await self.context.storage.read(read)), self.enabled)

    async def _status(self, _: GetSyncStatus) -> SyncStatus:
        identity = self._identity()

        def read(connection: Any) -> SyncStatus:
            peers = peers_active(connection)
            ours = version_vector(connection)
            pending = outbox_size(connection) + sum(
                operations_pending(ours, peer.known, identity.device_id) for peer in peers)
            last = setting_get(connection, setting_last_anti_entropy)
            online = sum(1 for peer in peers if peer.online) if self.enabled else 0
            return SyncStatus(self.settings.domain, online + (1 if self.enabled else 0), len(peers) + 1, pending,
                              None if last is None else int(last),
                              int(setting_get(connection, setting_total_ops_synced, 0)), self.enabled, self.paused)

        return await self.context.storage.read(read)

    def _settings_reply_now(self) -> SyncSettingsReply:
        return SyncSettingsReply(self.enabled, self.paused)

    async def _settings_reply(self, _: GetSyncSettings) -> SyncSettingsReply:
        return self._settings_reply_now()

    async def _update_settings(self, request: UpdateSyncSettings) -> SyncSettingsReply:
        enabled = self.enabled if request.enabled is None else request.enabled
        paused = self.paused if request.paused is None else request.paused

        def store(connection: Any) -> None:
            if request.enabled is not None:
                setting_put(connection, setting_enabled, enabled)
            if request.paused is not None:
                setting_put(connection, setting_paused, paused)

        await self.context.storage.write(store)
        resumed = (self.paused and not paused) or (not self.enabled and enabled)
        self.enabled, self.paused = enabled, paused
        if resumed:
            self.anti_entropy_due = True
        await self._ensure_loop()
        if resumed:
            self.loop_wakeup.set()  # a loop already running goes at once (a new one does anyway)
        return self._settings_reply_now()

    async def _item_state(self, request: GetKnowledgeSyncState) -> Any:
        if not valid_knowledge_id(request.knowledge_id):
            return _invalid("the knowledge id must be a knw_* id")
        await self._capture()
        return await self.context.storage.read(lambda connection: item_sync_state(connection, request.knowledge_id))

    async def _announce(self, request: AnnounceDevice) -> DeviceAnnouncement:
        identity = self._identity()
        return DeviceAnnouncement(identity.device_id, identity.device_name, request.port, pairable=self.enabled)

    # -- receiving from peers --------------------------------------------------------------

    def _envelope_valid(self, envelope: SignedEnvelope, public_key: str, now: float) -> bool:
        if abs(envelope.signed_at - now) > signature_skew_seconds_max:
            return False
        text = signing_text(envelope.method, envelope.path, envelope.signed_at, envelope.body)
        return verify_signature(public_key, text, envelope.signature)

    async def _sender(self, envelope: SignedEnvelope) -> Peer | PeerRefused:
        default = self.settings.enabled_default

        def read(connection: Any) -> tuple[Peer | None, bool, bool]:
            # The switches are the main actor's; it stores them before it answers, so the
            # inbound actor reads them here and a change applies to the next request at once.
            return (peer_get(connection, envelope.device_id), bool(setting_get(connection, setting_enabled, default)),
                    bool(setting_get(connection, setting_paused, False)))

        peer, self.enabled, self.paused = await self.context.storage.read(read)
        if peer is None or not peer.active:
            return PeerRefused("this device is not paired with the sender")
        if not self._envelope_valid(envelope, peer.public_key, self.context.env.clock.wall()):
            return PeerRefused("the request's signature is invalid")
        return peer

    async def _push_received(self, request: PushOperations) -> Any:
        sender = await self._sender(request.envelope)
        if isinstance(sender, PeerRefused):
            return sender
        if not self.enabled or self.paused:
            return SyncPaused()
        result = await self._apply(request.operations, sender.device_id)
        if result is None:  # paused while this request was on its way in
            return SyncPaused()
        applied, duplicates, refused = result
        now, identity = self.context.env.clock.wall(), self._identity()

        def reached(connection: Any) -> dict[str, int]:
            peer_reached(connection, sender.device_id, sent_seq=None, now=now)
            return advertised_vector(connection, domain_trust(connection, identity).revoked)

        return OperationsAccepted(applied, duplicates, refused, await self.context.storage.write(reached))

    async def _digest_received(self, request: ExchangeDigest) -> Any:
        sender = await self._sender(request.envelope)
        if isinstance(sender, PeerRefused):
            return sender
        if not self.enabled or self.paused:
            return SyncPaused()
        await self._take_records(request.members)
        applied = 0
        if request.operations:
            result = await self._apply(request.operations, sender.device_id)
            if result is None:  # paused while this request was on its way in
                return SyncPaused()
            applied = result[0]
        await self._capture()
        theirs = {str(origin): int(counter) for origin, counter in dict(request.version_vector).items()
                  if isinstance(counter, int) and not isinstance(counter, bool)}
        identity = self._identity()

        default = self.settings.enabled_default

        def read(connection: Any) -> tuple[dict[str, int], list[bytes], bool, list[dict[str, Any]], str, int] | None:
            # The switch and the operations of one snapshot: an edit made after a pause was
            # answered is never in the answer of a request that was already being handled.
            if not _switches_open(connection, default):
                return None
            revoked = domain_trust(connection, identity).revoked
            missing, more = operations_missing_documents(
                connection, theirs, operations_max=push_operations_max, bytes_max=push_body_bytes_max,
                refused_origins=[sender.device_id, *revoked], seq_max=request.until_seq)
            digest = domain_records_digest(connection)
            members = domain_records(connection) if request.members_digest and digest != request.members_digest else []
            return advertised_vector(connection, revoked), missing, more, members, digest, operations_arrived(connection)

        found = await self.context.storage.read(read)
        if found is None:
            return SyncPaused()
        ours, missing, more, members, digest, arrived = found
        await self._record_known(sender, theirs)
        return DigestAnswer(ours, tuple(missing), more, applied, tuple(members), digest, arrived)

    async def _apply_by_inbound(self, documents: tuple[Any, ...], sender: str) -> int:
        try:
            return await self.context.system.ref(sync_kind_name, inbound_key).ask(
                ApplyOperations(documents=documents, sender=sender), timeout=sync_ask_seconds)
        except ActorError as error:  # its mailbox full, a timeout, a crashed turn: apply it here
            logger.info("the inbound sync actor did not apply a pulled batch: %s", type(error).__name__)
            result = await self._apply(documents, sender)
            return 0 if result is None else result[0]

    async def _apply_pulled(self, request: ApplyOperations) -> int:
        """Operations an anti-entropy answer carried; none when sync was paused meanwhile
        (anti-entropy after the resume exchanges them again)."""
        result = await self._apply(request.documents, request.sender)
        return 0 if result is None else result[0]

    async def _take_records(self, documents: Sequence[Any]) -> None:
        """Store a peer's membership records; announce the peers the domain revoked here."""
        if not documents:
            return
        identity, now = self._identity(), self.context.env.clock.wall()
        revoked = await self.context.storage.write(
            lambda connection: apply_records(connection, identity, documents, now))
        for device_id in revoked:
            self._announce_event("PEER_OFFLINE", device_id, "")
        if revoked and not self.inbound:
            await self._ensure_loop()

    async def _record_known(self, peer: Peer, theirs: Mapping[str, int]) -> None:
        """What a peer told us it holds (its vector in an anti-entropy request), merged into
        what we knew: our next push to it starts there, so operations it received by another
        way (relayed, or pulled) are not sent to it again."""
        merged = dict(peer.known)
        for origin, counter in theirs.items():
            merged[origin] = max(merged.get(origin, 0), counter)
        if merged != dict(peer.known):
            await self.context.storage.write(lambda connection: peer_known(connection, peer.device_id, merged))




    def _trust_and_vector(self, connection: Any) -> tuple[Mapping[str, str], dict[str, int]]:
        """The keys of the origins we accept operations from (this device, its peers and the
        domain's members, ``_domain``), and what we hold of each."""
        return domain_trust(connection, self._identity()).keys, version_vector(connection)

    def _checked(self, document: Any, keys: Mapping[str, str], sender: str) -> tuple[Operation, str, bytes] | None:
        """An operation we accept with its digest and stored document, or None (malformed,
        unknown or revoked origin, bad signature, not shared, too large).  An operation its
        origin sends itself is authenticated by the request's signature (the origin signed the
        whole body, this operation included): only relayed operations need their own signature
        checked, which spares the receiver an Ed25519 verification per operation on the
        common path."""
        try:
            operation = Operation.decode(document)
        except ValueError:
            return None
        key = keys.get(operation.origin)
        if key is None or not operation.scope.startswith(shared_scope_prefix):
            return None
        if not valid_knowledge_id(operation.knowledge_id):
            return None
        digest, stored = digest_and_document(operation)
        if len(stored) > operation_bytes_max:
            return None
        if operation.origin != sender and not verify_signature(key, digest.encode(), operation.signature):
            return None
        return operation, digest, stored

    async def _apply(self, documents: Sequence[Any], sender: str) -> tuple[int, int, int] | None:
        """Store, merge and materialise a batch of peer operations in one job (``sender``: the
        device whose signed request carried them).  Operations the version vector says are
        held already are dropped before anything is decoded or verified: anti-entropy and
        gossip running side by side deliver many twice, and the second copy costs a dict
        lookup instead of a digest and a signature check.  None: sync was paused or disabled
        by the time the job ran (the switch is read in the job's transaction), nothing stored."""
        documents = list(documents)
        keys, held = await self.context.storage.read(self._trust_and_vector)
        identity = self._identity()
        own = identity.device_id
        operations, refused, duplicates = [], max(0, len(documents) - push_operations_max), 0
        placeholders: list[Mapping[str, Any]] = []
        for document in documents[:push_operations_max]:
            if _held_by_vector(document, held):
                duplicates += 1
                continue
            if isinstance(document, dict) and document.get(kind_covered_key) is True:
                if _placeholder_valid(document, keys, own):
                    placeholders.append(document)
                else:
                    refused += 1
                continue
            checked = self._checked(document, keys, sender)
            if checked is None:
                refused += 1
            elif checked[0].origin != own:
                operations.append(checked)
            else:
                duplicates += 1
        if not operations and not placeholders:
            return 0, duplicates, refused
        now, default = self.context.env.clock.wall(), self.settings.enabled_default

        def job(connection: Any) -> tuple[int, list[Materialised], list[Any]] | None:
            if not _switches_open(connection, default):
                return None  # paused or disabled since the request came in: nothing is accepted
            changed: list[Materialised] = []
            events: list[Any] = []
            placed = store_covered(connection, placeholders) if placeholders else 0
            if not operations:
                return placed, changed, events
            capture_items(connection, identity, now, [operation.knowledge_id for operation, _, _ in operations])
            batch = store_operations(connection, operations, now)
            for shown in materialise_many(connection, [(state.winner, state.winner_digest) for state in batch.changed],
                                          now):
                changed.append(shown)
                events.extend(shown.conflicts)
            setting_add(connection, setting_total_ops_synced, batch.applied)
            return batch.applied + placed, changed, events

        self.last_received_at = self.context.env.clock.monotonic()
        stored = await self.context.storage.write(job)
        if stored is None:
            return None
        applied, changed, events = stored
        self.last_received_at = self.context.env.clock.monotonic()
        self._reindex(changed)
        for event in events:
            publish_event(self.context.system, event)
        return applied, duplicates + len(operations) + len(placeholders) - applied, refused

    # -- the recall index ------------------------------------------------------------------

    def _reindex(self, shown: Sequence[Materialised]) -> None:
        """Queue materialised items for the recall index; a task beside the turns drains the
        queue in batches, so replication does not wait on embedding (the store, the source of
        truth, is already committed; reconciliation at start-up repairs a lost queue).
        Removals go at once; in a bulk catch-up, upserts wait for a pause in received batches
        (``reindex_quiet_seconds``), at most ``reindex_delay_seconds_max``."""
        for item in shown:
            if item.removed:
                self.reindex_removed.add(item.knowledge_id)
                self.reindex_pending.pop(item.knowledge_id, None)
                self.reindex_wakeup.set()
            else:
                self.reindex_removed.discard(item.knowledge_id)
                self.reindex_pending[item.knowledge_id] = (self.reindex_pending.get(item.knowledge_id, False)
                                                           or not item.created)
        if self.reindex_pending and self.reindex_queued_at == math.inf:
            self.reindex_queued_at = self.context.env.clock.monotonic()
        if (self.reindex_pending or self.reindex_removed) and not self.context.task_running(reindex_task_name):
            self.context.start_task(reindex_task_name, self._drain_reindex)

    def _reindex_wait_seconds(self) -> float:
        if len(self.reindex_pending) < reindex_bulk_items_min:
            return 0.0
        now = self.context.env.clock.monotonic()
        return max(0.0, min(self.last_received_at + reindex_quiet_seconds - now,
                            self.reindex_queued_at + reindex_delay_seconds_max - now))

    async def _drain_reindex(self) -> int:
        done = 0
        while self.reindex_pending or self.reindex_removed:
            if self.reindex_removed:
                removed = sorted(self.reindex_removed)[:reindex_batch_items_max]
                self.reindex_removed.difference_update(removed)
                done += await self._refresh_index(removed, reindex=False)
                continue
            wait = self._reindex_wait_seconds()
            if wait > 0:
                self.reindex_wakeup = trio.Event()
                with trio.move_on_after(wait):
                    await self.reindex_wakeup.wait()  # a removal does not wait for the pause
                continue
            batch = sorted(self.reindex_pending)[:reindex_batch_items_max]
            existed = [knowledge_id for knowledge_id in batch if self.reindex_pending.pop(knowledge_id)]
            created = sorted(set(batch).difference(existed))
            if not self.reindex_pending:
                self.reindex_queued_at = math.inf  # else the rest are past their wait already
            done += await self._refresh_index(created, reindex=False) if created else 0
            done += await self._refresh_index(existed, reindex=True) if existed else 0
        return done

    async def _refresh_index(self, knowledge_ids: list[str], *, reindex: bool) -> int:
        try:
            await self.index.refresh(self.context, knowledge_ids, reindex=reindex)
        except Exception as error:  # the store stands; reconciliation at start-up repairs the index
            logger.warning("refreshing the index after sync failed: %s", type(error).__name__)
        return len(knowledge_ids)

    async def index_settled(self) -> bool:
        return not self.reindex_pending and not self.reindex_removed \
            and not self.context.task_running(reindex_task_name)

    # -- the loop --------------------------------------------------------------------------

    async def _capture(self) -> int:
        identity, env = self._identity(), self.context.env
        total = 0
        while True:
            now = env.clock.wall()
            made = await self.context.storage.write(lambda connection, now=now: capture(connection, identity, now))
            total += len(made)
            if not made and await self.context.storage.read(outbox_size) == 0:
                return total
            if not made:
                return total  # outbox rows that made no operation were drained; the rest next round

    async def _replicate(self) -> None:
        rounds_without_pause = 0
        while True:
            done = await self._round(self.anti_entropy_due)
            # A round that pushed something goes again at once (what was captured while it
            # waited on peers need not wait another interval), a bounded number of times.
            if done.pushed and rounds_without_pause < gossip_rounds_without_pause_max:
                rounds_without_pause += 1
                await trio.sleep(0)
                continue
            rounds_without_pause = 0
            with trio.move_on_after(self.settings.gossip_interval_seconds):
                await self.loop_wakeup.wait()
            if self.loop_wakeup.is_set():  # a resume during the round or the pause: this round answers it
                self.loop_wakeup = trio.Event()

    async def _run_round(self, request: RunSyncRound) -> SyncRoundDone:
        return await self._round(request.anti_entropy, forced=True)

    async def _round(self, anti_entropy: bool, *, forced: bool = False) -> SyncRoundDone:
        """One round at a time (the loop's and a forced one share cursors)."""
        async with self.round_lock:
            return await self._round_locked(anti_entropy, forced=forced)

    async def _round_locked(self, anti_entropy: bool, *, forced: bool) -> SyncRoundDone:
        captured = await self._capture()
        if not self.enabled or self.paused:
            return SyncRoundDone(captured, 0, 0, 0)
        env = self.context.env
        now = env.clock.wall()
        due = anti_entropy or now - self.last_anti_entropy >= self.settings.anti_entropy_interval_seconds
        exchanges = [_Exchange(peer) for peer in await self._peers() if forced or peer.retry_at <= now]
        # Every peer at once: each one's requests wait on its own writer, so while one applies
        # a page the next page (for another peer) is already on its way; one at a time, a
        # device's pushes were a queue of round trips with the other writers idle.
        async with trio.open_nursery() as nursery:
            for exchange in exchanges:
                nursery.start_soon(self._exchange, exchange, due)
        pushed, pulled = sum(item.pushed for item in exchanges), sum(item.pulled for item in exchanges)
        reached = sum(1 for item in exchanges if item.reached)
        if any(item.stopped for item in exchanges):
            # Paused or disabled midway: no later send; anti-entropy stays due for the resume.
            return SyncRoundDone(captured, pushed, pulled, reached)
        if due:
            self.anti_entropy_due = False
            self.last_anti_entropy = now

            def settle(connection: Any) -> int:
                setting_put(connection, setting_last_anti_entropy, now)
                # One bounded compaction batch per anti-entropy round: the peers' vectors were
                # just refreshed, so what every peer holds is known at its freshest.
                return compact(connection, [peer.known for peer in peers_active(connection)])

            await self.context.storage.write(settle)
            identity = self._identity()
            self._announce_event("ANTI_ENTROPY_DONE", identity.device_id, identity.device_name)
        return SyncRoundDone(captured, pushed, pulled, reached)

    async def _exchange(self, exchange: _Exchange, anti_entropy: bool) -> None:
        """Gossip (and anti-entropy when due) with one peer; what happened is left in
        ``exchange`` (a failure of one peer never cancels the others' exchanges)."""
        peer = exchange.peer
        try:
            exchange.pushed = await self._gossip(peer)
            if anti_entropy:
                exchange.pulled = await self._anti_entropy(peer)
        except _SendingStopped:
            exchange.stopped = True
            return
        except PeerUnreachable as error:
            logger.info("the sync peer %s was not reached: %s", peer.device_id, error)
            await self._missed(peer)
            return
        exchange.reached = True
        if not peer.online:
            self._announce_event("PEER_ONLINE", peer.device_id, peer.device_name)

    def _check_sending(self) -> None:
        """Called right before every request that carries operations or vectors, with no await
        between it and the request: ``_update_settings`` sets the switches before it answers,
        so once a pause is answered no later request of a round in progress leaves."""
        if not self.enabled or self.paused:
            raise _SendingStopped()

    async def _missed(self, peer: Peer) -> None:
        delay = min(self.settings.retry_seconds_max, self.settings.retry_seconds_min * 2 ** min(peer.failures, 16))
        retry_at = self.context.env.clock.wall() + delay
        await self.context.storage.write(lambda connection: peer_missed(connection, peer.device_id, retry_at=retry_at))
        if peer.online:
            self._announce_event("PEER_OFFLINE", peer.device_id, peer.device_name)

    async def _gossip(self, peer: Peer) -> int:
        """Push this device's operations that ``peer`` misses by the vector it last told us,
        in pages of ``push_operations_max`` / ``push_body_bytes_max``; nothing to send is no
        request at all."""
        identity, env = self._identity(), self.context.env
        known, pushed = dict(peer.known), 0
        for _ in range(gossip_batches_per_round_max):
            documents, _ = await self.context.storage.read(lambda connection, known=known: (
                operations_missing_documents(connection, known, operations_max=push_operations_max,
                                             bytes_max=push_body_bytes_max, origins=[identity.device_id])))
            if not documents:
                break
            self._check_sending()
            answer = await post_to_peer(env.http, identity, peer.address, peer_ops_path, None, env.clock.wall(),
                                        body=operations_body(documents))
            theirs = _vector(answer.get("version_vector") if isinstance(answer, dict) else None)
            sent = known.get(identity.device_id, 0) + len(documents)
            known = theirs or {**known, identity.device_id: sent}
            pushed += len(documents)
            await self._reached(peer, known, len(documents))
            if known.get(identity.device_id, 0) < sent:
                break  # it did not take them all (paused midway, or it lost them): next round
        if pushed:
            self._announce_event("SYNC_COMPLETE", peer.device_id, peer.device_name)
        return pushed

    async def _reached(self, peer: Peer, known: Mapping[str, int], acknowledged: int) -> None:
        now = self.context.env.clock.wall()

        def store(connection: Any) -> None:
            peer_reached(connection, peer.device_id, sent_seq=None, now=now)
            peer_known(connection, peer.device_id, known)
            if acknowledged:
                setting_add(connection, setting_total_ops_synced, acknowledged)

        await self.context.storage.write(store)

    async def _anti_entropy(self, peer: Peer) -> int:
        """Exchange version vectors with ``peer``: the first request carries ours alone, the
        answer its vector and what we miss; each later request carries the operations it
        misses by that vector.  With nothing to repair that is one request of two vectors per
        peer (a few hundred bytes), never a resend of what it holds."""
        identity, env = self._identity(), self.context.env
        known, pulled, more, records_wanted = dict(peer.known), 0, True, False
        # Both directions are bounded by what had arrived on each side at the first page: an
        # exchange repairs what was missing when it began.  What arrives later is gossip's to
        # deliver (its origin pushes it); chasing it here relayed a busy stream a second time.
        ours_first: int | None = None
        theirs_first: int | None = None
        for page in range(anti_entropy_pages_max):

            def read(connection: Any, known: dict[str, int] = known, records_wanted: bool = records_wanted,
                     seq_max: int | None = ours_first
                     ) -> tuple[dict[str, int], list[bytes], str, list[dict[str, Any]], int]:
                revoked = domain_trust(connection, identity).revoked
                documents, _ = operations_missing_documents(
                    connection, known, operations_max=push_operations_max, bytes_max=push_body_bytes_max,
                    refused_origins=[peer.device_id, *revoked], seq_max=seq_max)
                return (advertised_vector(connection, revoked), documents, domain_records_digest(connection),
                        domain_records(connection) if records_wanted else [], operations_arrived(connection))

            ours, outgoing, digest, members, arrived = await self.context.storage.read(read)
            if page == 0:
                outgoing = []  # what it last told us may be stale: vectors first, then exactly what it misses
                ours_first = arrived
            elif not more and not outgoing and not records_wanted:
                break
            # Records travel only when the two sides' digests differ: first ours goes out, the
            # answer carries its records if they differ, and ours follow on the next page.
            fields: dict[str, Any] = {"version_vector": ours, "members_digest": digest}
            if theirs_first is not None:
                fields["until_seq"] = theirs_first
            if records_wanted:
                fields["members"], records_wanted = members, False
            self._check_sending()
            answer = await post_to_peer(env.http, identity, peer.address, peer_digest_path, None, env.clock.wall(),
                                        body=operations_body(outgoing, **fields))
            if not isinstance(answer, dict):
                raise PeerUnreachable(None, "the answer was not a digest")
            if page == 0:
                if isinstance(answer.get("members"), list):
                    await self._take_records(answer["members"])
                records_wanted = bool(answer.get("members_digest")) and answer.get("members_digest") != digest
            documents = answer.get("operations") or []
            if documents:
                # Applied by the inbound actor, one batch after another with the peers' pushes:
                # each batch then sees what the one before stored, and the operations gossip
                # delivered meanwhile are dropped by the vector check, not verified twice.
                pulled += await self._apply_by_inbound(tuple(documents), peer.device_id)
            known = _vector(answer.get("version_vector"))
            as_of = answer.get("as_of")
            if page == 0 and isinstance(as_of, int) and not isinstance(as_of, bool) and as_of >= 0:
                theirs_first = as_of  # an older peer sends none: its answers stay unbounded
            more = bool(answer.get("more"))
            await self._reached(peer, known, len(outgoing))
        return pulled

    # -- helpers ---------------------------------------------------------------------------

    def _identity(self) -> DeviceIdentity:
        assert self.identity is not None, "the identity is loaded on activation"
        return self.identity

    def _announce_event(self, kind: str, peer_id: str, peer_name: str) -> None:
        publish_event(self.context.system, SyncEvent(kind, peer_id, peer_name, int(self.context.env.clock.wall())))


@dataclass(frozen=True, kw_only=True)
class ApplyOperations:
    """The main actor → the inbound one: apply operations an anti-entropy answer of
    ``sender`` carried (→ how many were new)."""

    documents: tuple[Any, ...]
    sender: str


@dataclass(frozen=True, kw_only=True)
class AnnounceDevice:
    """→ ``DeviceAnnouncement`` of this device for a listener on ``port`` (discovery)."""

    port: int


def sync_actor_kind(settings: SyncSettings | None = None) -> ActorKind:
    chosen = settings or SyncSettings()
    return ActorKind(sync_kind_name, lambda context: SyncActor(context, chosen),
                     mailbox_messages_max=sync_mailbox_messages_max)


sync_ask_seconds = 30.0


async def sync_peers(system: Any, *, timeout: float = sync_ask_seconds) -> PeerList:
    """The peer list (``PeerList.peers[0]`` is this device; ``PeerList.enabled`` is the
    runtime's switch): discovery marks ``paired`` from it and answers ``{"devices": []}`` when
    ``enabled`` is false."""
    return await system.ref(sync_kind_name, sync_key).ask(ListPeers(), timeout=timeout)


async def announce_device(system: Any, port: int, *, timeout: float = sync_ask_seconds) -> DeviceAnnouncement:
    """What discovery announces for this device: its id, name and ``port``; ``pairable`` is
    the runtime's ``enabled``."""
    return await system.ref(sync_kind_name, sync_key).ask(AnnounceDevice(port=port), timeout=timeout)


__all__ = [
    "AnnounceDevice",
    "ApplyOperations",
    "RecallIndexSync",
    "SyncActor",
    "SyncSettings",
    "advertised_vector",
    "announce_device",
    "anti_entropy_pages_max",
    "anti_entropy_reminder_name",
    "gossip_batches_per_round_max",
    "gossip_rounds_without_pause_max",
    "inbound_key",
    "peer_digest_path",
    "peer_join_path",
    "peer_ops_path",
    "reindex_batch_items_max",
    "reindex_bulk_items_min",
    "reindex_delay_seconds_max",
    "reindex_quiet_seconds",
    "reindex_task_name",
    "replicate_task_name",
    "revoked_counter_advertised",
    "sync_actor_kind",
    "sync_ask_seconds",
    "sync_mailbox_messages_max",
    "sync_peers",
    "sync_settings_from_environment",
]
