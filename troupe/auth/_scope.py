"""Token scopes: which entries a token may touch.

Three shapes, as the contract names them: ``all`` entries, an explicit ``entries`` list, or a
raw-character ``prefix`` (``%`` and ``_`` are plain characters: matching is ``startswith``,
never SQL ``LIKE``).  A scope may name entries that do not exist yet; the first message
creates them.

Stored as ``(kind, value)`` text columns (``value`` is a JSON list for ``entries``, the prefix
for ``prefix``, empty for ``all``) so that the CLI, running as another process, writes exactly
what the server reads.  ``TokenScope.problem()`` re-checks a stored scope against today's
entry-id rules: a token whose scope no longer passes answers 401 until it is re-issued.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ._entry_ids import entry_id_problem, entry_prefix_problem
from ._exceptions import InvalidScope

scope_entries_max = 1000
"""An explicit entry list holds at most this many ids (use a prefix beyond that)."""

scope_kinds = ("all", "entries", "prefix")


@dataclass(frozen=True)
class TokenScope:
    """``kind`` is one of ``scope_kinds``; ``entries`` for ``entries``, ``prefix`` for ``prefix``."""

    kind: str
    entries: frozenset[str] = frozenset()
    prefix: str = ""

    @classmethod
    def all(cls) -> TokenScope:
        return cls("all")

    @classmethod
    def of_entries(cls, entries: Iterable[str]) -> TokenScope:
        scope = cls("entries", entries=frozenset(entries))
        _raise_if_invalid(scope)
        return scope

    @classmethod
    def of_prefix(cls, prefix: str) -> TokenScope:
        scope = cls("prefix", prefix=prefix)
        _raise_if_invalid(scope)
        return scope

    def allows(self, entry_id: str) -> bool:
        """True when this scope grants ``entry_id``."""
        if self.kind == "all":
            return True
        if self.kind == "entries":
            return entry_id in self.entries
        return entry_id.startswith(self.prefix)

    @property
    def is_all(self) -> bool:
        return self.kind == "all"

    def problem(self) -> str | None:
        """Why this scope breaks the current entry-id rules (or None)."""
        if self.kind == "all":
            return None
        if self.kind == "entries":
            if not self.entries:
                return "入口列表不能为空"
            if len(self.entries) > scope_entries_max:
                return f"入口列表最多 {scope_entries_max} 个"
            for entry_id in sorted(self.entries):
                problem = entry_id_problem(entry_id)
                if problem is not None:
                    return f"{entry_id!r}: {problem}"
            return None
        if self.kind == "prefix":
            return entry_prefix_problem(self.prefix)
        return f"未知范围类型 {self.kind!r}"

    def encode(self) -> tuple[str, str]:
        """``(kind, value)`` as stored."""
        if self.kind == "entries":
            return self.kind, json.dumps(sorted(self.entries), ensure_ascii=False)
        if self.kind == "prefix":
            return self.kind, self.prefix
        return self.kind, ""

    @classmethod
    def decode(cls, kind: str, value: str) -> TokenScope:
        """The stored form back; never raises (an unreadable scope is an invalid one)."""
        if kind == "entries":
            try:
                entries = json.loads(value)
            except ValueError:
                entries = None
            if not isinstance(entries, list) or not all(isinstance(item, str) for item in entries):
                return cls("invalid")
            return cls("entries", entries=frozenset(entries))
        if kind == "prefix":
            return cls("prefix", prefix=value)
        if kind == "all":
            return cls("all")
        return cls("invalid")

    def describe(self) -> str:
        """One human line for ``troupe token list``."""
        if self.kind == "entries":
            return "entries " + ",".join(sorted(self.entries))
        if self.kind == "prefix":
            return f"prefix {self.prefix}"
        return self.kind


def _raise_if_invalid(scope: TokenScope) -> None:
    problem = scope.problem()
    if problem is not None:
        raise InvalidScope(problem)


__all__ = ["TokenScope", "scope_entries_max", "scope_kinds"]
