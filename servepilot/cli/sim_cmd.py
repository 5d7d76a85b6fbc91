"""`servepilot sim`: a what-if of the fleet in fleet.yaml, in bench's result schema."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from servepilot.bench.console import progress_counts
from servepilot.bench.outputs import check_out_dir, write_results_json
from servepilot.cli.console import print_step, print_warning, warning_text
from servepilot.cli.levels_view import exit_code, level_bars, print_runs
from servepilot.cli.load_options import add_load_flags, add_workload_flags, levels_from_args
from servepilot.cli.options import (
    Commands,
    add_command,
    add_config_flag,
    config_from_args,
    record_of,
)
from servepilot.core.config import PolicyName, ScalingPolicyName
from servepilot.core.results import Load
from servepilot.engine.cpu import cpu_flags
from servepilot.load.flags import LoadFlags
from servepilot.load.loadplan import LoadPlan
from servepilot.sim.fleet import narration
from servepilot.sim.fleet.flags import SimFlags
from servepilot.sim.fleet.records import Progress
from servepilot.sim.fleet.session import SimOptions, SimOutput, simulate
from servepilot.sim.fleet.setup import ORACLE

# The seed's measurement: a new node loads DeepSeek-V4 from NVMe in 78 s.
DEFAULT_COLD_START = "78s"

DESCRIPTION = """\
Simulate the fleet of fleet.yaml under a bench workload, without starting anything: clients,
network hops, the gateway's own routing policy and admission objects, and every replica's
vLLM scheduler and KV cache step by step, with step times from a calibrated profile
(--profile, from `servepilot calibrate`), a GPU operator profile (--profile, from `servepilot
profile`) or the planner's roofline of the model on the accelerator.

It takes bench's load and workload flags (same seeds, same request sizes, same arrivals) and
writes results.json in bench's schema (servepilot.bench/v1, "source": "simulated"), so
`servepilot bench compare` diffs a prediction against a measurement.

examples:
  servepilot sim -c fleet.yaml --profile profile.json --sweep --out runs/sim
  servepilot sim -c llama-8b-h100.yaml --rate 5000 --duration 1h  (docs/examples/ in the repo)
  servepilot sim -c fleet.yaml --rate 200 --duration 30m --autoscale 2:20 --scaling-policy step
  servepilot bench compare runs/sim/results.json runs/measured/results.json
