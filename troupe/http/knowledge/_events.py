"""``/events``: the WebSocket side of one subscriber of the knowledge events hub (§4).

Why the connection pulls from the hub instead of the hub pushing to sockets: the hub
(``("knowledge_events", "main")``) must never wait on a client, so it only offers encoded
messages to each connection's bounded queue (``Subscription``) and drops a connection whose
queue is full.  This handler is the other end: it asks the hub to ``Subscribe`` (the first
message is ``connected``), then loops ``next_message`` → one JSON text frame, each send bounded
by ``event_send_seconds_max``.  A client that stopped reading (or vanished without closing) is
found either way: its send times out here, or its queue fills and the hub drops it.

Alongside, a task reads and discards what the client sends: quart-trio only notices the
client's close after its receive buffer drains, and the protocol has no client messages.

Endings, each with a close code the client can act on (then the hub forgets the
subscription, ``Unsubscribe``):

- the client closed: nothing to send; quart-trio cancels the handler;
- a slow consumer (queue full or a send that timed out): 1008 ``slow_consumer``;
- the hub restarted (its subscriber set is gone): 1012 ``hub_restarted``, reconnect;
- the server is shutting down (``ShutdownSignal``): 1001 ``going_away``;
- the hub refused (too many connections) or could not be asked: the handshake is closed with
  1013 before it is accepted (hypercorn answers the upgrade 403).

Events are notifications, not a log: nothing is replayed on reconnect.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import trio
from quart import websocket

from troupe.actors.knowledge import (
    KnowledgeRefused,
    Subscribe,
    SubscriptionClosed,
    Unsubscribe,
    event_send_seconds_max,
    events_key,
    events_kind_name,
    hub_gone_reason,
    slow_consumer_reason,
)
from troupe.http import ShutdownSignal
from troupe.runtime import ActorCrashed, AskTimeout, Overloaded, Unavailable

from ._errors import request_id_header, request_id_of

logger = logging.getLogger("troupe.knowledge.events")

subscribe_ask_seconds_max = 10.0
close_seconds_max = 2.0
"""The close frame is a courtesy: a client that does not take it within this is left."""
client_message_characters_max = 4_096
"""What one client frame may hold before the connection is closed (1009): clients send nothing."""

close_going_away = 1001
close_policy_violation = 1008
close_message_too_big = 1009
close_service_restart = 1012
close_try_again_later = 1013

assert 0 < event_send_seconds_max


@dataclass(frozen=True)
class EventsSettings:
    event_send_seconds_max: float = event_send_seconds_max
    subscribe_ask_seconds_max: float = subscribe_ask_seconds_max


def encode_message(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


async def _close(code: int, reason: str) -> None:
    with trio.move_on_after(close_seconds_max):
        try:
            await websocket.close(code, reason)
        except Exception as exc:  # the client may already be gone; nothing to tell it then
            logger.debug("closing an events connection failed: %s", type(exc).__name__)


async def _discard_client_messages(outcome: list[Any], cancel_scope: trio.CancelScope) -> None:
    while True:
        message = await websocket.receive()
        if len(message) > client_message_characters_max:
            outcome[:] = [close_message_too_big, "client messages are not accepted"]
            cancel_scope.cancel()
            return


async def serve_events(system: Any, shutdown: ShutdownSignal, settings: EventsSettings) -> None:
    """The ``/events`` handler (see the module docstring)."""
    hub = system.ref(events_kind_name, events_key)
    try:
        subscription = await hub.ask(Subscribe(), timeout=settings.subscribe_ask_seconds_max)
    except (Overloaded, Unavailable, AskTimeout, ActorCrashed) as exc:
        logger.warning("events hub unavailable: %s", type(exc).__name__)
        subscription = None
    if subscription is None or isinstance(subscription, KnowledgeRefused):
        await websocket.close(close_try_again_later, "try again later")
        return
    await websocket.accept(headers={request_id_header: request_id_of(websocket.scope)})
    outcome: list[Any] = [close_going_away, "going_away"]
    try:
        with shutdown.scope():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_discard_client_messages, outcome, nursery.cancel_scope)
                outcome[:] = await _forward(subscription, settings)
                nursery.cancel_scope.cancel()
    finally:
        try:
            hub.tell(Unsubscribe(subscription.subscription_id))
        except (Overloaded, Unavailable):
            logger.warning("events hub refused an unsubscribe; it forgets closed subscriptions itself")
    await _close(*outcome)


async def _forward(subscription: Any, settings: EventsSettings) -> tuple[int, str]:
    """Send every message until the subscription ends; the close code and reason."""
    while True:
        try:
            message = await subscription.next_message()
        except SubscriptionClosed as closed:
            if closed.reason == slow_consumer_reason:
                return close_policy_violation, slow_consumer_reason
            if closed.reason == hub_gone_reason:
                return close_service_restart, hub_gone_reason
            return close_going_away, closed.reason
        with trio.move_on_after(settings.event_send_seconds_max) as send_scope:
            await websocket.send(encode_message(message))
        if send_scope.cancelled_caught:
            subscription.close(slow_consumer_reason)
            return close_policy_violation, slow_consumer_reason


__all__ = [
    "EventsSettings",
    "close_going_away",
    "close_policy_violation",
    "close_service_restart",
    "close_try_again_later",
    "encode_message",
    "serve_events",
]
