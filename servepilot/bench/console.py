"""The bench result in the terminal: the run table and the sweet-spot line.

The columns are the HTML report's (`report.columns`), so what the terminal shows and what
the report shows cannot disagree.
"""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.columns import RUN_COLUMNS
from servepilot.bench.report.fmt import fmt_ms, fmt_num, format_load
from servepilot.core.results import BenchResult


def render_runs_table(result: BenchResult) -> Table:
    """One row per run; the sweet spot in bold green, values over an SLO in red."""
    table = Table(
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
        title=f"servepilot bench ({result.source.value})",
        title_justify="left",
    )
    for i, column in enumerate(RUN_COLUMNS):
        table.add_column(
            _stacked(column.header, column.unit), justify="left" if i == 0 else "right"
        )
    spot = result.sweet_spot.load if result.sweet_spot else None
    for run in result.runs:
        cells = []
        for column in RUN_COLUMNS:
            # Text, not markup: a cell holding "[...]" must print as is, not as a style tag.
            cell = Text(column.text(run))
            if column.over_slo(run, result.slo):
                cell.stylize("bold red")
            if column.alarm is not None and column.alarm(run):
                cell.stylize("bold yellow reverse")
            cells.append(cell)
        table.add_row(*cells, style="bold green" if run.load == spot else None)
    if result.slo:
        limits = ", ".join(f"{k}={v:g}" for k, v in result.slo.items())
        table.caption = f"SLO {limits}; red: above the SLO"
        table.caption_justify = "left"
    return table


def _stacked(header: str, unit: str) -> str:
    """One word per line: sixteen columns then fit a 120-column terminal."""
    words = header.split()
    if unit and unit not in words:
        words.append(unit)
    return "\n".join(words)


def sweet_spot_line(result: BenchResult) -> str:
    """`sweet spot: c=16 (1,234 tok/s, TTFT p99 120 ms, E2E p99 3,400 ms): <reason>`."""
    spot = result.sweet_spot
    if spot is None:
        return "sweet spot: none found for these runs"
    run = next((r for r in result.runs if r.load == spot.load), None)
    facts = ""
    if run is not None:
        facts = (
            f" ({fmt_num(run.output_throughput)} tok/s, TTFT p99 {fmt_ms(run.ttft_ms.p99)},"
            f" E2E p99 {fmt_ms(run.e2e_ms.p99)})"
        )
    return f"sweet spot: {format_load(spot.load)}{facts}: {spot.reason}"
