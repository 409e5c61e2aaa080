"""The ``knowledge-sync`` workload: three desktops of one household pair and replicate their
``shared:*`` knowledge through the real PIXIU apps, under faults of single devices and of the
network between them.

Why a workload of several devices (``devices_count``, run by ``_devices``): the sync
contract's promises hold between devices: after healing every replica shows the same
knowledge, a forget on one desk is never undone by an edit made offline on another, a revoked
device's later edits never land, and the winner of concurrent edits does not depend on which
one arrived first.  So each device runs the real knowledge app (ASGI driver, runtime fault
points armed, its own disk with crashes and power losses), the devices reach each other only
through ``env.http`` over the simulated mesh (partitions, delays, lost requests and replies,
late duplicates), and every user action is an HTTP request to one device's app.

What the users do (each client step, on the client's own device):

- pair: the user of another desk makes a token (``/sync/token``, QR or a PIN) on that device,
  and this device pairs with it (``/sync/pair``); repeated until every pair of devices is paired
  both ways (a lost answer may leave a pair half-paired: the pairing is simply done again);
- write CONVERSATION turns to ``shared:home`` / ``shared:team`` (a unique tag ``ts<n>z`` in each
  text, an idempotency key per request, unknown outcomes retried with the same key);
- update a shared item this device shows (``/memory/update`` at the version it shows);
- forget a shared item by its tag (plan, then confirm with the token);
- read ``/sync/status``, ``/sync/peers`` and ``/sync/state/knowledge/{id}`` (shapes checked);
- once per run (in most seeds), the household unpairs the last device: every other device
  revokes it (``/sync/peers/{id}/revoke``), and that device's users go on writing.

Invariants:

- **convergence**: at the quiet end (network healed, 120 simulated seconds of gossip and
  anti-entropy, then a forced round on every device) every pair of devices that is paired
  both ways and not revoked holds the same operation digest (``/sync/state/knowledge/{id}``,
  read over HTTP) and the same stored row (scope, status, version, title, body) for every
  shared item, except items touched by a revoked device (those legitimately differ: what the
  revoked device sent before its revocation reached some devices and not others);
- **winner**: on every device and item, the stored winner is the ``merge_all`` of the
  operations it holds, folded in their stored order and in reverse (the winner is a function
  of the set, never of arrival order), and the materialised row shows that winner (absent for a
  tombstone, at the winner's lamport as version otherwise);
- **tombstones**: an item a checkpoint saw tombstoned on a device stays tombstoned there and
  never comes back into ``knowledge_items``, and at the quiet end a tombstone on one converged
  device is a tombstone on all;
- **revocation**: a text written to the revoked device after every other device acknowledged
  its revocation never appears in another device's evidence, items or operation log;
- every error answer is a JSON object with an ``error`` code, and the app never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import trio

from troupe.actors.knowledge.sync import (
    Operation,
    RunSyncRound,
    SyncSettings,
    kind_tombstone,
    merge_all,
    sync_key,
    sync_kind_name,
)
from troupe.storage import StorageError

from ._asgi import AsgiDriver, AsgiResponse
from ._violation import Violation
from ._workload import World, register_workload
from ._workload_http import send_traced

checker_name = "knowledge-sync"
surface_name = "knowledge"
shared_scopes = ("shared:home", "shared:team")
devices_total = 3
request_seconds_max = 30.0
"""Above a pairing's ask (one peer request of at most 10 s): a slow answer is an unknown outcome."""
attempts_max = 3
client_pause_seconds_max = 0.3
revocation_probability = 0.7
"""Share of seeds in which the household unpairs the last device."""
revocation_after_share = 0.4
"""The unpairing happens once this share of the step budget is spent (roughly)."""
final_rounds = 3
"""Forced sync rounds on every device at the quiet end, after the settling time."""
pairing_settle_seconds = 60.0
"""After a pairing attempt, how long it may still be finishing on the devices (the route's ask
and the join's peer request are bounded well below this)."""
tag_pattern = re.compile(r"ts(\d+)z")
phrases = ("客厅的灯坏了", "周六去超市买牛奶", "The spare key is under the blue pot", "猫粮放在柜子里",
           "孩子周三有钢琴课", "Boiler service due in March")
