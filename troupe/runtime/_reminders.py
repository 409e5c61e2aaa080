"""Durable reminders: timers that survive crashes, restarts and passivation.

A reminder is a row in storage (``kind, key, name, due_wall, payload``).  The service keeps the
reminders due within a horizon in a heap, sleeps until the earliest is due by the Env's wall
clock, and delivers ``ReminderFired`` to the actor (activating it).  The row is deleted inside
the actor's turn, after ``on_reminder`` returned, so a crash before that fires it again after
the restart; a reminder whose turn crashes twice is poison, reported and dropped.

Trade-off: reminders are matched on wall time, which can jump.  A forward jump fires what it
skips over (at most ``wake_seconds_max`` late).  A backward jump must not hold back reminders
that were already due, so the service never lets its notion of "now" go backward: it uses the
highest wall time it has seen, persisted every ``high_water_persist_seconds`` so that a restart
on a clock that went back does not delay reminders by more than that.

Simulator hooks: the ``reminder_late`` fault point holds a delivery back by
``delay_seconds("reminder_late")``; the service itself is a supervised child with the
``reminder_service_crashes`` fault point (see ``ActorSystem``), and a restart re-arms it from
storage.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import trio

from . import _limits
from ._actor import ReminderFired
from ._exceptions import ActorError, PoisonMessage
from ._fault_points import no_fault_points

if TYPE_CHECKING:
    from ._system import ActorSystem

wake_seconds_max = 1.0
"""Longest sleep between wall-clock checks."""

high_water_persist_seconds = 30.0
"""How far the wall-clock high-water mark may advance before it is written to storage."""

high_water_kind = "runtime"
high_water_key = "reminders.wall_high_water"


class ReminderService:
    def __init__(self, system: ActorSystem) -> None:
        self._system = system
        self._heap: list[tuple[float, str, str, str, float]] = []
        """(fire_at, kind, key, name, due_wall), lazily deleted: an entry is live only while
        ``_scheduled`` maps its address to the same (fire_at, due_wall)."""
        self._scheduled: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._in_flight: set[tuple[str, str, str]] = set()
        self._changed = trio.Event()
        self._loaded_until = float("-inf")
        self._wall_high_water = float("-inf")
        self._high_water_monotonic = 0.0
        self._wall_high_water_persisted = float("-inf")
        self.fired = 0
        self.poisoned = 0

    # -- what actors call -------------------------------------------------------------

    async def set(self, kind: str, key: str, name: str, due_wall: float, payload: Any) -> None:
        from troupe.storage import reminder_set

        storage = self._require_storage()
        await storage.write(lambda connection: reminder_set(connection, kind, key, name, due_wall, payload))
        self.arm(kind, key, name, due_wall)

    async def cancel(self, kind: str, key: str, name: str) -> None:
        from troupe.storage import reminder_delete

        storage = self._require_storage()
        await storage.write(lambda connection: reminder_delete(connection, kind, key, name))
        self._scheduled.pop((kind, key, name), None)

    def arm(self, kind: str, key: str, name: str, due_wall: float) -> None:
        address = (kind, key, name)
        # Reading the clock here lets the high-water mark see the wall time the actor just
        # used: a forward jump seen only by the actor, then a backward one, must not strand it.
        if due_wall > max(self._loaded_until, self.now() + _limits.reminder_horizon_seconds):
            self._scheduled.pop(address, None)  # beyond the horizon: a later scan loads it
            return
        self._schedule(address, due_wall, due_wall)

    def _schedule(self, address: tuple[str, str, str], fire_at: float, due_wall: float) -> None:
        self._scheduled[address] = (fire_at, due_wall)
        heapq.heappush(self._heap, (fire_at, *address, due_wall))
        self._changed.set()

    async def completed(self, kind: str, key: str, fired: ReminderFired) -> None:
        """Called inside the actor's turn: delete the row unless it was set again meanwhile."""
        await self._delete_if_still_due(kind, key, fired.name, fired.due_wall, fired.revision)

    def _require_storage(self):
        storage = self._system.storage
        if storage is None:
            raise RuntimeError("durable reminders need an actor system with storage")
        return storage

    # -- the service task -------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        system = self._system
        self._heap.clear()
        self._scheduled.clear()
        self._in_flight.clear()
        self._loaded_until = float("-inf")
        async with trio.open_nursery() as nursery:
            limiter = trio.CapacityLimiter(_limits.reminder_deliveries_in_flight_max)
            if system.storage is not None:
                await self._load_high_water()
                await self._scan(self.now())
            task_status.started()
            if system.storage is None:
                await trio.sleep_forever()
            while True:
                now = self.now()
                if now - self._wall_high_water_persisted >= high_water_persist_seconds:
                    await self._persist_high_water(now)
                if now >= self._loaded_until - _limits.reminder_retry_seconds:
                    await self._scan(now)
                while self._heap and self._heap[0][0] <= now:
                    fire_at, kind, key, name, due_wall = heapq.heappop(self._heap)
                    address = (kind, key, name)
                    if self._scheduled.get(address) != (fire_at, due_wall):
                        continue  # superseded or cancelled
                    if address in self._in_flight:
                        # Set again during its own turn: fire once the running delivery ends.
                        self._schedule(address, now + _limits.reminder_retry_seconds, due_wall)
                        continue
                    del self._scheduled[address]
                    self._in_flight.add(address)
                    nursery.start_soon(self._deliver, limiter, kind, key, name, due_wall)
                delay = wake_seconds_max
                if self._heap:
                    delay = min(delay, max(self._heap[0][0] - now, 0.0))
                self._changed = trio.Event()
                with trio.move_on_after(delay):
                    await self._changed.wait()

    def now(self) -> float:
        """The wall clock, never going backward: after a backward jump it keeps advancing from
        its high-water mark at the pace of the monotonic clock (see the module docstring)."""
        clock = self._system.env.clock
        monotonic = clock.monotonic()
        advanced = self._wall_high_water + (monotonic - self._high_water_monotonic)
        self._wall_high_water = max(clock.wall(), advanced)
        self._high_water_monotonic = monotonic
        return self._wall_high_water

    async def _load_high_water(self) -> None:
        from troupe.storage import state_get

        stored = await self._system.storage.read(
            lambda connection: state_get(connection, high_water_kind, high_water_key)
        )
        if stored is not None:
            self._wall_high_water = max(self._wall_high_water, float(stored))
        self._high_water_monotonic = self._system.env.clock.monotonic()
        self._wall_high_water_persisted = self._wall_high_water

    async def _persist_high_water(self, now: float) -> None:
        from troupe.storage import state_put

        await self._system.storage.write(
            lambda connection: state_put(connection, high_water_kind, high_water_key, now)
        )
        self._wall_high_water_persisted = now

    async def _scan(self, now: float) -> None:
        from troupe.storage import reminders_due

        until = now + _limits.reminder_horizon_seconds
        rows = await self._system.storage.read(
            lambda connection: reminders_due(connection, until, _limits.reminder_batch_max)
        )
        for row in rows:
            address = (row.kind, row.key, row.name)
            scheduled = self._scheduled.get(address)
            if address in self._in_flight or (scheduled is not None and scheduled[1] == row.due_wall):
                continue  # being delivered, or already scheduled for this due time
            self._schedule(address, row.due_wall, row.due_wall)
        # A full batch means more may lie inside the horizon: scan again soon after them.
        if len(rows) >= _limits.reminder_batch_max:
            until = rows[-1].due_wall
        self._loaded_until = until

    async def _deliver(self, limiter: trio.CapacityLimiter, kind: str, key: str, name: str, due_wall: float) -> None:
        from troupe.storage import reminder_get

        system = self._system
        address = (kind, key, name)
        retry_after = None
        revision: int | None = None
        try:
            if system.env.fault_points is not no_fault_points and system._fault("reminder_late", kind, key):
                await trio.sleep(system.env.fault_points.delay_seconds("reminder_late"))
            async with limiter:
                row = await system.storage.read(lambda connection: reminder_get(connection, kind, key, name))
                if row is None or row.due_wall != due_wall:
                    return  # cancelled or replaced in storage
                revision = row.revision
                system.tracer.record("reminder_fire", kind, key, name=name)
                self.fired += 1
                # PLANTED BUG (simulator tests only): delete the row before the actor handled it.
                if "reminder_lost_on_crash" in system.env.planted_bugs:
                    await self._delete_if_still_due(kind, key, name, due_wall, revision)
                await system.ref(kind, key).ask(ReminderFired(name, due_wall, row.payload, revision))
        except PoisonMessage:
            self.poisoned += 1
            system.tracer.record("reminder_poison", kind, key, name=name)
            try:
                await self._delete_if_still_due(kind, key, name, due_wall, revision)
            except Exception as error:  # storage trouble: the row stays, so it is tried again
                system.tracer.record("reminder_error", kind, key, name=name, error=type(error).__name__)
                retry_after = _limits.reminder_retry_seconds
        except ActorError as error:
            retry_after = getattr(error, "retry_after_seconds", _limits.reminder_retry_seconds)
        except Exception as error:  # storage trouble: try again later
            system.tracer.record("reminder_error", kind, key, name=name, error=type(error).__name__)
            retry_after = _limits.reminder_retry_seconds
        finally:
            self._in_flight.discard(address)
        if retry_after is not None and address not in self._scheduled:
            # Re-arm in memory only: the row is still in storage with its original due time.
            self._schedule(address, self.now() + retry_after, due_wall)

    async def _delete_if_still_due(self, kind: str, key: str, name: str, due_wall: float,
                                   revision: int | None = None) -> None:
        from troupe.storage import reminder_delete

        await self._require_storage().write(
            lambda connection: reminder_delete(connection, kind, key, name, due_wall=due_wall,
                                               revision=revision)
        )
