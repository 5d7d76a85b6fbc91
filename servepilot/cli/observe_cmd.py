"""`servepilot observe render`: the fleet's Grafana dashboard and Prometheus alert rules."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.cli.console import out_console
from servepilot.cli.options import Commands, add_config_flag, config_from_args
from servepilot.observe.alerts import rules
from servepilot.observe.files import DASHBOARD_FILE, RULES_FILE, write_files

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


def register(sub: Commands) -> None:
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
    dashboard_path, rules_path = write_files(config, args.out)
    names = ", ".join(r.name for r in rules(config))
    out_console.print(f"wrote {dashboard_path}\nwrote {rules_path} ({names})")
    return 0
