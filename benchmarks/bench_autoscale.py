"""Autoscaling policies side by side on the simulator (issue 17): static provisioning for the
peak, `target` (HPA-like), `step` (the seeds' rules) and `predictive` (a forecast ahead of the
cold start plus its own error, never below `step`'s step up), and a clairvoyant reference
(`oracle`), on the same simulated fleet under three shipped traces and three held out.

The fleet: Llama-3.1-70B replicas, each on 4 H100s (tensor parallel 4), step times from the
planner's roofline, max_num_seqs 128, a cold start of 78 s (the seed's load from NVMe),
replicas between 2 and 20 (the seed's bounds), a decision every 5 s, vLLM's gauges scraped
every 2 s. Every request is P0 (interactive): prompts of 200-2,000 tokens, 50-500 output
tokens (uniform, seeded). The SLO: TTFT <= 1 s and TPOT <= 75 ms per request; attainment is
the share of all requests sent that met both (refused ones count as misses).

1. The capacity of one replica: one replica under open-loop Poisson rates (2 simulated
   minutes each); the highest rate with >= 99% attainment is `replica_rps`, what
   `predictive` sizes with (at fill 0.8 unless --fill) and what static provisioning is
   sized with: ceil(peak rate / (0.8 x replica_rps)) replicas, ready from the start.
2. Traces (`autoscale_traces.py`), arrival rates over time (non-homogeneous Poisson, thinned
   from a seeded generator: the same arrivals for every policy). Shipped:
     diurnal  40 min: a compressed day, 20 -> 125 -> 20 req/s on a cosine
     ramp     30 min: 25 req/s for 8 min, up to 125 req/s in 8 min (+12.5 req/s a minute:
              more than a replica's worth per cold start), held 8 min, down in 6
     bursts   30 min: 40 req/s with four 3-minute bursts to 110 req/s (10 s rises)
   and held out, written after the policies' rules (other seeds, peaks, slopes and burst
   spacing): diurnal-b, ramp-b, bursts-b, reported in a second table. The autoscaled fleets
   start at 4 ready replicas.
3. `oracle` (`scaling/oracle.py`, not a product policy) is told the trace's rate and asks
   every tick for ceil(highest rate over the cold start and a tick ahead / (0.8 x
   replica_rps)) within [2, 20], giving replicas back as soon as that allows: the fewest
   replica-hours a policy with this cold start and fill can reach knowing the future.
4. Per trace and policy: attainment, TTFT and TPOT p99, replica-hours (every replica from
   its launch, cold start included, to its stop or the trace's end), scale events, the peak
   of replicas, and the policy's CPU time per decision.
5. On the bursts traces, static fleets of --floors shares of the peak's: what must already
   be ready when a burst that rises faster than a cold start comes, and what holding it costs.

Targets (issue 17): `predictive` >= 99% attainment on the ramp where `target` and `step`
fall below it, and >= 30% fewer replica-hours than static peak provisioning at equal
attainment, judged on every trace run. A saving that `oracle` itself does not reach is out of
reach on that trace (said with its numbers, and predictive's share of the oracle's saving);
the exit status is 1 only on a target missed that is not out of reach. Printed as tables;
written to OUT/summary.json.

    python benchmarks/bench_autoscale.py [--out runs/bench-autoscale] [--traces ramp,...]
        [--floors 0.5,0.6] [--error-quantile none] [--error-window 300] [--no-error-fade]
        [--down-cooldown 300] [--fall-release none] [--fill 0.9] [--policies predictive,oracle]
        [--replica-rps 8.5]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.autoscale_report import (  # noqa: E402
    Row,
    floors,
    is_static,
    oracle_verdicts,
    table,
    verdicts,
)
from benchmarks.autoscale_runs import (  # noqa: E402
    COLD_START_S,
    FILL,
    POLICIES,
    SLO,
    WARM_POOL,
    Knobs,
    jobs,
    replica_rps,
    run_policy,
)
from benchmarks.autoscale_traces import HELD_OUT, SHIPPED, TRACES, Bursts  # noqa: E402
from servepilot.core.slo import parse_slo  # noqa: E402
from servepilot.sim.fleet.records import SLEEP_S, WAKE_S  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-autoscale"))
    parser.add_argument("--traces", default=",".join(TRACES), help="comma-separated (default: all)")
    parser.add_argument(
        "--down-cooldown",
        type=float,
        default=Knobs().down_cooldown_s,
        metavar="S",
        help="the step rules' down cool-down (default: StepRules'); 300 for the HPA's window",
    )
    parser.add_argument(
        "--error-quantile",
        default=str(Knobs().error_quantile),
        metavar="Q",
        help="predictive's error headroom quantile (default: ForecastSizing's); none: no headroom",
    )
    parser.add_argument(
        "--error-window",
        type=int,
        default=Knobs().error_window_s,
        metavar="S",
        help="the seconds of predictive's forecast errors its headroom reads (default: "
        "ForecastSizing's)",
    )
    parser.add_argument(
        "--error-fade",
        action=argparse.BooleanOptionalAction,
        default=Knobs().error_fade,
        help="predictive's errors count x (1 - age / window) in its headroom (default: "
        "ForecastSizing's)",
    )
    parser.add_argument(
        "--fall-release",
        default=str(Knobs().fall_release),
        metavar="R",
        help="predictive skips its hold when its forecast falls by at least R replicas' worth "
        "over the horizon (default: ForecastSizing's); none: always holds",
    )
    parser.add_argument(
        "--burst",
        default=f"{Knobs().burst_window_s}:{Knobs().burst_sigmas:g}",
        metavar="W:S",
        help="the +pool runs' burst rule: predictive wakes the pool at once when the last W "
        "seconds' mean rate stands S Poisson deviations above its forecast (default: "
        "ForecastSizing's); none: the forecast alone",
    )
    parser.add_argument(
        "--wake-confirm",
        type=float,
        default=Knobs().wake_confirm_s,
        metavar="S",
        help="the +pool runs: how long predictive's forecast must ask for a wake before it "
        "wakes (default: ForecastSizing's; 0: at once)",
    )
    parser.add_argument(
        "--pool-interval",
        type=float,
        default=Knobs().pool_interval_s,
        metavar="S",
        help="the +pool runs' decision interval (default: autoscale.pool_interval_s)",
    )
    parser.add_argument(
        "--fill",
        type=float,
        default=Knobs().fill,
        help="the share of --replica-rps predictive plans each replica at (static: 0.8)",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="comma-separated, of " + ", ".join(POLICIES) + " (default: all)",
    )
    parser.add_argument(
        "--replica-rps",
        type=float,
        default=None,
        metavar="RPS",
        help="one replica's capacity within the SLO (default: measured first)",
    )
    parser.add_argument(
        "--warm-pool",
        type=int,
        default=WARM_POOL,
        metavar="K",
        help=f"the +pool runs' sleeping replicas (default {WARM_POOL})",
    )
    parser.add_argument(
        "--pool-refill",
        choices=["cold", "sleep"],
        default="sleep",
        help="the +pool runs: refill the pool by cold starts, or only by replicas given back "
        "(default)",
    )
    parser.add_argument(
        "--floors",
        default="0.5,0.6,0.7,0.8",
        metavar="SHARES",
        help="static fleets of these shares of the peak's on the bursts traces ('' for none)",
    )
    args = parser.parse_args()
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        parser.error(f"unknown policies: {', '.join(sorted(unknown))}")
    return args


def main() -> int:
    args = parse_args()
    slo = parse_slo(SLO)
    cpu0 = time.process_time()
    rps, sweep = (args.replica_rps, []) if args.replica_rps else replica_rps(slo, jobs())
    print(f"one replica: {rps:g} req/s within the SLO ({SLO})", flush=True)
    shares = [float(v) for v in args.floors.split(",") if v]
    quantile = None if args.error_quantile.lower() == "none" else float(args.error_quantile)
    release = None if args.fall_release.lower() == "none" else float(args.fall_release)
    window, sigmas = (None, 0.0) if args.burst == "none" else _burst(args.burst)
    knobs = Knobs(
        args.down_cooldown,
        quantile,
        args.error_window,
        args.error_fade,
        release,
        args.fill,
        args.warm_pool,
        args.pool_refill == "cold",
        window,
        sigmas,
        args.pool_interval,
        args.wake_confirm,
    )
    rows: list[Row] = []
    for name in args.traces.split(","):
        trace = TRACES[name]
        sends = trace.arrivals()
        for policy in args.policies.split(","):
            rows.append(run_policy(trace, sends, policy, rps, slo, knobs))
            _progress(rows[-1])
        peak = math.ceil(trace.peak_rps / (FILL * rps))
        for share in shares if isinstance(trace.shape, Bursts) else ():
            size = max(1, round(share * peak))
            rows.append(run_policy(trace, sends, "static", rps, slo, knobs, size))
            _progress(rows[-1])
    main_rows = [r for r in rows if not is_static(r) or r.policy == "static"]
    for title, names in (("shipped traces", SHIPPED), ("held-out traces", HELD_OUT)):
        chosen = [r for r in main_rows if r.trace in names]
        if chosen:
            print(f"{title}:\n{table(chosen)}")
    if shares:
        print(f"smaller static fleets on the bursts traces:\n{floors(rows)}")
    judged = verdicts(rows) + oracle_verdicts(rows, tuple(TRACES))
    lines = [v.text for v in judged]
    for line in lines:
        print(line)
    cpu_s = time.process_time() - cpu0
    print(f"CPU: {cpu_s:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "replica_rps": rps, "sweep": sweep, "slo": SLO, "cold_start_s": COLD_START_S,
        "down_cooldown_s": args.down_cooldown, "error_quantile": quantile, "fill": args.fill,
        "error_window_s": args.error_window, "error_fade": args.error_fade,
        "fall_release": release,
        "traces": {name: trace.shape.describe() for name, trace in TRACES.items()},
        "warm_pool": args.warm_pool, "pool_refill": args.pool_refill, "wake_s": WAKE_S,
        "burst": args.burst, "pool_interval_s": args.pool_interval,
        "wake_confirm_s": args.wake_confirm,
        "sleep_s": SLEEP_S,
        "rows": [asdict(r) for r in rows], "verdicts": lines, "cpu_s": round(cpu_s, 1),
    }  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any(v.missed for v in judged) else 0


def _burst(text: str) -> tuple[int, float]:
    window, _, sigmas = text.partition(":")
    try:
        return int(window), float(sigmas)
    except ValueError:
        raise SystemExit(f"--burst: expected W:S (seconds:sigmas) or none, got {text!r}") from None


def _progress(r: Row) -> None:
    hours = f"{r.replica_hours:.2f} replica-hours"
    print(f"  {r.trace} {r.policy}: {r.attainment:.2%} SLO attainment, {hours}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
