"""Scopes: ``user:<name>`` and ``shared:<domain>``, the knowledge surface's hard filters.

Why a module of its own: every read and write of the knowledge surface is confined to exactly
one scope, and a scope that is parsed loosely in one place and strictly in another is how data
crosses between users.  So there is one parser, one canonical text form, and one comparison:
two scopes match only when their canonical texts are equal.  No prefix matching, no wildcard,
no case folding: ``user:Alice`` and ``user:alice`` are different scopes, and ``shared:home``
never sees ``user:*`` rows (the contract's "scope 是硬过滤").

Names are 1 to ``scope_name_characters_max`` characters of letters and digits (any script, so
``user:小天`` works) and ``. _ - @``; no spaces, no control characters, no second ``:``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

scope_kind_user = "user"
scope_kind_shared = "shared"
scope_kinds = (scope_kind_user, scope_kind_shared)

scope_name_characters_max = 64
"""The part after ``user:`` / ``shared:``."""
scope_characters_max = len(scope_kind_shared) + 1 + scope_name_characters_max
"""A whole scope text; the longest kind plus ``:`` plus the longest name."""
scope_name_punctuation = frozenset("._-@")

local_user_scope = "user:local"
"""The scope of this machine's own user: the insights stream reads it (contract §3.24)."""


class ScopeInvalid(ValueError):
    """A scope text that is not ``user:<name>`` or ``shared:<domain>``; the HTTP layer answers
    400 ``INVALID_REQUEST`` with ``str(exc)`` as the message."""


@dataclass(frozen=True)
class Scope:
    """A parsed scope.  ``text`` is the canonical form stored in every row."""

    kind: str
    name: str

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_shared(self) -> bool:
        return self.kind == scope_kind_shared

    @property
    def is_user(self) -> bool:
        return self.kind == scope_kind_user

    def __str__(self) -> str:
        return self.text


def scope_problem(text: object) -> str | None:
    """Why ``text`` is not a valid scope, or ``None`` when it is."""
    if not isinstance(text, str) or not text:
        return "scope is empty"
    if len(text) > scope_characters_max:
        return f"scope is longer than {scope_characters_max} characters"
    kind, separator, name = text.partition(":")
    if not separator or kind not in scope_kinds:
        return "scope must be 'user:<name>' or 'shared:<domain>'"
    if not name:
        return "scope name is empty"
    if len(name) > scope_name_characters_max:
        return f"scope name is longer than {scope_name_characters_max} characters"
    for character in name:
        if not (character.isalnum() or character in scope_name_punctuation):
            return f"scope name contains {character!r}; allowed: letters, digits and . _ - @"
    return None


def parse_scope(text: object) -> Scope:
    """The parsed scope; ``ScopeInvalid`` when ``text`` is not one."""
    problem = scope_problem(text)
    if problem is not None:
        raise ScopeInvalid(problem)
    assert isinstance(text, str)
    kind, _, name = text.partition(":")
    return Scope(kind=kind, name=name)


def is_shared_scope(text: str) -> bool:
    """True for a valid ``shared:*`` scope (sensitive content is refused there)."""
    return parse_scope(text).is_shared


def scope_matches(row_scope: str, requested_scope: str) -> bool:
    """The hard filter: a row is visible to a request only in exactly its own scope."""
    return row_scope == requested_scope


def filter_by_scope(rows: Iterable, requested_scope: str, *, attribute: str = "scope") -> list:
    """The rows whose ``attribute`` equals ``requested_scope``; a last line of defence for code
    that gathered candidates from a shared index (the recall engine filters first)."""
    return [row for row in rows if getattr(row, attribute) == requested_scope]


__all__ = [
    "Scope",
    "ScopeInvalid",
    "filter_by_scope",
    "is_shared_scope",
    "local_user_scope",
    "parse_scope",
    "scope_characters_max",
    "scope_kind_shared",
    "scope_kind_user",
    "scope_kinds",
    "scope_matches",
    "scope_name_characters_max",
    "scope_problem",
]
