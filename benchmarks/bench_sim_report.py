"""bench_sim.py's records and report: cases, measured against predicted, errors, drift."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servepilot.plan.costmodel import StepShape
from servepilot.plan.costprofile import load_profile

METRICS = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    replica: str
    """A key of REPLICAS."""
    flags: tuple[str, ...]
    """Workload and load flags, given alike to bench and sim."""


@dataclass(slots=True)
class Row:
    case: Case
    seed: int
    measured: dict[str, float] | None = None
    predicted: dict[str, float] | None = None
    problems: list[str] = field(default_factory=list)
    load_average: float | None = None
    """The machine's 1-minute load average after the measurement: the replica and the
    client make about 1.5; much more means something else ran beside them."""

    def errors_pct(self) -> dict[str, float | None]:
        if self.measured is None or self.predicted is None:
            return dict.fromkeys(METRICS)
        return {m: _pct(self.predicted[m], self.measured[m]) for m in METRICS}


def _pct(predicted: float, measured: float) -> float | None:
    return 100.0 * (predicted - measured) / measured if measured else None


def read_metrics(path: Path) -> dict[str, float]:
    """TTFT p50, TPOT p50 and output throughput of a servepilot.bench/v1 file's one run."""
    document = json.loads(path.read_text())
    if document.get("schema") != "servepilot.bench/v1" or len(document.get("runs", [])) != 1:
        raise RuntimeError(f"{path}: expected servepilot.bench/v1 with one run")
    run = document["runs"][0]
    if run["failed"]:
        raise RuntimeError(f"{path}: {run['failed']} requests failed ({run.get('errors')})")
    return {
        "ttft_p50_ms": float(run["ttft_ms"]["p50"]),
        "tpot_p50_ms": float(run["tpot_ms"]["p50"]),
        "output_tok_s": float(run["output_throughput"]),
    }


DRIFT_SHAPES = {"decode of 1": (0, 0, 1, 200, 0), "decode of 8": (0, 0, 8, 2000, 0),
                "prefill of 256": (256, 1, 0, 0, 256 * 257 // 2)}  # fmt: skip


def drift_pct(before: Path, after: Path) -> dict[str, float]:
    """How much slower (+) the machine ran a few reference steps at the end of the run than
    at its calibration: noise that no simulator can predict."""
    first, last = load_profile(before), load_profile(after)
    return {name: 100 * (last.step_time_s(StepShape(*s)) / first.step_time_s(StepShape(*s)) - 1)
            for name, s in DRIFT_SHAPES.items()}  # fmt: skip


def table(rows: list[Row]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    head = f"{'case':<24}" + "".join(f" {m + ' meas':>18} {'sim':>9} {'err %':>7}" for m in METRICS)
    lines = [head]
    for row in rows:
        errors = row.errors_pct()
        cells = ""
        for m in METRICS:
            measured = row.measured[m] if row.measured else None
            predicted = row.predicted[m] if row.predicted else None
            cells += f" {num(measured, ',.1f'):>18} {num(predicted, ',.1f'):>9}"
            cells += f" {num(errors[m], '+.1f'):>7}"
        lines.append(f"{row.case.name:<24}{cells}")
    lines += [f"{row.case.name}: {problem}" for row in rows for problem in row.problems]
    return "\n".join(lines)


def error_summary(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per metric: median and p90 of the absolute errors (%) over the cases."""
    out = {}
    for m in METRICS:
        errors = sorted(abs(e) for row in rows if (e := row.errors_pct()[m]) is not None)
        if errors:
            at = 0.9 * (len(errors) - 1)
            low, high = int(at), min(int(at) + 1, len(errors) - 1)
            p90 = errors[low] + (errors[high] - errors[low]) * (at - low)
            out[m] = {"median_abs_pct": statistics.median(errors), "p90_abs_pct": p90,
                      "cases": len(errors)}  # fmt: skip
    return out


def case_summary(r: Row) -> dict[str, Any]:
    return {"case": r.case.name, "replica": r.case.replica, "seed": r.seed,
            "flags": " ".join(r.case.flags), "load_average": r.load_average,
            "measured": r.measured, "predicted": r.predicted, "error_pct": r.errors_pct(),
            "problems": r.problems}  # fmt: skip


def finish(rows: list[Row], summary: dict[str, Any], args: argparse.Namespace) -> None:
    if rows:
        print(table(rows))
    for metric, e in summary["errors"].items():
        print(f"{metric}: median |error| {e['median_abs_pct']:.1f}%, p90 {e['p90_abs_pct']:.1f}% "
              f"over {e['cases']} cases")  # fmt: skip
    if summary["drift_pct"]:
        print("machine drift (step times at the end against the calibration): " + ", ".join(
            f"{name} {pct:+.1f}%" for name, pct in summary["drift_pct"].items()))  # fmt: skip
    print(f"results: {args.out}/summary.json")
    failed = [row.case.name for row in rows if row.problems]
    over = [m for m, e in summary["errors"].items() if e["median_abs_pct"] > args.tolerance_pct]
    if failed:
        raise SystemExit(f"failed cases: {', '.join(failed)}")
    if over:
        raise SystemExit(f"median error above {args.tolerance_pct:g}%: {', '.join(over)}")
