"""Seed 003's adaptive batch thresholds on the simulator (issue 37, item 4): the per-replica
admission budget moved with the arrival rate (autoscale.adaptive_budget) against a fixed one,
on a trace with a low period, a peak and a low period again.

The fleet: N Llama-3.1-70B replicas, each on 4 H100s (tensor parallel 4), step times from the
planner's roofline, max_num_seqs 128 (the replica's hard capacity at the gateway: min of that
and what its KV cache holds), vLLM's gauges scraped every 2 s, a decision every 5 s; the fleet
keeps its size (the `target` policy held at N:N), so only the budget differs between rows.
Every request is P0: prompts of 200-2,000 tokens, 50-500 output tokens (uniform, seeded).
The SLO: TTFT <= 1 s and TPOT <= 75 ms per request; attainment is the share of the requests
sent in the phase that met both (refused ones count as misses).

The trace (Poisson, seeded: the same arrivals in every row): LOW_RPS for LOW_S, PEAK_RPS for
PEAK_S, LOW_RPS for LOW_S again. Each phase is measured on its own run of the trace from its
start (the phases before it as warm-up), so every number belongs to one phase.

Rows: `fixed`: the hard capacity all along (what the gateway does without the section);
`adaptive`: the seed's numbers (fleet-wide lines 20 / 100 req/s, budgets 32 / 20 / 8, a 30 s
window, 10% hysteresis); `fixed 8` and `fixed 32`: the two bands' budgets held all along.
A second table autoscales instead (`target` at 0.7 of the budgets within [2, 40] replicas,
from 4, with no cold start so that only the budget differs): a smaller budget there also asks
for more replicas, so it adds replica-hours to the comparison.

Numbers per phase: attainment, TTFT and TPOT p99 (of the requests completed), throughput,
requests refused, requests that waited in the gateway's queue during the phase, and the
budget changes up to the phase's end.

    python benchmarks/bench_adaptive_budget.py [--replicas 16] [--out runs/bench-adaptive]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.autoscale_runs import fleet as autoscale_fleet  # noqa: E402
from benchmarks.autoscale_runs import jobs  # noqa: E402
from servepilot.core.config import AdaptiveBudgetConfig  # noqa: E402
from servepilot.core.results import Load, LoadMode  # noqa: E402
from servepilot.core.slo import parse_slo  # noqa: E402
from servepilot.load.loadplan import LoadPlan  # noqa: E402
from servepilot.scaling.adaptive_budget import AdaptiveBudget  # noqa: E402
from servepilot.scaling.target_utilisation import TargetUtilisation  # noqa: E402
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec  # noqa: E402
from servepilot.sim.fleet.traffic import JobTable  # noqa: E402

SLO = "ttft_p99_ms=1000,tpot_p99_ms=75"
LOW_RPS, PEAK_RPS = 15.0, 120.0
LOW_S, PEAK_S = 120.0, 180.0
PHASES = (("low", 0.0, LOW_S), ("peak", LOW_S, PEAK_S), ("low after", LOW_S + PEAK_S, LOW_S))
GRACE_S = 60.0
ROWS = ("fixed", "adaptive", "fixed 8", "fixed 32")
AUTOSCALED_ROWS = ("fixed", "adaptive")
AUTOSCALE_BOUNDS = (2, 40)
START = 4
COLD_START_S = 0.0
"""Replicas the policy asks for serve at once: the budget's effect alone, not a cold start's."""


@dataclass(frozen=True, slots=True)
class Row:
    budget: str
    phase: str
    attainment: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    throughput_rps: float
    output_tokens_per_s: float
    refused: int
    queued: int
    """Requests that waited in the gateway's admission queue, from the run's start to the
    phase's end (`per_phase` turns it into the phase's own)."""
    budget_changes: int
    replica_hours: float
    """Every replica's time from its launch to its stop or the phase's end, from 0 s."""


def fleet(replicas: int, capacity: int | None = None, cold_start_s: float = 0.0) -> FleetSpec:
    """bench-autoscale's fleet (Llama-3.1-70B, TP 4 on H100s), its budget `capacity`."""
    spec = autoscale_fleet(replicas)
    return replace(spec, capacity=capacity or spec.capacity, cold_start_s=cold_start_s)


