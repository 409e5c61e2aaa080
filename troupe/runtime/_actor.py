"""What a domain actor sees: the ``Actor`` base class, its ``ActorContext`` and its kind.

An actor is virtual: it is addressed by ``(kind, key)``, activated by its first message (when
``on_activate`` loads its state from storage), runs one message at a time, and passivates when
idle or evicted.  Anything that must survive a crash is written to storage inside the turn,
before ``receive`` returns: the reply is only sent after that, so an acknowledged write is a
durable write.  A crash discards the instance; the next message activates a fresh one from
storage, which is why actors keep no state that storage does not also have.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import _limits
from ._env import Env
from ._limits import RestartIntensity

if TYPE_CHECKING:
    from ._system import ActorRef, ActorSystem


class Actor:
    """Subclass this; override ``receive`` and, where needed, the lifecycle hooks."""

    def __init__(self, context: ActorContext) -> None:
        self.context = context

    async def on_activate(self) -> None:
        """Load state from storage. Runs before the first message after (re)activation."""

    async def receive(self, message: Any) -> Any:
        """Handle one message; the return value is the reply to ``ask``."""
        raise NotImplementedError

    async def on_reminder(self, name: str, payload: Any) -> None:
        """A durable reminder set with ``context.set_reminder`` is due."""

    async def on_passivate(self) -> None:
        """Idle or evicted: release resources. State is already durable; nothing to save."""


@dataclass(frozen=True)
class ActorKind:
    """How to make and bound actors of one kind."""

    name: str
    factory: Callable[[ActorContext], Actor]
    mailbox_messages_max: int = _limits.mailbox_messages_max
    idle_seconds: float = _limits.idle_seconds
    turn_timeout_seconds: float = _limits.turn_timeout_seconds
    intensity: RestartIntensity = field(default_factory=RestartIntensity)
    """Restarts one actor may have before it escalates to its kind supervisor."""
    kind_intensity: RestartIntensity = field(
        default_factory=lambda: RestartIntensity(_limits.kind_escalations_max, _limits.kind_period_seconds)
    )
    """Escalations the kind supervisor absorbs before the whole kind goes down."""

    def __post_init__(self) -> None:
        assert self.name and "/" not in self.name
        assert self.mailbox_messages_max >= 1
        assert 0 < self.turn_timeout_seconds
        assert 0 < self.idle_seconds


@dataclass(frozen=True)
class ReminderFired:
    """Delivered by the runtime when a durable reminder is due; handled by ``on_reminder``."""

    name: str
    due_wall: float
    payload: Any = None
    revision: int | None = None
    """Which setting of the reminder fired (see ``troupe.storage.Reminder.revision``)."""


@dataclass(frozen=True)
class TaskEnded:
    """Delivered to ``receive`` when a task started with ``context.start_task`` has ended:
    returned (``result``), raised (``error``) or was cancelled by ``context.cancel_task``
    (``cancelled``).  Not delivered when the task died with its instance (crash, passivation,
    stop) or was replaced by a task of the same name: then no one is left who asked for it."""

    name: str
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False


class ActorContext:
    """The actor's handle on the runtime: its identity, the Env, storage, refs, timers."""

    __slots__ = ("kind", "key", "system", "_cell", "_discarded")

    def __init__(self, kind: str, key: str, system: ActorSystem, cell: Any) -> None:
        self.kind = kind
        self.key = key
        self.system = system
        self._cell = cell
        self._discarded = False

    @property
    def discarded(self) -> bool:
        """True once the runtime has thrown this instance away (after a crash, a failed
        activation or a finished passivation).  Workloads read it from outside the system to
        check that one key never has two live instances at once."""
        return self._discarded

    @property
    def env(self) -> Env:
        return self.system.env

    @property
    def storage(self) -> Any:
        """The ``troupe.storage.Engine`` (``None`` when the system runs without storage)."""
        return self.system.storage

    def ref(self, kind: str, key: str) -> ActorRef:
        return self.system.ref(kind, key)

    def trace(self, event: str, **fields: Any) -> None:
        self.system.tracer.record(event, self.kind, self.key, **fields)

    async def set_reminder(self, name: str, due_wall: float, payload: Any = None) -> None:
        """Durably schedule ``on_reminder(name, payload)`` at wall time ``due_wall``.

        Survives crashes and restarts; setting the same name again replaces it.
        """
        await self.system.reminders.set(self.kind, self.key, name, due_wall, payload)

    async def cancel_reminder(self, name: str) -> None:
        await self.system.reminders.cancel(self.kind, self.key, name)

    def reminder_armed(self, name: str, due_wall: float) -> None:
        """Tell the scheduler about a reminder the actor wrote in its own transaction."""
        self.system.reminders.arm(self.kind, self.key, name, due_wall)

    def start_timer(self, name: str, delay_seconds: float, message: Any) -> None:
        """In-memory timer: ``message`` is told to this actor after the delay, unless the actor
        passivates or crashes first.  For concerns that need not survive a restart."""
        self.system._start_timer(self._cell, name, delay_seconds, message)

    def cancel_timer(self, name: str) -> None:
        scope = self._cell.timers.pop(name, None)
        if scope is not None:
            scope.cancel()

    def start_task(self, name: str, async_function: Callable[[], Awaitable[Any]]) -> None:
        """Run ``async_function()`` beside the actor's turns, in the kind's nursery, for work
        that outlives one turn (an agent turn streaming from a model).  The actor hears
        ``TaskEnded(name, ...)`` through ``receive`` when it ends.  A running task keeps the
        actor from idle passivation; it is cancelled when the instance is discarded (crash,
        passivation, eviction, stop).  Starting a name that runs cancels the old task first.

        The function runs outside turns: it may touch the actor's state only in synchronous
        stretches (no await in between), which trio makes atomic with respect to turns."""
        self.system._start_task(self._cell, name, async_function)

    def cancel_task(self, name: str) -> None:
        """Cancel the task ``name`` if it runs; ``TaskEnded(cancelled=True)`` follows unless
        the function finished before it saw the cancellation."""
        task = self._cell.tasks.get(name)
        if task is not None:
            task.scope.cancel()

    def task_running(self, name: str) -> bool:
        return name in self._cell.tasks

    def passivate(self) -> None:
        """Passivate after the current turn (the actor may be activated again at any time)."""
        self._cell.passivate_requested = True
