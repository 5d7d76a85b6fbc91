"""The files a bench (or sim) run leaves in --out: results.json, requests.csv, report.html."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from servepilot.bench.records import RequestRecord
from servepilot.bench.records_csv import write_records_csv
from servepilot.bench.report.html import write_html_report
from servepilot.core.errors import ConfigError
from servepilot.core.results import BenchResult, Load


def check_out_dir(out_dir: Path, flag: str = "--out") -> None:
    """Make sure `out_dir` is a directory we can write, before any work is spent on a run
    whose results could then not be saved. Creates it (and its parents) when missing."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(
            f"{flag} {out_dir}: is a file, not a directory",
            hint=f"give {flag} a directory (it is created if missing), e.g. {flag} runs/bench",
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{flag} {out_dir}: cannot write there ({exc.strerror or exc})",
            hint=f"give {flag} a directory you can write",
        ) from None


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