sync_settings = SyncSettings(gossip_interval_seconds=2.0, anti_entropy_interval_seconds=10.0,
                             retry_seconds_min=0.5, retry_seconds_max=8.0)
"""Shorter than production's so a 300-step run sees many rounds, backoffs and anti-entropy."""


@dataclass
class SentWrite:
    device: int
    key: str
    scope: str
    tag: int
    body: dict[str, Any]
    after_revocation: bool = False
    outcome: str = "unknown"


def _read_device(connection: Any) -> dict[str, Any]:
    """What the checkers compare, from one read transaction of one device."""
    identity = connection.execute("SELECT device_id FROM sync_identity WHERE id = 1").fetchone()
    peers = {row[0]: row[1] for row in connection.execute("SELECT device_id, status FROM sync_peers")}
    items = {row[0]: tuple(row[1:]) for row in connection.execute(
        "SELECT id, scope, status, version, title, body_json FROM knowledge_items WHERE scope LIKE 'shared:%'")}
    states = {row[0]: (row[1], int(row[2])) for row in connection.execute(
        "SELECT knowledge_id, winner_op_id, tombstone FROM sync_items")}
    operations: dict[str, list[str]] = {}
    for knowledge_id, document in connection.execute("SELECT knowledge_id, document FROM sync_ops ORDER BY seq"):
        operations.setdefault(knowledge_id, []).append(document)
    forgotten = {row[0] for row in connection.execute("SELECT id FROM knowledge_forgotten")}
    outbox = {row[0] for row in connection.execute("SELECT knowledge_id FROM sync_outbox")}
    texts = [row[0] for row in connection.execute(
        "SELECT raw_json FROM knowledge_evidence WHERE scope LIKE 'shared:%'")]
    return {"device_id": identity[0] if identity else None, "peers": peers, "items": items, "states": states,
            "operations": operations, "forgotten": forgotten, "texts": texts, "outbox": outbox}


