"""Operating a fleet: the Grafana dashboard and the Prometheus alert rules rendered from
fleet.yaml (pure functions returning dicts; the command writes them)."""

from __future__ import annotations

from servepilot.observe.alerts import alert_rules
from servepilot.observe.dashboard import dashboard

__all__ = ["alert_rules", "dashboard"]
