"""`cluster.backend: ray` without Ray installed: `up` says what to install, before anything
starts."""

from __future__ import annotations

import asyncio
import sys

import pytest

from servepilot.core.config import parse_config
from servepilot.core.errors import FleetError
from servepilot.fleet.up import UpReporter, run_up


def test_up_on_ray_without_ray_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [
        m for m in sys.modules if m == "ray" or m.startswith(("ray.", "servepilot.fleet.ray."))
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if not installed
    config = parse_config({"cluster": {"backend": "ray"}}, origin="test")
    steps: list[str] = []
    report = UpReporter(step=steps.append, serving=lambda started: None, warn=steps.append)
    with pytest.raises(FleetError) as caught:
        asyncio.run(run_up(config, report))
    assert caught.value.message == "cluster.backend: ray needs Ray, which is not installed"
    assert caught.value.hint == "pip install 'servepilot[ray]' (`make install` installs it)"
    assert steps == []