def _row_meaning(row: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """A stored row with its body parsed: the origin keeps the body's key order as written and
    a replica stores the operation's canonical (sorted) JSON, so the bytes of ``body_json``
    differ while the knowledge is the same (reported to the sync slice; see docs/simulator.md)."""
    if row is None:
        return None
    try:
        return (*row[:4], json.loads(row[4]))
    except ValueError:
        return row


class KnowledgeSyncWorkload:
    name = "knowledge-sync"
    devices_count = devices_total

    def __init__(self) -> None:
        self.counter = 0
        self.writes: dict[str, SentWrite] = {}
        self.device_ids: dict[int, str] = {}
        self.paired: set[tuple[int, int]] = set()
        """(device, peer) pairs whose ``/sync/pair`` or join was acknowledged."""
        self.revoked_device: int | None = None
        self.revocations_acknowledged: set[int] = set()
        self.revocation_planned: bool | None = None
        self.revocation_busy = False
        self.revocation_started = False
        """Set when the household decides to unpair: no new pairing involving that device."""
        self.pairings_in_flight = 0
        self.pairing_settled_at = 0.0
        self.steps = 0
        self.tombstones_seen: dict[int, set[str]] = {}
        self.responses = 0
        self.items_compared = 0
        self._pending: list[Violation] = []
        self._reported: set[str] = set()

    # ------------------------------------------------------------------ plug-in
    def device_surfaces(self) -> list[Any]:
        from troupe.http.knowledge import new_knowledge_surface

        return [new_knowledge_surface({}, os_release_text="", sync_settings=sync_settings)]

    def actor_kinds(self, world: World) -> list[Any]:
        return []

    def migrations(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = (), *, once: bool = False,
                 kind: str = "answer") -> None:
        """``kind`` names the broken rule first (``divergence``, ``winner``, ``tombstone``,
        ``revocation``, ``answer``), so a sweep counts each rule's violations apart."""
        if once:
            if text in self._reported:
                return
            self._reported.add(text)
        self._pending.append(Violation(f"knowledge-sync {kind}: {text}", tuple(sorted(set(sequences))),
                                       ((sync_kind_name, sync_key),), checker=checker_name))

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    @staticmethod
    def _cluster(world: World) -> Any:
        return world.notes["cluster"]

    async def _send(self, world: World, driver: AsgiDriver, method: str, path: str,
                    document: Any = None) -> tuple[AsgiResponse | None, Any, tuple[int, int]]:
        body = b"" if document is None else json.dumps(document, ensure_ascii=False).encode()
        headers = [("content-type", "application/json")] if body else []
        exchange = await send_traced(world, driver, surface_name, method, path, violate=self._violate,
                                     headers=headers, body=body, seconds_max=request_seconds_max)
        response, parsed = exchange.response, exchange.document
        invoked, completed = exchange.invoke_seq, exchange.complete_seq
        if response is None:
            return None, None, (invoked, completed)
        self.responses += 1
        if response.status >= 400 and not (isinstance(parsed, dict) and isinstance(parsed.get("error"), str)):
            self._violate(f"{method} {path} answered {response.status} without an error code: {response.body[:200]!r}",
                          (invoked, completed))
        return response, parsed, (invoked, completed)

    # ------------------------------------------------------------------ client steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        device = world.notes["device"]
        driver = world.apps.get(surface_name)
        if driver is None or world.engine is None or not self._cluster(world).is_up(device):
            return
        self.steps += 1
        if self.revocation_planned is None:
            self.revocation_planned = world.random.random() < revocation_probability
        missing = self._unpaired()
        roll = world.random.random()
        if missing and roll < 0.5:
            await self.pair(world, device, missing)
        elif self._revocation_due(world) and roll < 0.6:
            await self.revoke(world)
        elif roll < 0.45:
            await self.write(world, device, driver)
        elif roll < 0.65:
            await self.update(world, device, driver)
        elif roll < 0.75:
            await self.forget(world, device, driver)
        else:
            await self.read(world, device, driver)

    def _unpaired(self) -> list[tuple[int, int]]:
        wanted = [(left, right) for left in range(devices_total) for right in range(devices_total) if left < right]
        unpairing = devices_total - 1 if self.revocation_started else None
        return [pair for pair in wanted
                if not ((pair in self.paired and pair[::-1] in self.paired) or unpairing in pair)]

    def _revocation_due(self, world: World) -> bool:
        if not self.revocation_planned or self.revocations_acknowledged >= set(range(devices_total - 1)):
            return False
        if self.pairings_in_flight or trio.current_time() < self.pairing_settled_at:
            return False
        config_steps = world.notes.get("steps_total", 300)
        return self.steps >= revocation_after_share * config_steps and not self.revocation_busy

    async def _device_id(self, world: World, device: int) -> str | None:
        known = self.device_ids.get(device)
        if known is not None:
            return known
        other = self._cluster(world).world(device)
        if other.engine is None or not self._cluster(world).is_up(device):
            return None
        try:
            row = await other.engine.read(
                lambda connection: connection.execute("SELECT device_id FROM sync_identity WHERE id = 1").fetchone())
        except StorageError:
            return None
        if row is not None:
            self.device_ids[device] = row[0]
        return self.device_ids.get(device)

    # -- pairing ---------------------------------------------------------------------------
    async def pair(self, world: World, device: int, missing: list[tuple[int, int]]) -> None:
        """The users of two desks pair them: a token made on the issuer, used on ``device``."""
        candidates = [pair for pair in missing if device in pair]
        if not candidates:
            return
        left, right = candidates[world.random.randrange(0, len(candidates))]
        issuer = right if left == device else left
        self.pairings_in_flight += 1
        try:
            await self._pair(world, device, issuer)
        finally:
            self.pairings_in_flight -= 1
            # A pairing whose answer was lost may still finish on the devices a while later:
            # the household unpairs a device only once no pairing can still be under way.
            if devices_total - 1 in (device, issuer):
                self.pairing_settled_at = trio.current_time() + pairing_settle_seconds

    async def _pair(self, world: World, device: int, issuer: int) -> None:
        cluster = self._cluster(world)
        issuer_driver = cluster.world(issuer).apps.get(surface_name)
        own_driver = world.apps.get(surface_name)
        if issuer_driver is None or own_driver is None or not cluster.is_up(issuer):
            return
        method = "PIN" if world.random.random() < 0.5 else "QR"
        pin = f"{world.random.randrange(0, 1_000_000):06d}"
        token_request: dict[str, Any] = {"method": method, "ttl_seconds": 300}
        if method == "PIN":
            token_request["pin"] = pin
        response, document, sequences = await self._send(cluster.world(issuer), issuer_driver, "POST", "/sync/token",
                                                         token_request)
        if response is None or response.status != 200:
            return
        if not isinstance(document, dict) or not isinstance(document.get("token"), str) \
                or document.get("method") != method:
            self._violate(f"/sync/token answered {response.body[:200]!r}", sequences)
            return
        pair_request: dict[str, Any] = {"method": method, "token": document["token"]}
        if method == "PIN":
            pair_request["pin"] = pin
        response, document, sequences = await self._send(world, own_driver, "POST", "/sync/pair", pair_request)
        if response is None:
            return
        if response.status == 200:
            issuer_id = await self._device_id(world, issuer)
            if not isinstance(document, dict) or document.get("status") != "paired" or (
                    issuer_id is not None and document.get("peer_id") != issuer_id):
                self._violate(f"/sync/pair answered {response.body[:200]!r}", sequences)
                return
            self.paired.update({(device, issuer), (issuer, device)})
        elif response.status not in (422, 500, 503):
            self._violate(f"/sync/pair answered {response.status} {response.body[:200]!r}", sequences)

    # -- revocation ------------------------------------------------------------------------
    async def revoke(self, world: World) -> None:
        """Every other device revokes the last device (one request each, retried later)."""
        target = devices_total - 1
        self.revocation_started = True
        if self.pairings_in_flight or trio.current_time() < self.pairing_settled_at:
            return
        self.revoked_device = target
        target_id = await self._device_id(world, target)
        if target_id is None:
            return
        cluster = self._cluster(world)
        self.revocation_busy = True
        try:
            for device in range(devices_total - 1):
                if device in self.revocations_acknowledged or not cluster.is_up(device):
                    continue
                driver = cluster.world(device).apps.get(surface_name)
                if driver is None:
                    continue
                response, document, sequences = await self._send(cluster.world(device), driver, "POST",
                                                                 f"/sync/peers/{target_id}/revoke")
                if response is None:
                    continue
                if response.status == 200:
                    if not isinstance(document, dict) or document.get("status") != "revoked" \
                            or document.get("peer_id") != target_id:
                        self._violate(f"revoke answered {response.body[:200]!r}", sequences)
                    self.revocations_acknowledged.add(device)
                elif response.status == 404:
                    # Never paired on this device (or revoked by an earlier attempt whose answer
                    # was lost): either way it is not an active peer here.
                    self.revocations_acknowledged.add(device)
                elif response.status not in (500, 503):
                    self._violate(f"revoke answered {response.status} {response.body[:200]!r}", sequences)
        finally:
            self.revocation_busy = False
        if self.revocations_acknowledged >= set(range(devices_total - 1)):
            world.tracer.record("sync_revoked_everywhere", "workload", self.name, device=target)

    def _revoked_everywhere(self) -> bool:
        return self.revoked_device is not None and self.revocations_acknowledged >= set(range(devices_total - 1))

    # -- writes, updates, forgets ------------------------------------------------------------
    async def write(self, world: World, device: int, driver: AsgiDriver) -> None:
        tag = self._next()
        scope = shared_scopes[world.random.randrange(0, len(shared_scopes))]
        phrase = phrases[world.random.randrange(0, len(phrases))]
        key = f"sync-{tag}:w"
        body = {"source_type": "CONVERSATION", "scope": scope, "idempotency_key": key,
                "raw": {"user": f"{phrase} ts{tag}z", "assistant": f"记下了 ts{tag}z"},
                "provenance": {"session_id": f"home-{device}", "run_id": f"run-{device}", "turn_id": f"turn-{tag}",
                               "occurred_at": 1_788_393_600 + tag}}
        sent = SentWrite(device, key, scope, tag, body,
                         after_revocation=device == self.revoked_device and self._revoked_everywhere())
        self.writes[key] = sent
        for _attempt in range(attempts_max):
            response, document, sequences = await self._send(world, driver, "POST", "/memory/write", body)
            if response is not None and response.status == 200:
                sent.outcome = "acknowledged"
                return
            if response is not None and isinstance(document, dict) and document.get("error") in (
                    "IDEMPOTENCY_FAILED", "IDEMPOTENCY_IN_PROGRESS"):
                return  # a failed or running first attempt: the outcome stays unknown
            if response is not None and response.status not in (500, 503):
                self._violate(f"/memory/write {key} answered {response.status} {response.body[:200]!r}", sequences)
                return
            await trio.sleep(world.random.random())

    async def _shared_items(self, world: World) -> list[tuple[str, int, str]]:
        try:
            return await world.engine.read(lambda connection: [tuple(row) for row in connection.execute(
                "SELECT id, version, scope FROM knowledge_items WHERE scope LIKE 'shared:%' AND status = 'ACTIVE' "
                "ORDER BY id")])
        except StorageError:
            return []

    async def update(self, world: World, device: int, driver: AsgiDriver) -> None:
        items = await self._shared_items(world)
        if not items:
            await self.write(world, device, driver)
            return
        knowledge_id, version, scope = items[world.random.randrange(0, len(items))]
        tag = self._next()
        key = f"sync-{tag}:u"
        body = {"knowledge_id": knowledge_id, "expected_version": version, "scope": scope, "idempotency_key": key,
                "body": {"note": f"{phrases[world.random.randrange(0, len(phrases))]} ts{tag}z"}}
        self.writes[key] = SentWrite(device, key, scope, tag, body,
                                     after_revocation=device == self.revoked_device and self._revoked_everywhere())
        response, document, sequences = await self._send(world, driver, "POST", "/memory/update", body)
        if response is None or response.status in (200, 409, 404, 500, 503):
            return
        if response.status == 422 or (isinstance(document, dict) and document.get("error") in (
                "VERSION_CONFLICT", "KNOWLEDGE_NOT_ACTIVE", "NOT_FOUND")):
            return
        self._violate(f"/memory/update {key} answered {response.status} {response.body[:200]!r}", sequences)

    async def forget(self, world: World, device: int, driver: AsgiDriver) -> None:
        written = sorted(self.writes.values(), key=lambda sent: sent.tag)
        if not written:
            await self.write(world, device, driver)
            return
        target = written[world.random.randrange(0, len(written))]
        plan = {"command": f"忘记 ts{target.tag}z", "confirm": False, "scope": target.scope}
        response, document, _ = await self._send(world, driver, "POST", "/forget", plan)
        if response is None or response.status != 200 or not isinstance(document, dict) \
                or not isinstance(document.get("confirmation_token"), str):
            return
        confirm = {**plan, "confirm": True, "confirmation_token": document["confirmation_token"]}
        await self._send(world, driver, "POST", "/forget", confirm)

    async def read(self, world: World, device: int, driver: AsgiDriver) -> None:
        roll = world.random.random()
        if roll < 0.3:
            response, document, sequences = await self._send(world, driver, "GET", "/sync/status")
            if response is not None and response.status == 200 and not (
                    isinstance(document, dict) and isinstance(document.get("peers_total"), int)
                    and isinstance(document.get("enabled"), bool) and isinstance(document.get("paused"), bool)):
                self._violate(f"/sync/status answered {response.body[:200]!r}", sequences)
        elif roll < 0.6:
            response, document, sequences = await self._send(world, driver, "GET", "/sync/peers")
            if response is not None and response.status == 200:
                peers = document.get("peers") if isinstance(document, dict) else None
                if not isinstance(peers, list) or not peers or peers[0].get("is_self") is not True:
                    self._violate(f"/sync/peers answered {response.body[:200]!r}", sequences)
        else:
            items = await self._shared_items(world)
            if not items:
                return
            knowledge_id = items[world.random.randrange(0, len(items))][0]
            response, document, sequences = await self._send(world, driver, "GET",
                                                             f"/sync/state/knowledge/{knowledge_id}")
            if response is not None and response.status == 200 and not (
                    isinstance(document, dict) and isinstance(document.get("present"), bool)):
                self._violate(f"/sync/state answered {response.body[:200]!r}", sequences)

    # ------------------------------------------------------------------ checks
    async def after_restart(self, world: World) -> list[Violation]:
        snapshot = await self._snapshot(world)
        if snapshot is not None:
            self._check_device(world.notes["device"], snapshot)
        return self._take_pending()

    async def _snapshot(self, world: World) -> dict[str, Any] | None:
        if world.engine is None:
            return None
        try:
            return await world.engine.read(_read_device)
        except StorageError:
            return None

    def _check_device(self, device: int, snapshot: dict[str, Any], *, quiescent: bool = False) -> None:
        """Winner, materialisation and tombstone rules on one device's committed state.  The
        row is compared with its winner only at the quiet end and when no local change of it
        waits in the outbox (a local edit is not an operation until it is captured)."""
        seen = self.tombstones_seen.setdefault(device, set())
        for knowledge_id, (winner_op_id, _tombstone) in snapshot["states"].items():
            documents = snapshot["operations"].get(knowledge_id, [])
            operations = [Operation.decode(json.loads(document)) for document in documents]
            forward, backward = merge_all(operations), merge_all(list(reversed(operations)))
            if forward is None or backward is None:
                self._violate(f"d{device}: {knowledge_id} has a sync state and no operations", once=True, kind="winner")
                continue
            if forward.winner.op_id != backward.winner.op_id:
                self._violate(f"d{device}: {knowledge_id}'s winner depends on the order of its operations "
                              f"({forward.winner.op_id} vs {backward.winner.op_id})", once=True, kind="winner")
            if forward.winner.op_id != winner_op_id:
                self._violate(f"d{device}: {knowledge_id} stores winner {winner_op_id} but its operations make "
                              f"{forward.winner.op_id}", once=True, kind="winner")
            row = snapshot["items"].get(knowledge_id)
            if forward.winner.kind == kind_tombstone:
                seen.add(knowledge_id)
                if row is not None:
                    self._violate(f"d{device}: tombstoned {knowledge_id} is still in knowledge_items", once=True, kind="tombstone")
            elif quiescent and row is not None and knowledge_id not in snapshot["forgotten"] \
                    and knowledge_id not in snapshot["outbox"]:
                payload = forward.winner.payload or {}
                if row[3] != str(payload.get("title", ""))[:256] or row[2] != forward.winner.lamport:
                    self._violate(f"d{device}: {knowledge_id} shows version {row[2]} title {row[3]!r}, its winner "
                                  f"{forward.winner.op_id} has lamport {forward.winner.lamport} title "
                                  f"{payload.get('title')!r}", once=True, kind="winner")
        for knowledge_id in sorted(seen):
            state = snapshot["states"].get(knowledge_id)
            if state is None or not state[1]:
                self._violate(f"d{device}: the tombstone of {knowledge_id} was undone", once=True, kind="tombstone")
            if knowledge_id in snapshot["items"]:
                self._violate(f"d{device}: forgotten {knowledge_id} came back into knowledge_items", once=True, kind="tombstone")

    def _late_tags(self) -> set[int]:
        return {sent.tag for sent in self.writes.values() if sent.after_revocation}

    def _check_revoked(self, device: int, snapshot: dict[str, Any]) -> None:
        late = self._late_tags()
        if not late or device == self.revoked_device:
            return
        texts = list(snapshot["texts"]) + [row[3] + row[4] for row in snapshot["items"].values()]
        texts += [document for documents in snapshot["operations"].values() for document in documents]
        for text in texts:
            for found in tag_pattern.findall(text):
                if int(found) in late:
                    self._violate(f"d{device} holds ts{found}z, written on the revoked device after its "
                                  "revocation", once=True, kind="revocation")

    async def at_quiescence(self, world: World) -> list[Violation]:
        device = world.notes["device"]
        cluster = self._cluster(world)
        if device == 0:
            await self._final_rounds(cluster)
        snapshot = await self._snapshot(world)
        if snapshot is None:
            return self._take_pending()
        self._check_device(device, snapshot, quiescent=True)
        self._check_revoked(device, snapshot)
        if device == 0:
            await self._check_convergence(cluster)
        return self._take_pending()

    async def _final_rounds(self, cluster: Any) -> None:
        for _ in range(final_rounds):
            for index in range(devices_total):
                other = cluster.world(index)
                if not cluster.is_up(index) or other.system is None:
                    continue
                try:
                    await other.system.ref(sync_kind_name, sync_key).ask(RunSyncRound(), timeout=60.0)
                except Exception:  # noqa: BLE001 - a failed round shows up as divergence
                    continue

    async def _check_convergence(self, cluster: Any) -> None:
        snapshots: dict[int, dict[str, Any]] = {}
        for index in range(devices_total):
            if cluster.is_up(index) and index != self.revoked_device:
                snapshot = await self._snapshot(cluster.world(index))
                if snapshot is not None and snapshot["device_id"] is not None:
                    snapshots[index] = snapshot
        revoked_id = self.device_ids.get(self.revoked_device) if self.revoked_device is not None else None
        for left in snapshots:
            for right in snapshots:
                if left >= right:
                    continue
                a, b = snapshots[left], snapshots[right]
                if a["peers"].get(b["device_id"]) != "ACTIVE" or b["peers"].get(a["device_id"]) != "ACTIVE":
                    continue  # never paired both ways: nothing to converge
                await self._compare(cluster, left, right, a, b, revoked_id)

    async def _compare(self, cluster: Any, left: int, right: int, a: dict[str, Any], b: dict[str, Any],
                       revoked_id: str | None) -> None:
        def touched_by_revoked(knowledge_id: str) -> bool:
            if revoked_id is None:
                return False
            return any(f'"origin":"{revoked_id}"' in document
                       for snapshot in (a, b) for document in snapshot["operations"].get(knowledge_id, []))

        ids = sorted(set(a["states"]) | set(b["states"]))
        compared = [knowledge_id for knowledge_id in ids if not touched_by_revoked(knowledge_id)]
        self.items_compared += len(compared)
        cluster.tracer.record("sync_compared", "workload", self.name, devices=[left, right], items=len(compared),
                              skipped=len(ids) - len(compared))
        for knowledge_id in compared:
            state_a, state_b = a["states"].get(knowledge_id), b["states"].get(knowledge_id)
            if state_a is None or state_b is None:
                self._violate(f"{knowledge_id} replicated to only one of d{left}, d{right}", once=True, kind="divergence")
                continue
            if state_a != state_b:
                self._violate(f"{knowledge_id}: d{left} has winner {state_a}, d{right} has {state_b}", once=True, kind="divergence")
            if _row_meaning(a["items"].get(knowledge_id)) != _row_meaning(b["items"].get(knowledge_id)):
                self._violate(f"{knowledge_id}: d{left} stores {a['items'].get(knowledge_id)!r:.160}, d{right} "
                              f"stores {b['items'].get(knowledge_id)!r:.160}", once=True, kind="divergence")
        # The contract's view: /sync/state answers the same digest on both (over HTTP).
        for knowledge_id in ids[:20]:
            if touched_by_revoked(knowledge_id):
                continue
            answers = []
            for index in (left, right):
                world = cluster.world(index)
                driver = world.apps.get(surface_name)
                if driver is None:
                    return
                response, document, _ = await self._send(world, driver, "GET", f"/sync/state/knowledge/{knowledge_id}")
                answers.append(document if response is not None and response.status == 200 else None)
            if None not in answers and answers[0].get("operation_digest") != answers[1].get("operation_digest"):
                self._violate(f"{knowledge_id}: /sync/state digests differ between d{left} and d{right}", once=True, kind="divergence")


register_workload("knowledge-sync", KnowledgeSyncWorkload, in_default=False)

__all__ = ["KnowledgeSyncWorkload", "SentWrite", "devices_total", "shared_scopes", "sync_settings"]
