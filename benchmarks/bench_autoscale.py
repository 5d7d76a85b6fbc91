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
3. `oracle` (`autoscale_oracle.py`, not a product policy) is told the trace's rate and asks
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
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
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
from benchmarks.autoscale_traces import HELD_OUT, SHIPPED, TRACES, Bursts, Trace  # noqa: E402
from servepilot.core.config import parse_config  # noqa: E402
from servepilot.core.results import Load, LoadMode  # noqa: E402
from servepilot.core.slo import Slo, parse_slo  # noqa: E402
from servepilot.engine.cpu import cpu_flags  # noqa: E402
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s  # noqa: E402
from servepilot.load.loadplan import LoadPlan  # noqa: E402
from servepilot.scaling.oracle import ClairvoyantPolicy  # noqa: E402
from servepilot.scaling.predictive import ForecastSizing, PredictivePolicy  # noqa: E402
from servepilot.scaling.snapshot import AutoscalePolicy, FleetSnapshot, ScaleDecision  # noqa: E402
from servepilot.scaling.step import StepPolicy, StepRules  # noqa: E402
from servepilot.scaling.target_utilisation import TargetUtilisation  # noqa: E402
from servepilot.sim.fleet.records import SLEEP_S, WAKE_S  # noqa: E402
from servepilot.sim.fleet.setup import replica_setup  # noqa: E402
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec  # noqa: E402
from servepilot.sim.fleet.traffic import Job, JobTable  # noqa: E402

SLO = "ttft_p99_ms=1000,tpot_p99_ms=75"
COLD_START_S = 78.0
INTERVAL_S = 5.0
MIN_REPLICAS, MAX_REPLICAS, START_REPLICAS = 2, 20, 4
FILL = 0.8
"""The share of a replica's capacity the predictive sizing (and static provisioning) plans
it at."""
GRACE_S = 60.0
POLICIES = ("static", "target", "step", "predictive", "oracle", "predictive+pool", "oracle+pool")
WARM_POOL = 10
"""The "+pool" runs' sleeping replicas (--warm-pool), woken in WAKE_S (measured on an H200):
enough to wake a burst's (40 -> 110 req/s: 11 replicas at 6.8) less what is up already."""


def pooled(policy: str) -> bool:
    return policy.endswith("+pool")


def fleet(replicas: int, warm_pool: int = 0, cold_refill: bool = True) -> FleetSpec:
    config = parse_config(
        {
            "model": {"source": "llama-3.1-70b"},
            "hardware": {"device": "gpu", "accelerator": "h100", "count": 8},
            "engine": {"max_model_len": 8192, "max_num_seqs": 128, "tensor_parallel_size": 4},
            "replicas": {"count": replicas},
        },
        origin="bench_autoscale",
    )
    setup = replica_setup(config, None, cpu_flags())
    return FleetSpec(
        scheduler=setup.scheduler,
        cost=setup.cost,
        replicas=replicas,
        capacity=setup.capacity,
        gateway=config.gateway,
        scrape_interval_s=2.0,
        cold_start_s=COLD_START_S,
        autoscale_interval_s=INTERVAL_S,
        warm_pool=warm_pool,
        cold_refill=cold_refill,
        wake_s=WAKE_S,
        sleep_s=SLEEP_S,
        seed=7,
    )


def jobs(count: int = 20_000, seed: int = 11) -> JobTable:
    rng = random.Random(seed)
    return JobTable(
        Job(rng.randint(200, 2000), rng.randint(50, 500), priority=0) for _ in range(count)
    )


def replica_rps(slo: Slo, table: JobTable) -> tuple[float, list[dict[str, float]]]:
    """The highest rate one replica serves with >= 99% attainment (a 0.5 req/s grid)."""
    best, rows = 0.0, []
    rate = 5.0
    while True:
        plan = LoadPlan(Load(mode=LoadMode.RATE, value=rate), duration_s=120.0, grace_s=30.0)
        offsets = iter_arrival_offsets_s(rate, Arrival.POISSON, seed=5)
        run = FleetSim(fleet(1)).run(plan, table, slo, offsets=offsets).run
        rows.append({"rate": rate, "attainment": round(run.slo_attainment, 4)})
        if run.slo_attainment < 0.99:
            return best, rows
        best, rate = rate, rate + 0.5


Watch = Callable[[AutoscalePolicy, FleetSnapshot, float, ScaleDecision], None]
"""Called after each decision with the policy, what it saw, when, and what it answered
(`autoscale_breakdown.py` records the ticks with it)."""


class Timed:
    """A policy whose decisions are timed (CPU per tick), and shown to `watch` if given."""

    def __init__(self, policy: AutoscalePolicy, watch: Watch | None = None) -> None:
        self.policy = policy
        self.name = policy.name
        self.calls = 0
        self.cpu_s = 0.0
        self.watch = watch

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        t0 = time.process_time()
        decision = self.policy.decide(snapshot, now_s)
        self.cpu_s += time.process_time() - t0
        self.calls += 1
        if self.watch is not None:
            self.watch(self.policy, snapshot, now_s, decision)
        return decision


