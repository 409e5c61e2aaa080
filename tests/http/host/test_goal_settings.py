"""The goal dedup knobs an operator sets in the environment (``TROUPE_HOST_GOAL_JUDGEMENT``,
``TROUPE_HOST_GOAL_FALLBACK_SECONDS``): parsed once when the host surface is built, refused
at start with a ``ServeError`` naming the variable, and really applied to the goals actor."""

from __future__ import annotations

import pytest

from troupe.actors.host import GoalSettings, dedup_fallback_seconds_default
from troupe.http.host import (
    goal_fallback_seconds_max,
    goal_fallback_seconds_variable,
    goal_judgement_variable,
    goal_settings_from_environment,
    new_host_surface,
)
from troupe.server import ServeError


def test_defaults_without_the_variables():
    assert goal_settings_from_environment({}) == GoalSettings(
        judgement_enabled=True, fallback_seconds=dedup_fallback_seconds_default)


def test_judgement_off_and_fallback_zero_and_the_boundary():
    settings = goal_settings_from_environment({goal_judgement_variable: "OFF", goal_fallback_seconds_variable: "0"})
    assert settings.judgement_enabled is False and settings.fallback_seconds == 0.0
    at_max = goal_settings_from_environment({goal_fallback_seconds_variable: str(goal_fallback_seconds_max)})
    assert at_max.fallback_seconds == goal_fallback_seconds_max


@pytest.mark.parametrize("variable, value", [
    (goal_judgement_variable, "maybe"),
    (goal_fallback_seconds_variable, "-1"),
    (goal_fallback_seconds_variable, "soon"),
    (goal_fallback_seconds_variable, "nan"),
    (goal_fallback_seconds_variable, str(goal_fallback_seconds_max + 1)),
])
def test_bad_values_stop_the_server_naming_the_variable(variable, value):
    with pytest.raises(ServeError, match=variable):
        new_host_surface({variable: value})


def test_the_surface_gives_the_goals_actor_these_settings():
    surface = new_host_surface({goal_judgement_variable: "off", goal_fallback_seconds_variable: "90"})
    [goals_kind] = [kind for kind in surface.actor_kinds if kind.name == "host_goals"]
    actor = goals_kind.factory(None)
    assert actor.settings == GoalSettings(judgement_enabled=False, fallback_seconds=90.0)
