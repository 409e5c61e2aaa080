"""``explain`` and the HTML timeline on a hand-built trace (``troupe sim explain`` on a real
failing replay is in test_simulator.py, where the sweep already shrank one)."""

from troupe.sim._explain import events_per_actor_max, explain
from troupe.sim._timeline import records_drawn_max, timeline_html, write_timeline_html
from troupe.sim._violation import Violation


def hand_built_trace():
    """A deposit acknowledged before its commit, a process crash, and the write gone."""
    rows = [
        (1_000_000, "invoke", "client", "a1", {"op": 17, "operation": "deposit", "amount": 5}),
        (1_000_010, "activate", "account", "a1", {}),
        (1_000_020, "turn", "account", "a1", {"id": "m-17", "message": "Deposit"}),
        (1_000_030, "ack", "client", "a1", {"op": 17, "result": 105}),
        (1_000_035, "turn", "account", "a2", {"id": "m-18", "message": "Balance"}),
        (1_000_040, "fault", "account", "a2", {"point": "turn_raises"}),
        (1_000_041, "crash", "account", "a2", {"error": "InjectedFault"}),
        (1_000_050, "commit", "storage", "", {"batch": 3, "jobs": 2}),
        (1_500_000, "sim_crash", "sim", "", {"generation": 1}),
        (1_600_000, "sim_restart", "sim", "", {"generation": 2}),
        (1_700_000, "activate", "account", "a1", {}),
    ]
    rows += [(1_800_000 + index, "turn", "account", "a3", {"id": f"m-{index}"}) for index in range(100)]
    return [[number, *row] for number, row in enumerate(rows, start=1)]


def test_explain_tells_the_operation_and_what_happened_between_per_actor():
    records = hand_built_trace()
    violation = Violation("acknowledged write lost: a1 op 17", sequences=(4, 11), actors=(("account", "a1"),),
                          checker="history")
    story = explain(records, violation)
    assert story.startswith("Violation [history]: acknowledged write lost: a1 op 17")
    assert "Trace records named: #4, #11" in story
    operations = story.split("Operations involved:")[1].split("Events from")[0]
    # The ack was named; its invocation is found by the op id.
    assert "op 17 on a1: invoke -> ack" in operations and "#1 " in operations and "#4 " in operations
    assert "Events from #1 to #11" in story
    window = story.split("Events from")[1]
    assert window.index("account/a1:") < window.index("account/a2:")
    assert "[FAULT] fault point=turn_raises" in window
    assert "[CRASH] crash error=InjectedFault" in window and "[CRASH] sim_crash" in window
    assert "[COMMIT] commit batch=3 jobs=2" in window
    assert "[RESTART] sim_restart" in window
    assert "#11 t=1.700000 activate   <-- named by the violation" in window
    assert "account/a3" not in window  # after the window


def test_explain_is_bounded_and_says_what_it_left_out():
    records = hand_built_trace()
    violation = Violation("too many turns", sequences=(12, 111))
    story = explain(records, violation)
    assert "Operations involved: none named by the violation" in story
    lane = story.split("account/a3: 100 events")[1]
    assert lane.count("\n    #") == events_per_actor_max
    assert "events left out" in lane
    assert "#12 " in lane and "#111 " in lane  # the named ones are always kept


def test_explain_without_sequences_falls_back_to_the_actors_last_events():
    story = explain(hand_built_trace(), "applied twice: key k1")
    assert "names no record of this trace" in story and "account/a3" in story
    story = explain(hand_built_trace(), Violation("dirty instance", actors=(("account", "a2"),)))
    assert "account/a2: 3 events" in story and "account/a3" not in story


def test_html_timeline_is_self_contained_with_lanes_and_highlights(tmp_path):
    records = hand_built_trace()
    path = tmp_path / "timeline.html"
    write_timeline_html(records, str(path), [Violation("lost <write>", sequences=(4,), actors=(("account", "a1"),))])
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and "</html>" in page
    for lane in ("account/a1", "account/a2", "account/a3", "client/a1", "storage"):
        assert f">{lane}<title>" in page
    assert page.count('class="highlight"') == 1 and "lost &lt;write&gt;" in page
    assert 'class="crash"' in page and 'class="fault"' in page and 'class="commit"' in page
    assert 'class="sim_crash"' in page and 'class="sim_restart"' in page
    assert "<script" not in page and "<link" not in page and "https://" not in page


def test_html_timeline_draws_a_bounded_window_around_the_violation():
    records = [[number, number * 10, "turn", "account", f"a{number % 50}", {}] for number in range(1, 20_001)]
    page = timeline_html(records, [Violation("x", sequences=(15_000,))])
    assert page.count('class="event"') + page.count('class="highlight"') <= records_drawn_max + 1
    assert f"({records_drawn_max} of 20000)" in page and 'class="highlight"' in page
    assert ">(other actors)<title>" in page


def test_plain_text_violation_tells_the_actors_whose_keys_it_mentions():
    story = explain(hand_built_trace(), "[quiescence] acknowledged result changed: op 17 on a2: 105 vs 5")
    assert "for the actors it names" in story
    assert "account/a2: 3 events" in story and "account/a1" not in story and "account/a3" not in story
