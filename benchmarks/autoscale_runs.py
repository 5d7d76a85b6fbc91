"""The runs of bench_autoscale.py: the simulated fleet (Llama-3.1-70B on 4 H100s a replica, a
78 s cold start), its workload, one replica's capacity within the SLO, the policies as `sim
--autoscale` builds them, and one trace under one policy (`run_policy`, also what
autoscale_breakdown.py replays).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from benchmarks.autoscale_report import Row
from benchmarks.autoscale_traces import Trace
from servepilot.core.config import AutoscaleConfig, parse_config
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.engine.cpu import cpu_flags
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s
from servepilot.load.loadplan import LoadPlan
from servepilot.scaling.oracle import ClairvoyantPolicy
from servepilot.scaling.predictive import ForecastSizing, PredictivePolicy
from servepilot.scaling.snapshot import AutoscalePolicy, FleetSnapshot, ScaleDecision
from servepilot.scaling.step import StepPolicy, StepRules
from servepilot.scaling.target_utilisation import TargetUtilisation
from servepilot.sim.fleet.records import SLEEP_S, WAKE_S
from servepilot.sim.fleet.setup import replica_setup
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable

SLO = "ttft_p99_ms=1000,tpot_p99_ms=75"
COLD_START_S = 78.0
INTERVAL_S = 5.0
POOL_INTERVAL_S = AutoscaleConfig().pool_interval_s
"""Behind a warm pool the controller decides every second (`autoscale.pool_interval_s`)."""
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


def tick_s(warm_pool: int, pool_interval_s: float = POOL_INTERVAL_S) -> float:
    """How often the fleet's controller decides: as `up` does, the pool's tick behind one."""
    return pool_interval_s if warm_pool else INTERVAL_S


def fleet(
    replicas: int,
    warm_pool: int = 0,
    cold_refill: bool = True,
    pool_interval_s: float = POOL_INTERVAL_S,
) -> FleetSpec:
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
        autoscale_interval_s=tick_s(warm_pool, pool_interval_s),
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
    burst_window_s: int | None = ForecastSizing(1.0, 1.0).burst_window_s
    burst_sigmas: float = ForecastSizing(1.0, 1.0).burst_sigmas
    pool_interval_s: float = POOL_INTERVAL_S
    wake_confirm_s: float = ForecastSizing(1.0, 1.0).wake_confirm_s


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
    pool = knobs.warm_pool if pooled(policy) else 0
    tick = tick_s(pool, knobs.pool_interval_s)
    if name == "predictive":
        sizing = ForecastSizing(
            rps, COLD_START_S + tick, fill=knobs.fill, error_quantile=knobs.error_quantile,
            error_window_s=knobs.error_window_s, error_fade=knobs.error_fade,
            fall_release=knobs.fall_release,
        )  # fmt: skip
        if pool:
            sizing = replace(sizing, pool=pool, wake_horizon_s=WAKE_S + tick,
                             burst_window_s=knobs.burst_window_s,
                             burst_sigmas=knobs.burst_sigmas,
                             wake_confirm_s=knobs.wake_confirm_s)  # fmt: skip
        return PredictivePolicy(sizing, rules)
    if name == "oracle":
        horizon_s, wake_s = COLD_START_S + tick, WAKE_S + tick
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
    sim = FleetSim(fleet(size, pool, knobs.cold_refill, knobs.pool_interval_s), autoscaler=timed)
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
