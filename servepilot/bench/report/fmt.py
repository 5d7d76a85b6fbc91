"""Number and load formats shared by the HTML report, the console table and `bench compare`.

One place, so a value reads the same in the terminal and in the report.
"""

from __future__ import annotations

from servepilot.core.results import Load, LoadMode

MISSING = "—"


def format_load(load: Load) -> str:
    """`c=16` for a closed loop at concurrency 16, `r=2.5/s` for an open loop at 2.5 req/s."""
    if load.mode is LoadMode.CONCURRENCY:
        return f"c={load.value:g}"
    return f"r={load.value:g}/s"


def level_name(load: Load) -> str:
    """`concurrency 16`, `rate 2.5/s`: a level's name in sentences and beside its progress."""
    if load.mode is LoadMode.CONCURRENCY:
        return f"concurrency {load.value:g}"
    return f"rate {load.value:g}/s"


def load_axis_label(mode: LoadMode) -> str:
    if mode is LoadMode.CONCURRENCY:
        return "concurrency (requests in flight)"
    return "request rate (req/s)"


def fmt_num(value: float | None) -> str:
    """Three significant digits or more: enough to compare runs, few enough to scan a column."""
    if value is None:
        return MISSING
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.01 or magnitude == 0:
        return f"{value:.2f}"
    return f"{value:.2g}"


def fmt_ms(value: float | None) -> str:
    return MISSING if value is None else f"{fmt_num(value)} ms"


def fmt_pct(fraction: float | None) -> str:
    """A share (0..1) as a percentage."""
    if fraction is None:
        return MISSING
    return f"{fraction * 100:.1f}%"


def fmt_signed(value: float | None, suffix: str = "") -> str:
    if value is None:
        return MISSING
    text = fmt_num(value)
    return (text if value < 0 else f"+{text}") + suffix


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return MISSING
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{fmt_num(value / size)} {unit}"
    return f"{fmt_num(value)} B"


def fmt_tick(value: float) -> str:
    """Axis ticks: short (1.5k, 2M) because they sit side by side under a plot."""
    magnitude = abs(value)
    for suffix, size in (("M", 1e6), ("k", 1e3)):
        if magnitude >= size:
            return f"{value / size:g}{suffix}"
    if magnitude >= 1 or magnitude == 0:
        return f"{value:g}"
    return f"{value:.3g}"
