"""`servepilot top`'s refresh: a gateway that stops answering leaves the last view on screen,
with a line saying so, instead of closing it."""

import pytest
from rich.console import Console

from servepilot.cli import top_cmd
from servepilot.core.errors import FleetError
from servepilot.engine.metrics import scrape
from servepilot.observe.top.sample import FleetSample, fleet_sample, replica_states
from servepilot.observe.top.view import TopView

ADMIN = [{"id": "r0", "url": "http://r0", "healthy": True, "in_flight": 2, "running": 2,
          "waiting": 0, "kv_cache_usage": 0.25}]  # fmt: skip


def shown(renderable: object) -> str:
    console = Console(width=160, record=True)
    console.print(renderable)
    return console.export_text()


def test_a_gateway_that_stops_answering_keeps_the_last_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = TopView()
    view.add(fleet_sample(0.0, scrape(""), replica_states(ADMIN), {}))

    def down(url: str) -> FleetSample:
        raise FleetError(f"the gateway at {url} did not answer: refused")

    monkeypatch.setattr(top_cmd, "poll", down)
    text = shown(top_cmd._refresh(view, "http://gw"))
    assert "http://gw: 1 of 1 replicas healthy · 2 in flight" in text
    assert "r0        yes               2         2         0   25%" in text
    assert "the gateway at http://gw did not answer: refused" in text
