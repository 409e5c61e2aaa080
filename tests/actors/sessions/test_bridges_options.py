"""Question answers in the structured shape name only what the question asked: an invented
option or question, or two options for a single-select question, is ``validation_failed`` and
leaves the request pending (issue 12)."""

from __future__ import annotations

import pytest
import trio

from troupe.actors.sessions._bridges import Answered, answers_problem, offered_option_ids
from troupe.sim._sim_env import sim_env

from .kernel_helpers import RecordingPorts

asked = [{"id": "q1", "question": "Which?", "options": [{"id": "opt-a", "label": "A"}, {"label": "B"}, "C"]},
         {"id": "q2", "question": "Say something"},
         {"id": "q3", "question": "Which ones?", "multiSelect": True, "options": ["x", "y", "z"]}]


@pytest.fixture
def ports(tmp_path):
    return RecordingPorts(sim_env(1, str(tmp_path)))


def test_offered_ids_are_id_then_label_then_the_string():
    assert offered_option_ids(asked[0]) == {"opt-a", "B", "C"}
    assert offered_option_ids(asked[1]) == frozenset()


@pytest.mark.parametrize("answers, problem", [
    ([{"questionId": "q1", "selectedOptionIds": ["B"]}], None),
    ([{"questionId": "q3", "selectedOptionIds": ["x", "y", "z"]}], None),  # multiSelect: true
    ([{"questionId": "q3", "selectedOptionIds": []}], None),
    # Single select (no multiSelect, or not exactly true): one option at most.
    ([{"questionId": "q1", "selectedOptionIds": ["opt-a", "B"]}],
     {"reason": "single_select", "questionId": "q1", "optionsMax": 1}),
    ([{"questionId": "q3", "selectedOptionIds": ["x", "x"]}], {"reason": "option_repeated", "questionId": "q3"}),
    ([{"questionId": "q2", "selectedOptionIds": [], "freeText": "hi"}], None),
    (["蓝"], None),  # free-form answers are the client's business
    ([{"questionId": "q1", "selected": ["anything"]}], None),
    ([{"questionId": "q1", "selectedOptionIds": ["invented-option"]}],
     {"reason": "option_not_offered", "questionId": "q1", "optionId": "invented-option"}),
    ([{"questionId": "q1", "selectedOptionIds": ["A"]}],  # a label whose option has an id
     {"reason": "option_not_offered", "questionId": "q1", "optionId": "A"}),
    ([{"questionId": "q2", "selectedOptionIds": ["x"]}],
     {"reason": "option_not_offered", "questionId": "q2", "optionId": "x"}),
    ([{"questionId": "q9", "selectedOptionIds": []}], {"reason": "question_not_asked", "questionId": "q9"}),
    ([{"questionId": "q1", "selectedOptionIds": "opt-a"}], {"reason": "options_malformed", "questionId": "q1"}),
])
def test_answers_problem(answers, problem):
    assert answers_problem(asked, answers) == problem


async def test_invented_option_is_refused_and_changes_nothing(ports):
    bridges = ports.bridges
    results = []

    async def ask():
        results.append(await bridges.ask_questions(turn_id="t", questions=asked))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        request = await ports.wait_for("server.question.request")
        request_id = request["requestId"]
        refused = bridges.answer_question(request_id, [{"questionId": "q1", "selectedOptionIds": ["invented-option"]}])
        assert (refused.code, refused.status) == ("validation_failed", 400)
        assert refused.detail["optionId"] == "invented-option"
        assert bridges.pending_count() == 1 and not ports.payloads("server.question.closed")
        right = [{"questionId": "q1", "selectedOptionIds": ["opt-a"]}]
        assert isinstance(bridges.answer_question(request_id, right), Answered)
    assert results[0].status == "answered" and results[0].answers == tuple(right)
