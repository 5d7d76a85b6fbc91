"""Bench output: the per-request CSV, the HTML report and the console table, on known answers."""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from servepilot.bench.console import render_runs_table, sweet_spot_line, terminal_columns
from servepilot.bench.metrics import request_times
from servepilot.bench.records import RequestRecord
from servepilot.bench.records_csv import CSV_COLUMNS, write_records_csv
from servepilot.bench.report.columns import RUN_COLUMNS
from servepilot.bench.report.html import render_html_report, write_html_report
from servepilot.bench.report.plots import CDF_POINTS
from servepilot.bench.report.svg import Axis, _linear_domain, _log_domain, wants_log
from servepilot.core.results import (
    BenchResult,
    ClientHealth,
    Load,
    LoadMode,
    Run,
    Source,
    Stats,
    SweetSpot,
    Window,
)

WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
C4 = Load(mode=LoadMode.CONCURRENCY, value=4)
R2 = Load(mode=LoadMode.RATE, value=2.5)


def stats(p50: float | None, p99: float | None) -> Stats:
    return Stats(mean=p50, p50=p50, p90=p99, p99=p99, count=0 if p50 is None else 10)


def make_run(value: float, **overrides: object) -> Run:
    fields: dict[str, object] = {
        "load": Load(mode=LoadMode.CONCURRENCY, value=value),
        "duration_s": 10.0,
        "completed": 100,
        "failed": 0,
        "request_throughput": 10.0,
        "output_throughput": 100.0 * value,
        "total_token_throughput": 300.0 * value,
        "ttft_ms": stats(20.0 * value, 40.0 * value),
        "tpot_ms": stats(5.0, 9.0),
        "itl_ms": stats(5.0, 12.5),
        "e2e_ms": stats(600.0, 900.0 + value),
        "goodput_rps": 9.5,
        "slo_attainment": 0.95,
    }
    fields.update(overrides)
    return Run.model_validate(fields)


def make_result(runs: tuple[Run, ...], **overrides: object) -> BenchResult:
    fields: dict[str, object] = {
        "source": Source.MEASURED,
        "target": {"url": "http://127.0.0.1:8000/v1", "model": "m"},
        "workload": {"kind": "random", "input_tokens": 128},
        "slo": {"ttft_p99_ms": 300.0},
        "runs": runs,
        "sweet_spot": SweetSpot(load=runs[0].load, reason="plateau") if runs else None,
    }
    fields.update(overrides)
    return BenchResult.model_validate(fields)


# --- CSV ---------------------------------------------------------------------------------

RECORDS = (
    # Closed loop: sent when intended. 4 tokens: TPOT = (500 - 100) / 3.
    RequestRecord(0, 1.0, 1.0, (1.1, 1.2, 1.3, 1.5), 1.5, 128, 4, replica="r0"),
    # Open loop sent 250 ms late: TTFT counts from the intended 2.0, not the sent 2.25.
    RequestRecord(1, 2.0, 2.25, (2.3, 2.4), 2.4, 128, 2),
    # One output token: no TPOT.
    RequestRecord(2, 3.0, 3.0, (3.1,), 3.1, 128, 1),
    # Failed before any content: no latency at all, no usage.
    RequestRecord(3, 4.0, 4.0, (), 4.05, error="http_503", error_detail='said "no", twice\nbye'),
    # Stream cut after two chunks: its TTFT is real, its E2E is not.
    RequestRecord(4, 5.0, 5.0, (5.2, 5.3), 5.3, 128, None, error="stream_cut"),
    # Warm-up: kept and flagged.
    RequestRecord(5, 0.0, 0.0, (0.1, 0.2), 0.2, 128, 2, warmup=True),
    # No usage from the server: the content-chunk count (3) stands in, as in results.json.
    RequestRecord(6, 6.0, 6.0, (6.1, 6.2, 6.3), 6.3, None, None),
)


