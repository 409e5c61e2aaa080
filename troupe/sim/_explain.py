"""The story of a violation, told from the trace: what the clients did and what happened between.

A violation names trace sequence numbers (a client's invocation and acknowledgement, a commit,
a crash).  ``explain`` turns those into text a person can follow: first the operations involved
(every client record of the same operation, found by its op id, so an acknowledgement also
brings its invocation), then every event between the earliest and the latest of them, grouped
per actor (``kind/key``) in trace order, with faults, crashes and commits marked.

The output is bounded, because a window can span thousands of events: at most
``actors_shown_max`` actors (those the violation names and those with named, crash or fault
events first) and ``events_per_actor_max`` events each (named, crash and fault events first,
then the ones closest to the end of the window), and it says how much it left out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ._violation import Violation, as_violation

events_per_actor_max = 24
actors_shown_max = 12
operations_shown_max = 12
field_text_characters_max = 60
fallback_records_count = 60
"""When a violation names no record: how many of the trace's last records to tell instead."""

client_events = frozenset({"invoke", "ack", "fail", "unknown"})
crash_events = frozenset({"crash", "child_crash", "sim_crash", "sim_power_loss", "escalate", "kind_failed",
                          "poison", "activation_failed", "passivate_failed"})
fault_events = frozenset({"fault", "commit_failed", "overloaded", "unavailable", "unavailable_refused",
                          "turn_timeout", "timer_dropped", "reminder_poison", "reminder_error"})
restart_events = frozenset({"restart", "recover", "sim_restart", "sim_clean_restart"})
commit_events = frozenset({"commit"})


def event_mark(event: str) -> str:
    """The tag shown before an event's name: what kind of moment it is, at a glance."""
    if event in crash_events:
        return "[CRASH] "
    if event in fault_events:
        return "[FAULT] "
    if event in restart_events:
        return "[RESTART] "
    if event in commit_events:
        return "[COMMIT] "
    return ""


def lane_name(kind: str, key: str) -> str:
    if kind and key:
        return f"{kind}/{key}"
    return kind or key or "(runtime)"


def explain(records: Sequence[Sequence[Any]], violation: Violation | str) -> str:
    """The story of ``violation`` in the trace ``records`` (``read_trace`` lists)."""
    violation = as_violation(violation)
    by_sequence = {record[0]: record for record in records}
    named = [number for number in violation.sequences if number in by_sequence]
    missing = [number for number in violation.sequences if number not in by_sequence]
    lines = [f"Violation{f' [{violation.checker}]' if violation.checker else ''}: {violation.text}"]
    if violation.sequences:
        lines.append(f"Trace records named: {_numbers(named) or 'none found'}"
                     + (f" (not in this trace: {_numbers(missing)})" if missing else ""))
    if violation.actors:
        lines.append("Actors: " + ", ".join(lane_name(kind, key) for kind, key in violation.actors))
    operations = _operations(records, [by_sequence[number] for number in named])
    involved = set(named) | {record[0] for group in operations.values() for record in group}
    lines.append("")
    lines += _operation_lines(operations)
    if involved:
        first, last = min(involved), max(involved)
        window = [record for record in records if first <= record[0] <= last]
        lines.append(f"Events from #{first} to #{last} (t={_seconds(by_sequence[first][1])}"
                     f"..{_seconds(by_sequence[last][1])}), per actor:")
        actors = violation.actors
    else:
        # A violation that names no record (an older checker's plain text) may still name keys.
        actors = violation.actors or _mentioned_actors(records, violation.text)
        window = _fallback_window(records, actors)
        lines.append(f"The violation names no record of this trace; its last {len(window)} events"
                     f"{' for the actors it names' if actors else ''}, per actor:")
    lines += _window_lines(window, involved, set(named), actors)
    return "\n".join(lines) + "\n"


def _operations(records, named_records) -> dict[tuple[str, str, Any], list[Sequence[Any]]]:
    """Every client record of each operation a named client record belongs to."""
    wanted = {_operation_identity(record) for record in named_records} - {None}
    operations: dict[tuple[str, str, Any], list[Sequence[Any]]] = {identity: [] for identity in sorted(wanted, key=str)}
    if not wanted:
        return operations
    for record in records:
        identity = _operation_identity(record)
        if identity in operations:
            operations[identity].append(record)
    return operations


def _operation_identity(record: Sequence[Any]) -> tuple[str, str, Any] | None:
    """(kind, key, op) of a client history record; the kind is the history's, usually "client"."""
    fields = record[5]
    if record[2] in client_events and isinstance(fields, dict) and "op" in fields:
        return (record[3], record[4], fields["op"])
    return None


