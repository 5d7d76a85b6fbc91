"""`servepilot observe render`: the fleet's Grafana dashboard and Prometheus alert rules."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from servepilot.cli.console import out_console
from servepilot.cli.options import add_config_flag, config_from_args
from servepilot.core.errors import ConfigError
from servepilot.observe import alert_rules, dashboard
from servepilot.observe.alerts import rules

DASHBOARD_FILE = "servepilot-dashboard.json"
RULES_FILE = "servepilot-alerts.yaml"
DESCRIPTION = f"""\
render: write {DASHBOARD_FILE} (import it in Grafana: Dashboards > New > Import, pick the
Prometheus data source) and {RULES_FILE} (add it to prometheus.yml's rule_files). The
dashboard shows the fleet, each replica and each priority class: request rate, TTFT/TPOT/ITL
percentiles, queues, sheds, KV usage, preemptions, prefix-cache hits, batch utilisation, cost
per QPS; GPU panels when hardware.device is gpu, autoscaler panels when it autoscales. The
rules carry the operating thresholds (no ready replica, batch utilisation < 70% for 5 min, cost
per QPS > $0.1, GPU > 95% for 30 s, memory growth > 2 MB per request, KV near full,
preemptions, requests waiting in vLLM, sheds, TTFT p99 over slo.ttft_p99_ms), each saying
what to do.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "observe", help="render the Grafana dashboard and Prometheus alert rules of a fleet",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    render = actions.add_parser("render", help="write the dashboard JSON and alert rules YAML")
    add_config_flag(render)
    render.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="folder to write the two files into (created if missing)")  # fmt: skip
    render.set_defaults(run=run_render)


def run_render(args: argparse.Namespace) -> int:
    config = config_from_args(args, {})
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / DASHBOARD_FILE).write_text(json.dumps(dashboard(config), indent=2) + "\n")
        (out / RULES_FILE).write_text(yaml.safe_dump(alert_rules(config), sort_keys=False))
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror or exc}") from None
    names = ", ".join(r.name for r in rules(config))
    out_console.print(f"wrote {out / DASHBOARD_FILE}\nwrote {out / RULES_FILE} ({names})")
    return 0
