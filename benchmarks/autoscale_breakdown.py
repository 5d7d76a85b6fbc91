"""Where `predictive` spends the replica-hours the clairvoyant reference (`oracle`) does not:
both run on the same trace and arrivals as in `bench_autoscale.py`, every decision (5 s) is
recorded, and the difference in replicas asked for, times the tick, is summed by the trace's
phase and by the part of predictive's answer that caused it.

Phases (from the trace's rate function): `low` before the rise, `rise`, `peak`, `fall`, and
`after` the fall; on a diurnal cosine the peak is the top tenth of the swing and `low` /
`after` its bottom tenth. Causes, each the replicas one more part of predictive's answer adds
to the one before (they sum to predictive's answer less the oracle's):

    forecast  ceil(forecast peak over the horizon / (fill x replica_rps)), within [min, max],
              less the oracle's answer (negative: the forecast is below the known future)
    headroom  the same with the error headroom added, less the above
    hold      the highest of those needs over the hold window (none when the forecast falls
              by `fall_release` replicas' worth: the policy skips it), less the above
    rules     predictive's answer (the step rules' step up, the removal check's floor) less
              the hold's need

Replicas asked for are paid from the decision on (a launch pays its cold start; a drained
replica stops when idle, so the recorded sums run slightly below the simulator's
replica-hours, which are printed alongside).

    python benchmarks/autoscale_breakdown.py [--traces ramp,diurnal-b] [--replica-rps 8.5]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.autoscale_runs import INTERVAL_S, SLO, Knobs, run_policy  # noqa: E402
from benchmarks.autoscale_traces import TRACES, Bursts, Diurnal, Ramp, Trace  # noqa: E402
from servepilot.core.slo import parse_slo  # noqa: E402
from servepilot.scaling.predictive import PredictivePolicy  # noqa: E402
from servepilot.scaling.snapshot import AutoscalePolicy, FleetSnapshot, ScaleDecision  # noqa: E402

PHASES = ("low", "rise", "peak", "fall", "after")
CAUSES = ("forecast", "headroom", "hold", "rules")


@dataclass(frozen=True, slots=True)
class Tick:
    now_s: float
    replicas: int
    """What the policy asked for."""
    parts: tuple[int, ...] = ()
    """Predictive only: its need from the forecast, + headroom, + hold (as in CAUSES)."""


class Recorder:
    """Records every decision; for `PredictivePolicy`, the parts of its answer too."""

    def __init__(self) -> None:
        self.ticks: list[Tick] = []
        self._needs: list[tuple[float, int]] = []

    def __call__(
        self, policy: AutoscalePolicy, snapshot: FleetSnapshot, now_s: float, d: ScaleDecision
    ) -> None:
        parts: tuple[int, ...] = ()
        if isinstance(policy, PredictivePolicy):
            parts = self._parts(policy, now_s)
        self.ticks.append(Tick(now_s, d.replicas, parts))

    def _parts(self, policy: PredictivePolicy, now_s: float) -> tuple[int, ...]:
        sizing, rules = policy.sizing, policy.step.rules
        capacity = sizing.fill * sizing.replica_rps
        rate = policy.forecast.peak(sizing.horizon_s)
        headroom = policy.errors.headroom() if policy.errors is not None else 0.0
        bare = rules.bounded(math.ceil(round(rate / capacity, 9)))
        need_now = rules.bounded(math.ceil(round((rate + headroom) / capacity, 9)))
        if policy.falling():  # the policy skipped its hold: so does the record
            self._needs.clear()
        self._needs.append((now_s, need_now))
        held = max(n for t, n in self._needs if t >= now_s - policy.hold_s)
        return (bare, need_now, held)


def phase(trace: Trace, t: float) -> str:
    shape = trace.shape
    if isinstance(shape, Ramp):
        ends = (shape.up_at_s, shape.up_s, shape.hold_s, shape.down_s)
        edge = 0.0
        for name, span in zip(PHASES[:4], ends, strict=True):
            edge += span
            if t < edge:
                return name
        return "after"
    if isinstance(shape, Diurnal):
        swing = (shape.rate(t) - shape.low) / (shape.high - shape.low)
        first_half = t < shape.period_s / 2
        if swing < 0.1:
            return "low" if first_half else "after"
        if swing >= 0.9:
            return "peak"
        return "rise" if first_half else "fall"
    if isinstance(shape, Bursts):
        return "peak" if shape.rate(t) > shape.base else "low"
    raise TypeError(shape)


def breakdown(trace: Trace, rps: float) -> str:
    slo, knobs = parse_slo(SLO), Knobs()
    sends = trace.arrivals()
    recorded: dict[str, Recorder] = {}
    hours: dict[str, float] = {}
    for name in ("predictive", "oracle"):
        recorded[name] = Recorder()
        row = run_policy(trace, sends, name, rps, slo, knobs, watch=recorded[name])
        hours[name] = row.replica_hours
    by_phase: dict[str, list[float]] = defaultdict(lambda: [0.0] * (len(CAUSES) + 3))
    ticks = zip(recorded["predictive"].ticks, recorded["oracle"].ticks, strict=True)
    for mine, known in ticks:
        steps = (known.replicas, *mine.parts, mine.replicas)
        sums = by_phase[phase(trace, mine.now_s)]
        sums[0] += INTERVAL_S * mine.replicas
        sums[1] += INTERVAL_S * known.replicas
        sums[2] += INTERVAL_S * (mine.replicas - known.replicas)
        for i in range(len(CAUSES)):
            sums[3 + i] += INTERVAL_S * (steps[i + 1] - steps[i])
    head = ["phase", "predictive", "oracle", "excess", *CAUSES]
    lines = [
        f"{trace.name}: replica-hours (simulator) predictive {hours['predictive']:.2f}, "
        f"oracle {hours['oracle']:.2f}; replica-hours asked for, by phase and cause:",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    total = [0.0] * (len(CAUSES) + 3)
    for name in PHASES:
        if name in by_phase:
            sums = by_phase[name]
            total = [a + b for a, b in zip(total, sums, strict=True)]
            lines.append(f"| {name} | " + " | ".join(f"{v / 3600:+.2f}" for v in sums) + " |")
    lines.append("| all | " + " | ".join(f"{v / 3600:+.2f}" for v in total) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="ramp,diurnal-b", help="comma-separated")
    parser.add_argument("--replica-rps", type=float, default=8.5, metavar="RPS")
    args = parser.parse_args()
    for name in args.traces.split(","):
        print(breakdown(TRACES[name], args.replica_rps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
