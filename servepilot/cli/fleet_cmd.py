"""`servepilot status`, `down` and `logs`: look at, stop or read fleets from another shell."""

from __future__ import annotations

import argparse

from servepilot.cli.console import out_console, print_step, print_warning, simple_table
from servepilot.cli.options import Commands
from servepilot.fleet import control
from servepilot.fleet.control import fleet_statuses, stop_fleets
from servepilot.fleet.logs import GATEWAY, log_chunks
from servepilot.fleet.ray.view import (
    GROUP_COLUMNS,
    NODE_COLUMNS,
    REPLICA_COLUMNS,
    ClusterView,
    read_view,
)


def register(sub: Commands) -> None:
    status = sub.add_parser(
        "status",
        help="show the fleets `servepilot up` is running and the state of their replicas",
        description="Show each running fleet: its gateway endpoint and, per replica, whether "
        "it is healthy and how many requests it is serving. A fleet on Ray "
        "(cluster.backend: ray) also shows the cluster's nodes, the replicas' placement "
        "groups and their actors' state (ready, lost, restarted how often). Exit status: 0 "
        "(also when no fleet runs); 1 when --port names a port no fleet runs on.",
    )
    status.set_defaults(run=run_status)

    down = sub.add_parser(
        "down",
        help="stop fleets started by `servepilot up` (drain, then stop every replica)",
        description="Tell `servepilot up` to stop: the gateway refuses new requests, in-flight "
        "ones finish, then the replicas stop (on Ray: their actors and placement groups are "
        "removed, the cluster is left as it was found). After --timeout seconds whatever is "
        "left is killed. Without --port, every fleet `servepilot up` runs for this user on this "
        "machine stops, each named as it stops; --port P stops the one on P alone. Exit status: "
        "0 when each stopped, or when none was running (nothing to stop); 1 when --port names "
        "a port no fleet runs on, or a process could not be stopped.",
    )
    down.add_argument(
        "--timeout", type=float, default=90.0, metavar="S",
        help="seconds to wait for a clean stop before killing (default 90)",
    )  # fmt: skip
    down.set_defaults(run=run_down)

    logs = sub.add_parser(
        "logs", help="print a replica's (r0, r1, ...), the gateway's or its access log (access) "
        "of the running (or the last) fleet",
        description="Print a log of the running fleet or, when none runs, of the last run. "
        "--port P: the fleet on P, or once it has stopped the last run that served on P.",
    )  # fmt: skip
    logs.add_argument("name", nargs="?", default=GATEWAY, metavar="REPLICA|gateway|access")
    logs.add_argument("-f", "--follow", action="store_true", help="go on until the fleet stops")
    logs.set_defaults(run=run_logs)
    for parser in (status, down, logs):
        parser.add_argument("--port", type=int, metavar="P", help="only the fleet on this port")


def run_status(args: argparse.Namespace) -> int:
    statuses = fleet_statuses(args.port)
    if not statuses and args.port is not None:
        raise control.no_fleet_on(args.port)
    if not statuses:
        out_console.print("no fleet is running (start one with `servepilot up`)")
        return 0
    for st in statuses:
        out_console.print(control.status_line(st), soft_wrap=True)
        if st.problem:
            print_warning(st.problem)
        if st.replicas:
            rows = map(control.replica_cells, st.replicas)
            out_console.print(simple_table("", control.REPLICA_COLUMNS, rows, no_wrap=True))
            for line in control.guessed_lines(st.replicas):
                out_console.print(line, soft_wrap=True)
        if st.alive and (cluster := read_view(st.record.port)) is not None:
            _print_cluster(cluster)
    return 0


def _print_cluster(view: ClusterView) -> None:
    """A fleet on Ray: the cluster's nodes, the replicas' placement groups and actors."""
    out_console.print(view.summary(), soft_wrap=True)
    tables = (
        ("nodes", NODE_COLUMNS, view.node_cells()),
        ("placement groups", GROUP_COLUMNS, view.group_cells()),
        ("replica actors", REPLICA_COLUMNS, view.replica_cells()),
    )
    for title, columns, rows in tables:
        out_console.print(simple_table(title, columns, rows, no_wrap=True))


def run_down(args: argparse.Namespace) -> int:
    outcomes = stop_fleets(args.port, args.timeout)
    if not outcomes and args.port is not None:
        raise control.no_fleet_on(args.port)
    if not outcomes:  # what a bare `down` is for, already true
        out_console.print("no fleet is running; nothing to stop")
        return 0
    code = 0
    for outcome in outcomes:
        warn, line = control.outcome_line(outcome, args.timeout)
        (print_warning if warn else print_step)(line)
        if outcome.leftover_pids:
            print_warning(f"processes still alive: {outcome.leftover_pids}")
            code = 1
    return code


def run_logs(args: argparse.Namespace) -> int:
    for chunk in log_chunks(args.name, args.port, follow=args.follow):
        print(chunk, end="", flush=True)
    return 0
