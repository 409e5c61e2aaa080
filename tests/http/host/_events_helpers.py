"""Helpers for the notifications and events tests: publish reminders through the goals
slice's publication function (``publish``), and read SSE frames from a real connection."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio

from troupe.actors.host import Goal, cancel_notifications, publish
from troupe.actors.host._goal_schema import (
    dedup_state_none,
    goal_kind_normal,
    goal_status_active,
    notification_kind_goal_dedup,
)

events_path = "/api/v1/events"
status_path = "/api/v1/events/status"
notifications_path = "/api/v1/notifications"


def goal_for(goal_id: int, *, entry_id: str | None = None, content: str = "整理出行清单",
             deadline_at: float = 1_791_800_000.0, schedule_revision: int = 1) -> Goal:
    """A goal as the publication function sees it (no goals row is needed to publish)."""
    return Goal(
        id=goal_id, content=content, content_key=content, kind=goal_kind_normal, people=(), entry_id=entry_id,
        deadline_at=deadline_at, deadline_is_date=False, reminder_minutes=30, status=goal_status_active,
        revision=1, schedule_revision=schedule_revision, canonical_id=None, dedup_state=dedup_state_none,
        dedup_candidate_id=None, dedup_queued_at=None, dedup_fallback_at=None, dedup_released_at=None,
        dedup_attempts=0, basis_changed_at=None, source="test", created_at=0.0, updated_at=0.0,
        completed_at=None, abandoned_at=None,
    )


async def publish_reminders(host: Any, goals: list[Goal], *, reminder_kind: str = "due") -> list[int]:
    """Publish one reminder per goal in one transaction; their notification ids."""
    now = host.clock.wall()

    def job(connection: Any) -> list[int]:
        ids = [publish(connection, goal, reminder_kind, goal.deadline_at or now, now) for goal in goals]
        assert all(identifier is not None for identifier in ids)
        return ids

    return await host.engine.write(job)


async def publish_one(host: Any, goal_id: int, **fields: Any) -> int:
    return (await publish_reminders(host, [goal_for(goal_id, **fields)]))[0]


async def publish_dedup_notice(host: Any, goal_id: int, entry_id: str | None = None) -> int:
    now = host.clock.wall()

    def job(connection: Any) -> int:
        connection.execute(
            "INSERT INTO host_notifications (kind, goal_id, entry_id, reminder_kind, schedule_revision, "
            "deadline_at, scheduled_at, published_at, content, status) VALUES (?, ?, ?, NULL, 1, NULL, ?, ?, ?, 'pending')",
            (notification_kind_goal_dedup, goal_id, entry_id, now, now, "合并"))
        return connection.last_insert_rowid()

    return await host.engine.write(job)


async def cancel_goal_notifications(host: Any, goal_id: int) -> None:
    now = host.clock.wall()
    await host.engine.write(lambda connection: cancel_notifications(connection, goal_id, now))


@dataclass(frozen=True)
class Frame:
    id: str | None
    event: str | None
    data: Any


class FrameReader:
    """SSE frames of an open httpx streaming response (spec parsing: fields per line, blank
    line ends a frame, comment lines ignored)."""

    def __init__(self, response: Any) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next(self, timeout: float = 5.0) -> Frame | None:
        """The next frame, or None when the stream ended."""
        fields: dict[str, list[str]] = {}
        with trio.fail_after(timeout):
            async for line in self._lines:
                if line == "":
                    if fields:
                        data = "\n".join(fields.get("data", []))
                        return Frame(fields.get("id", [None])[-1], fields.get("event", [None])[-1],
                                     json.loads(data) if data else None)
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                fields.setdefault(name, []).append(value[1:] if value.startswith(" ") else value)
        return None

    async def until(self, event: str, timeout: float = 5.0) -> Frame:
        while True:
            frame = await self.next(timeout)
            assert frame is not None, f"stream ended before a {event} frame"
            if frame.event == event:
                return frame

    async def rest(self, timeout: float = 5.0) -> list[Frame]:
        """Every frame until the stream ends."""
        frames = []
        while (frame := await self.next(timeout)) is not None:
            frames.append(frame)
        return frames


@asynccontextmanager
async def open_events(client: Any, *, headers: dict[str, str] | None = None, params: Any = None):
    """``GET /events`` as a stream: yields ``(response, FrameReader)``."""
    async with client.stream("GET", events_path, headers=headers or {}, params=params) as response:
        yield response, FrameReader(response)


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not await predicate():
            await trio.sleep(0.02)