"""


def register(sub: Commands) -> None:
    help = "simulate a fleet under load (routing, admission, vLLM scheduling); bench schema"
    parser = add_command(sub, "sim", help, DESCRIPTION, run)
    add_config_flag(parser)
    add = parser.add_argument_group("simulated fleet").add_argument
    add("--profile", type=Path, metavar="PROFILE.json", help="step times measured by "
        "`servepilot calibrate` or composed from a GPU profile of `servepilot profile` "
        "(default: the roofline estimate)")  # fmt: skip
    add("--replicas", type=int, metavar="N", help="replicas (default: replicas.count)")
    add("--policy", choices=[p.value for p in PolicyName],
        help="routing policy (default: gateway.policy)")  # fmt: skip
    add("--network-ms", metavar="K=MS,...",
        help="one-way delays in ms: client (client-gateway), same (gateway-replica on the "
        "gateway's node), cross (other nodes); a value or LOW-HIGH, e.g. "
        "client=1,same=0.05,cross=7.5-15 (default: client half the request overhead the "
        "profile measured, else 0; same 0; cross 15-30 ms, a measured cross-node "
        "overhead, split each way)")  # fmt: skip
    add("--kv-events", choices=["on", "off"], help="on: the replicas publish their KV events "
        "and prefix-aware policies route on the exact index they keep; off: on the gateway's "
        "guess (default: engine.kv_events)")  # fmt: skip
    add("--kv-events-delay-ms", type=float, metavar="MS", help="from the end of the step that "
        "stored or evicted blocks to its events applied at the gateway (default: the "
        "replica's one-way hop, --network-ms)")  # fmt: skip
    add("--gateways", type=int, default=1, metavar="N",
        help="gateway pods behind a load balancer that deals them requests in turn, each "
        "routing with its own policy (a guessed prefix index knows only its pod's share; "
        "the exact index, from the replicas' KV events, is shared) (default 1)")  # fmt: skip
    add("--replicas-per-node", type=int, metavar="N",
        help="replicas sharing a node (default: hardware.count / GPUs per replica x "
             "hardware.replicas_per_gpu)")  # fmt: skip
    add("--scrape-interval", metavar="T", help="how often the gateway reads vLLM's gauges "
        "(default: gateway.health_interval_s)")  # fmt: skip
    add("--cold-start", default=DEFAULT_COLD_START, metavar="T",
        help="launch to serving, for replicas the autoscaler adds (default 78s, DeepSeek-V4's "
        "measured load from NVMe)")  # fmt: skip
    add("--start-cold", action="store_true", help="the first replicas start cold too")
    add("--warm-pool", type=int, metavar="K", help="keep K replicas asleep behind the serving "
        "ones (vLLM's sleep mode): the autoscaler wakes them before it starts any cold, puts "
        "replicas to sleep before it stops any, and refills the pool (default: fleet.yaml's "
        "replicas.asleep, of replicas.count)")  # fmt: skip
    add("--wake-time", metavar="T", help="waking a sleeping replica to serving (default 0.8s, "
        "Llama-3.1-8B on an H200, measured)")  # fmt: skip
    add(
        "--pool-refill",
        choices=["cold", "sleep"],
        default="cold",
        help="cold (default): after each wake, start a replica cold to sleep in its place; "
        "sleep: the pool is refilled only by replicas given back (no GPU time for refills)",
    )
    add("--sleep-time", metavar="T", help="a drained replica's sleep call, its GPU held till "
        "done (default 11.6s, the same replica's first sleep, measured)")  # fmt: skip
    add("--autoscale", metavar="MIN:MAX",
        help="scale between MIN and MAX replicas with --scaling-policy (without it: "
        "fleet.yaml's autoscale section, when enabled)")  # fmt: skip
    add("--scaling-policy", choices=[*(p.value for p in ScalingPolicyName), ORACLE],
        default="target",
        help="target (default): HPA-like; step: the step rules, +10%% above 80%% utilisation, -5%% "
        "below 50%%; predictive: what a forecast plus its own error needs, never below step's "
        "step up, given back once the forecast allows; oracle (sim only): told the level's "
        "future rate, what it needs a cold start (or a wake) ahead, at 0.8 x --replica-rps: "
        "the best any policy can do on this load (docs/autoscale.md)")  # fmt: skip
    add("--autoscale-target", type=float, default=0.7, metavar="F",
        help="target's share of the concurrency budgets to aim at (default 0.7)")  # fmt: skip
    add("--replica-rps", type=float, metavar="R", help="predictive: req/s a replica serves "
        "within the SLO")  # fmt: skip
    add("--forecast-horizon", metavar="T", help="predictive and oracle (default: cold start "
        "+ interval; with a warm pool they start cold only what the pool cannot wake within "
        "the wake time + interval)")  # fmt: skip
    add("--autoscale-interval", default="15s", metavar="T", help="how often to decide")
    add_load_flags(parser, real_client=False)
    add_workload_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, metavar="DIR", help="write results.json here")


def run(args: argparse.Namespace) -> int:
    record_of(LoadFlags, args).check_counts()
    if args.out is not None:
        check_out_dir(args.out)
    config = config_from_args(args, {"replicas.count": "replicas", "gateway.policy": "policy"})
    setup, opts = record_of(SimFlags, args).options(config, levels_from_args(args), cpu_flags())
    for line in narration.describe(setup, opts.spec):
        print_step(line)
    for note in setup.notes:
        print_warning(note)
    output = _run_with_progress(opts)
    stats = map(narration.level_stats, output.result.runs, output.stats)
    print_runs(output.result, list(stats))
    if args.out is not None:
        write_results_json(args.out, output.result)
        print_step(f"wrote {args.out}/results.json (compare: servepilot bench compare)")
    return exit_code(output.result, measured=False)


def _run_with_progress(opts: SimOptions) -> SimOutput:
    with level_bars() as bars:

        def started(load: Load, plan: LoadPlan) -> Callable[[Progress], None]:
            by_count = plan.max_requests is not None
            total = (plan.max_requests or 0) + plan.warmup_requests if by_count else None
            bars.start(load, total or plan.duration_s)

            def progress(p: Progress) -> None:
                done = p.completed + p.failed if by_count else p.sim_s
                counts = progress_counts(p.completed, p.failed)
                bars.update(load, done, f"{counts} · {p.sim_s:,.0f} s simulated")

            return progress

        return simulate(opts, started, bars.finish, lambda line: bars.note(warning_text(line)))
