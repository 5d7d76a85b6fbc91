"""The HTML report of a tuning run: one self-contained file (no script, no CDN, no font).

Verdict first (the best configuration and its gain over the default, or that nothing met the
SLA and which SLO binds), then goodput by trial (inline SVG, bench's chart code), the best
configuration as fleet.yaml and as a vLLM command, and every trial in a table. Everything
from outside (reasons, failure details, commands) goes through `html.escape`.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from pathlib import Path

from servepilot.bench.report.fmt import fmt_num, format_load
from servepilot.bench.report.style import BASE_CSS
from servepilot.bench.report.svg import PALETTE, Axis, Chart, RefLine, Series, render_chart
from servepilot.tune.summary import Summary, TrialRow

_CSS = (
    BASE_CSS
    + """
.sweet .load{font-size:20px;font-weight:700}
.warn{background:#fff4e0;border-left:5px solid #d97706;padding:10px 14px;margin:16px 0}
.runs th{background:#f2f4f7;padding:4px 6px;text-align:left;font-weight:600;
 border-bottom:2px solid #ccd;vertical-align:bottom}
.runs td{padding:3px 6px;border-bottom:1px solid #eee;vertical-align:top}
.runs td.num{text-align:right;white-space:nowrap}
.runs tr.failed td{color:#b71c1c}
pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:12.5px}
pre.wrap{white-space:pre-wrap;word-break:break-all}
"""
)


def render_report(
    summary: Summary,
    *,
    title: str,
    context: dict[str, str],
    fleet_yaml: str,
    command: str,
    generated_at: datetime | None = None,
) -> str:
    when = (generated_at or datetime.now().astimezone()).strftime("%Y-%m-%d %H:%M %Z")
    meta = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in context.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>servepilot tune — {escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>servepilot tune — {escape(title)}</h1>",
        f'<table class="meta">{meta}<tr><th>Generated</th><td>{escape(when)}</td></tr></table>',
        _verdict(summary),
        "<h2>Goodput at the SLA, trial by trial</h2>",
        _chart(summary),
        "<h2>Best configuration</h2>" if summary.met else "<h2>Best effort</h2>",
        f"<pre>{escape(fleet_yaml)}</pre>",
        f'<pre class="wrap">{escape(command)}</pre>',
        "<h2>Trials</h2>",
        '<div class="scroll">' + _table(summary) + "</div>",
        f'<p class="note">{summary.pruned} move(s) were never launched: the planner said '
        "they would not fit, or the sweep showed they could change nothing. "
        f"{summary.resumed} trial(s) were read back from trials.jsonl.</p>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(path: Path, html: str) -> None:
    path.write_text(html, encoding="utf-8")


def _verdict(summary: Summary) -> str:
    stop = f"search stopped: {escape(summary.stop.detail)}"
    best = summary.best
    if best is not None and best.score is not None:
        gain_text = summary.gain_text
        spot = format_load(best.score.best.load) if best.score.best is not None else ""
        return (
            '<div class="sweet"><div class="label">best configuration</div>'
            f'<div class="load">trial {best.trial.index}: {best.score.goodput_rps:.3f} req/s '
            f"at the SLA ({escape(gain_text)})</div>"
            f'<div class="reason">{escape(best.changes)} · best level {escape(spot)} · '
            f"{stop}</div></div>"
        )
    effort = summary.best_effort
    binding = summary.binding
    bind_text = (
        f"{binding.key} binds: {binding.observed_ms:,.0f} ms against {binding.limit_ms:,.0f} ms"
        if binding is not None
        else "no trial was measured"
    )
    which = f"best effort: trial {effort.trial.index} ({effort.changes}); " if effort else ""
    return (
        '<div class="warn"><b>No configuration met the SLA.</b> '
        f"{escape(which)}{escape(bind_text)}. {stop}</div>"
    )


def _chart(summary: Summary) -> str:
    points = tuple(
        (float(r.trial.index), r.score.goodput_rps) for r in summary.rows if r.score is not None
    )
    tips = tuple(f"trial {r.trial.index}: {r.changes}" for r in summary.rows if r.score is not None)
    refs: tuple[RefLine, ...] = ()
    if summary.default is not None and summary.default.score is not None:
        base = summary.default.score.goodput_rps
        refs = (RefLine(base, f"default {fmt_num(base)}", "#777"),)
    chart = Chart(
        "goodput at the SLA by trial",
        Axis("trial", whole=True),
        Axis("goodput (req/s)"),
        (Series("goodput", points, PALETTE[0], tips=tips),),
        y_refs=refs,
    )
    if not points:
        return '<p class="note">no trial was measured.</p>'
    return render_chart(chart)


def _table(summary: Summary) -> str:
    head = (
        "<tr><th>#</th><th>changes from the default</th><th>status</th>"
        '<th class="num">goodput req/s</th><th>best level</th><th>binding SLO</th>'
        "<th>signals / failure</th><th>why it ran</th>"
        '<th class="num">wall s</th></tr>'
    )
    chosen = summary.chosen
    rows = [
        _tr(r, chosen is not None and r.trial.index == chosen.trial.index) for r in summary.rows
    ]
    return f'<table class="runs">{head}{"".join(rows)}</table>'


def _tr(row: TrialRow, spot: bool) -> str:
    css = "spot" if spot else ("failed" if row.score is None else "")
    cells = [
        str(row.trial.index), escape(row.changes), escape(row.status),
        row.goodput_text, escape(row.level_text), escape(row.binding_text), escape(row.signals),
        escape(row.trial.reason), f"{row.trial.wall_s:,.1f}",
    ]  # fmt: skip
    numeric = {0, 3, 8}
    tds = "".join(
        f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
        for i, c in enumerate(cells)
    )
    return f'<tr class="{css}">{tds}</tr>'
