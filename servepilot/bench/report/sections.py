"""The text parts of the HTML report: header, sweet spot, warnings and tables.

Every string that comes from outside (target URL, model, workload fields, error reasons and
the sweet spot's reason) goes through `html.escape`: a report is opened in a browser, and a
hostile server or URL must not be able to put markup or script into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from html import escape

from servepilot.bench.report.columns import has_turns, report_columns
from servepilot.bench.report.fmt import MISSING, fmt_bytes, fmt_ms, fmt_num, format_load
from servepilot.bench.shortfalls import (
    client_limited,
    is_leak,
    leak_bytes_per_request,
    leaking_sources,
    shortfalls,
)
from servepilot.core.results import BenchResult, Run

"""The seeds' leak signal: resident memory growing by more than 2 MB per request served."""


def _value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping | list | tuple):
        return ", ".join(
            _value(v) for v in (value.values() if isinstance(value, Mapping) else value)
        )
    return str(value)


def _pairs(mapping: Mapping[str, object]) -> str:
    if not mapping:
        return MISSING
    return " · ".join(
        f"<span class=k>{escape(str(k))}</span> {escape(_value(v))}" for k, v in mapping.items()
    )


def target_name(result: BenchResult) -> str:
    return str(result.target.get("url") or result.target.get("name") or "target")


def header(result: BenchResult, generated_at: datetime) -> str:
    target = target_name(result)
    rows = [
        ("Source", escape(result.source.value)),
        ("Target", _pairs(result.target)),
        ("Workload", _pairs(result.workload)),
        ("SLOs", _pairs(result.slo) if result.slo else "none set (goodput counts every success)"),
        ("Generated", escape(generated_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip())),
    ]
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<h1>servepilot bench — {escape(target)}</h1>\n<table class="meta">{body}</table>'


def _find_run(result: BenchResult) -> Run | None:
    if result.sweet_spot is None:
        return None
    return next((r for r in result.runs if r.load == result.sweet_spot.load), None)


def sweet_spot(result: BenchResult) -> str:
    spot = result.sweet_spot
    if spot is None:
        return '<div class="sweet none"><b>No sweet spot</b> was found for these runs.</div>'
    run = _find_run(result)
    facts = ""
    if run is not None:
        facts = (
            f"{fmt_num(run.output_throughput)} output tok/s · TTFT p99 "
            f"{fmt_ms(run.ttft_ms.p99)} · E2E p99 {fmt_ms(run.e2e_ms.p99)}"
        )
    return (
        f'<div class="sweet"><div class="label">Sweet spot</div>'
        f'<div class="load">{escape(format_load(spot.load))}</div>'
        f"<div>{escape(facts)}</div>"
        f'<div class="reason">{escape(spot.reason)}</div></div>'
    )


def warnings(result: BenchResult) -> str:
    items = []
    if result.interrupted:
        items.append("The run was interrupted (Ctrl-C): only the levels that finished are here.")
    for run in result.runs:
        items += shortfalls(run)
        if (client := client_limited(run)) is not None:
            asked = client.requested_rate
            wanted = f" of the {fmt_num(asked)} req/s asked" if asked is not None else ""
            items.append(
                f"{format_load(run.load)}: the load generator, not the server, limited this "
                f"run ({fmt_num(client.achieved_rate)} req/s achieved{wanted}, send lag p99 "
                f"{fmt_num(client.send_lag_ms.p99)} ms); its latencies understate the "
                "server's best case and its throughput is not the server's ceiling."
            )
        if (growth := leak_bytes_per_request(run)) is not None:
            items.append(
                f"{format_load(run.load)}: the target's resident memory grew by "
                f"{fmt_bytes(growth)} per request (leak signal: more than 2 MiB per request)."
            )
        for source, growth in leaking_sources(run).items():
            items.append(
                f"{format_load(run.load)}: {source}'s memory grew by {fmt_bytes(growth)} "
                "per request (leak signal: more than 2 MiB per request)."
            )
    if not items:
        return ""
    lis = "".join(f"<li>{escape(i)}</li>" for i in items)
    return f'<div class="warn"><b>Warnings</b><ul>{lis}</ul></div>'


def runs_table(result: BenchResult) -> str:
    spot = result.sweet_spot.load if result.sweet_spot else None
    columns = report_columns(result.slo, turns=has_turns(result.runs))
    head = "".join(
        f"<th>{escape(c.header)}<br><span class=unit>{escape(c.unit)}</span></th>" for c in columns
    )
    rows = []
    for run in result.runs:
        cells = []
        for column in columns:
            classes = []
            if column.over_slo(run, result.slo):
                classes.append("over")
            if column.alarm is not None and column.alarm(run):
                classes.append("bad")
            cls = f' class="{" ".join(classes)}"' if classes else ""
            cells.append(f"<td{cls}>{escape(column.text(run))}</td>")
        row_cls = ' class="spot"' if run.load == spot else ""
        rows.append(f"<tr{row_cls}>{''.join(cells)}</tr>")
    note = (
        '<p class="note">Highlighted row: the sweet spot. Red cells: above the SLO. '
        "Latencies are measured from the intended send time.</p>"
    )
    body = "".join(rows)
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}'


def errors_table(runs: Iterable[Run]) -> str:
    by_reason: dict[str, dict[str, int]] = {}
    for run in runs:
        for reason, count in run.errors.items():
            by_reason.setdefault(reason, {})[format_load(run.load)] = count
    if not by_reason:
        return '<p class="note">No failed requests.</p>'
    totals = {reason: sum(per.values()) for reason, per in by_reason.items()}
    worst = max(totals.values())
    rows = []
    for reason, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        width = max(1.0, 100.0 * total / worst)
        per_run = ", ".join(f"{load}: {n:,}" for load, n in by_reason[reason].items())
        rows.append(
            f"<tr><td><code>{escape(reason)}</code></td><td class=num>{total:,}</td>"
            f'<td><div class="bar" style="width:{width:.0f}%"></div></td>'
            f"<td>{escape(per_run)}</td></tr>"
        )
    return (
        '<table class="errors"><thead><tr><th>Reason</th><th>Requests</th><th></th>'
        f"<th>By load</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def soak_summary(run: Run) -> str:
    first, last = run.windows[0], run.windows[-1]
    facts = [
        f"{len(run.windows)} windows over {fmt_num(last.end_s - first.start_s)} s",
        f"E2E p99 first window {fmt_num(first.e2e_p99_ms)} ms, last {fmt_num(last.e2e_p99_ms)} ms"
        f" (drift {_drift(first.e2e_p99_ms, last.e2e_p99_ms)})",
        f"failed {sum(w.failed for w in run.windows):,} of "
        f"{sum(w.completed + w.failed for w in run.windows):,}",
    ]
    growth = run.memory_growth_bytes_per_request
    if growth is not None:
        flag = " — above the 2 MiB leak signal" if is_leak(growth) else ""
        facts.append(f"memory growth {fmt_bytes(growth)} per request{flag}")
    for source, source_growth in run.memory_growth_by_source_bytes_per_request.items():
        flag = " — LEAK" if is_leak(source_growth) else ""
        facts.append(f"{source} {fmt_bytes(source_growth)} per request{flag}")
    return f'<p class="soak">{escape(format_load(run.load))}: {escape("; ".join(facts))}.</p>'


def _drift(first: float | None, last: float | None) -> str:
    if first is None or last is None or first == 0:
        return MISSING
    return f"{(last - first) / first * 100:+.1f}%"
