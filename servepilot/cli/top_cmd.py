"""`servepilot top`: a live view of a running fleet, refreshed in place."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from servepilot.cli.console import draw, out_console
from servepilot.cli.options import Commands, add_command, add_fleet_choice
from servepilot.core.errors import FleetError
from servepilot.fleet.target import find_fleet
from servepilot.observe.top.poll import poll
from servepilot.observe.top.view import Screen, TopView

DESCRIPTION = """\
A live view of a running fleet, refreshed in place, to keep open during an incident: each
replica (healthy, requests in flight, vLLM's running and waiting queues, KV cache use,
preemptions), each priority class (gateway queue, TTFT p50/p99 with the queue wait, requests
shed), vLLM's TPOT p50/p99 over the fleet, sheds by reason, the autoscaler's desired replicas
(when the fleet autoscales) and the degradation level.

Percentiles cover the last minute: the difference between the newest scrape of each
histogram and the one a minute before it. Everything is read over HTTP: the gateway's
/metrics and /admin/replicas, and each replica's /metrics.

Without --url, top finds the fleet `servepilot up` runs on this machine (the one on --port
when several run). When stdout is not a terminal (piped, a log), top prints one snapshot
(percentiles since the gateway started) and exits.

examples:
  servepilot top --url http://127.0.0.1:8000 --interval 2
  servepilot top | tee snapshot.txt
"""


def register(sub: Commands) -> None:
    help = "a live view of a running fleet: replicas, queues by class, latency, sheds"
    parser = add_command(sub, "top", help, DESCRIPTION, run_top)
    add_fleet_choice(parser)
    parser.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="seconds between refreshes (default 1)")  # fmt: skip


def run_top(args: argparse.Namespace) -> int:
    url = find_fleet(args.url, args.port).gateway_url
    view = TopView()
    view.add(poll(url))
    if not sys.stdout.isatty():
        out_console.print(render(view.screen(url)), soft_wrap=True)
        return 0
    interval_s = max(0.2, args.interval)
    with Live(render(view.screen(url)), console=out_console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval_s)
                live.update(_refresh(view, url), refresh=True)
        except KeyboardInterrupt:  # how a person closes a live view: not an error
            return 0


def _refresh(view: TopView, url: str) -> RenderableType:
    """The view with a new sample; while the gateway does not answer, the last one with a
    line saying so (a fleet restarting is exactly when top must stay open)."""
    try:
        view.add(poll(url))
    except FleetError as exc:
        stale = Text(f"{time.strftime('%H:%M:%S')} {exc.message}", style="bold red")
        return Group(render(view.screen(url)), stale)
    return render(view.screen(url))


def render(screen: Screen) -> RenderableType:
    notes = [Text(note, style="yellow") for note in screen.notes]
    return Group(
        Text(screen.headline, style="bold"),
        draw(screen.replicas, no_wrap=True),
        draw(screen.classes, no_wrap=True),
        *notes,
    )
