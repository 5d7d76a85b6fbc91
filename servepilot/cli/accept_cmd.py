"""`servepilot accept`: seed 004's acceptance checklist against a live fleet, as a report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.text import Text

from servepilot.bench.client import Target
from servepilot.bench.outputs import check_out_dir
from servepilot.bench.target import served_model
from servepilot.bench.tokenizer import open_tokenizer
from servepilot.cli.console import out_console, print_marked, print_step
from servepilot.cli.levels_view import bench_reporter, level_bars, memory_sources
from servepilot.cli.options import (
    Commands,
    add_command,
    add_config_flag,
    add_fleet_choice,
    add_server_flags,
    record_of,
)
from servepilot.core import loop
from servepilot.core.config import load_config
from servepilot.core.errors import ConfigError
from servepilot.core.units import parse_duration_s
from servepilot.fleet.target import find_fleet
from servepilot.observe.accept.items import Verdict
from servepilot.observe.accept.report import overall, reproduce_commands, write_report
from servepilot.observe.accept.run import AcceptOptions, run_accept

DESCRIPTION = """\
Run the acceptance checklist for a single-node deployment against a live fleet and
write report.html and report.json (schema servepilot.accept/v1) to --out, a verdict (pass,
fail, or n/a and why) with its evidence per item:

  1. TP fills the node (= its GPUs), MoE adds EP        (fleet.yaml; n/a on CPU)
  2. a minimal request runs                              (one chat request)
  3. the startup logs' KV capacity, the tuning baseline  (the replicas' logs)
  4. throughput, TTFT, TPOT and P99 over a concurrency curve (bench's sweep)
  5. the sweet spot, with P99 within fleet.yaml's slo there
  6. quantization when the KV budget binds               (preemptions during the run)
  7. a soak at the sweet spot: no leak (2 MB/request) in the gateway, the replicas'
     processes or the GPUs, no avalanche (1% failed), P99 steady
  8. the configuration and the steps written down        (the report itself)

The sweep and the soak are `servepilot bench`'s (the same load, numbers and progress); their
outputs (results.json, requests.csv, report.html) go to --out/sweep and --out/soak. The
defaults are sized for this machine's CPU fleet (minutes); an acceptance soak is 30 minutes or
more (--soak 30m). Exit code 1 when an item fails.

Without --url, accept tests the fleet `servepilot up` runs here (and reads its replicas'
logs and memory, as `bench --soak` does); with --url, a fleet elsewhere (item 3 is then n/a,
and item 7 fails: a leak in the replicas cannot be checked from here).

examples:
  servepilot accept -c fleet.yaml --out runs/accept
  servepilot accept -c fleet.yaml --soak 30m --requests 64 --max-concurrency 256 --out acc/
"""


def register(sub: Commands) -> None:
    help = "the single-node acceptance checklist against a live fleet; report.html and .json"
    parser = add_command(sub, "accept", help, DESCRIPTION, run_accept_cmd)
    add_config_flag(parser)
    add_fleet_choice(parser)
    add = parser.add_argument
    add("--out", type=Path, metavar="DIR", required=True,
        help="write report.html, report.json, sweep/ and soak/ here")  # fmt: skip
    add("--requests", type=int, default=8, metavar="N", help="requests per sweep level (default 8)")
    add("--max-concurrency", type=int, default=8, metavar="N",
        help="the sweep's last level: 1, 2, 4, ... N (default 8)")  # fmt: skip
    add("--input-tokens", type=int, default=128, metavar="N",
        help="prompt tokens of each request (default 128)")  # fmt: skip
    add("--output-tokens", type=int, default=32, metavar="N",
        help="max_tokens of each request (default 32)")  # fmt: skip
    add(
        "--soak",
        default="2m",
        metavar="T",
        help="soak at the sweet spot (default 2m; 30m to accept)",
    )
    add_server_flags(parser, "the fleet's only model")


def run_accept_cmd(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.max_concurrency < 1:
        raise ConfigError("--requests and --max-concurrency must be at least 1")
    check_out_dir(args.out)
    fleet = find_fleet(args.url, args.port)
    model = args.model or served_model(fleet.gateway_url, args.api_key)
    target = Target(base_url=fleet.gateway_url, model=model, api_key=args.api_key)
    opts = record_of(AcceptOptions, args, target=target, config=load_config(args.config),
                     logs=fleet.replica_logs(), soak_s=parse_duration_s(args.soak, "--soak"),
                     memory_sources=memory_sources(fleet.gateway_url))  # fmt: skip
    tokenizer = open_tokenizer(target.base_url, target.model, None)
    with level_bars() as bars:
        acceptance = loop.run(run_accept(opts, tokenizer, bench_reporter(bars), print_step))
    for item in acceptance.items:
        mark, style = f"{item.verdict.value.upper():<5}", _STYLE[item.verdict]
        print_marked(mark, style, f" {item.number}. {item.title}", [item.evidence], indent=6)
    verdict = overall(acceptance)
    out_console.print(Text(f"acceptance: {verdict.value}", style=_STYLE[verdict]))
    port = fleet.record.port if fleet.record else None
    commands = reproduce_commands(args.config, port, sys.argv[1:])
    json_path, html_path = write_report(args.out, acceptance, fleet.gateway_url, commands)
    print_step(f"wrote {html_path} and {json_path}")
    return 1 if verdict is Verdict.FAIL else 0


_STYLE = {Verdict.PASS: "bold green", Verdict.FAIL: "bold red", Verdict.NOT_APPLICABLE: "dim"}
