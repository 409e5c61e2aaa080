"""An HTML timeline of a trace: one lane per actor, time across, crashes and faults marked.

Text (``explain``) tells one violation's story; a picture shows a run's shape: which actors were
busy when the process died, how a crash rippled into restarts, where the violation's records
sit.  The page is one self-contained file (inline SVG and CSS, no script, no external assets)
so it opens anywhere, including from a CI artefact on a machine with no network.

Bounded on purpose: at most ``records_drawn_max`` records (a window around the violations'
records when the trace is longer) and ``lanes_max`` lanes (the rest share one last lane); every
mark carries a tooltip with its sequence number, time, event and fields.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

from ._explain import (
    client_events,
    commit_events,
    crash_events,
    fault_events,
    lane_name,
    restart_events,
)
from ._violation import Violation, as_violation

records_drawn_max = 4000
lanes_max = 40
lane_height_pixels = 18
plot_width_pixels = 1100
label_width_pixels = 220
axis_height_pixels = 30
time_ticks_count = 6
field_text_characters_max = 80
other_lane = ("(other actors)", "")
process_events = frozenset({"sim_crash", "sim_power_loss", "sim_restart", "sim_clean_restart"})
"""Events of the whole process: drawn as a line across every lane, not as one lane's mark."""


def write_timeline_html(records: Sequence[Sequence[Any]], path: str,
                        violations: Iterable[Violation | str] = ()) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(timeline_html(records, violations))


def timeline_html(records: Sequence[Sequence[Any]], violations: Iterable[Violation | str] = ()) -> str:
    violations = [as_violation(item) for item in violations]
    highlighted = {number for violation in violations for number in violation.sequences}
    drawn = _window(list(records), highlighted)
    lanes = _lanes(drawn, violations)
    height = axis_height_pixels + lane_height_pixels * max(len(lanes), 1) + 10
    width = label_width_pixels + plot_width_pixels + 20
    first_moment = drawn[0][1] if drawn else 0
    span = max((drawn[-1][1] - first_moment) if drawn else 0, 1)

    def x_of(moment: int) -> float:
        return label_width_pixels + (moment - first_moment) / span * plot_width_pixels

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    parts += _lane_backgrounds(lanes, width)
    parts += _axis(first_moment, span, height)
    for record in drawn:
        if record[2] in process_events:
            parts.append(_process_line(record, x_of(record[1]), height))
    for record in drawn:
        if record[2] not in process_events:
            lane = lanes.get((record[3], record[4]), lanes.get(other_lane, 0))
            parts.append(_mark(record, x_of(record[1]), _lane_middle(lane), record[0] in highlighted))
    parts.append("</svg>")
    return _page(records, drawn, violations, "\n".join(parts))


