"""`servepilot sleep RID` and `servepilot wake RID`: the warm pool of a running fleet."""

from __future__ import annotations

import argparse
import os

from servepilot.cli.console import out_console
from servepilot.cli.options import Commands, add_command, add_fleet_choice
from servepilot.core.errors import FleetError
from servepilot.fleet.control import SleepAnswer, sleep_or_wake
from servepilot.fleet.target import find_fleet

SLEEP_DESCRIPTION = """\
Put one replica of a running fleet to sleep (vLLM's sleep mode; the fleet runs with
engine.sleep_mode: true): the gateway stops routing to it, lets its requests in flight finish
(up to --timeout seconds), then tells it to sleep. Level 1 keeps the weights in host memory
(a wake takes about a second on a GPU), level 2 drops them. Prints the seconds the replica
took. The last replica serving is never put to sleep.

On a fleet with replicas.asleep whose engine has no sleep mode (vLLM on hardware.device:
cpu), the replica is parked instead: out of rotation, still loaded and running (it frees
nothing), back in rotation at once on `wake`.

example: servepilot sleep r1 --port 8080 --level 2
"""

WAKE_DESCRIPTION = """\
Wake a sleeping replica of a running fleet (one of replicas.asleep, or put to sleep by
`servepilot sleep`); the gateway routes to it again once it says it is awake. Prints the
seconds the replica took.

example: servepilot wake r1 --url http://127.0.0.1:8000
"""


def register(sub: Commands) -> None:
    help = "put a replica of the running fleet to sleep (warm pool; `wake` brings it back)"
    sleep = add_command(sub, "sleep", help, SLEEP_DESCRIPTION, run_sleep)
    sleep.add_argument("--level", type=int, choices=(1, 2), default=1,
                       help="1: weights kept in host memory (default); 2: dropped")  # fmt: skip
    sleep.add_argument("--timeout", type=float, default=30.0, metavar="S",
                       help="seconds its requests in flight may take (default 30)")  # fmt: skip
    help = "wake a sleeping replica of the running fleet and route to it again"
    wake = add_command(sub, "wake", help, WAKE_DESCRIPTION, run_wake)
    for parser in (sleep, wake):
        parser.add_argument("replica", metavar="REPLICA", help="its id, as `status` lists it")
        add_fleet_choice(parser)
        parser.add_argument("--admin-key-env", metavar="VAR", help="the variable holding the "
                            "gateway's admin key (gateway.auth.admin_key_env), when its admin "
                            "routes need one")  # fmt: skip


def run_sleep(args: argparse.Namespace) -> int:
    query = f"level={args.level}&timeout_s={args.timeout:g}"
    answer = _call(args, "sleep", query)
    drained = "" if answer.drained else "; requests still in flight were aborted"
    state = "parked" if answer.sleep == "parked" else f"asleep in {answer.took_s:.2f} s"
    out_console.print(f"replica {answer.replica_id} {state}{drained}")
    return 0


def run_wake(args: argparse.Namespace) -> int:
    answer = _call(args, "wake")
    out_console.print(f"replica {answer.replica_id} awake in {answer.took_s:.2f} s, in rotation")
    return 0


def _call(args: argparse.Namespace, action: str, query: str = "") -> SleepAnswer:
    url = find_fleet(args.url, args.port).gateway_url
    return sleep_or_wake(url, args.replica, action, query, _admin_key(args.admin_key_env))


def _admin_key(variable: str | None) -> str | None:
    if variable is None:
        return None
    key = os.environ.get(variable)
    if not key:
        raise FleetError(f"--admin-key-env: environment variable {variable} is unset or empty")
    return key
