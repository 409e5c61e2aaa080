"""Stream helpers for the black-box sessions tests: a background SSE follower that keeps every
frame it reads (split at blank lines) and lets a test wait for a frame, plus frame parsers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import trio

wait_seconds_max = 10.0


def data_of(frame: bytes) -> dict:
    line = next(line for line in frame.split(b"\n") if line.startswith(b"data: "))
    return json.loads(line[6:])


def event_name_of(frame: bytes) -> str | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"event: "):
            return line[7:].decode()
    return None


def type_of(frame: bytes) -> str | None:
    """The event type: the ``event:`` name of control and gap frames, else ``data.type``."""
    name = event_name_of(frame)
    if name is not None:
        return name
    if b"data: " not in frame:
        return None
    return data_of(frame).get("type")


def seq_of(frame: bytes) -> int | None:
    for line in frame.split(b"\n"):
        if line.startswith(b"id: "):
            return int(line[4:])
    return None


def is_turn_end(frame: bytes) -> bool:
    return type_of(frame) in ("turn.completed", "turn.aborted")


class Follower:
    """``GET path`` as SSE in the background; ``frames`` grows as they arrive."""

    def __init__(self, client: httpx.AsyncClient, path: str, headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.path = path
        self.headers = headers or {}
        self.frames: list[bytes] = []
        self.status: int | None = None
        self.ended = trio.Event()
        self._scope = trio.CancelScope()

    async def run(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        buffer = b""
        with self._scope:
            try:
                async with self.client.stream("GET", self.path, headers=self.headers) as response:
                    self.status = response.status_code
                    task_status.started()
                    async for chunk in response.aiter_bytes():
                        buffer += chunk
                        *complete, buffer = buffer.split(b"\n\n")
                        self.frames += [frame + b"\n\n" for frame in complete]
            finally:
                self.ended.set()

    def close(self) -> None:
        self._scope.cancel()

    def of_type(self, kind: str) -> list[bytes]:
        return [frame for frame in self.frames if type_of(frame) == kind]

    async def wait_for(self, predicate: Callable[[bytes], bool], *, count: int = 1) -> list[bytes]:
        """The first ``count`` frames satisfying ``predicate`` (waiting for them)."""
        with trio.fail_after(wait_seconds_max):
            while True:
                found = [frame for frame in self.frames if predicate(frame)]
                if len(found) >= count:
                    return found[:count]
                if self.ended.is_set():
                    raise AssertionError(f"stream ended before {count} matching frames: {self.frames!r}")
                await trio.sleep(0.01)

    async def wait_type(self, kind: str, *, count: int = 1) -> list[bytes]:
        return await self.wait_for(lambda frame: type_of(frame) == kind, count=count)


async def follow(nursery: trio.Nursery, client: httpx.AsyncClient, path: str,
                 headers: dict[str, str] | None = None) -> Follower:
    follower = Follower(client, path, headers)
    await nursery.start(follower.run)
    return follower
