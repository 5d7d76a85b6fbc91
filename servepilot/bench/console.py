"""The bench result in the terminal: the run table, the sweet-spot line, the words for a level
while it runs and the warnings about a run (`servepilot sim` shows its runs the same way).

The columns are the HTML report's (`report.columns`), so what the terminal shows and what
the report shows cannot disagree.
"""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.columns import RUN_COLUMNS
from servepilot.bench.report.fmt import fmt_ms, fmt_num, format_load, level_name
from servepilot.bench.shortfalls import client_limited, leak_bytes_per_request, shortfalls
from servepilot.core.results import BenchResult, Run


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


def progress_counts(completed: int, failed: int) -> str:
    """A running level's requests so far: `12 ok`, `12 ok, 1 failed`."""
    return f"{completed:,} ok" + (f", {failed:,} failed" if failed else "")


def level_summary(run: Run) -> str:
    """A finished level, in the place of its progress counts."""
    p99 = run.e2e_ms.p99
    p99_text = f"{p99:,.0f} ms" if p99 is not None else "—"
    refused = f" ({run.refused:,} refused)" if run.refused else ""
    return (
        f"{run.completed:,} ok, {run.failed:,} failed{refused} · "
        f"{run.output_throughput:,.1f} tok/s · P99 E2E {p99_text}"
    )


def run_warnings(run: Run) -> tuple[str, ...]:
    """What makes a measured run's numbers suspect: refusals, a load never reached, a client
    too slow, memory that leaks."""
    warnings = list(shortfalls(run))
    if (client := client_limited(run)) is not None:
        warnings.append(
            f"at {level_name(run.load)} the client could not keep up (achieved "
            f"{client.achieved_rate:.1f} req/s): the numbers understate the server; "
            "use --processes or a bigger client machine"
        )
    if (growth := leak_bytes_per_request(run)) is not None:
        warnings.append(
            f"memory grew {growth / 2**20:.1f} MiB per request during the soak: "
            "a leak by the 2 MB/request rule"
        )
    return tuple(warnings)


def ending(result: BenchResult, *, measured: bool) -> tuple[int, str | None]:
    """A run's exit code and what to say of it: 130 when Ctrl-C cut it short (its finished
    levels are saved); for a measured run, 1 when no request of any level succeeded, since
    its numbers then describe the failures, not the server; for a simulated one, a warning
    when most requests failed."""
    if result.interrupted:
        done = len(result.runs)
        return 130, (
            f"interrupted after {done} finished level{'s' if done != 1 else ''}: the results "
            "above (and in --out) hold only those"
        )
    failed = sum(run.failed for run in result.runs)
    total = failed + sum(run.completed for run in result.runs)
    if measured and result.runs and all(run.completed == 0 for run in result.runs):
        return 1, f"no request succeeded: all {failed:,} failed (see the errors above)"
    if not measured and failed * 2 > total:
        # A what-if that mostly fails answers "this fleet cannot carry this load"; say so
        # rather than let a table of failures pass for a result.
        return (
            0,
            f"{failed:,} of {total:,} simulated requests failed ({_top_errors(result)}): "
            "this fleet does not carry this load",
        )
    return 0, None


def _top_errors(result: BenchResult) -> str:
    counts: dict[str, int] = {}
    for run in result.runs:
        for kind, count in run.errors.items():
            counts[kind] = counts.get(kind, 0) + count
    top = sorted(counts.items(), key=lambda item: -item[1])[:3]
    return ", ".join(f"{kind} {count:,}" for kind, count in top) or "no error kinds recorded"
