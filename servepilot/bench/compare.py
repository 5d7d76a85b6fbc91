"""`servepilot bench compare A.json B.json`: two results, run by run.

The main use is a prediction against a measurement (`compare predicted.json measured.json`),
so besides the per-metric differences the comparison carries the simulator's accuracy metric:
the median (and p90) absolute percent error over matched runs for TTFT p50, TPOT p50 and
output throughput, relative to the measured side.

Deltas read "from A to B": delta = B - A, percent = delta / |A|. Whether B is better is
judged per metric (lower latency, higher throughput).
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.fmt import MISSING, fmt_num, fmt_signed, format_load
from servepilot.core.results import BenchResult, Load, Run, Source, Stats


class Better(enum.StrEnum):
    LOWER = "lower"
    HIGHER = "higher"


Verdict = Literal["better", "worse", "same"]
Side = Literal["a", "b"]


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: Better
    get: Callable[[Run], float | None]


def _stat(metric: str, pct: str) -> Metric:
    def get(run: Run) -> float | None:
        value: float | None = getattr(getattr(run, f"{metric}_ms"), pct)
        return value

    return Metric(f"{metric}_{pct}", f"{metric.upper()} {pct}", "ms", Better.LOWER, get)


def _turn_p50(stats: Stats | None) -> float | None:
    return None if stats is None else stats.p50


METRICS: tuple[Metric, ...] = (
    Metric(
        "request_throughput",
        "Request throughput",
        "req/s",
        Better.HIGHER,
        lambda r: r.request_throughput,
    ),
    Metric(
        "output_throughput",
        "Output throughput",
        "tok/s",
        Better.HIGHER,
        lambda r: r.output_throughput,
    ),
    _stat("ttft", "p50"),
    _stat("ttft", "p99"),
    # multi_turn only (None elsewhere): a run with a CPU tier of the KV cache against one
    # without differs in the returning turns.
    Metric(
        "ttft_first_turn_p50",
        "TTFT p50 1st turn",
        "ms",
        Better.LOWER,
        lambda r: _turn_p50(r.ttft_ms_first_turn),
    ),
    Metric(
        "ttft_returning_p50",
        "TTFT p50 returning",
        "ms",
        Better.LOWER,
        lambda r: _turn_p50(r.ttft_ms_returning),
    ),
    _stat("tpot", "p50"),
    _stat("tpot", "p99"),
    _stat("itl", "p99"),
    _stat("e2e", "p50"),
    _stat("e2e", "p99"),
    Metric("goodput_rps", "Goodput", "req/s", Better.HIGHER, lambda r: r.goodput_rps),
    # In percent, so its delta reads in percentage points.
    Metric(
        "slo_attainment", "SLO attainment", "%", Better.HIGHER, lambda r: r.slo_attainment * 100
    ),
)

ACCURACY_KEYS = ("ttft_p50", "tpot_p50", "output_throughput")
"""The simulator issue's accuracy metrics."""


@dataclass(frozen=True)
class MetricDelta:
    key: str
    label: str
    unit: str
    better: Better
    a: float | None
    b: float | None
    delta: float | None
    """B - A; None when either side has no value."""
    percent: float | None
    """delta / |A| in percent; None when A is 0 (and B is not) or a value is missing."""
    verdict: Verdict | None
    """Whether B is better than A for this metric."""


@dataclass(frozen=True)
class RunComparison:
    load: Load
    metrics: tuple[MetricDelta, ...]

    def metric(self, key: str) -> MetricDelta:
        return next(m for m in self.metrics if m.key == key)


@dataclass(frozen=True)
class Accuracy:
    """Absolute percent error of one metric over the matched runs where both sides have it."""

    key: str
    label: str
    runs: int
    median_pct: float | None
    p90_pct: float | None


@dataclass(frozen=True)
class Comparison:
    source_a: Source
    source_b: Source
    matched: tuple[RunComparison, ...]
    only_a: tuple[Load, ...]
    only_b: tuple[Load, ...]
    reference: Side
    """The side errors are relative to: the measured one (B when both or neither are)."""
    accuracy: tuple[Accuracy, ...]


def _delta(metric: Metric, a: float | None, b: float | None) -> MetricDelta:
    delta = percent = None
    verdict: Verdict | None = None
    if a is not None and b is not None:
        delta = b - a
        if a != 0:
            percent = delta / abs(a) * 100
        elif b == 0:
            percent = 0.0
        if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            verdict = "same"
        else:
            b_higher = b > a
            verdict = "better" if b_higher == (metric.better is Better.HIGHER) else "worse"
    return MetricDelta(
        metric.key, metric.label, metric.unit, metric.better, a, b, delta, percent, verdict
    )


def _compare_run(a: Run, b: Run) -> RunComparison:
    return RunComparison(a.load, tuple(_delta(m, m.get(a), m.get(b)) for m in METRICS))


def _key(load: Load) -> tuple[str, float]:
    # Loads come from JSON on both sides; rounding absorbs float noise such as 0.1 + 0.2.
    return load.mode.value, round(load.value, 9)


