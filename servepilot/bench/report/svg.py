"""Inline SVG line charts: axes with ticks, series, reference lines and a legend.

The report must open offline from one file, so it cannot load a plotting library; these few
primitives are all its charts need. Hover text uses SVG `<title>`, which browsers show
without any script.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from servepilot.bench.report.fmt import fmt_tick

# Okabe-Ito: distinguishable with the common colour-vision deficiencies, dark enough on white.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")

# Low load to high load, cool to warm: the order of the load levels stays readable at 20 lines.
_RAMP = ((94, 60, 153), (33, 102, 172), (27, 158, 119), (224, 130, 20), (178, 24, 43))

_FONT_PX = 12
_CHAR_PX = 6.8  # average glyph width of the sans-serif stack at 12 px, for layout estimates
_MARGIN_LEFT = 62
_MARGIN_RIGHT = 18
_MARGIN_TOP = 34
_MARGIN_BOTTOM = 48
_LEGEND_ROW_PX = 18


@dataclass(frozen=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]
    color: str
    markers: bool = True
    dashed: bool = False
    tips: tuple[str, ...] = ()
    """Hover text for each point (same order as `points`); markers only."""


@dataclass(frozen=True)
class RefLine:
    """A horizontal (on the y axis) or vertical (on the x axis) marker such as an SLO."""

    value: float
    label: str
    color: str


@dataclass(frozen=True)
class Axis:
    label: str
    log: bool = False
    lo: float | None = None
    """Fixed lower end (linear axes start at 0 unless this says otherwise)."""
    hi: float | None = None
    ticks: tuple[float, ...] = ()
    """Log axes only: tick at these values (a doubling sweep's own levels) instead of 1-2-5."""
    whole: bool = False
    """Linear axes of counted things (trials): ticks at whole numbers only."""


@dataclass(frozen=True)
class Chart:
    title: str
    x: Axis
    y: Axis
    series: tuple[Series, ...]
    x_refs: tuple[RefLine, ...] = ()
    y_refs: tuple[RefLine, ...] = ()
    width: int = 560
    plot_height: int = 250


@dataclass(frozen=True)
class _Scale:
    lo: float
    hi: float
    px_lo: float
    px_hi: float
    log: bool
    ticks: tuple[float, ...]

    def __call__(self, value: float) -> float:
        if self.log:
            frac = (math.log10(value) - math.log10(self.lo)) / (
                math.log10(self.hi) - math.log10(self.lo)
            )
        else:
            frac = (value - self.lo) / (self.hi - self.lo)
        return self.px_lo + frac * (self.px_hi - self.px_lo)


def ramp_color(i: int, n: int) -> str:
    """The i-th of n colours along the load ramp."""
    t = 0.0 if n <= 1 else i / (n - 1)
    pos = t * (len(_RAMP) - 1)
    k = min(int(pos), len(_RAMP) - 2)
    f = pos - k
    rgb = (round(a + (b - a) * f) for a, b in zip(_RAMP[k], _RAMP[k + 1], strict=True))
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def wants_log(values: list[float], ratio: float = 20.0) -> bool:
    """A log axis when the data spans more than `ratio`x (a doubling sweep, a long tail)."""
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(values) and max(values) / min(values) >= ratio


def _nice_step(span: float, target_ticks: int = 5) -> float:
    raw = span / target_ticks
    base = 10.0 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if base * mult >= raw:
            return base * mult
    return base * 10


def _linear_domain(values: list[float], axis: Axis) -> tuple[float, float, tuple[float, ...]]:
    lo = axis.lo if axis.lo is not None else min([0.0, *values])
    hi = axis.hi if axis.hi is not None else max(values, default=1.0)
    if axis.hi is None and len(set(values)) == 1 and hi > 0:
        hi *= 2  # a single value (one run) sits mid-plot, not pinned to the edge
    elif axis.hi is None:
        hi += (hi - lo) * 0.04  # room above the top value for an SLO line's label
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = _nice_step(hi - lo)
    if axis.whole:  # 1, 2, 5, 10, ...: a 2.5 step rounds down to 2
        step = float(max(1, math.floor(step)))
    lo = math.floor(lo / step + 1e-9) * step if axis.lo is None else lo
    hi = math.ceil(hi / step - 1e-9) * step if axis.hi is None else hi
    count = round((hi - lo) / step)
    # Multiplying, not accumulating, keeps ticks free of float drift (0.30000000000000004).
    ticks = tuple(round(lo + i * step, 10) for i in range(count + 1))
    return lo, hi, ticks


def _log_domain(values: list[float]) -> tuple[float, float, tuple[float, ...]]:
    positive = [v for v in values if v > 0] or [1.0]
    lo_exp = math.floor(math.log10(min(positive)))
    hi_exp = math.ceil(math.log10(max(positive)))
    candidates = [m * 10.0**e for e in range(lo_exp, hi_exp + 1) for m in (1, 2, 5)]
    lo = max(c for c in candidates if c <= min(positive))
    hi = min((c for c in candidates if c >= max(positive)), default=candidates[-1])
    if hi <= lo:
        hi = lo * 10
    ticks = [c for c in candidates if lo <= c <= hi]
    if len(ticks) > 9:  # more than ~3 decades: 1-2-5 labels would crowd, keep the decades
        ticks = [c for c in ticks if math.isclose(math.log10(c), round(math.log10(c)))]
    return lo, hi, tuple(ticks)


def _given_ticks_domain(values: list[float], axis: Axis) -> tuple[float, float, tuple[float, ...]]:
    ticks = tuple(t for t in axis.ticks if t > 0)
    every = [v for v in values if v > 0] + list(ticks)
    # A little room beyond the end ticks, so end points are not drawn on the frame.
    return min(every) / 1.15, max(every) * 1.15, ticks


def _scale(values: list[float], axis: Axis, px_lo: float, px_hi: float) -> _Scale:
    if axis.log and axis.ticks:
        lo, hi, ticks = _given_ticks_domain(values, axis)
    elif axis.log:
        lo, hi, ticks = _log_domain(values)
    else:
        lo, hi, ticks = _linear_domain(values, axis)
    return _Scale(lo, hi, px_lo, px_hi, axis.log, ticks)


def _legend_rows(series: tuple[Series, ...], width: float) -> list[list[tuple[Series, float]]]:
    rows: list[list[tuple[Series, float]]] = [[]]
    used = 0.0
    for s in series:
        item = 28 + len(s.name) * _CHAR_PX + 14
        if rows[-1] and used + item > width:
            rows.append([])
            used = 0.0
        rows[-1].append((s, used))
        used += item
    return rows if rows[0] else []


def _axes(chart: Chart, xs: _Scale, ys: _Scale, bottom: float) -> list[str]:
    left, right, top = xs.px_lo, xs.px_hi, ys.px_hi
    out = [
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" '
        'fill="#fff" stroke="#bbb"/>'
    ]
    for t in ys.ticks:
        y = ys(t)
        out.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt_tick(t)}</text>')
    last_end = -math.inf
    for t in xs.ticks:
        x = xs(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" class="grid"/>')
        label = fmt_tick(t)
        half = len(label) * _CHAR_PX / 2
        if x - half < last_end + 6:  # would overlap the previous label: keep the grid line only
            continue
        last_end = x + half
        out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{label}</text>')
    mid_y = (top + bottom) / 2
    out.append(
        f'<text x="{(left + right) / 2}" y="{bottom + 36}" text-anchor="middle" '
        f'class="axis">{escape(chart.x.label)}</text>'
    )
    out.append(
        f'<text transform="translate(14 {mid_y}) rotate(-90)" text-anchor="middle" '
        f'class="axis">{escape(chart.y.label)}</text>'
    )
    return out


def _refs(chart: Chart, xs: _Scale, ys: _Scale, bottom: float) -> list[str]:
    out: list[str] = []
    for ref in chart.y_refs:
        y = ys(ref.value)
        out.append(
            f'<line x1="{xs.px_lo}" x2="{xs.px_hi}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{ref.color}" stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{xs.px_hi - 4}" y="{y - 4:.1f}" text-anchor="end" class="ref" '
            f'fill="{ref.color}">{escape(ref.label)}</text>'
        )
    for ref in chart.x_refs:
        x = xs(ref.value)
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{ys.px_hi}" y2="{bottom}" '
            f'stroke="{ref.color}" stroke-width="2" stroke-dasharray="2 3"/>'
        )
        # Label on the side of the line with more room, so it never leaves the plot.
        right_side = x < (xs.px_lo + xs.px_hi) / 2
        anchor, dx = ("start", 5) if right_side else ("end", -5)
        out.append(
            f'<text x="{x + dx:.1f}" y="{ys.px_hi + 14}" text-anchor="{anchor}" '
            f'class="ref" fill="{ref.color}">{escape(ref.label)}</text>'
        )
    return out


