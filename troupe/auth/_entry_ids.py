"""The entry-id rules, shared by the host surface (path segments) and token scopes.

Why here and not in the host surface: a token's stored scope is checked against the *current*
rules on every request (a scope written before a rule tightened makes its token answer 401),
so the rules and the scopes must agree by construction.

The rules (contract ``000``): 1..200 characters, case-sensitive, not all whitespace, no ``?``,
no ``#`` and no Unicode ``Cc`` character (tab, newline and DEL included).  They are checked on
the ASGI-decoded path segment, the same string the route uses: colons and slashes stay.
"""

from __future__ import annotations

import unicodedata

entry_id_characters_max = 200
entry_id_forbidden_characters = frozenset("?#")

assert entry_id_characters_max > 0


def entry_id_character_problem(character: str) -> str | None:
    """Why ``character`` may not appear in an entry id, or None."""
    if character in entry_id_forbidden_characters:
        return f"入口 ID 不能包含 {character}"
    if unicodedata.category(character) == "Cc":
        return "入口 ID 不能包含控制字符"
    return None


def entry_id_problem(entry_id: str) -> str | None:
    """Why ``entry_id`` is not a valid entry id (a Chinese sentence for the client), or None."""
    if not entry_id:
        return "入口 ID 不能为空"
    if len(entry_id) > entry_id_characters_max:
        return f"入口 ID 最多 {entry_id_characters_max} 个字符"
    if entry_id.isspace():
        return "入口 ID 不能全为空白"
    for character in entry_id:
        problem = entry_id_character_problem(character)
        if problem is not None:
            return problem
    return None


def entry_prefix_problem(prefix: str) -> str | None:
    """A scope prefix follows the character rules (it may be a bare ``"  "``: only whole ids
    must not be all whitespace)."""
    if not prefix:
        return "前缀不能为空"
    if len(prefix) > entry_id_characters_max:
        return f"前缀最多 {entry_id_characters_max} 个字符"
    for character in prefix:
        problem = entry_id_character_problem(character)
        if problem is not None:
            return problem
    return None


__all__ = [
    "entry_id_character_problem",
    "entry_id_characters_max",
    "entry_id_problem",
    "entry_prefix_problem",
]