@pytest.fixture
def csv_rows(tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "requests.csv"
    write_records_csv(path, [(C4, r) for r in RECORDS[:3]] + [(R2, r) for r in RECORDS[3:]])
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        return list(reader)


def cell(row: dict[str, str], key: str) -> float | None:
    return None if row[key] == "" else float(row[key])


def test_csv_latencies_from_the_intended_send_time(csv_rows: list[dict[str, str]]) -> None:
    closed, late, one_token = csv_rows[0], csv_rows[1], csv_rows[2]
    assert (closed["load_mode"], closed["load_value"]) == ("concurrency", "4")
    assert cell(closed, "ttft_ms") == pytest.approx(100)
    assert cell(closed, "e2e_ms") == pytest.approx(500)
    assert cell(closed, "tpot_ms") == pytest.approx(400 / 3, abs=1e-3)
    assert cell(closed, "send_lag_ms") == 0
    assert (closed["n_chunks"], closed["output_tokens"], closed["replica"]) == ("4", "4", "r0")
    assert cell(late, "send_lag_ms") == pytest.approx(250)
    assert cell(late, "ttft_ms") == pytest.approx(300)  # not 50: no coordinated omission
    assert cell(late, "e2e_ms") == pytest.approx(400)
    assert cell(late, "tpot_ms") == pytest.approx(100)
    assert cell(one_token, "e2e_ms") == pytest.approx(100)
    assert one_token["tpot_ms"] == ""


def test_csv_leaves_missing_values_empty(csv_rows: list[dict[str, str]]) -> None:
    failed, cut, warm, no_usage = csv_rows[3], csv_rows[4], csv_rows[5], csv_rows[6]
    assert (failed["load_mode"], failed["load_value"]) == ("rate", "2.5")
    assert failed["ok"] == "false" and failed["error"] == "http_503"
    assert failed["error_detail"] == 'said "no", twice\nbye'
    for key in ("ttft_ms", "e2e_ms", "tpot_ms", "input_tokens", "output_tokens", "replica"):
        assert failed[key] == "", key
    assert failed["n_chunks"] == "0"
    assert cell(cut, "ttft_ms") == pytest.approx(200)
    assert (cut["e2e_ms"], cut["tpot_ms"], cut["error"]) == ("", "", "stream_cut")
    assert (warm["warmup"], csv_rows[0]["warmup"], csv_rows[0]["ok"]) == ("true", "false", "true")
    assert no_usage["output_tokens"] == "" and no_usage["input_tokens"] == ""
    assert cell(no_usage, "tpot_ms") == pytest.approx(100)  # (300 - 100) / (3 chunks - 1)


def test_csv_agrees_with_the_metrics_definition(csv_rows: list[dict[str, str]]) -> None:
    # The CSV inlines the arithmetic for speed; it must stay what results.json summarises.
    for row, record in zip(csv_rows, RECORDS, strict=True):
        times = request_times(record)
        if times is None:
            assert row["e2e_ms"] == ""
            continue
        assert cell(row, "ttft_ms") == pytest.approx(times.ttft_ms, abs=1e-3)
        assert cell(row, "e2e_ms") == pytest.approx(times.e2e_ms, abs=1e-3)
        expected = times.tpot_ms
        assert cell(row, "tpot_ms") == (
            None if expected is None else pytest.approx(expected, abs=1e-3)
        )


# --- HTML --------------------------------------------------------------------------------


def svg_of(html: str, title: str) -> str:
    match = re.search(rf'<svg[^>]*aria-label="{re.escape(title)}".*?</svg>', html, re.S)
    assert match, f"no chart titled {title!r}"
    return match.group(0)


def polyline_points(svg: str, series: str) -> int:
    match = re.search(rf'data-series="{re.escape(series)}" points="([^"]*)"', svg)
    assert match, f"no series {series!r}"
    return len(match.group(1).split())


def runs_table_rows(html: str) -> list[list[str]]:
    body = re.search(r'<table class="runs">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert body
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body.group(1), re.S)
    return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]


def test_html_run_table_holds_the_run_values() -> None:
    runs = (
        make_run(1),
        make_run(4),
        make_run(16, output_throughput=1234.5, input_tokens_mean=286.4),
    )
    html = render_html_report(make_result(runs), generated_at=WHEN)
    rows = runs_table_rows(html)
    assert len(rows) == 3 and all(len(r) == len(RUN_COLUMNS) for r in rows)
    load, done, failed, rps, tok_s, prompt, ttft50, ttft99 = rows[2][:8]
    assert (load, done, failed, rps, tok_s, prompt, ttft50, ttft99) == (
        "c=16",
        "100",
        "0",
        "10.0",
        "1,234",
        "286",  # the server's prompt tokens (usage), not the workload's asked 128
        "320",
        "640",
    )
    assert rows[0][5] == "—"  # no usage reported: no count, not the asked size
    assert rows[2][13] == "95.0%"
    # TTFT p99 of 640 ms breaks the 300 ms SLO; 40 ms at c=1 does not.
    assert '<td class="over">640</td>' in html
    assert '<td class="over">40.0</td>' not in html
    assert '<tr class="spot"><td>c=1</td>' in html
    assert "2025-01-02 03:04:05" in html


