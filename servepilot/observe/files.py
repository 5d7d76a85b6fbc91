"""The fleet's Grafana dashboard and Prometheus alert rules as files, as `servepilot observe
render` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.observe.alerts import alert_rules
from servepilot.observe.dashboard import dashboard

DASHBOARD_FILE = "servepilot-dashboard.json"
RULES_FILE = "servepilot-alerts.yaml"


def write_files(config: FleetConfig, out: Path) -> tuple[Path, Path]:
    """The dashboard and the rules in `out` (created); a folder that cannot be written is
    refused naming --out."""
    dashboard_path, rules_path = out / DASHBOARD_FILE, out / RULES_FILE
    try:
        out.mkdir(parents=True, exist_ok=True)
        dashboard_path.write_text(json.dumps(dashboard(config), indent=2) + "\n")
        rules_path.write_text(yaml.safe_dump(alert_rules(config), sort_keys=False))
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror or exc}") from None
    return dashboard_path, rules_path
