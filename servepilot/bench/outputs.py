"""The files a bench (or sim) run leaves in --out: results.json, requests.csv, report.html."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servepilot.bench.records import RequestRecord
from servepilot.bench.records_csv import write_records_csv
from servepilot.bench.report.html import write_html_report
from servepilot.core.results import BenchResult, Load


def write_results_json(out_dir: Path, result: BenchResult) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(result.to_json(), encoding="utf-8")


def write_outputs(
    out_dir: Path, result: BenchResult, records: Sequence[tuple[Load, RequestRecord]]
) -> None:
    """results.json, requests.csv (one row a request) and report.html (the plots)."""
    write_results_json(out_dir, result)
    write_records_csv(out_dir / "requests.csv", records)
    write_html_report(out_dir / "report.html", result, records)