def test_html_plots_one_point_per_run_and_marks_slo_and_sweet_spot() -> None:
    runs = tuple(make_run(v) for v in (1, 2, 4, 8, 16))
    html = render_html_report(make_result(runs), generated_at=WHEN)
    throughput = svg_of(html, "Output throughput against load")
    assert throughput.count('<circle class="pt"') == 5
    assert polyline_points(throughput, "output tok/s") == 5
    assert "sweet spot c=1" in throughput
    ttft = svg_of(html, "TTFT against load")
    assert polyline_points(ttft, "TTFT p99") == 5 and "SLO p99 300 ms" in ttft
    # A doubling sweep gets a log axis ticked at its own levels.
    assert all(f">{v}</text>" in throughput for v in (1, 2, 4, 8, 16))


def test_html_cdfs_have_one_line_per_load_with_bounded_points() -> None:
    small = [(C4, RequestRecord(i, i, i, (i + 0.1, i + 0.2), i + 0.2, 8, 2)) for i in range(5)]
    big = [(R2, RequestRecord(i, i, i, (i + 0.05 + i / 1e4,), i + 0.1, 8, 1)) for i in range(700)]
    warm = [(C4, RequestRecord(99, 0, 0, (0.1,), 0.1, 8, 1, warmup=True))]
    html = render_html_report(make_result((make_run(4),)), small + big + warm, generated_at=WHEN)
    cdf = svg_of(html, "TTFT distribution")
    assert polyline_points(cdf, "c=4 (n=5)") == 5  # the warm-up request is not counted
    assert polyline_points(cdf, "r=2.5/s (n=700)") == CDF_POINTS
    assert polyline_points(svg_of(html, "E2E distribution"), "c=4 (n=5)") == 5


def test_html_escapes_text_from_outside() -> None:
    hostile = '"><script>alert(1)</script>'
    run = make_run(1, errors={"<img src=x onerror=alert(2)>": 3}, failed=3)
    result = make_result(
        (run,),
        target={"url": f"http://evil/{hostile}"},
        workload={"kind": "<b>bold</b>"},
        sweet_spot=SweetSpot(load=run.load, reason="<iframe src=x>"),
    )
    html = render_html_report(result, generated_at=WHEN)
    for raw in ("<script", "<img", "<iframe", "<b>bold"):
        assert raw not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html


