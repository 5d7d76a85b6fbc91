"""`servepilot up`: start the replicas and the gateway, serve until Ctrl-C."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from servepilot.cli.console import err_console, out_console, print_step, print_warning, simple_table
from servepilot.cli.options import Commands, add_command, add_config_flag, config_from_args
from servepilot.core import loop
from servepilot.core.config import (
    EngineKind,
    FleetConfig,
    PolicyName,
    ScalingPolicyName,
    parse_bounds,
)
from servepilot.engine.cpu import cpu_flags
from servepilot.fleet import up
from servepilot.fleet.detach import start_detached
from servepilot.fleet.up import UpReporter, UpStarted, run_up
from servepilot.routing import StepTimeModel
from servepilot.sim.fleet.setup import fleet_step_model

HELP = "start vLLM (or simulated) replicas and the gateway in front of them; Ctrl-C stops"
DESCRIPTION = """\
Start N vLLM replicas of the model as child processes (each on a free port, logs in
~/.local/state/servepilot/runs/), wait until every one is ready (it answers /health, then a
2-token smoke generation returns tokens), then start the gateway: one OpenAI-compatible
endpoint that routes each request to a replica.

On GPUs (hardware.device: gpu) each replica gets its own TP x PP GPUs (CUDA_VISIBLE_DEVICES),
kept inside one NVLink domain or NUMA node when the topology can be read, else in order;
hardware.gpu_ids restricts them. A fleet that needs more GPUs than the node has is refused.

Stop with Ctrl-C here, or `servepilot down` from another shell: new requests are refused,
in-flight ones finish, then the replicas stop. No process is left behind, even if this one is
killed. With --detach the fleet runs in the background (closing the terminal does not stop
it): `up` returns once it serves, or fails saying why with nothing left running.

`--engine sim` (or `engine.kind: sim` in fleet.yaml) starts simulated replicas instead:
vLLM's HTTP API and metrics, timed in real time by servepilot's model of vLLM's scheduler,
with the KV capacity vLLM would have. Dozens fit on one machine, to try the gateway at
scale; `--model` may then also be a preset (llama-3.1-8b, deepseek-v3, ...).

`cluster.backend: ray` in fleet.yaml runs the replicas as Ray actors on a Ray cluster's nodes
(`cluster.address: local` starts one on this machine), spread one per node, restarted by Ray
when a node is lost; the gateway runs here and follows them (docs/ray.md, "Scaling out on Ray").

`--autoscale MIN:MAX` (fleet.yaml's `autoscale` section) adds replicas when they are busy and
removes idle ones, draining each first, by the `--scaling-policy` (docs/autoscale.md, "Autoscaling
policies"); every decision goes to the gateway's log and /metrics, the changes to this output.
On Ray an added replica is one more actor, in a placement group of its own. With
fleet.yaml's `replicas.asleep: K` it keeps a warm pool of K replicas behind those serving:
woken before any cold start, refilled behind; asleep with engine.sleep_mode (GPU), *parked* on
CPU (loaded, running, out of rotation; docs/autoscale.md, "A warm pool under the autoscaler").
"""


def register(sub: Commands) -> None:
    parser = add_command(sub, "up", HELP, DESCRIPTION, run)
    add_config_flag(parser)
    add = parser.add_argument
    add("--replicas", type=int, metavar="N", help="number of vLLM replicas")
    add("--port", type=int, metavar="P", help="gateway port (default 8000)")
    add("--model", metavar="SOURCE", help="`smollm2` or a local Hugging Face model folder")
    add("--engine", choices=[k.value for k in EngineKind],
        help="vllm (default) or sim: simulated replicas (engine.kind)")  # fmt: skip
    add(
        "--autoscale",
        metavar="MIN:MAX",
        help="scale between MIN and MAX replicas (local or on Ray)",
    )
    add("--scaling-policy", choices=[p.value for p in ScalingPolicyName],
        help="step (default): the +10%%/-5%% step rules; predictive; target")  # fmt: skip
    add("--replica-rps", type=float, metavar="R",
        help="predictive: req/s one replica serves within the SLO")  # fmt: skip
    add("--detach", action="store_true",
        help="run in the background, return once serving; `servepilot down` stops it")  # fmt: skip
    # Set by --detach for the `up` it starts: the run folder it made.
    add("--detached-run-dir", type=Path, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(
        args,
        {
            "replicas.count": "replicas",
            "gateway.port": "port",
            "model.source": "model",
            "engine.kind": "engine",
            "autoscale.policy": "scaling_policy",
            "autoscale.replica_rps": "replica_rps",
        },
    )
    if args.autoscale:
        lo, hi = parse_bounds(args.autoscale)
        bounds = {"autoscale.enabled": True, "autoscale.min_replicas": lo,
                  "autoscale.max_replicas": hi}  # fmt: skip
        config = config.with_overrides(bounds, dict.fromkeys(bounds, "--autoscale"))
    if args.detach:
        started = start_detached(config, lambda text: print(text, end="", flush=True))
        print_step(f"serving in the background (pid {started.record.pid}); logs in "
                   f"{started.record.run_dir} (its output: {started.log_path.name})")  # fmt: skip
        return 0
    # A spinner while the replicas load (tens of seconds on CPU, minutes for large models);
    # it stops as soon as the fleet serves so the endpoint stays on screen.
    spinner = err_console.status("waiting for the replicas to load the model…")

    def serving(started: UpStarted) -> None:
        spinner.stop()
        _serving(started)

    reporter = UpReporter(step=print_step, serving=serving, warn=print_warning)
    spinner.start()
    try:
        loop.run(run_up(config, reporter, args.detached_run_dir, predicted_step_model(config)))
    finally:
        spinner.stop()
    print_step(up.stamped("stopped"))
    return 0


def predicted_step_model(config: FleetConfig) -> Callable[[str], StepTimeModel] | None:
    """Each replica's step times for the predicted_latency policy (None for the others):
    what `servepilot sim` steps a replica of the same fleet.yaml by."""
    if config.gateway.policy is not PolicyName.PREDICTED_LATENCY:
        return None
    model = fleet_step_model(config, cpu_flags())
    return lambda _replica_id: model


def _serving(started: UpStarted) -> None:
    rows = map(up.replica_cells, started.replicas)
    out_console.print(simple_table("replicas", up.REPLICA_COLUMNS, rows, no_wrap=True))
    out_console.print(started.endpoint_text, soft_wrap=True, markup=False)
