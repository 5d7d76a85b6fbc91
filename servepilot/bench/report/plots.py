"""The report's charts, built from a result (and its per-request records when given)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from html import escape

from servepilot.bench.metrics import request_times
from servepilot.bench.records import RequestRecord
from servepilot.bench.report.fmt import fmt_num, format_load, load_axis_label
from servepilot.bench.report.svg import (
    PALETTE,
    Axis,
    Chart,
    RefLine,
    Series,
    ramp_color,
    render_chart,
    wants_log,
)
from servepilot.core.results import BenchResult, Load, LoadMode, Run, Stats, Window

CDF_POINTS = 200
"""Points per CDF line: enough for a smooth curve, few enough that 20 lines stay light."""

_SPOT_COLOR = "#1b7a3a"
_NO_DATA = '<p class="nodata">{title}: no data to plot.</p>'


def _chart_or_note(chart: Chart) -> str:
    if not any(s.points for s in chart.series):
        return _NO_DATA.format(title=escape(chart.title))
    return render_chart(chart)


def _load_series(
    runs: Sequence[Run],
    name: str,
    color: str,
    get: Callable[[Run], float | None],
    unit: str,
    dashed: bool = False,
) -> Series:
    points, tips = [], []
    for run in runs:
        value = get(run)
        if value is not None:
            points.append((run.load.value, value))
            tips.append(f"{format_load(run.load)}: {name} {fmt_num(value)} {unit}")
    return Series(name, tuple(points), color, dashed=dashed, tips=tuple(tips))


def _latency_chart(
    runs: Sequence[Run], x: Axis, metric: str, slo: dict[str, float], spot: tuple[RefLine, ...]
) -> Chart:
    def pick(pct: str) -> Callable[[Run], float | None]:
        def get(run: Run) -> float | None:
            stats: Stats = getattr(run, f"{metric}_ms")
            value: float | None = getattr(stats, pct)
            return value

        return get

    label = metric.upper()
    limit = slo.get(f"{metric}_p99_ms")
    refs = (RefLine(limit, f"SLO p99 {fmt_num(limit)} ms", "#c62828"),) if limit else ()
    return Chart(
        f"{label} against load",
        x,
        Axis(f"{label} (ms)"),
        (
            _load_series(runs, f"{label} p99", PALETTE[1], pick("p99"), "ms"),
            _load_series(runs, f"{label} p50", PALETTE[0], pick("p50"), "ms", dashed=True),
        ),
        x_refs=spot,
        y_refs=refs,
    )


def _is_geometric(levels: list[float]) -> bool:
    """A doubling-style sweep (1, 2, 4 ... 64) reads best on a log axis, a stepped one
    (2, 4, 6 ... 40) on a linear axis."""
    if not wants_log(levels, 16):
        return False
    ratios = sorted(b / a for a, b in itertools.pairwise(levels))
    return ratios[len(ratios) // 2] >= 1.5


def load_plots(result: BenchResult) -> list[str]:
    """Throughput and latency against load, one set per load mode in the result."""
    out: list[str] = []
    for mode in LoadMode:
        runs = sorted((r for r in result.runs if r.load.mode is mode), key=lambda r: r.load.value)
        if not runs:
            continue
        levels = sorted({r.load.value for r in runs})
        log = _is_geometric(levels)
        # Up to a dozen levels, tick at the levels themselves (1, 2, 4, ... 64 reads better
        # than 1, 2, 5, ... 100 under a doubling sweep); beyond that the 1-2-5 ticks.
        ticks = tuple(levels) if log and len(levels) <= 12 else ()
        x = Axis(load_axis_label(mode), log=log, ticks=ticks)
        spot: tuple[RefLine, ...] = ()
        if result.sweet_spot is not None and result.sweet_spot.load.mode is mode:
            load = result.sweet_spot.load
            spot = (RefLine(load.value, f"sweet spot {format_load(load)}", _SPOT_COLOR),)
        throughput = Chart(
            "Output throughput against load",
            x,
            Axis("output throughput (tok/s)"),
            (
                _load_series(
                    runs, "output tok/s", PALETTE[2], lambda r: r.output_throughput, "tok/s"
                ),
            ),
            x_refs=spot,
        )
        out.append(_chart_or_note(throughput))
        out.extend(
            _chart_or_note(_latency_chart(runs, x, m, result.slo, spot))
            for m in ("ttft", "e2e", "tpot")
        )
    return out


def _cdf_points(values: list[float]) -> tuple[tuple[float, float], ...]:
    ordered = sorted(values)
    n = len(ordered)
    if n <= CDF_POINTS:
        return tuple((v, (i + 1) / n) for i, v in enumerate(ordered))
    ranks = (round(k * (n - 1) / (CDF_POINTS - 1)) for k in range(CDF_POINTS))
    return tuple((ordered[i], (i + 1) / n) for i in ranks)


def latency_samples(
    records: Sequence[tuple[Load, RequestRecord]],
) -> dict[Load, tuple[list[float], list[float]]]:
    """TTFT and E2E (ms) of each load's successful, measured (non-warm-up) requests."""
    samples: dict[Load, tuple[list[float], list[float]]] = {}
    for load, record in records:
        times = None if record.warmup else request_times(record)
        if times is not None:
            ttft, e2e = samples.setdefault(load, ([], []))
            ttft.append(times.ttft_ms)
            e2e.append(times.e2e_ms)
    return dict(sorted(samples.items(), key=lambda kv: (kv[0].mode.value, kv[0].value)))


