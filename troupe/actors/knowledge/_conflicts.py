"""Semantic conflict detection between a knowledge item and what a new write says about it.

Why it exists: the contract (§3.9, §4.2) wants every write checked against what is already
known, field by field, with an explicit resolution per changed field and an audit list
(``/conflicts``) whose severity never disagrees with the resolution.  Conflicts are detected
when a write's structured content lands on an existing ACTIVE knowledge item of the same scope
and the same subject (its normalised title); the diff walks both bodies and names each changed
leaf with a JSON path (``body.items[2].amount``).

Resolution rules (pure, deterministic, no model call, so the simulator replays them):

==========================================  ===========  ================================
old value → new value                        resolution   what the knowledge becomes
==========================================  ===========  ================================
missing or null → anything                   (none)       the new value (an addition)
list → list                                  MERGE        the union, old order first
same scalar type (number, string)            NEW_WINS     the new value
boolean flipped, or the types differ         MANUAL       the OLD value, until resolved
==========================================  ===========  ================================

Severity is derived from the resolution on every read (``severity_for``: MERGE→low,
NEW_WINS→medium, MANUAL→high) so a re-judged conflict is always self-consistent; the stored
column is only a copy kept for filtering.

Trade-off: "same subject" is the normalised title, not a model's judgement: cheap, exact and
replayable, and it misses paraphrased subjects (two titles for one thing stay two items).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Resolution = Literal["NEW_WINS", "MERGE", "MANUAL"]
Severity = Literal["low", "medium", "high"]
ConflictStatus = Literal["none", "resolved", "manual"]

resolutions: tuple[str, ...] = ("NEW_WINS", "MERGE", "MANUAL")
severity_by_resolution: Mapping[str, Severity] = {
    "MERGE": "low",
    "NEW_WINS": "medium",
    "MANUAL": "high",
}
conflict_fields_per_write_max = 64
"""Changed leaves recorded per write; a wholesale rewrite records the first ones."""
field_path_characters_max = 256
conflict_value_characters_max = 2_000
"""An old/new value longer than this (as JSON) is stored cut, with a marker."""
conflicts_list_max = 500
"""``/conflicts`` answers the newest this many."""
diff_depth_max = 16
"""Nesting deeper than this is compared as one value."""

assert set(severity_by_resolution) == set(resolutions)


def severity_for(resolution: str) -> Severity:
    """The contract's severity of a resolution (unknown ones are treated as MANUAL: the
    contract's clients default to "high" rather than miss a conflict)."""
    return severity_by_resolution.get(resolution, "high")


@dataclass(frozen=True)
class FieldChange:
    """One leaf that differs: its JSON path, both values, and how it is resolved."""

    field: str
    old_value: Any
    new_value: Any
    resolution: Resolution


@dataclass(frozen=True)
class ConflictPlan:
    """What a write does to an existing knowledge item: the changes that are conflicts (one
    audit row each), and the body the item takes (``merged_body``)."""

    changes: tuple[FieldChange, ...]
    merged_body: Any
    manual_pending: bool


_subject_drop = re.compile(r"[\s\W_]+", re.UNICODE)


def normalised_subject(title: str) -> str:
    """The subject key two writes must share to be compared: the title case-folded, with
    whitespace and punctuation removed."""
    return _subject_drop.sub("", title.casefold())


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def resolve_change(old_value: Any, new_value: Any) -> Resolution | None:
    """The resolution of one changed leaf (``None``: not a conflict, e.g. an addition)."""
    if old_value is None or old_value == new_value:
        return None
    if new_value is None:
        return "MANUAL"  # a value withdrawn: the user decides whether it is gone
    if isinstance(old_value, list) and isinstance(new_value, list):
        return "MERGE"
    if isinstance(old_value, bool) or isinstance(new_value, bool):
        return "MANUAL"  # a flipped yes/no is a contradiction, not an update
    if _is_number(old_value) and _is_number(new_value):
        return "NEW_WINS"
    if isinstance(old_value, str) and isinstance(new_value, str):
        return "NEW_WINS"
    return "MANUAL"


