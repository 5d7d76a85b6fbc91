"""The HTML report of a bench run: one self-contained file that opens offline.

No script, no CDN, no web font: the charts are inline SVG generated here
(`servepilot.bench.report.svg`), the styling a short inline stylesheet. The file can be
mailed, attached to an issue or archived next to results.json and still render in ten years.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape
from pathlib import Path

from servepilot.bench.records import RequestRecord
from servepilot.bench.report import plots, sections
from servepilot.bench.report.style import BASE_CSS
from servepilot.core.results import BenchResult, Load

_CSS = (
    BASE_CSS
    + """
.k{color:#666}
.sweet .load{font-size:24px;font-weight:700}
.sweet.none{background:#f4f4f4;border-color:#999}
.warn{background:#fff4e0;border-left:5px solid #d97706;padding:8px 14px;margin:16px 0}
.warn ul{margin:4px 0 0;padding-left:20px}
.runs th{background:#f2f4f7;padding:4px 5px;text-align:right;font-weight:600;
 border-bottom:2px solid #ccd;vertical-align:bottom}
.runs td{padding:3px 5px;text-align:right;border-bottom:1px solid #eee;white-space:nowrap}
.runs th:first-child,.runs td:first-child{text-align:left}
.unit{font-weight:400;color:#777;font-size:11px}
td.over{color:#b71c1c;font-weight:700}td.bad{color:#fff;background:#c2410c!important}
.nodata{color:#777;font-style:italic;border:1px dashed #ccc;padding:16px;margin:0;align-self:start}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:10px 16px}
.errors td,.errors th{padding:3px 10px;text-align:left;border-bottom:1px solid #eee}
.errors td.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{background:#d55e00;height:10px;min-width:2px;width:0}.errors td:nth-child(3){width:160px}
.soak{margin:4px 0}
"""
)


def _charts(parts: Sequence[str]) -> str:
    return '<div class="charts">' + "\n".join(parts) + "</div>"


def _body(result: BenchResult, records: Sequence[tuple[Load, RequestRecord]] | None) -> list[str]:
    out = [
        "<h2>Runs</h2>",
        '<div class="scroll">' + sections.runs_table(result) + "</div>",
        "<h2>Throughput and latency against load</h2>",
        _charts(plots.load_plots(result)),
    ]
    if records:
        out += [
            "<h2>Latency distributions</h2>",
            '<p class="note">Successful, non-warm-up requests; one line per load level.</p>',
            _charts(plots.cdf_plots(records)),
        ]
    for run in result.runs:
        if run.windows:
            out += ["<h2>Soak</h2>", sections.soak_summary(run)]
            out.append(_charts(plots.soak_plots(run, result.slo)))
    out += ["<h2>Errors by reason</h2>", sections.errors_table(result.runs)]
    return out


def render_html_report(
    result: BenchResult,
    records: Sequence[tuple[Load, RequestRecord]] | None = None,
    *,
    generated_at: datetime | None = None,
) -> str:
    """The report as one HTML document."""
    when = generated_at or datetime.now().astimezone()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>servepilot bench — {escape(sections.target_name(result))}</title>",
        f"<style>{_CSS}</style></head><body>",
        sections.header(result, when),
        sections.sweet_spot(result),
        sections.warnings(result),
        *_body(result, records),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def write_html_report(
    path: Path,
    result: BenchResult,
    records: Sequence[tuple[Load, RequestRecord]] | None = None,
    *,
    generated_at: datetime | None = None,
) -> None:
    path.write_text(render_html_report(result, records, generated_at=generated_at), "utf-8")