def trace(seed: int = 5) -> list[float]:
    """Send times: Poisson at LOW_RPS, PEAK_RPS, LOW_RPS, phase by phase."""
    rng, times, start = random.Random(seed), [], 0.0
    for rate, span_s in ((LOW_RPS, LOW_S), (PEAK_RPS, PEAK_S), (LOW_RPS, LOW_S)):
        at = start + rng.expovariate(rate)
        while at < start + span_s:
            times.append(at)
            at += rng.expovariate(rate)
        start += span_s
    return times


def run_phase(
    name: str, replicas: int, phase: tuple[str, float, float], table: JobTable, scaled: bool
) -> Row:
    """`replicas` all along, or (`scaled`) autoscaled from START."""
    label, from_s, span_s = phase
    budget = AdaptiveBudget(AdaptiveBudgetConfig(enabled=True)) if name == "adaptive" else None
    held = int(name.split()[1]) if name.startswith("fixed ") else None
    if scaled:
        spec = fleet(START, held, COLD_START_S)
        policy = TargetUtilisation(0.7, *AUTOSCALE_BOUNDS)
    else:
        spec, policy = fleet(replicas, held), TargetUtilisation(0.7, replicas, replicas)
    sim = FleetSim(spec, autoscaler=policy, budget=budget)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=PEAK_RPS), duration_s=span_s,
                    warmup_s=from_s, grace_s=GRACE_S)  # fmt: skip
    out = sim.run(plan, table, parse_slo(SLO), offsets=iter(trace()))
    run, stats = out.run, out.stats
    changes = len(sim.autoscale.budget_events) if sim.autoscale is not None else 0
    return Row(name, label, run.slo_attainment, run.ttft_ms.p99 or 0.0, run.tpot_ms.p99 or 0.0,
               run.request_throughput, run.output_throughput, run.refused, stats.queued,
               changes, stats.replica_s / 3600)  # fmt: skip


def per_phase(rows: list[Row]) -> list[Row]:
    """Each budget's queued count less the one at the previous phase's end: the runs are the
    same simulation (same seeds, same arrivals) up to where the shorter one stops sending."""
    out, before = [], 0
    for row in rows:
        before = 0 if row.phase == PHASES[0][0] else before
        out.append(replace(row, queued=row.queued - before))
        before = row.queued
    return out


def table(rows: list[Row]) -> str:
    head = ("budget", "phase", "attain", "TTFT p99 ms", "TPOT p99 ms", "req/s", "out tok/s",
            "refused", "queued", "changes", "replica-h")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r.budget, r.phase, f"{r.attainment:.1%}", f"{r.ttft_p99_ms:,.0f}",
                 f"{r.tpot_p99_ms:.1f}", f"{r.throughput_rps:.1f}",
                 f"{r.output_tokens_per_s:,.0f}", str(r.refused), str(r.queued),
                 str(r.budget_changes), f"{r.replica_hours:.2f}")  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--out", type=Path, default=Path("runs/bench-adaptive"))
    parser.add_argument("--no-autoscaled", action="store_true")
    args = parser.parse_args()
    table_ = jobs()
    cpu0 = time.process_time()
    fixed = per_phase([run_phase(name, args.replicas, phase, table_, scaled=False)
                       for name in args.rows.split(",") for phase in PHASES])  # fmt: skip
    print(f"Fixed fleet: {args.replicas} replicas, hard capacity {fleet(1).capacity}; SLO {SLO}")
    print(table(fixed))
    scaled: list[Row] = []
    if not args.no_autoscaled:
        scaled = per_phase([run_phase(name, 0, phase, table_, scaled=True)
                            for name in AUTOSCALED_ROWS for phase in PHASES])  # fmt: skip
        lo, hi = AUTOSCALE_BOUNDS
        print(f"\nAutoscaled: target 0.7 within [{lo}, {hi}] from {START}, cold start "
              f"{COLD_START_S:g} s")  # fmt: skip
        print(table(scaled))
    print(f"\n{time.process_time() - cpu0:.0f} s CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"fixed": [asdict(r) for r in fixed], "autoscaled": [asdict(r) for r in scaled]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
