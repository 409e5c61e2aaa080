"""The package re-exports every module's ``__all__`` (each sorted), each name from the one
module that defines it, and the shared vocabularies agree across the slices."""

from __future__ import annotations

import importlib
import pkgutil
from typing import get_args

import troupe.actors.knowledge as knowledge


def modules():
    for info in pkgutil.iter_modules(knowledge.__path__):
        if info.name.startswith("_"):
            yield importlib.import_module(f"troupe.actors.knowledge.{info.name}")


def test_every_module_is_re_exported_sorted_and_once():
    owners: dict[str, str] = {}
    for module in modules():
        assert module.__all__ == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert name not in owners, f"{name} is exported by {owners[name]} and {module.__name__}"
            owners[name] = module.__name__
            assert name in knowledge.__all__, name
            assert getattr(knowledge, name) is getattr(module, name), name
    assert sorted(owners) == sorted(knowledge.__all__)
    assert knowledge.__all__ == sorted(knowledge.__all__)


def test_limits_and_vocabularies_have_one_definition():
    from troupe.actors.knowledge import _agent_context, _preferences, _query, _structuring

    assert set(get_args(knowledge.KnowledgeStatus)) == set(knowledge.knowledge_statuses)
    assert set(get_args(knowledge.PreferenceCategory)) == set(knowledge.preference_categories)
    assert _preferences.Category is knowledge.PreferenceCategory
    assert _query.query_top_k_max is knowledge.query_top_k_max
    assert (_agent_context.top_k_max, _agent_context.max_chars_max) == (
        knowledge.agent_context_top_k_max, knowledge.agent_context_characters_max)
    for name in ("entities_per_knowledge_max", "relations_per_knowledge_max", "entity_characters_max",
                 "relation_type_characters_max"):
        assert getattr(_structuring, name) is getattr(knowledge, name), name
    assert _structuring.title_characters_max == knowledge.knowledge_title_characters_max
    assert knowledge.forget_targets_max <= knowledge.forget_items_per_call_max
    assert {knowledge.resolution_new_wins, knowledge.resolution_merge, knowledge.resolution_manual} == set(
        knowledge.resolutions)
    assert knowledge.context_statuses == ("ACTIVE", "PROMOTED", "EXPIRED")
