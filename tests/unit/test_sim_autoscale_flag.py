"""`sim --autoscale MIN:MAX`: the policy it builds, and the texts it refuses by name."""

from __future__ import annotations

import pytest

from servepilot.core.errors import ConfigError
from servepilot.scaling.target_utilisation import TargetUtilisation
from servepilot.sim.fleet.setup import autoscaler


def test_min_max_builds_the_target_utilisation_policy() -> None:
    assert autoscaler(None, 0.7) is None and autoscaler("", 0.7) is None
    factory = autoscaler("2:16", 0.6)
    assert factory is not None
    assert (factory.func, factory.args) == (TargetUtilisation, (0.6, 2, 16))
    assert isinstance(factory(), TargetUtilisation)
    assert autoscaler("0:1", 0.7) is not None


@pytest.mark.parametrize("text", ["3", "2:x", "5:2", "-1:4", "0:0", ":"])
def test_anything_else_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=f"--autoscale '{text}': expected MIN:MAX"):
        autoscaler(text, 0.7)