@dataclass(frozen=True, slots=True)
class Knobs:
    """What the flags change in the policies (defaults: theirs)."""

    down_cooldown_s: float = StepRules().down_cooldown_s
    error_quantile: float | None = ForecastSizing(1.0, 1.0).error_quantile
    error_window_s: int = ForecastSizing(1.0, 1.0).error_window_s
    error_fade: bool = ForecastSizing(1.0, 1.0).error_fade
    fall_release: float | None = ForecastSizing(1.0, 1.0).fall_release
    fill: float = FILL
    """Predictive's fill (static provisioning stays at FILL)."""
    warm_pool: int = WARM_POOL
    cold_refill: bool = False
    """The +pool runs refill their pool by cold starts (else by replicas given back)."""


def build(policy: str, rps: float, knobs: Knobs, trace: Trace) -> AutoscalePolicy | None:
    """The policy as `sim --autoscale 2:20 --scaling-policy NAME` builds it (the step rules'
    down cool-down and predictive's error headroom and fill aside, when the flags change
    them); "oracle": the clairvoyant reference, told `trace`'s rate, at static's fill;
    "+pool": the same behind a warm pool (the oracle starting cold only what the pool
    cannot wake)."""
    rules = StepRules(min_replicas=MIN_REPLICAS, max_replicas=MAX_REPLICAS)
    rules = replace(rules, down_cooldown_s=knobs.down_cooldown_s)
    name = policy.removesuffix("+pool")
    if name == "target":
        return TargetUtilisation(0.7, MIN_REPLICAS, MAX_REPLICAS)
    if name == "step":
        return StepPolicy(rules)
    if name == "predictive":
        sizing = ForecastSizing(
            rps, COLD_START_S + INTERVAL_S, fill=knobs.fill, error_quantile=knobs.error_quantile,
            error_window_s=knobs.error_window_s, error_fade=knobs.error_fade,
            fall_release=knobs.fall_release,
        )  # fmt: skip
        if pooled(policy):
            sizing = replace(sizing, pool=knobs.warm_pool, wake_horizon_s=WAKE_S + INTERVAL_S)
        return PredictivePolicy(sizing, rules)
    if name == "oracle":
        pool = knobs.warm_pool if pooled(policy) else 0
        horizon_s, wake_s = COLD_START_S + INTERVAL_S, WAKE_S + INTERVAL_S
        return ClairvoyantPolicy(
            trace.rate, horizon_s, FILL * rps, MIN_REPLICAS, MAX_REPLICAS, pool=pool,
            wake_horizon_s=wake_s,
        )  # fmt: skip
    return None


def run_policy(
    trace: Trace,
    sends: list[float],
    policy: str,
    rps: float,
    slo: Slo,
    knobs: Knobs,
    static: int | None = None,
    watch: Watch | None = None,
) -> Row:
    """One trace under one policy; "static" is a fleet of `static` replicas (default: sized
    for the trace's peak) ready from the start."""
    label = policy if static is None else f"static {static}"
    static = static or math.ceil(trace.peak_rps / (FILL * rps))
    built = build(policy, rps, knobs, trace)
    timed = Timed(built, watch) if built is not None else None
    pool = knobs.warm_pool if pooled(policy) else 0
    size = static if timed is None else START_REPLICAS
    sim = FleetSim(fleet(size, pool, knobs.cold_refill), autoscaler=timed)
    mean_rps = len(sends) / trace.duration_s
    plan = LoadPlan(
        Load(mode=LoadMode.RATE, value=mean_rps), duration_s=trace.duration_s, grace_s=GRACE_S
    )
    offsets: Iterator[float] = iter(sends)
    out = sim.run(plan, jobs(), slo, offsets=offsets)
    run = out.run
    events = sim.autoscale.events if sim.autoscale is not None else []
    awake_s, asleep_s = sim.fleet.seconds(trace.duration_s)
    return Row(
        trace=trace.name,
        policy=label,
        attainment=run.slo_attainment,
        ttft_p99_ms=run.ttft_ms.p99 or 0.0,
        tpot_p99_ms=run.tpot_ms.p99 or 0.0,
        replica_hours=awake_s / 3600.0,
        asleep_hours=asleep_s / 3600.0,
        scale_events=len(events),
        peak_replicas=out.stats.replicas_peak,
        decide_us=timed.cpu_s / timed.calls * 1e6 if timed is not None and timed.calls else 0.0,
        requests=run.completed + run.failed,
    )


def main() -> int:
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
    slo = parse_slo(SLO)
    cpu0 = time.process_time()
    rps, sweep = (args.replica_rps, []) if args.replica_rps else replica_rps(slo, jobs())
    print(f"one replica: {rps:g} req/s within the SLO ({SLO})", flush=True)
    shares = [float(v) for v in args.floors.split(",") if v]
    quantile = None if args.error_quantile.lower() == "none" else float(args.error_quantile)
    release = None if args.fall_release.lower() == "none" else float(args.fall_release)
    knobs = Knobs(
        args.down_cooldown,
        quantile,
        args.error_window,
        args.error_fade,
        release,
        args.fill,
        args.warm_pool,
        args.pool_refill == "cold",
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
        "sleep_s": SLEEP_S,
        "rows": [asdict(r) for r in rows], "verdicts": lines, "cpu_s": round(cpu_s, 1),
    }  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if any(v.missed for v in judged) else 0


def _progress(r: Row) -> None:
    hours = f"{r.replica_hours:.2f} replica-hours"
    print(f"  {r.trace} {r.policy}: {r.attainment:.2%} SLO attainment, {hours}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