def _series(s: Series, xs: _Scale, ys: _Scale) -> list[str]:
    coords = [(xs(x), ys(y)) for x, y in s.points]
    dash = ' stroke-dasharray="5 3"' if s.dashed else ""
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
    out = [
        f'<polyline class="line" data-series="{escape(s.name)}" points="{path}" fill="none" '
        f'stroke="{s.color}" stroke-width="2"{dash}/>'
    ]
    if s.markers:
        for i, (x, y) in enumerate(coords):
            tip = f"<title>{escape(s.tips[i])}</title>" if i < len(s.tips) else ""
            out.append(
                f'<circle class="pt" cx="{x:.1f}" cy="{y:.1f}" r="3.5" '
                f'fill="{s.color}">{tip}</circle>'
            )
    return out


def _legend(series: tuple[Series, ...], left: float, top: float, width: float) -> list[str]:
    out: list[str] = []
    for r, row in enumerate(_legend_rows(series, width)):
        y = top + r * _LEGEND_ROW_PX
        for s, dx in row:
            x = left + dx
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            out.append(
                f'<line x1="{x:.1f}" x2="{x + 22:.1f}" y1="{y - 4}" y2="{y - 4}" '
                f'stroke="{s.color}" stroke-width="3"{dash}/>'
            )
            out.append(f'<text x="{x + 28:.1f}" y="{y}">{escape(s.name)}</text>')
    return out