def _window(records: list[Sequence[Any]], highlighted: set[int]) -> list[Sequence[Any]]:
    """All records when few; otherwise ``records_drawn_max`` of them centred on the
    highlighted ones (or the first ones when nothing is highlighted)."""
    if len(records) <= records_drawn_max:
        return records
    indexes = [index for index, record in enumerate(records) if record[0] in highlighted]
    if not indexes:
        return records[:records_drawn_max]
    centre = (indexes[0] + indexes[-1]) // 2
    start = min(max(centre - records_drawn_max // 2, 0), len(records) - records_drawn_max)
    return records[start:start + records_drawn_max]


def _lanes(drawn, violations: list[Violation]) -> dict[tuple[str, str], int]:
    """Lane index per actor: the violation's actors first, then by first appearance."""
    order: list[tuple[str, str]] = []
    for violation in violations:
        for address in violation.actors:
            if tuple(address) not in order:
                order.append(tuple(address))
    for record in drawn:
        address = (record[3], record[4])
        if record[2] not in process_events and address not in order:
            order.append(address)
    if len(order) > lanes_max:
        order = order[: lanes_max - 1] + [other_lane]
    return {address: index for index, address in enumerate(order)}


def _lane_middle(lane: int) -> float:
    return axis_height_pixels + lane * lane_height_pixels + lane_height_pixels / 2


def _lane_backgrounds(lanes: dict[tuple[str, str], int], width: int) -> list[str]:
    parts = []
    for (kind, key), lane in lanes.items():
        top = axis_height_pixels + lane * lane_height_pixels
        shade = "#f4f4f4" if lane % 2 else "#ffffff"
        parts.append(f'<rect class="lane" x="0" y="{top}" width="{width}" height="{lane_height_pixels}" fill="{shade}"/>')
        label = lane_name(kind, key)
        parts.append(f'<text class="label" x="4" y="{top + lane_height_pixels - 5}">{html.escape(label[:34])}'
                     f"<title>{html.escape(label)}</title></text>")
    return parts


def _axis(first_moment: int, span: int, height: int) -> list[str]:
    parts = []
    for tick in range(time_ticks_count + 1):
        x = label_width_pixels + tick * plot_width_pixels / time_ticks_count
        seconds = (first_moment + span * tick / time_ticks_count) / 1_000_000
        parts.append(f'<line x1="{x:.1f}" y1="{axis_height_pixels - 6}" x2="{x:.1f}" y2="{height}" stroke="#ddd"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{axis_height_pixels - 10}">{seconds:.3f}s</text>')
    return parts


def _process_line(record, x: float, height: int) -> str:
    color = {"sim_crash": "#d62728", "sim_power_loss": "#6a1b9a"}.get(record[2], "#888")
    dash = "" if record[2] in ("sim_crash", "sim_power_loss") else ' stroke-dasharray="4 3"'
    return (f'<line class="{record[2]}" x1="{x:.1f}" y1="{axis_height_pixels}" x2="{x:.1f}" y2="{height}"'
            f' stroke="{color}" stroke-width="2"{dash}><title>{_tooltip(record)}</title></line>')


def _mark(record, x: float, y: float, highlighted: bool) -> str:
    event = record[2]
    halo = (f'<circle class="highlight" cx="{x:.1f}" cy="{y:.1f}" r="8" fill="#ffd600" stroke="#000"/>'
            if highlighted else "")
    title = f"<title>{_tooltip(record)}</title>"
    if event in crash_events:
        shape = (f'<path class="crash" d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}M{x - 5:.1f},{y + 5:.1f}'
                 f'L{x + 5:.1f},{y - 5:.1f}" stroke="#d62728" stroke-width="2.5">{title}</path>')
    elif event in fault_events:
        shape = (f'<path class="fault" d="M{x:.1f},{y - 6:.1f}L{x + 5:.1f},{y + 4:.1f}L{x - 5:.1f},{y + 4:.1f}Z"'
                 f' fill="#ff7f0e">{title}</path>')
    elif event in commit_events:
        shape = f'<rect class="commit" x="{x - 1:.1f}" y="{y - 6:.1f}" width="3" height="12" fill="#2ca02c">{title}</rect>'
    elif event in restart_events:
        shape = f'<circle class="restart" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="none" stroke="#1f77b4" stroke-width="2">{title}</circle>'
    elif event in client_events:
        color = {"invoke": "#1f77b4", "ack": "#2ca02c", "fail": "#d62728", "unknown": "#9467bd"}[event]
        shape = f'<circle class="client" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">{title}</circle>'
    else:
        shape = f'<circle class="event" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#999">{title}</circle>'
    return halo + shape


def _tooltip(record) -> str:
    number, moment, event, kind, key, fields = record
    details = " ".join(f"{name}={value!r}"[:field_text_characters_max]
                       for name, value in (sorted(fields.items()) if isinstance(fields, dict) else []))
    return html.escape(f"#{number} t={moment / 1_000_000:.6f}s {event} {lane_name(kind, key)} {details}".strip())


def _page(records, drawn, violations: list[Violation], svg: str) -> str:
    shown = (f"records #{drawn[0][0]}..#{drawn[-1][0]} ({len(drawn)} of {len(records)})" if drawn
             else "no records")
    violation_items = "".join(f"<li>{html.escape(str(violation))}</li>" for violation in violations)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>troupe sim timeline</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; }}
svg text.label {{ font: 11px monospace; }} svg text.tick {{ font: 10px monospace; fill: #666; }}
.legend span {{ margin-right: 14px; }}
</style></head><body>
<h1>troupe sim timeline</h1>
<p>Showing {html.escape(shown)}; one lane per actor (kind/key), time across. Hover a mark for its record.</p>
<p class="legend"><span style="color:#d62728">&#x2715; crash / process crash line</span>
<span style="color:#6a1b9a">| power loss</span> <span style="color:#888">&#x254e; process restart</span>
<span style="color:#ff7f0e">&#x25b2; fault</span> <span style="color:#2ca02c">&#x258d; commit</span>
<span style="color:#1f77b4">&#x25cf; invoke</span> <span style="color:#2ca02c">&#x25cf; ack</span>
<span style="background:#ffd600">&#x25cf; named by a violation</span></p>
{f"<h2>Violations</h2><ul>{violation_items}</ul>" if violation_items else ""}
{svg}
</body></html>
"""
