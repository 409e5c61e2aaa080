"""Per-end-user admission: the cap of live sessions (default 8) at and just over its bound,
released on close and on passivation, per user; through real session actors too."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.sessions import (
    CloseSession,
    CreateOptions,
    OpenSession,
    SessionOpened,
    new_session_id,
)
from troupe.actors.sessions._end_users import (
    AdmitSession,
    Admitted,
    ReleaseSession,
    active_sessions_per_end_user_max,
    end_user_actor_kind,
    session_limit_retry_after_seconds,
)
from troupe.actors.sessions._schema import sessions_migrations
from troupe.actors.sessions._session import SessionSettings, session_actor_kind
from troupe.runtime import ActorSystem, real_env
from troupe.storage import Engine


@pytest.fixture
async def system(nursery, tmp_path):
    env = real_env(str(tmp_path))
    engine = await Engine.open(env, nursery=nursery, migrations=[*sessions_migrations])
    system = ActorSystem(env, [session_actor_kind(SessionSettings()), end_user_actor_kind()], storage=engine)
    await nursery.start(system.run)
    return system


async def test_the_cap_is_eight_and_the_ninth_is_refused_with_retry_after(system):
    assert active_sessions_per_end_user_max == 8
    end_user = system.ref("end_user", "u_1")
    for index in range(8):
        reply = await end_user.ask(AdmitSession(f"s_{index}"))
        assert reply == Admitted(f"s_{index}", index + 1)
    again = await end_user.ask(AdmitSession("s_0"))
    assert again == Admitted("s_0", 8)  # already admitted: no new slot
    refused = await end_user.ask(AdmitSession("s_8"))
    assert refused.code == "session_limit_exceeded" and refused.status == 429
    assert refused.retry_after_seconds == session_limit_retry_after_seconds
    assert (await system.ref("end_user", "u_2").ask(AdmitSession("s_8"))).active == 1  # per user
    end_user.tell(ReleaseSession("s_3"))
    assert (await end_user.ask(AdmitSession("s_8"))).active == 8


async def test_sessions_hold_slots_until_closed_or_passivated(system):
    opened = []
    for _ in range(8):
        session_id = new_session_id(system.env)
        reply = await system.ref("session", session_id).ask(
            OpenSession(end_user_id="u_1", mode="create", options=CreateOptions())
        )
        assert isinstance(reply, SessionOpened)
        opened.append(session_id)
    ninth = new_session_id(system.env)
    refused = await system.ref("session", ninth).ask(OpenSession(end_user_id="u_1", mode="create"))
    assert refused.code == "session_limit_exceeded" and refused.retry_after_seconds > 0
    await system.ref("session", opened[0]).ask(CloseSession(end_user_id="u_1"))
    reply = await system.ref("session", ninth).ask(OpenSession(end_user_id="u_1", mode="create"))
    assert isinstance(reply, SessionOpened)
    # Passivation (here: draining the system) releases every slot; resumes are admitted again.
    await system.drain()
    for session_id in opened[1:4]:
        reply = await system.ref("session", session_id).ask(OpenSession(end_user_id="u_1", mode="resume"))
        assert reply.resumed is True
    with trio.fail_after(1):
        admitted = await system.ref("end_user", "u_1").ask(AdmitSession("probe"))
    assert admitted.active == 4


async def test_admitting_keeps_the_actor_activated_and_an_empty_set_idles_out(nursery, tmp_path):
    env = real_env(str(tmp_path))
    system = ActorSystem(env, [end_user_actor_kind(idle_seconds=0.2)])
    await nursery.start(system.run)
    end_user = system.ref("end_user", "u_1")
    await end_user.ask(AdmitSession("s_1"))
    await trio.sleep(0.6)
    assert system.live_count == 1  # the admission survived three idle periods
    assert (await end_user.ask(AdmitSession("s_2"))).active == 2
    end_user.tell(ReleaseSession("s_1"))
    end_user.tell(ReleaseSession("s_2"))
    with trio.fail_after(2):
        while system.live_count:
            await trio.sleep(0.05)
