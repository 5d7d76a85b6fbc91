"""The bench result in the terminal: the run table, the sweet-spot line, the words for a level
while it runs and the warnings about a run (`servepilot sim` shows its runs the same way).

The columns are the HTML report's (`report.columns`), so what the terminal shows and what
the report shows cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.columns import Column, has_turns, report_columns
from servepilot.bench.report.fmt import fmt_ms, fmt_num, format_load, level_name
from servepilot.bench.runlength import Estimate
from servepilot.bench.runner import LAG_LIMIT_MS
from servepilot.bench.shortfalls import (
    client_limited,
    leak_bytes_per_request,
    leaking_sources,
    shortfalls,
)
from servepilot.core.results import BenchResult, Load, Run
from servepilot.load.loadplan import LoadPlan


def render_runs_table(result: BenchResult) -> Table:
    """One row per run; the sweet spot in bold green, values over an SLO in red."""
    table = Table(
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        header_style="bold",
        title=f"servepilot bench ({result.source.value})",
        title_justify="left",
    )
    columns = terminal_columns(result)
    for i, column in enumerate(columns):
        table.add_column(
            _stacked(column.header, column.unit), justify="left" if i == 0 else "right"
        )
    spot = result.sweet_spot.load if result.sweet_spot else None
    for run in result.runs:
        cells = []
        for column in columns:
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


def terminal_columns(result: BenchResult) -> tuple[Column, ...]:
    """The report's columns less those that would only repeat another here, so that the table
    fits a 120-column terminal: without an SLO, goodput is Req/s (and SLO met is never
    shown); in a closed loop no rate was asked, so got/asked is Req/s. report.html keeps
    every other column."""
    closed = all(run.client is None or run.client.requested_rate is None for run in result.runs)
    dropped = {"Goodput"} if not result.slo else set()
    if closed:
        dropped.add("Rate got/asked")
    columns = report_columns(result.slo, turns=has_turns(result.runs))
    return tuple(c for c in columns if c.header not in dropped)


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


def fmt_length_s(seconds: float) -> str:
    """`45 s`, `12 min`, `1 h 05 min`: a length read at a glance."""
    if seconds < 100:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def estimate_line(estimate: Estimate, plans: Sequence[LoadPlan], loads: Sequence[Load]) -> str:
    """The run's length as far as it is known: before the first request, once the first
    answer is in, and after each level (`plans` and `loads`: every level, a sweep's to its
    upper bound)."""
    done, total = estimate.levels_done, estimate.levels_total
    head = "estimate: "
    if done:
        head = f"level {done} of {'at most ' if estimate.sweep else ''}{total} done; estimate: "
    left = plans[done:]
    count = f"{len(left)} level{'s' if len(left) != 1 else ''}"
    long_s, short_s = estimate.left_s, estimate.short_s
    if long_s is None or short_s is None:
        body = f"{count} left, {_sizes(left)}; their time is estimated once the first answer is in"
    elif estimate.bound_only:
        body = f"at most {fmt_length_s(long_s)} left: {count} of {_sizes(left)}"
    else:
        basis = estimate.pace.basis if estimate.pace else "the levels' sizes"
        body = (
            f"{_range(short_s, long_s)} left for {count}, from {basis} "
            "(the short end if throughput grows with the load, the long end if it stays flat)"
        )
    if estimate.sweep and loads:
        body += (
            f"; the sweep may stop sooner (its bound: {total} levels, "
            f"{format_load(loads[0])} to {format_load(loads[-1])})"
        )
    return head + body


def _range(short_s: float, long_s: float) -> str:
    """`about 3 min`, or `1-3 min` when the ends differ."""
    low, high = fmt_length_s(short_s), fmt_length_s(long_s)
    if low == high:
        return f"about {high}"
    low_value, low_unit = low.rsplit(" ", 1)
    if high.endswith(f" {low_unit}") and " h " not in high:
        return f"{low_value}-{high}"
    return f"{low} to {high}"


def _sizes(plans: Sequence[LoadPlan]) -> str:
    """`20 requests each (+5 warm-up)`, `30 s each + up to 30 s for the answers in flight`."""
    if not plans:
        return "nothing"
    plan = plans[0]
    warmup = f" (+{plan.warmup_requests:,} warm-up)" if plan.warmup_requests else ""
    if plan.duration_s is not None:
        return (
            f"{fmt_length_s(plan.duration_s)} each{warmup} + up to "
            f"{fmt_length_s(plan.grace_s)} for the answers in flight to finish"
        )
    total = sum(p.max_requests or 0 for p in plans)
    return f"{total:,} requests in all{warmup}"


def progress_left(left_s: tuple[float, float] | None) -> str:
    """`about 4 min left`, `2-4 min left` (the estimate's short and long end), or nothing
    while unknown."""
    return "" if left_s is None else f"{_range(*left_s)} left"


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
        asked = client.requested_rate
        rate = f"{client.achieved_rate:.2f}" + (f" of {asked:g}" if asked is not None else "")
        warnings.append(
            f"at {level_name(run.load)} the client fell behind ({rate} req/s sent, send lag "
            f"p99 {client.send_lag_ms.p99 or 0:,.0f} ms; more than {LAG_LIMIT_MS:g} ms, or a "
            "rate short of the schedule, makes a client-bound run): the numbers understate "
            "the server; give the client a quieter or bigger machine, or --processes"
        )
    if (growth := leak_bytes_per_request(run)) is not None:
        warnings.append(
            f"memory grew {growth / 2**20:.1f} MiB per request during the soak: "
            "a leak by the 2 MB/request rule"
        )
    for source, growth in leaking_sources(run).items():
        warnings.append(
            f"{source}: memory grew {growth / 2**20:.1f} MiB per request during the soak: "
            "a leak by the 2 MB/request rule"
        )
    return tuple(warnings)


def ending(result: BenchResult, *, measured: bool) -> tuple[int, str | None]:
    """A run's exit code and what to say of it: 130 when Ctrl-C cut it short (its finished
    levels are saved); for a measured run, 1 when no request of any level succeeded, since
    its numbers then describe the failures, not the server; for a simulated one, a warning
    when most requests failed."""
    if result.interrupted:
        return 130, _interrupted(result)
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


def _interrupted(result: BenchResult) -> str:
    windows = sum(len(run.windows) for run in result.runs)
    if windows:  # a soak: one level, kept as the windows that finished
        finished = f"{windows} finished soak window{'s' if windows != 1 else ''}"
    else:
        done = len(result.runs)
        finished = f"{done} finished level{'s' if done != 1 else ''}"
    return f"interrupted after {finished}: the results above (and in --out) hold only those"


def _top_errors(result: BenchResult) -> str:
    counts: dict[str, int] = {}
    for run in result.runs:
        for kind, count in run.errors.items():
            counts[kind] = counts.get(kind, 0) + count
    top = sorted(counts.items(), key=lambda item: -item[1])[:3]
    return ", ".join(f"{kind} {count:,}" for kind, count in top) or "no error kinds recorded"
