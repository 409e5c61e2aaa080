"""Scopes: ``user:<name>`` and ``shared:<domain>`` parsed one way, compared exactly, and bounded."""

from __future__ import annotations

import pytest

from troupe.actors.knowledge import (
    Scope,
    ScopeInvalid,
    filter_by_scope,
    is_shared_scope,
    local_user_scope,
    parse_scope,
    scope_characters_max,
    scope_matches,
    scope_name_characters_max,
    scope_problem,
)


def test_valid_scopes_parse_to_their_canonical_text():
    assert parse_scope("user:alice") == Scope("user", "alice")
    assert parse_scope("shared:home").is_shared and not parse_scope("shared:home").is_user
    assert parse_scope("user:小天").text == "user:小天"
    assert str(parse_scope("user:a.b_c-d@e")) == "user:a.b_c-d@e"
    assert parse_scope(local_user_scope).is_user


@pytest.mark.parametrize("text", [
    "", "alice", "user:", "shared:", "team:home", "User:alice", "user:al ice", "user:a:b",
    "user:a/b", "user:a\nb", " user:alice", "user:alice ", None, 42,
])
def test_invalid_scopes_are_refused(text):
    assert scope_problem(text) is not None
    with pytest.raises(ScopeInvalid):
        parse_scope(text)


def test_scope_names_at_and_over_their_limit():
    assert parse_scope("shared:" + "d" * scope_name_characters_max).name == (
        "d" * scope_name_characters_max)
    assert scope_problem("shared:" + "d" * (scope_name_characters_max + 1)) is not None
    assert scope_problem("user:" + "d" * (scope_name_characters_max + 1)) is not None
    assert len("shared:" + "d" * scope_name_characters_max) == scope_characters_max
    assert scope_problem("shared:" + "d" * scope_characters_max) is not None


def test_scopes_match_only_exactly():
    assert scope_matches("user:alice", "user:alice")
    assert not scope_matches("user:Alice", "user:alice")
    assert not scope_matches("user:alice", "shared:alice")
    assert not scope_matches("user:alice", "user:alic")
    assert is_shared_scope("shared:home") and not is_shared_scope("user:home")
    with pytest.raises(ScopeInvalid):
        is_shared_scope("shared")


def test_filter_by_scope_is_a_hard_filter():
    class Row:
        def __init__(self, scope):
            self.scope = scope

    rows = [Row("user:alice"), Row("shared:home"), Row("user:alice2")]
    assert [row.scope for row in filter_by_scope(rows, "user:alice")] == ["user:alice"]
