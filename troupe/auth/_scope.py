"""Token scopes: which entries a token may touch, or which end user it speaks for.

Three shapes, as the host contract names them: ``all`` entries, an explicit ``entries`` list,
or a raw-character ``prefix`` (``%`` and ``_`` are plain characters: matching is
``startswith``, never SQL ``LIKE``).  A scope may name entries that do not exist yet; the
first message creates them.

A fourth shape, ``end_user``, belongs to the sessions surface: the token *is* one end user
(``u_123``), the identity the sessions contract's ``authenticate`` seam returns.  It never
grants an entry, so a sessions token presented to the host surface opens nothing even if the
audiences were ever mixed up.

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

end_user_id_characters_max = 128
"""An end-user id (the sessions contract's ``endUser.id``) has 1..128 characters."""

scope_kinds = ("all", "entries", "prefix", "end_user")


def end_user_id_problem(end_user_id: str) -> str | None:
    """Why ``end_user_id`` cannot identify an end user (or None)."""
    if not end_user_id or end_user_id.strip() != end_user_id:
        return "终端用户 ID 不能为空，首尾不能有空白"
    if len(end_user_id) > end_user_id_characters_max:
        return f"终端用户 ID 最多 {end_user_id_characters_max} 个字符"
    if any(not character.isprintable() for character in end_user_id):
        return "终端用户 ID 不能包含控制字符"
    return None


@dataclass(frozen=True)
class TokenScope:
    """``kind`` is one of ``scope_kinds``; ``entries`` for ``entries``, ``prefix`` for
    ``prefix``, ``end_user_id`` for ``end_user``."""

    kind: str
    entries: frozenset[str] = frozenset()
    prefix: str = ""
    end_user_id: str = ""

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

    @classmethod
    def of_end_user(cls, end_user_id: str) -> TokenScope:
        """A sessions token speaking for one end user."""
        scope = cls("end_user", end_user_id=end_user_id)
        _raise_if_invalid(scope)
        return scope

    def allows(self, entry_id: str) -> bool:
        """True when this scope grants ``entry_id`` (an end-user scope grants no entry)."""
        if self.kind == "all":
            return True
        if self.kind == "entries":
            return entry_id in self.entries
        if self.kind == "prefix":
            return entry_id.startswith(self.prefix)
        return False

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
        if self.kind == "end_user":
            return end_user_id_problem(self.end_user_id)
        return f"未知范围类型 {self.kind!r}"

    def encode(self) -> tuple[str, str]:
        """``(kind, value)`` as stored."""
        if self.kind == "entries":
            return self.kind, json.dumps(sorted(self.entries), ensure_ascii=False)
        if self.kind == "prefix":
            return self.kind, self.prefix
        if self.kind == "end_user":
            return self.kind, self.end_user_id
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
        if kind == "end_user":
            return cls("end_user", end_user_id=value)
        return cls("invalid")

    def describe(self) -> str:
        """One human line for ``troupe token list``."""
        if self.kind == "entries":
            return "entries " + ",".join(sorted(self.entries))
        if self.kind == "prefix":
            return f"prefix {self.prefix}"
        if self.kind == "end_user":
            return f"end user {self.end_user_id}"
        return self.kind


def _raise_if_invalid(scope: TokenScope) -> None:
    problem = scope.problem()
    if problem is not None:
        raise InvalidScope(problem)


__all__ = [
    "TokenScope",
    "end_user_id_characters_max",
    "end_user_id_problem",
    "scope_entries_max",
    "scope_kinds",
]
