"""Shared fakes for the kernel slice's tests: the session actor's ports, recorded."""

from __future__ import annotations

import trio

from troupe.actors.sessions._bridges import Bridges


class RecordingPorts:
    """``KernelPorts`` whose publish records ``(type, payload)`` and numbers events from 1."""

    def __init__(self, env, *, subscribed: bool = True, model=None) -> None:
        self.env = env
        self.model = model or env.model
        self.events: list[tuple[str, dict]] = []
        self.turn_ids: list[str | None] = []
        self.subscribed = subscribed
        self.bridges = Bridges.for_env(
            env, publish=self.publish, has_subscribers=lambda: self.subscribed
        )

    def publish(self, type: str, payload: dict, turn_id: str | None) -> int:
        self.events.append((type, payload))
        self.turn_ids.append(turn_id)
        return len(self.events)

    def types(self) -> list[str]:
        return [type for type, _ in self.events]

    def payloads(self, type: str) -> list[dict]:
        return [payload for kind, payload in self.events if kind == type]

    async def wait_for(self, type: str, count: int = 1) -> dict:
        while len(self.payloads(type)) < count:
            await trio.sleep(0.001)
        return self.payloads(type)[count - 1]