def _operation_lines(operations) -> list[str]:
    if not operations:
        return ["Operations involved: none named by the violation", ""]
    lines = ["Operations involved:"]
    for (_, key, op), group in list(operations.items())[:operations_shown_max]:
        outcome = group[-1][2] if group else "?"
        lines.append(f"  op {op} on {key}: {' -> '.join(record[2] for record in group)}"
                     f"{'' if outcome != 'invoke' else ' (never completed)'}")
        for record in group:
            lines.append("    " + _record_line(record, named=set()))
    if len(operations) > operations_shown_max:
        lines.append(f"  ... {len(operations) - operations_shown_max} more operations left out")
    lines.append("")
    return lines


def _fallback_window(records, actors) -> list[Sequence[Any]]:
    actors = set(actors)
    chosen = [record for record in records if not actors or (record[3], record[4]) in actors]
    return chosen[-fallback_records_count:]


def _mentioned_actors(records, text: str) -> tuple[tuple[str, str], ...]:
    """Actors whose key appears in ``text`` as a whole word (``acct-1`` but not ``acct-10``)."""
    addresses = {(record[3], record[4]) for record in records if record[4]}
    keys = {key for _, key in addresses if re.search(rf"(?<![\w.-]){re.escape(key)}(?![\w-])", text)}
    return tuple(sorted(address for address in addresses if address[1] in keys))


def _window_lines(window, involved: set[int], named: set[int], actors) -> list[str]:
    lanes: dict[tuple[str, str], list[Sequence[Any]]] = {}
    for record in window:
        lanes.setdefault((record[3], record[4]), []).append(record)
    named_actors = set(actors)

    def priority(item) -> int:
        address, events = item
        if address in named_actors or any(record[0] in involved for record in events):
            return 0
        if any(event_mark(record[2]) for record in events):
            return 1
        return 2

    ordered = sorted(lanes.items(), key=priority)  # stable: first appearance within a priority
    lines = []
    for (kind, key), events in ordered[:actors_shown_max]:
        lines.append(f"  {lane_name(kind, key)}: {len(events)} event{'s' if len(events) != 1 else ''}")
        lines += ["    " + line for line in _lane_lines(events, involved, named)]
    left_out = ordered[actors_shown_max:]
    if left_out:
        names = ", ".join(lane_name(kind, key) for (kind, key), _ in left_out[:5])
        count = sum(len(events) for _, events in left_out)
        lines.append(f"  ... {len(left_out)} more actors ({count} events) left out: {names}"
                     f"{', ...' if len(left_out) > 5 else ''}")
    return lines


def _lane_lines(events, involved: set[int], named: set[int]) -> list[str]:
    """One actor's events, at most ``events_per_actor_max``: named and marked ones first, then
    the latest; gaps say how many were skipped."""
    if len(events) <= events_per_actor_max:
        kept = set(range(len(events)))
    else:
        important = [index for index, record in enumerate(events)
                     if record[0] in involved or event_mark(record[2]) in ("[CRASH] ", "[FAULT] ")]
        kept = set(important[:events_per_actor_max])
        for index in range(len(events) - 1, -1, -1):
            if len(kept) >= events_per_actor_max:
                break
            kept.add(index)
    lines = []
    previous = -1
    for index in sorted(kept):
        if index - previous > 1:
            lines.append(f"... {index - previous - 1} events left out ...")
        lines.append(_record_line(events[index], named))
        previous = index
    if previous < len(events) - 1:
        lines.append(f"... {len(events) - 1 - previous} events left out ...")
    return lines


def _record_line(record: Sequence[Any], named: set[int]) -> str:
    number, moment, event, _, _, fields = record
    text = f"#{number} t={_seconds(moment)} {event_mark(event)}{event}"
    if fields:
        text += " " + " ".join(f"{name}={_value(value)}" for name, value in _items(fields))
    if number in named:
        text += "   <-- named by the violation"
    return text


def _items(fields) -> list[tuple[str, Any]]:
    return sorted(fields.items()) if isinstance(fields, dict) else [("fields", fields)]


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) > field_text_characters_max:
        text = text[: field_text_characters_max - 3] + "..."
    return text


def _seconds(moment_microseconds: int) -> str:
    return f"{moment_microseconds / 1_000_000:.6f}"


def _numbers(numbers: list[int]) -> str:
    return ", ".join(f"#{number}" for number in numbers)
