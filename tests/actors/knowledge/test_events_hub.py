"""The ``/events`` hub through a real ActorSystem: ``connected`` first, fan-out in publish
order to every subscriber, a slow subscriber dropped without stalling the others, heartbeats
on the interval, a hub crash ending every subscription, and the subscriber cap."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.knowledge import KnowledgeRefused, MemoryReady
from troupe.actors.knowledge._events_hub import (
    EventsHubSettings,
    HubStatistics,
    HubStatus,
    PublishEvent,
    Subscribe,
    Subscription,
    SubscriptionClosed,
    Unsubscribe,
    events_hub_kind,
    publish_event,
    slow_consumer_reason,
)
from troupe.runtime import ActorCrashed, ActorSystem, real_env


def ready(number: int) -> MemoryReady:
    return MemoryReady(evidence_id=f"evd_{number}", knowledge_id=f"knw_{number}", title=f"t{number}", scope="user:a")


async def open_system(nursery, tmp_path, **settings) -> ActorSystem:
    system = ActorSystem(real_env(str(tmp_path)), [events_hub_kind(EventsHubSettings(**settings))])
    await nursery.start(system.run)
    return system


async def test_connected_then_events_in_order_to_every_subscriber(nursery, tmp_path):
    system = await open_system(nursery, tmp_path)
    hub = system.ref("knowledge_events", "main")
    first = await hub.ask(Subscribe())
    second = await hub.ask(Subscribe())
    assert isinstance(first, Subscription) and first.subscription_id != second.subscription_id
    for number in range(3):
        assert publish_event(system, ready(number))
    for subscription in (first, second):
        connected = await subscription.next_message()
        assert connected["event"] == "connected"
        assert connected["data"]["connection_id"] == subscription.subscription_id
        got = [(await subscription.next_message())["data"]["evidence_id"] for _ in range(3)]
        assert got == ["evd_0", "evd_1", "evd_2"]
    await hub.ask(Unsubscribe(first.subscription_id))
    with pytest.raises(SubscriptionClosed):
        await first.next_message()
    assert (await hub.ask(HubStatus())).subscribers == 1


async def test_a_slow_subscriber_is_dropped_and_the_others_keep_receiving(nursery, tmp_path):
    system = await open_system(nursery, tmp_path, queue_messages_max=4)
    hub = system.ref("knowledge_events", "main")
    slow = await hub.ask(Subscribe())
    fast = await hub.ask(Subscribe())
    received = []

    async def read_fast():
        while len(received) < 10:
            received.append(await fast.next_message())

    async with trio.open_nursery() as readers:
        readers.start_soon(read_fast)
        for number in range(9):
            await hub.ask(PublishEvent(ready(number)))
            await trio.sleep(0)
    # The slow one held connected + 3 events (4 = the queue bound); the 4th event dropped it.
    assert slow.closed_reason == slow_consumer_reason
    with pytest.raises(SubscriptionClosed) as closed:
        await slow.next_message()
    assert closed.value.reason == slow_consumer_reason
    assert [message["event"] for message in received] == ["connected"] + ["memory_ready"] * 9
    assert await hub.ask(HubStatus()) == HubStatistics(subscribers=1, published=9, dropped_slow=1)


async def test_heartbeats_arrive_on_the_interval(nursery, tmp_path, autojump_clock):
    system = await open_system(nursery, tmp_path, heartbeat_interval_seconds=5.0)
    hub = system.ref("knowledge_events", "main")
    subscription = await hub.ask(Subscribe())
    await subscription.next_message()
    start = trio.current_time()
    heartbeat = await subscription.next_message()
    assert heartbeat["event"] == "heartbeat" and isinstance(heartbeat["data"]["timestamp"], int)
    assert 5.0 <= trio.current_time() - start < 6.0


async def test_a_hub_crash_ends_every_subscription(nursery, tmp_path):
    system = await open_system(nursery, tmp_path)
    hub = system.ref("knowledge_events", "main")
    subscription = await hub.ask(Subscribe())
    with pytest.raises(ActorCrashed):
        await hub.ask("not a message")
    # Even what was queued before the crash is not delivered: the connection ends at once.
    with pytest.raises(SubscriptionClosed) as closed:
        await subscription.next_message()
    assert closed.value.reason == "hub_restarted"
    # The next incarnation serves new subscribers.
    again = await hub.ask(Subscribe())
    assert (await again.next_message())["event"] == "connected"


async def test_subscribers_are_capped_at_the_limit(nursery, tmp_path):
    system = await open_system(nursery, tmp_path, subscribers_max=2)
    hub = system.ref("knowledge_events", "main")
    await hub.ask(Subscribe())
    second = await hub.ask(Subscribe())
    refused = await hub.ask(Subscribe())
    assert isinstance(refused, KnowledgeRefused) and (refused.code, refused.status) == ("OVERLOADED", 503)
    await hub.ask(Unsubscribe(second.subscription_id))
    assert isinstance(await hub.ask(Subscribe()), Subscription)