def _pair(
    a: Sequence[Run], b: Sequence[Run]
) -> tuple[list[tuple[Run, Run]], list[Load], list[Load]]:
    """Match runs by load, in A's order; repeated loads pair up in order of appearance."""
    pending: dict[tuple[str, float], list[Run]] = {}
    for run in b:
        pending.setdefault(_key(run.load), []).append(run)
    pairs, only_a = [], []
    for run in a:
        queue = pending.get(_key(run.load))
        if queue:
            pairs.append((run, queue.pop(0)))
        else:
            only_a.append(run.load)
    matched_b = {id(rb) for _, rb in pairs}
    only_b = [run.load for run in b if id(run) not in matched_b]
    return pairs, only_a, only_b


def _quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default method)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _accuracy(key: str, runs: Sequence[RunComparison], reference: Side) -> Accuracy:
    errors = []
    for run in runs:
        m = run.metric(key)
        if m.a is None or m.b is None:
            continue
        ref = m.b if reference == "b" else m.a
        if ref != 0:
            errors.append(abs(m.a - m.b) / abs(ref) * 100)
    label = next(m.label for m in METRICS if m.key == key)
    if not errors:
        return Accuracy(key, label, 0, None, None)
    return Accuracy(key, label, len(errors), statistics.median(errors), _quantile(errors, 0.9))


def compare_results(a: BenchResult, b: BenchResult) -> Comparison:
    """Compare B against A, run by run (pure: no I/O)."""
    pairs, only_a, only_b = _pair(a.runs, b.runs)
    matched = tuple(_compare_run(ra, rb) for ra, rb in pairs)
    reference: Side = (
        "a" if a.source is Source.MEASURED and b.source is not Source.MEASURED else "b"
    )
    accuracy = tuple(_accuracy(key, matched, reference) for key in ACCURACY_KEYS)
    return Comparison(
        a.source, b.source, matched, tuple(only_a), tuple(only_b), reference, accuracy
    )


def accuracy_line(comparison: Comparison, label_a: str = "A", label_b: str = "B") -> str:
    """`median absolute error vs measured.json: TTFT p50 4.2% (p90 8.0%, 5 runs); ...`."""
    ref = label_b if comparison.reference == "b" else label_a
    parts = []
    for acc in comparison.accuracy:
        if acc.median_pct is None or acc.p90_pct is None:
            parts.append(f"{acc.label} {MISSING} (no matched run has both values)")
        else:
            parts.append(
                f"{acc.label} {acc.median_pct:.1f}% (p90 {acc.p90_pct:.1f}%, {acc.runs} runs)"
            )
    return f"median absolute error vs {ref}: " + "; ".join(parts)


_TURN_KEYS = frozenset({"ttft_first_turn_p50", "ttft_returning_p50"})
_VERDICT_STYLE = {"better": "green", "worse": "red", "same": "dim"}


def _run_table(run: RunComparison, label_a: str, label_b: str) -> Table:
    table = Table(
        title=format_load(run.load),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    for header in ("metric", label_a, label_b, "Δ (B-A)", "Δ%", "B vs A"):
        table.add_column(header, justify="left" if header in ("metric", "B vs A") else "right")
    for m in run.metrics:
        if m.a is None and m.b is None and m.key in _TURN_KEYS:
            continue  # not a multi_turn run: the rows would say nothing
        arrow = "↓" if m.better is Better.LOWER else "↑"
        pct = MISSING if m.percent is None else f"{m.percent:+.1f}%"
        verdict = Text(m.verdict or MISSING, style=_VERDICT_STYLE.get(m.verdict or "", ""))
        table.add_row(
            Text(f"{m.label} ({m.unit}) {arrow}"),
            fmt_num(m.a),
            fmt_num(m.b),
            fmt_signed(m.delta),
            pct,
            verdict,
        )
    return table


def render_comparison(comparison: Comparison, label_a: str = "A", label_b: str = "B") -> Group:
    """The console view: sources, one table per matched run, unmatched loads, accuracy."""
    a, b = comparison.source_a.value, comparison.source_b.value
    parts: list[RenderableType] = [
        Text(f"A = {label_a} ({a})   B = {label_b} ({b})"),
        Text("↓ lower is better, ↑ higher is better; Δ = B - A, Δ% relative to A", style="dim"),
    ]
    parts += [_run_table(run, label_a, label_b) for run in comparison.matched]
    if comparison.only_a:
        parts.append(Text("only in A: " + ", ".join(format_load(x) for x in comparison.only_a)))
    if comparison.only_b:
        parts.append(Text("only in B: " + ", ".join(format_load(x) for x in comparison.only_b)))
    if not comparison.matched:
        parts.append(
            Text("no run of A has the load of a run of B: nothing to compare", style="yellow")
        )
    parts.append(Text(accuracy_line(comparison, label_a, label_b), style="bold"))
    return Group(*parts)