def _usable(chart: Chart) -> tuple[Series, ...]:
    """Drop points a log axis cannot place (zero or negative)."""

    def keep(p: tuple[float, float]) -> bool:
        return (not chart.x.log or p[0] > 0) and (not chart.y.log or p[1] > 0)

    return tuple(
        Series(
            s.name,
            tuple(p for p in s.points if keep(p)),
            s.color,
            s.markers,
            s.dashed,
            tuple(t for p, t in zip(s.points, s.tips, strict=False) if keep(p)),
        )
        for s in chart.series
    )


def render_chart(chart: Chart) -> str:
    """The chart as an `<svg>` element sized to its legend."""
    series = _usable(chart)
    left, right = _MARGIN_LEFT, chart.width - _MARGIN_RIGHT
    top, bottom = _MARGIN_TOP, _MARGIN_TOP + chart.plot_height
    legend_rows = len(_legend_rows(series, right - left))
    height = bottom + _MARGIN_BOTTOM + legend_rows * _LEGEND_ROW_PX + 4
    xs_data = [p[0] for s in series for p in s.points] + [r.value for r in chart.x_refs]
    ys_data = [p[1] for s in series for p in s.points] + [r.value for r in chart.y_refs]
    xs = _scale(xs_data, chart.x, left, right)
    ys = _scale(ys_data, chart.y, bottom, top)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{chart.width}" '
        f'height="{height}" viewBox="0 0 {chart.width} {height}" font-size="{_FONT_PX}" '
        f'role="img" aria-label="{escape(chart.title)}">',
        f'<text x="{left}" y="20" class="title">{escape(chart.title)}</text>',
        *_axes(chart, xs, ys, bottom),
        *(part for s in series for part in _series(s, xs, ys)),
        *_refs(chart, xs, ys, bottom),
        *_legend(series, left, bottom + _MARGIN_BOTTOM + 12, right - left),
        "</svg>",
    ]
    return "\n".join(parts)
