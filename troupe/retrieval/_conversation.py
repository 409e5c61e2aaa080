"""Chat turns as memories: each message indexed with the conversation around it.

Why it exists: in a chat, the words that find a message are often not in it.  "Yes, twice
last month!" answers "have you been to the support group?"; a later question about the
support group must find the answer, not only the question.  So each turn is indexed as
``speaker: text`` and carries its neighbouring turns as ``context``: a separate, lower-weight
text column and a share of its vector (see ``RecallSettings``).  Neighbours are taken only
within the same sitting (turns closer in time than ``context_gap_seconds_max``), so context
never leaks from one day's conversation into another's.

Trade-offs: every turn's text is indexed about ``1 + turns_before + turns_after`` times (in
the context column), which grows the text index accordingly; context is only a recall signal,
never returned as the memory's text.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from ._memory_index import MemoryItem

context_turns_before_default = 2
context_turns_after_default = 2
context_gap_seconds_max = 6 * 3600
context_turn_characters_max = 600


@dataclass(frozen=True)
class ConversationTurn:
    key: str
    speaker: str
    text: str
    at: datetime.datetime


def _line(turn: ConversationTurn) -> str:
    return f"{turn.speaker}: {turn.text[:context_turn_characters_max]}"


def conversation_items(
    turns: Sequence[ConversationTurn],
    *,
    tenant: str,
    scope: str = "",
    kind: str = "message",
    visibility: frozenset[str] = frozenset(),
    turns_before: int = context_turns_before_default,
    turns_after: int = context_turns_after_default,
) -> list[MemoryItem]:
    """One ``MemoryItem`` per turn (turns in conversation order), context folded in."""
    items = []
    gap = datetime.timedelta(seconds=context_gap_seconds_max)
    for index, turn in enumerate(turns):
        neighbours = []
        for other in range(max(0, index - turns_before), min(len(turns), index + turns_after + 1)):
            if other != index and abs(turns[other].at - turn.at) <= gap:
                neighbours.append(_line(turns[other]))
        items.append(
            MemoryItem(
                key=turn.key,
                text=f"{turn.speaker}: {turn.text}",
                tenant=tenant,
                created_at=turn.at,
                scope=scope,
                kind=kind,
                speaker=turn.speaker,
                visibility=visibility,
                event_start=turn.at,
                context="\n".join(neighbours),
            )
        )
    return items
