"""The judged GPU cases as a table (gpu_sim_report.py prints it): each case measured against
predicted, then per set and per model each metric's median and p90 |error| beside its floor
(the same engine twice), and, where the folders judged together measured a case on two
loans, how far apart those two engines are.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.gpu_judging import CACHE_WARM_PCT, cache_warm, unjudged

METRICS = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")


def _error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'case':34s} {'set':5s} " + " ".join(f"{m:>22s}" for m in METRICS) + " cache"]
    for row in rows:
        cells = []
        for m in METRICS:
            meas, pred = row["measured"][m], row["predicted"][m]
            cells.append(f"{meas:9.1f} {pred:7.1f} {_error(pred, meas):+5.0%}")
        hit = row.get("cache_hit_pct")
        why = unjudged(row)
        cells.append(("   -" if hit is None else f"{hit:4.0f}%") + (f" {why}" if why else ""))
        lines.append(f"{row['case']:34s} {row['set'][:5]:5s} " + " ".join(cells))
    lines.append("")
    warm_cases = sum(cache_warm(r) for r in rows)
    if warm_cases:
        lines.append(f"{warm_cases} cases cache-warm (over {CACHE_WARM_PCT:g} points more of their "
                     "prompt tokens from vLLM's prefix cache than the workload shares): shown, "
                     "not judged")  # fmt: skip
    if routed := sum(unjudged(r) == "routing" for r in rows):
        lines.append(f"{routed} cases of a MoE on dummy weights' own routing (a batch's tokens "
                     "to nearly the same experts; gpu_judging.py): shown, not judged")  # fmt: skip
    judged = [r for r in rows if unjudged(r) is None]
    for which in ("calibration", "validation"):
        lines += _summary(which, [r for r in judged if r["set"] == which])
    # Per model too: one model's miss is not hidden in (or blamed on) the others.
    models = sorted({r["case"].split("/")[0] for r in judged})
    if len(models) > 1:
        lines.append("validation, per model")
        for model in models:
            chosen = [r for r in judged if r["set"] == "validation" and
                      r["case"].startswith(f"{model}/")]  # fmt: skip
            lines += _summary(f"  {model}", chosen, width=20)
    if apart := engines_apart(judged):
        lines.append("validation, the same case measured on two loans (another host and start)")
        lines += apart
    return "\n".join(lines)


def engines_apart(rows: list[dict[str, Any]]) -> list[str]:
    """Each metric's median and p90 difference between two engines' measurements of the
    same validation case, where the folders judged together measured it more than once: what
    the same vLLM on another host and start reproduces, beside the floor's two passes on one
    engine. Empty when no case was measured twice."""
    first: dict[str, dict[str, Any]] = {}
    pairs = []
    for row in rows:
        if row["set"] != "validation":
            continue
        if row["case"] in first:
            pairs.append((first[row["case"]], row))
        else:
            first[row["case"]] = row
    lines = []
    for m in METRICS if pairs else ():
        apart = [
            abs(_error(later["measured"][m], earlier["measured"][m])) for earlier, later in pairs
        ]
        lines.append(f"  {m:13s} n={len(apart):2d} apart: median {statistics.median(apart):6.1%}"
                     f"  p90 {_pct(apart, 0.9):6.1%}")  # fmt: skip
    return lines


def _summary(label: str, chosen: list[dict[str, Any]], width: int = 11) -> list[str]:
    """Each metric's median and p90 |error| over `chosen`, with its floor."""
    lines = []
    for m in METRICS if chosen else ():
        errs = [abs(_error(r["predicted"][m], r["measured"][m])) for r in chosen]
        floors = [abs(_error(r["again"][m], r["measured"][m])) for r in chosen if "again" in r]
        floor = "no floor"
        if floors:
            floor = f"floor median {statistics.median(floors):.1%} ({len(floors)} cases)"
        lines.append(
            f"{label:{width}s} {m:13s} n={len(errs):2d} median |err| "
            f"{statistics.median(errs):6.1%}  p90 {_pct(errs, 0.9):6.1%}  " + floor
        )
    return lines