def cdf_plots(records: Sequence[tuple[Load, RequestRecord]]) -> list[str]:
    samples = latency_samples(records)
    charts = []
    for which, name in ((0, "TTFT"), (1, "E2E")):
        series = tuple(
            Series(
                f"{format_load(load)} (n={len(pair[which]):,})",
                _cdf_points(pair[which]),
                ramp_color(i, len(samples)),
                markers=False,
            )
            for i, (load, pair) in enumerate(samples.items())
        )
        values = [p[0] for s in series for p in s.points]
        x = Axis(f"{name} (ms)", log=wants_log(values, 20))
        charts.append(
            Chart(f"{name} distribution", x, Axis("fraction of requests", lo=0, hi=1), series)
        )
    return [_chart_or_note(c) for c in charts]


def _time_axis(windows: Sequence[Window]) -> tuple[Axis, float]:
    span = windows[-1].end_s - windows[0].start_s
    for unit, size, limit in (("s", 1.0, 600.0), ("min", 60.0, 36_000.0)):
        if span <= limit:
            return Axis(f"time since start ({unit})"), size
    return Axis("time since start (h)"), 3600.0


def _window_series(
    windows: Sequence[Window],
    scale: float,
    name: str,
    color: str,
    unit: str,
    get: Callable[[Window], float | None],
) -> Series:
    points, tips = [], []
    for w in windows:
        value = get(w)
        if value is not None:
            points.append(((w.start_s + w.end_s) / 2 / scale, value))
            tips.append(f"{fmt_num(w.start_s)} to {fmt_num(w.end_s)} s: {fmt_num(value)} {unit}")
    return Series(name, tuple(points), color, tips=tuple(tips))


def _memory_mib(window: Window) -> float | None:
    memory = window.resident_memory_bytes
    return None if memory is None else memory / 2**20


def soak_plots(run: Run, slo: dict[str, float]) -> list[str]:
    """Throughput, P99 and resident memory per window of one soak run."""
    windows = sorted(run.windows, key=lambda w: w.start_s)
    x, scale = _time_axis(windows)
    where = format_load(run.load)
    ttft_slo, e2e_slo = slo.get("ttft_p99_ms"), slo.get("e2e_p99_ms")
    refs = tuple(
        RefLine(limit, f"{label} SLO {fmt_num(limit)} ms", color)
        for limit, label, color in ((ttft_slo, "TTFT", PALETTE[0]), (e2e_slo, "E2E", PALETTE[1]))
        if limit is not None
    )
    throughput = _window_series(
        windows, scale, "output tok/s", PALETTE[2], "tok/s", lambda w: w.output_throughput
    )
    ttft = _window_series(windows, scale, "TTFT p99", PALETTE[0], "ms", lambda w: w.ttft_p99_ms)
    e2e = _window_series(windows, scale, "E2E p99", PALETTE[1], "ms", lambda w: w.e2e_p99_ms)
    memory = _window_series(windows, scale, "resident memory", PALETTE[3], "MiB", _memory_mib)
    charts = (
        Chart(f"Soak {where}: throughput per window", x, Axis("output tok/s"), (throughput,)),
        Chart(f"Soak {where}: P99 per window", x, Axis("p99 (ms)"), (ttft, e2e), y_refs=refs),
        Chart(f"Soak {where}: target resident memory", x, Axis("resident memory (MiB)"), (memory,)),
    )
    return [_chart_or_note(c) for c in charts]
