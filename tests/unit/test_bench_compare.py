"""`bench compare`: exact deltas, unmatched runs, missing values and the accuracy summary."""

from __future__ import annotations

import pytest
from rich.console import Console

from servepilot.bench.compare import (
    METRICS,
    Better,
    compare_results,
    render_comparison,
)
from servepilot.core.results import BenchResult, Load, LoadMode, Run, Source, Stats


def stats(p50: float | None, p99: float | None = None) -> Stats:
    return Stats(mean=p50, p50=p50, p90=p99, p99=p99, count=0 if p50 is None else 10)


def run(
    value: float,
    *,
    mode: LoadMode = LoadMode.CONCURRENCY,
    ttft50: float | None = 100.0,
    tpot50: float | None = 10.0,
    tok_s: float = 1000.0,
    slo: float = 0.9,
) -> Run:
    return Run(
        load=Load(mode=mode, value=value),
        duration_s=10.0,
        completed=100,
        failed=0,
        request_throughput=10.0,
        output_throughput=tok_s,
        total_token_throughput=2 * tok_s,
        ttft_ms=stats(ttft50, 400.0),
        tpot_ms=stats(tpot50, 20.0),
        itl_ms=stats(10.0, 30.0),
        e2e_ms=stats(1000.0, 2000.0),
        goodput_rps=9.0,
        slo_attainment=slo,
    )


def result(source: Source, *runs: Run) -> BenchResult:
    return BenchResult(source=source, target={}, workload={}, runs=runs)


PREDICTED = result(
    Source.SIMULATED,
    run(1),
    run(2, ttft50=100.0, tpot50=10.0, tok_s=1000.0, slo=0.9),
    run(4, ttft50=200.0, tpot50=None, tok_s=1500.0),
)
MEASURED = result(
    Source.MEASURED,
    run(2, ttft50=110.0, tpot50=8.0, tok_s=1250.0, slo=0.95),
    run(4, ttft50=250.0, tpot50=12.0, tok_s=1500.0),
    run(8),
)


def test_matches_runs_by_load_and_reports_the_rest() -> None:
    comparison = compare_results(PREDICTED, MEASURED)
    assert [m.load.value for m in comparison.matched] == [2, 4]
    assert comparison.only_a == (Load(mode=LoadMode.CONCURRENCY, value=1),)
    assert comparison.only_b == (Load(mode=LoadMode.CONCURRENCY, value=8),)
    assert (comparison.source_a, comparison.source_b) == (Source.SIMULATED, Source.MEASURED)


def test_exact_deltas_percents_and_direction() -> None:
    c2 = compare_results(PREDICTED, MEASURED).matched[0]
    ttft = c2.metric("ttft_p50")
    assert (ttft.a, ttft.b, ttft.delta) == (100.0, 110.0, 10.0)
    assert ttft.percent == pytest.approx(10.0)
    assert ttft.better is Better.LOWER and ttft.verdict == "worse"
    tok = c2.metric("output_throughput")
    assert (tok.delta, tok.percent, tok.verdict) == (250.0, 25.0, "better")
    tpot = c2.metric("tpot_p50")
    assert (tpot.delta, tpot.percent, tpot.verdict) == (-2.0, -20.0, "better")
    slo = c2.metric("slo_attainment")  # in percent: the delta reads in percentage points
    assert slo.delta == pytest.approx(5.0) and slo.percent == pytest.approx(5 / 90 * 100)
    assert c2.metric("e2e_p99").verdict == "same" and c2.metric("e2e_p99").percent == 0.0
    assert [m.key for m in c2.metrics] == [m.key for m in METRICS]


def test_missing_values_and_zero_baselines() -> None:
    c4 = compare_results(PREDICTED, MEASURED).matched[1]
    tpot = c4.metric("tpot_p50")
    assert (tpot.a, tpot.b, tpot.delta, tpot.percent, tpot.verdict) == (
        None,
        12.0,
        None,
        None,
        None,
    )
    zero = compare_results(
        result(Source.MEASURED, run(1, tok_s=0.0, slo=0.0)),
        result(Source.MEASURED, run(1, tok_s=50.0, slo=0.0)),
    ).matched[0]
    assert zero.metric("output_throughput").percent is None  # growth from zero has no percent
    assert zero.metric("output_throughput").delta == 50.0
    assert zero.metric("slo_attainment").percent == 0.0


def test_median_absolute_percent_error_relative_to_the_measured_side() -> None:
    accuracy = {a.key: a for a in compare_results(PREDICTED, MEASURED).accuracy}
    ttft = accuracy["ttft_p50"]  # |100-110|/110 and |200-250|/250
    errors = sorted([10 / 110 * 100, 20.0])
    assert ttft.runs == 2 and ttft.median_pct == pytest.approx(sum(errors) / 2)
    assert ttft.p90_pct == pytest.approx(errors[0] + 0.9 * (errors[1] - errors[0]))
    tpot = accuracy["tpot_p50"]  # only c=2 has both: |10-8|/8
    assert (tpot.runs, tpot.median_pct, tpot.p90_pct) == (1, 25.0, 25.0)
    tok = accuracy["output_throughput"]  # |1000-1250|/1250 and 0
    assert tok.median_pct == pytest.approx(10.0)
    # Measured first: errors stay relative to the measurement, whatever the order.
    flipped = compare_results(MEASURED, PREDICTED)
    assert flipped.reference == "a"
    assert [(a.key, a.median_pct) for a in flipped.accuracy] == [
        (a.key, a.median_pct) for a in accuracy.values()
    ]
    # Two measurements (before/after): relative to B.
    twice = compare_results(MEASURED, MEASURED.model_copy(update={"runs": PREDICTED.runs}))
    assert twice.reference == "b"
    assert {a.key: a for a in twice.accuracy}["output_throughput"].median_pct == pytest.approx(12.5)


def test_rate_loads_match_despite_float_noise_and_modes_do_not_mix() -> None:
    a = result(Source.SIMULATED, run(0.1 + 0.2, mode=LoadMode.RATE), run(3))
    b = result(Source.MEASURED, run(0.3, mode=LoadMode.RATE), run(3, mode=LoadMode.RATE))
    comparison = compare_results(a, b)
    assert [m.load.mode for m in comparison.matched] == [LoadMode.RATE]
    assert comparison.only_a[0].mode is LoadMode.CONCURRENCY
    assert comparison.only_b[0].mode is LoadMode.RATE


def test_render_shows_sources_dashes_unmatched_and_summary() -> None:
    console = Console(record=True, width=160)
    console.print(render_comparison(compare_results(PREDICTED, MEASURED), "pred.json", "meas.json"))
    text = console.export_text()
    assert "pred.json (simulated)" in text and "meas.json (measured)" in text
    assert "only in A: c=1" in text and "only in B: c=8" in text
    assert "—" in text and "+25.0%" in text and "better" in text and "worse" in text
    assert "median absolute error vs meas.json: TTFT p50 14.5% (p90 18.9%, 2 runs)" in text
    nothing = compare_results(result(Source.MEASURED), result(Source.SIMULATED, run(1)))
    console.print(render_comparison(nothing))
    assert "nothing to compare" in console.export_text()
