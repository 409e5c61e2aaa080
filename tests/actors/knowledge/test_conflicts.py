"""Conflict detection: the resolution table, JSON paths, merged bodies, severity derived from
the resolution, conflict status, and the bounds on recorded changes and stored values."""

from __future__ import annotations

from troupe.actors.knowledge._conflicts import (
    conflict_fields_per_write_max,
    conflict_status_of,
    conflict_value_characters_max,
    detect_conflicts,
    normalised_subject,
    resolve_change,
    severity_for,
    stored_value,
)


def test_resolution_table():
    assert resolve_change(None, 5) is None  # an addition
    assert resolve_change(5, 5) is None
    assert resolve_change(156, 186) == "NEW_WINS"
    assert resolve_change("a", "b") == "NEW_WINS"
    assert resolve_change(["a"], ["b"]) == "MERGE"
    assert resolve_change(True, False) == "MANUAL"
    assert resolve_change(1, "one") == "MANUAL"
    assert resolve_change("x", None) == "MANUAL"


def test_severity_is_derived_from_resolution():
    assert [severity_for(r) for r in ("MERGE", "NEW_WINS", "MANUAL", "UNKNOWN")] == [
        "low", "medium", "high", "high"]


def test_detect_conflicts_names_json_paths_and_merges():
    old = {"items": [{"amount": 210}, {"amount": 68.5}, {"amount": 156}], "tags": ["电费"],
           "paid": True, "note": "x"}
    new = {"items": [{"amount": 210}, {"amount": 68.5}, {"amount": 186}], "tags": ["水费"],
           "paid": False, "extra": 1}
    plan = detect_conflicts(old, new)
    found = [(c.field, c.old_value, c.new_value, c.resolution) for c in plan.changes]
    assert found == [
        ("body.items[2].amount", 156, 186, "NEW_WINS"),
        ("body.tags", ["电费"], ["水费"], "MERGE"),
        ("body.paid", True, False, "MANUAL"),
    ]
    assert plan.merged_body == {"items": [{"amount": 210}, {"amount": 68.5}, {"amount": 186}],
                                "tags": ["电费", "水费"], "paid": True, "note": "x", "extra": 1}
    assert plan.manual_pending


def test_equal_bodies_have_no_conflicts():
    plan = detect_conflicts({"a": 1}, {"a": 1})
    assert plan.changes == () and plan.merged_body == {"a": 1} and not plan.manual_pending


def test_recorded_changes_are_bounded():
    old = {f"k{i}": i for i in range(conflict_fields_per_write_max + 1)}
    new = {key: value + 1 for key, value in old.items()}
    assert len(detect_conflicts(old, new).changes) == conflict_fields_per_write_max
    below = dict(list(old.items())[:conflict_fields_per_write_max])
    assert len(detect_conflicts(below, {k: v + 1 for k, v in below.items()}).changes) == (
        conflict_fields_per_write_max)


def test_stored_values_are_cut_just_over_the_limit():
    fits = "x" * (conflict_value_characters_max - 2)  # JSON adds two quotes
    assert stored_value(fits) == fits
    cut = stored_value(fits + "y")
    assert isinstance(cut, str) and len(cut) == conflict_value_characters_max and cut.endswith("…")


def test_conflict_status():
    assert conflict_status_of([]) == "none"
    assert conflict_status_of([("NEW_WINS", False)]) == "resolved"
    assert conflict_status_of([("MANUAL", False), ("MERGE", False)]) == "resolved"
    assert conflict_status_of([("NEW_WINS", False), ("MANUAL", True)]) == "manual"


def test_subjects_ignore_case_spaces_and_punctuation():
    assert normalised_subject("April Bill!") == normalised_subject("april  bill")
    assert normalised_subject("2026年4月家庭支出清单") == "2026年4月家庭支出清单"
