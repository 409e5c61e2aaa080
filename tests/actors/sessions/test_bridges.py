"""Bridges: first answer wins, 404 / 409 / 410, deadlines, degradation, bounds."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.sessions._bridges import (
    Answered,
    arguments_digest,
    pending_requests_max,
    settled_requests_remembered_max,
)
from troupe.sim._sim_env import sim_env

from .kernel_helpers import RecordingPorts


@pytest.fixture
def ports(tmp_path):
    return RecordingPorts(sim_env(1, str(tmp_path)))


def test_digest_is_canonical():
    assert arguments_digest({"b": 1, "a": "中"}) == arguments_digest({"a": "中", "b": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": 2})
    assert len(arguments_digest({})) == 64


async def test_tool_request_first_answer_wins(ports):
    bridges = ports.bridges
    answers = []

    async def ask():
        answers.append(await bridges.request_tool(turn_id="t", call_id="c1", name="n", arguments={}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await ports.wait_for("server.tool.request")
        assert bridges.pending_count() == 1
        assert isinstance(bridges.answer_tool("c1", "one"), Answered)
        assert bridges.answer_tool("c1", "two").code == "request_already_answered"
    assert answers[0].status == "answered" and answers[0].result == "one"
    assert bridges.pending_count() == 0
    assert bridges.answer_tool("c2", "x").code == "request_not_found"
    statistics = bridges.statistics()
    assert (statistics.requests, statistics.answered, statistics.pending) == (1, 1, 0)


async def test_tool_deadline_then_410(ports, autojump_clock):
    answer = await ports.bridges.request_tool(
        turn_id="t", call_id="c1", name="n", arguments={}, timeout_seconds=1.0
    )
    assert answer.status == "timeout"
    assert ports.bridges.answer_tool("c1", "late").status == 410


async def test_cancel_all_publishes_and_later_answers_are_410(ports):
    bridges = ports.bridges
    results = {}

    async def tool():
        results["tool"] = await bridges.request_tool(turn_id="t", call_id="c1", name="n", arguments={})

    async def permission():
        results["permission"] = await bridges.request_permission(
            turn_id="t", call_id="c2", name="Http", arguments={"url": "u"}, summary="GET u",
            attribution={"origin": "builtin"},
        )

    async def question():
        results["question"] = await bridges.ask_questions(turn_id="t", questions=[{"question": "?"}])

    async with trio.open_nursery() as nursery:
        for task in (tool, permission, question):
            nursery.start_soon(task)
        await ports.wait_for("server.tool.request")
        await ports.wait_for("server.permission.request")
        asked = await ports.wait_for("server.question.request")
        assert bridges.cancel_all("aborted_by_user") == 3
    assert results["tool"].status == "cancelled"
    assert (results["permission"].verdict, results["permission"].reason) == ("deny", "cancelled")
    assert results["question"].status == "cancelled"
    assert ports.payloads("server.tool.cancel")[0] == {
        "callId": "c1", "reason": "aborted_by_user", "ts": ports.payloads("server.tool.cancel")[0]["ts"]
    }
    assert ports.payloads("server.permission.closed")[0]["outcome"] == "cancelled"
    assert ports.payloads("server.question.closed")[0]["outcome"] == "cancelled"
    assert bridges.answer_tool("c1", {}).code == "request_cancelled"
    assert bridges.answer_question(asked["requestId"], []).code == "request_cancelled"


async def test_cancel_all_of_one_turn_only(ports):
    bridges = ports.bridges
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: bridges.request_tool(turn_id="t1", call_id="a", name="n", arguments={}))
        nursery.start_soon(lambda: bridges.request_tool(turn_id="t2", call_id="b", name="n", arguments={}))
        await ports.wait_for("server.tool.request", 2)
        assert bridges.cancel_all("x", turn_id="t1") == 1
        assert bridges.pending_count() == 1
        bridges.answer_tool("b", 1)


async def test_permission_digest_mismatch_keeps_request_open(ports):
    bridges = ports.bridges
    decisions = []

    async def ask():
        decisions.append(await bridges.request_permission(
            turn_id="t", call_id="c", name="WebFetch", arguments={"url": "https://x/"},
            summary="GET https://x/", attribution={"origin": "builtin"},
        ))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        asked = await ports.wait_for("server.permission.request")
        assert asked["digest"] == arguments_digest({"url": "https://x/"})
        assert asked["attribution"] == {"origin": "builtin", "callId": "c"}
        refused = bridges.answer_permission(asked["requestId"], "bad", "allow")
        assert (refused.code, refused.status) == ("digest_mismatch", 409)
        assert bridges.pending_count() == 1
        assert isinstance(bridges.answer_permission(asked["requestId"], asked["digest"], "allow"), Answered)
        assert bridges.answer_permission(asked["requestId"], asked["digest"], "deny").status == 409
    assert (decisions[0].verdict, decisions[0].reason) == ("allow", "answered")
    assert ports.payloads("server.permission.closed")[0]["verdict"] == "allow"


async def test_permission_expires_at_120_seconds(ports, autojump_clock):
    started = trio.current_time()
    decision = await ports.bridges.request_permission(
        turn_id="t", call_id="c", name="Http", arguments={}, summary=None, attribution={},
    )
    assert trio.current_time() - started == pytest.approx(120.0)
    assert (decision.verdict, decision.reason) == ("deny", "expired")
    assert "summary" not in ports.payloads("server.permission.request")[0]


async def test_question_waits_while_subscribed_and_degrades_after_grace(ports, autojump_clock):
    bridges = ports.bridges
    results = []

    async def ask():
        results.append(await bridges.ask_questions(turn_id="t", questions=[{"question": "?"}]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await trio.sleep(100)  # subscribed: no degradation
        assert not results
        ports.subscribed = False
        await trio.sleep(59)
        assert not results  # still inside the 60 s grace
        await trio.sleep(3)
    assert results[0].status == "degraded" and results[0].why == "unattended"


async def test_question_ends_at_its_ttl_even_with_subscribers(ports, autojump_clock):
    started = trio.current_time()
    result = await ports.bridges.ask_questions(turn_id="t", questions=[{"question": "?"}])
    assert trio.current_time() - started == pytest.approx(600.0)
    assert (result.status, result.why) == ("degraded", "expired")


async def test_pending_requests_are_bounded(ports):
    bridges = ports.bridges
    async with trio.open_nursery() as nursery:
        for index in range(pending_requests_max):
            nursery.start_soon(lambda index=index: bridges.request_tool(
                turn_id="t", call_id=f"c{index}", name="n", arguments={}))
        await ports.wait_for("server.tool.request", pending_requests_max)
        over = await bridges.request_tool(turn_id="t", call_id="over", name="n", arguments={})
        assert over.status == "refused"
        assert bridges.statistics().refused == 1
        bridges.cancel_all("done")


async def test_settled_ids_are_remembered_within_bound(ports, autojump_clock):
    bridges = ports.bridges
    for index in range(settled_requests_remembered_max + 1):
        await bridges.request_tool(turn_id="t", call_id=f"c{index}", name="n", arguments={},
                                   timeout_seconds=0.001)
    assert bridges.answer_tool("c0", {}).code == "request_not_found"  # forgotten: the oldest
    assert bridges.answer_tool("c1", {}).code == "request_cancelled"
