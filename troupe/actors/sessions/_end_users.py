"""The ``("end_user", id)`` actor: admission of live sessions per end user, and the listing.

The contract caps the *active* sessions of one end user (default 8; one more is 429
``session_limit_exceeded`` with Retry-After).  Active means live: an epoch is open in this
process (created, resumed or forked, and not yet closed or passivated).  Each session actor
asks ``AdmitSession`` before it opens an epoch and tells ``ReleaseSession`` when the epoch
ends (close, passivation, or, after a crash, its next activation), so the set of admitted
sessions is owned by exactly one actor and needs no lock.

Trade-off: the admitted set lives in memory only.  It is only meaningful while the sessions
it counts are live in this same process, and they all die with the process, so there is
nothing to recover after a restart.  While it admits anything the actor holds a background
task (``ActorContext.start_task``), which keeps it from idle passivation; once the set is
empty the task ends and the actor idles out normally.  (It never passivates itself: a
message queued behind that request would run on the departing instance and be forgotten.)
If the live-actor cap evicts it anyway, the next admission starts from an empty set and the
cap is briefly under-counted (never over-counted, so nobody is refused wrongly).

The same actor answers ``GET /v2/sessions``: the stored rows, newest activity first, with
``live`` and the live status of the sessions it admitted (sessions tell it their status as it
changes, so a list costs one read and no round trip to each session).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from troupe.runtime import Actor, ActorContext, ActorKind, TaskEnded

from ._protocol import ListSessions, SessionList, SessionMeta, SessionRefused, end_user_kind_name
from ._store import list_sessions, session_status_idle

active_sessions_per_end_user_max = 8
"""The contract's default cap on live sessions per end user."""

session_limit_retry_after_seconds = 30.0
"""Retry-After for ``session_limit_exceeded``: a slot frees when a session closes or idles out."""

assert active_sessions_per_end_user_max >= 1
assert session_limit_retry_after_seconds > 0


_hold_task_name = "hold"
"""The task that keeps this actor activated while it admits sessions."""


@dataclass(frozen=True)
class AdmitSession:
    """A session is about to open an epoch.  Admitting an already admitted id is a no-op."""

    session_id: str


@dataclass(frozen=True)
class Admitted:
    session_id: str
    active: int


@dataclass(frozen=True)
class ReleaseSession:
    """The session's epoch ended (tell; releasing an unknown id is a no-op)."""

    session_id: str


@dataclass(frozen=True)
class NoteSessionState:
    """A live session's status changed (tell): what ``ListSessions`` shows for it."""

    session_id: str
    status: str
    last_seq: int
    last_activity_at_ms: int


@dataclass
class _LiveState:
    status: str = session_status_idle
    last_seq: int | None = None
    last_activity_at_ms: int | None = None


class EndUserActor(Actor):
    def __init__(self, context: ActorContext, *, active_sessions_max: int) -> None:
        super().__init__(context)
        self.active_sessions_max = active_sessions_max
        self.admitted: dict[str, _LiveState] = {}

    async def receive(self, message: Any) -> Any:
        if isinstance(message, AdmitSession):
            return self._admit(message.session_id)
        if isinstance(message, ReleaseSession):
            self.admitted.pop(message.session_id, None)
            if not self.admitted:
                self.context.cancel_task(_hold_task_name)
            return None
        if isinstance(message, TaskEnded):
            return None
        if isinstance(message, NoteSessionState):
            state = self.admitted.get(message.session_id)
            if state is not None:
                state.status = message.status
                state.last_seq = message.last_seq
                state.last_activity_at_ms = message.last_activity_at_ms
            return None
        if isinstance(message, ListSessions):
            return await self._list(message)
        raise TypeError(f"end_user actor cannot handle {type(message).__name__}")

    def _admit(self, session_id: str) -> Admitted | SessionRefused:
        if session_id in self.admitted:
            return Admitted(session_id, len(self.admitted))
        if len(self.admitted) >= self.active_sessions_max:
            return SessionRefused(
                "session_limit_exceeded",
                f"活跃会话已达上限（{self.active_sessions_max}）",
                {"limit": self.active_sessions_max},
                retry_after_seconds=session_limit_retry_after_seconds,
            )
        self.admitted[session_id] = _LiveState()
        if not self.context.task_running(_hold_task_name):
            self.context.start_task(_hold_task_name, trio.sleep_forever)
        return Admitted(session_id, len(self.admitted))

    async def _list(self, message: ListSessions) -> SessionList:
        end_user_id = self.context.key
        rows, total = await self.context.storage.read(
            lambda connection: list_sessions(connection, end_user_id, message.limit, message.offset)
        )
        sessions = []
        for row in rows:
            state = self.admitted.get(row.session_id)
            live = state is not None
            last_seq = row.last_seq
            status = row.status
            last_activity = row.last_activity_at_ms
            if state is not None:
                status = state.status
                last_seq = state.last_seq if state.last_seq is not None else last_seq
                last_activity = state.last_activity_at_ms or last_activity
            elif status == "running":
                # A dormant session is never running: that row was left by a crash mid-turn.
                status = session_status_idle
            sessions.append(
                SessionMeta(
                    session_id=row.session_id,
                    end_user_id=row.end_user_id,
                    status=status,
                    live=live,
                    last_seq=last_seq,
                    created_at_ms=row.created_at_ms,
                    last_activity_at_ms=last_activity,
                    title=row.title,
                )
            )
        return SessionList(tuple(sessions), total)


def end_user_actor_kind(
    *, active_sessions_max: int = active_sessions_per_end_user_max, **options: Any
) -> ActorKind:
    """The ``end_user`` kind; ``options`` go to ``ActorKind`` (mailbox, timeouts)."""
    assert active_sessions_max >= 1
    factory: Callable[[ActorContext], Actor] = lambda context: EndUserActor(  # noqa: E731
        context, active_sessions_max=active_sessions_max
    )
    return ActorKind(end_user_kind_name, factory, **options)


__all__ = [
    "AdmitSession",
    "Admitted",
    "EndUserActor",
    "NoteSessionState",
    "ReleaseSession",
    "active_sessions_per_end_user_max",
    "end_user_actor_kind",
    "session_limit_retry_after_seconds",
]
