"""A violation: what broke, and which trace records show it happening.

Checkers return ``Violation``s rather than bare strings so that ``troupe sim explain`` can
find the story in the trace: ``sequences`` are the trace sequence numbers of the events the
violation concerns (a client's invocation and acknowledgement, a commit, a crash), ``actors``
the ``(kind, key)`` addresses involved.  ``signature`` is the text without run-specific
numbers, used to count each distinct violation once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    text: str
    sequences: tuple[int, ...] = ()
    actors: tuple[tuple[str, str], ...] = ()
    checker: str = ""

    def __str__(self) -> str:
        if not self.sequences:
            return self.text
        return f"{self.text} (trace #{', #'.join(str(number) for number in self.sequences)})"

    @property
    def signature(self) -> str:
        """The kind of violation: the text with every number, quoted id or key masked."""
        return re.sub(r"\d+", "N", self.text.split(":", 1)[0])


def as_violation(item: Violation | str, checker: str = "") -> Violation:
    return item if isinstance(item, Violation) else Violation(str(item), checker=checker)