def test_html_is_self_contained(tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    write_html_report(path, make_result((make_run(1), make_run(2))), generated_at=WHEN)
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not re.search(r"<script|<link|\bsrc=|@import|url\(", html)


def test_html_report_with_zero_completed_requests() -> None:
    empty = stats(None, None)
    run = make_run(
        8,
        completed=0,
        failed=10,
        request_throughput=0.0,
        output_throughput=0.0,
        ttft_ms=empty,
        tpot_ms=empty,
        itl_ms=empty,
        e2e_ms=empty,
        goodput_rps=0.0,
        slo_attainment=0.0,
        errors={"connect_error": 10},
    )
    failed = [(C4, RequestRecord(i, i, i, (), i, error="connect_error")) for i in range(10)]
    html = render_html_report(make_result((run,), sweet_spot=None), failed, generated_at=WHEN)
    assert "No sweet spot" in html
    assert "TTFT against load: no data to plot." in html
    assert "TTFT distribution: no data to plot." in html
    assert "connect_error" in html
    assert runs_table_rows(html)[0][5] == "—"
    assert "No sweet spot" in render_html_report(make_result(()), [], generated_at=WHEN)


def test_html_soak_windows_and_client_warnings() -> None:
    windows = tuple(
        Window(
            start_s=60.0 * i,
            end_s=60.0 * (i + 1),
            completed=100,
            failed=i,
            request_throughput=1.6,
            output_throughput=200.0 - i,
            ttft_p99_ms=50.0 + i,
            e2e_p99_ms=800.0 + 10 * i,
            resident_memory_bytes=None if i == 2 else 2**30 + i * 2**26,
        )
        for i in range(5)
    )
    bound = ClientHealth(
        requested_rate=50.0, achieved_rate=31.0, send_lag_ms=stats(3.0, 45.0), client_bound=True
    )
    soak = make_run(2, windows=windows, memory_growth_bytes_per_request=3 * 2**20, client=bound)
    html = render_html_report(make_result((soak,)), generated_at=WHEN)
    assert polyline_points(svg_of(html, "Soak c=2: P99 per window"), "E2E p99") == 5
    assert polyline_points(svg_of(html, "Soak c=2: target resident memory"), "resident memory") == 4
    assert "drift +5.0%" in html  # E2E p99 800 -> 840 ms
    assert "3.00 MiB per request" in html and "leak signal" in html
    assert '<td class="bad">client-bound</td>' in html
    assert "31.0 / 50.0" in html and "send lag p99 45.0 ms" in html


# --- SVG scales --------------------------------------------------------------------------


def test_linear_axis_gets_round_ticks_from_zero() -> None:
    lo, hi, ticks = _linear_domain([13.0, 87.0], Axis("y"))
    assert (lo, hi) == (0.0, 100.0) and ticks == (0.0, 20.0, 40.0, 60.0, 80.0, 100.0)
    assert _linear_domain([0.1, 0.22], Axis("y"))[2] == (0.0, 0.05, 0.1, 0.15, 0.2, 0.25)


def test_log_axis_ticks_at_1_2_5_and_which_data_wants_one() -> None:
    assert _log_domain([3.0, 70.0]) == (2.0, 100.0, (2.0, 5.0, 10.0, 20.0, 50.0, 100.0))
    assert wants_log([1, 2, 4, 64]) and not wants_log([10, 20, 40]) and not wants_log([0, 100])


# --- console -----------------------------------------------------------------------------


def test_console_table_and_sweet_spot_line() -> None:
    runs = (make_run(1), make_run(4, ttft_ms=stats(None, None)))
    result = make_result(runs, sweet_spot=SweetSpot(load=runs[1].load, reason="[bold]plateau"))
    table = render_runs_table(result)
    # A closed loop asked no rate: got/asked would repeat Req/s, so the terminal leaves it out.
    assert len(table.columns) == len(RUN_COLUMNS) - 1 and table.row_count == 2
    console = Console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    assert "c=1" in text and "c=4" in text and "—" in text and "95.0%" in text
    line = sweet_spot_line(result)
    assert line == "sweet spot: c=4 (400 tok/s, TTFT p99 —, E2E p99 904 ms): [bold]plateau"
    assert sweet_spot_line(make_result(runs, sweet_spot=None)).startswith("sweet spot: none")


def test_the_terminal_table_fits_120_columns_by_leaving_out_what_repeats() -> None:
    runs = tuple(make_run(c, completed=12_345, output_throughput=12_345.6) for c in (1, 64, 1024))
    headers = [c.header for c in terminal_columns(make_result(runs, slo={}))]
    assert "Goodput" not in headers and "SLO met" not in headers and "Rate got/asked" not in headers
    assert [c.header for c in terminal_columns(make_result(runs))] == [
        c.header for c in RUN_COLUMNS if c.header != "Rate got/asked"
    ]
    for result in (make_result(runs, slo={}), make_result(runs)):
        console = Console(record=True, width=120)
        console.print(render_runs_table(result))
        assert "…" not in console.export_text()  # nothing cut short


def test_html_warns_of_refusals_a_load_never_reached_and_an_interruption() -> None:
    runs = (make_run(16, completed=2, failed=10, refused=9, peak_in_flight=12,
                     load_reached=False),)  # fmt: skip
    html = render_html_report(make_result(runs, interrupted=True), generated_at=WHEN)
    assert "The run was interrupted (Ctrl-C)" in html
    assert "the server shed load: 75% of 12 requests were refused by the server" in html
    assert "concurrency 16 never reached its load: at most 12 requests were in flight" in html


def test_the_html_report_says_nothing_of_slo_attainment_without_an_slo() -> None:
    # Without an SLO every success "meets" it: "SLO met 100%" would claim a check not made.
    runs = (make_run(1), make_run(4))
    bare = render_html_report(make_result(runs, slo={}), generated_at=WHEN)
    assert "SLO met" not in bare
    assert "none set" in bare
    assert "SLO met" in render_html_report(make_result(runs), generated_at=WHEN)
