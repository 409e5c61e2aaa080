"""The ``/events`` fan-out: one actor owns every WebSocket subscriber of the knowledge surface.

Why an actor: the subscriber set is state, and the design wants each piece of state owned by
exactly one actor, never a module-level global.  ``("knowledge_events", "main")`` keeps the
subscriptions; the scope actors (and anything else) ``tell`` it ``PublishEvent``; each
WebSocket connection ``ask``s it ``Subscribe`` and then pulls from its own ``Subscription``.

Why bounded queues and drop-on-full: one slow or vanished client must never stall the
publishers or the other clients.  ``offer`` never waits: a subscription whose queue already
holds ``event_queue_messages_max`` messages is closed with reason ``slow_consumer`` and
removed, and its connection ends (the client reconnects; events are notifications, not a log,
so nothing is replayed).  The connection's own socket writes are bounded by the HTTP layer
(``event_send_seconds_max``): a write that hangs stops the pulling, the queue fills, and the hub
drops the client at the next event or heartbeat.

Heartbeats come from the hub (``heartbeat_interval_seconds``) through the same queues, so a
heartbeat also finds a client that stopped reading.  The heartbeat loop is a task of the hub
(``start_task``); it runs only while there are subscribers, which also keeps the hub from idle
passivation while connections are open.

A hub crash discards the instance and its subscriber set: ``Subscription.closed`` turns true
(the context is discarded), so every connection ends and its client reconnects to the next
incarnation.  Events published while there are no subscribers are simply dropped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from troupe.runtime import Actor, ActorContext, ActorKind, Overloaded, TaskEnded, Unavailable

from ._protocol import Connected, Heartbeat, KnowledgeRefused, events_key, events_kind_name

logger = logging.getLogger(__name__)

event_queue_messages_max = 256
"""Messages one connection may have waiting; one more and it is dropped as slow."""
subscribers_max = 1_024
"""Open ``/events`` connections at once; more are refused (503)."""
heartbeat_interval_seconds = 15.0
event_send_seconds_max = 10.0
"""How long the HTTP layer may wait on one socket write before giving the client up."""
events_mailbox_messages_max = 4_096
heartbeat_task_name = "heartbeat"
slow_consumer_reason = "slow_consumer"
hub_gone_reason = "hub_restarted"

assert event_queue_messages_max >= 2  # ``connected`` plus at least one event
assert event_send_seconds_max < heartbeat_interval_seconds * event_queue_messages_max


class SubscriptionClosed(Exception):
    """The subscription ended (slow consumer, unsubscribed, hub restarted); ``reason`` says
    which.  The connection closes its socket."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Subscription:
    """One connection's bounded queue of encoded messages (JSON-ready dicts).  The hub
    offers; the connection pulls with ``next_message``."""

    __slots__ = ("subscription_id", "_send", "_receive", "_reason", "_context")

    def __init__(self, subscription_id: str, context: ActorContext,
                 queue_messages_max: int = event_queue_messages_max) -> None:
        self.subscription_id = subscription_id
        self._send, self._receive = trio.open_memory_channel[dict[str, Any]](queue_messages_max)
        self._reason: str | None = None
        self._context = context

    @property
    def closed_reason(self) -> str | None:
        if self._reason is None and self._context.discarded:
            return hub_gone_reason
        return self._reason

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    def offer(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` without waiting; False (and the subscription closed as slow)
        when the queue is full or the subscription is closed."""
        if self._reason is not None:
            return False
        try:
            self._send.send_nowait(message)
        except trio.WouldBlock:
            self.close(slow_consumer_reason)
            return False
        return True

    def close(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason
            self._send.close()

    def pending(self) -> int:
        return self._send.statistics().current_buffer_used

    async def next_message(self, *, poll_seconds: float = heartbeat_interval_seconds) -> dict[str, Any]:
        """The next message; raises ``SubscriptionClosed`` once the subscription is closed
        (a slow consumer gets no more messages, even queued ones).  Wakes every
        ``poll_seconds`` to notice a hub that was discarded without closing it."""
        while True:
            reason = self.closed_reason
            if reason is not None:
                raise SubscriptionClosed(reason)
            with trio.move_on_after(poll_seconds):
                try:
                    return await self._receive.receive()
                except trio.EndOfChannel:
                    raise SubscriptionClosed(self.closed_reason or hub_gone_reason) from None


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscribe:
    """→ ``Subscription`` (its first message is ``connected``) | ``KnowledgeRefused``
    (503 ``OVERLOADED`` beyond ``subscribers_max``)."""


@dataclass(frozen=True)
class Unsubscribe:
    subscription_id: str


@dataclass(frozen=True)
class PublishEvent:
    """``event`` is anything with ``encode() -> {"event": ..., "data": ...}``."""

    event: Any


@dataclass(frozen=True)
class HubStatus:
    """→ ``HubStatistics``."""


@dataclass(frozen=True)
class HubStatistics:
    subscribers: int
    published: int
    dropped_slow: int


@dataclass(frozen=True)
class HeartbeatDue:
    """Told by the heartbeat task; the hub offers a heartbeat to every subscriber."""


# ---------------------------------------------------------------------------------------------
# The actor
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventsHubSettings:
    queue_messages_max: int = event_queue_messages_max
    subscribers_max: int = subscribers_max
    heartbeat_interval_seconds: float = heartbeat_interval_seconds


class EventsHubActor(Actor):
    def __init__(self, context: ActorContext, settings: EventsHubSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.subscriptions: dict[str, Subscription] = {}
        self.published = 0
        self.dropped_slow = 0

    async def receive(self, message: Any) -> Any:
        if isinstance(message, PublishEvent):
            self._broadcast(message.event.encode())
            self.published += 1
            return None
        if isinstance(message, Subscribe):
            return self._subscribe()
        if isinstance(message, Unsubscribe):
            subscription = self.subscriptions.pop(message.subscription_id, None)
            if subscription is not None:
                subscription.close("unsubscribed")
            return None
        if isinstance(message, HeartbeatDue):
            self._broadcast(Heartbeat(timestamp=int(self.context.env.clock.wall())).encode())
            return None
        if isinstance(message, HubStatus):
            return HubStatistics(len(self.subscriptions), self.published, self.dropped_slow)
        if isinstance(message, TaskEnded):
            self._ensure_heartbeat()
            return None
        raise TypeError(f"the events hub does not handle {type(message).__name__}")

    async def on_passivate(self) -> None:
        for subscription in self.subscriptions.values():
            subscription.close(hub_gone_reason)
        self.subscriptions.clear()

    def _subscribe(self) -> Subscription | KnowledgeRefused:
        self._forget_closed()
        if len(self.subscriptions) >= self.settings.subscribers_max:
            return KnowledgeRefused("OVERLOADED", "too many event connections", 503)
        subscription = Subscription(self.context.env.ids.new_id("ws_"), self.context,
                                    self.settings.queue_messages_max)
        subscription.offer(Connected(connection_id=subscription.subscription_id,
                                     heartbeat_seconds=self.settings.heartbeat_interval_seconds).encode())
        self.subscriptions[subscription.subscription_id] = subscription
        self._ensure_heartbeat()
        return subscription

    def _broadcast(self, message: dict[str, Any]) -> None:
        for subscription_id, subscription in list(self.subscriptions.items()):
            if not subscription.offer(message):
                if subscription.closed_reason == slow_consumer_reason:
                    self.dropped_slow += 1
                    self.context.trace("knowledge_events_dropped", subscription=subscription_id)
                del self.subscriptions[subscription_id]

    def _forget_closed(self) -> None:
        for subscription_id, subscription in list(self.subscriptions.items()):
            if subscription.closed:
                del self.subscriptions[subscription_id]

    def _ensure_heartbeat(self) -> None:
        self._forget_closed()
        if self.subscriptions and not self.context.task_running(heartbeat_task_name):
            self.context.start_task(heartbeat_task_name, self._heartbeats)

    async def _heartbeats(self) -> None:
        """Tell the hub a heartbeat is due every interval while anyone listens."""
        me = self.context.ref(self.context.kind, self.context.key)
        while self.subscriptions:
            await trio.sleep(self.settings.heartbeat_interval_seconds)
            try:
                me.tell(HeartbeatDue())
            except (Overloaded, Unavailable):
                logger.warning("events hub mailbox full; heartbeat skipped")


def events_hub_kind(settings: EventsHubSettings | None = None) -> ActorKind:
    chosen = settings or EventsHubSettings()
    return ActorKind(events_kind_name, lambda context: EventsHubActor(context, chosen),
                     mailbox_messages_max=events_mailbox_messages_max)


def publish_event(system: Any, event: Any) -> bool:
    """Tell the hub about ``event`` without waiting; False when the hub's mailbox refused it
    (events are notifications: a dropped one is logged, never retried)."""
    try:
        system.ref(events_kind_name, events_key).tell(PublishEvent(event))
    except (Overloaded, Unavailable):
        logger.warning("events hub refused %s", type(event).__name__)
        return False
    return True


__all__ = [
    "EventsHubActor",
    "EventsHubSettings",
    "HeartbeatDue",
    "HubStatistics",
    "HubStatus",
    "PublishEvent",
    "Subscribe",
    "Subscription",
    "SubscriptionClosed",
    "Unsubscribe",
    "event_queue_messages_max",
    "event_send_seconds_max",
    "events_hub_kind",
    "events_mailbox_messages_max",
    "heartbeat_interval_seconds",
    "heartbeat_task_name",
    "hub_gone_reason",
    "publish_event",
    "slow_consumer_reason",
    "subscribers_max",
]