def _merged_list(old: list[Any], new: list[Any]) -> list[Any]:
    merged = list(old)
    for value in new:
        if value not in merged:
            merged.append(value)
    return merged


def _path(root: str, key: str | int) -> str:
    return f"{root}[{key}]" if isinstance(key, int) else f"{root}.{key}"


def _walk(
    old: Any, new: Any, path: str, depth: int, changes: list[FieldChange]
) -> Any:
    """The merged value of ``old`` and ``new`` at ``path``; appends the conflicts found."""
    if old == new:
        return old
    if depth < diff_depth_max and isinstance(old, dict) and isinstance(new, dict):
        merged = dict(old)
        for key, value in new.items():
            merged[key] = _walk(old.get(key), value, _path(path, str(key)), depth + 1, changes)
        return merged
    both_lists = isinstance(old, list) and isinstance(new, list)
    if depth < diff_depth_max and both_lists and len(old) == len(new) and all(
        isinstance(value, dict) for value in [*old, *new]
    ):
        # Records in the same positions (``items[2].amount``): compared element by element.
        return [
            _walk(old_value, new_value, _path(path, index), depth + 1, changes)
            for index, (old_value, new_value) in enumerate(zip(old, new, strict=True))
        ]
    resolution = resolve_change(old, new)
    if resolution is None:
        return new if old is None else old
    changes.append(FieldChange(path[:field_path_characters_max], old, new, resolution))
    if resolution == "NEW_WINS":
        return new
    if resolution == "MERGE":
        return _merged_list(old, new)
    return old  # MANUAL: the known value stays until someone decides


def detect_conflicts(old_body: Any, new_body: Any, *, root: str = "body") -> ConflictPlan:
    """Diffs two bodies (JSON values) leaf by leaf and resolves every difference (see the
    module docstring's table); equal bodies give an empty plan whose ``merged_body`` is the
    old body.  Keys the new body leaves out are kept (a write adds to what is known)."""
    changes: list[FieldChange] = []
    merged = _walk(old_body, new_body, root, 0, changes)
    recorded = tuple(changes[:conflict_fields_per_write_max])
    return ConflictPlan(
        changes=recorded,
        merged_body=merged,
        manual_pending=any(change.resolution == "MANUAL" for change in recorded),
    )


def explicit_update_changes(old_body: Any, new_body: Any, *, root: str = "body") -> tuple[FieldChange, ...]:
    """The field-level conflicts of an explicit ``/memory/update``: the leaves
    ``detect_conflicts`` finds changed, each resolved NEW_WINS, because the update already
    replaced the body with what was asked (a person or an approved agent chose the new
    value; nothing is left for a MANUAL decision and nothing was merged)."""
    plan = detect_conflicts(old_body, new_body, root=root)
    return tuple(FieldChange(change.field, change.old_value, change.new_value, "NEW_WINS")
                 for change in plan.changes)


def stored_value(value: Any) -> Any:
    """A conflict value as stored and shown: itself, or a cut JSON text with a marker when it
    is longer than ``conflict_value_characters_max``."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if len(text) <= conflict_value_characters_max:
        return value
    return text[: conflict_value_characters_max - 1] + "…"


def conflict_status_of(resolutions_pending: Iterable[tuple[str, bool]]) -> ConflictStatus:
    """``conflict_status`` of a knowledge item from its conflicts' ``(resolution, pending)``:
    ``manual`` while a MANUAL one is pending, ``resolved`` when it has any other, else
    ``none``."""
    status: ConflictStatus = "none"
    for resolution, pending in resolutions_pending:
        if resolution == "MANUAL" and pending:
            return "manual"
        status = "resolved"
    return status


__all__ = [
    "ConflictPlan",
    "ConflictStatus",
    "FieldChange",
    "Resolution",
    "Severity",
    "conflict_fields_per_write_max",
    "conflict_status_of",
    "conflict_value_characters_max",
    "conflicts_list_max",
    "detect_conflicts",
    "diff_depth_max",
    "explicit_update_changes",
    "field_path_characters_max",
    "normalised_subject",
    "resolutions",
    "resolve_change",
    "severity_by_resolution",
    "severity_for",
    "stored_value",
]
