"""Metric computations on synthetic timelines with known answers."""

import pytest

from servepilot.bench.metrics import request_times, stats, summarize, windows
from servepilot.bench.records import RequestRecord
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo, parse_slo

LOAD = Load(mode=LoadMode.RATE, value=2.0)


def rec(index: int, intended: float, sent: float, chunks: list[float], out: int | None,
        **kw: object) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        index=index, intended_s=intended, sent_s=sent, chunk_s=tuple(chunks),
        end_s=chunks[-1] if chunks else sent, input_tokens=10, output_tokens=out, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_ttft_and_e2e_count_from_the_intended_send_time() -> None:
    # Scheduled at 1.0 s, sent late at 1.5 s (the client was behind), first token at 1.6 s.
    times = request_times(rec(0, 1.0, 1.5, [1.6, 1.7, 1.8, 1.9, 2.0], out=5))
    assert times is not None
    assert times.ttft_ms == pytest.approx(600.0)
    assert times.e2e_ms == pytest.approx(1000.0)
    # (1000 - 600) / (5 - 1)
    assert times.tpot_ms == pytest.approx(100.0)


def test_tpot_uses_server_token_counts_not_chunks() -> None:
    # Speculative decoding style: 2 chunks carrying 9 tokens.
    times = request_times(rec(0, 0.0, 0.0, [0.1, 0.5], out=9))
    assert times is not None and times.tpot_ms == pytest.approx(50.0)
    # One output token: TPOT is undefined, not zero.
    one = request_times(rec(1, 0.0, 0.0, [0.1], out=1))
    assert one is not None and one.tpot_ms is None


def test_stats_percentiles_known_answer() -> None:
    s = stats([float(v) for v in range(1, 101)])
    assert s.mean == pytest.approx(50.5)
    assert s.p50 == pytest.approx(50.5)
    assert s.p90 == pytest.approx(90.1)
    assert s.p99 == pytest.approx(99.01)
    assert s.count == 100
    empty = stats([])
    assert empty.mean is None and empty.p99 is None and empty.count == 0


def test_summary_of_a_known_run() -> None:
    records = [
        rec(0, 0.0, 0.0, [0.1, 0.2, 0.3], out=3),  # ttft 100, e2e 300, tpot 100
        rec(1, 0.5, 0.5, [0.9, 1.0, 1.1], out=3),  # ttft 400, e2e 600, tpot 100
        rec(2, 1.0, 1.0, [], out=None, error="http_500"),
        rec(3, 1.5, 1.5, [1.6, 1.8, 2.0], out=3),  # ttft 100, e2e 500, tpot 200
        rec(9, -1.0, -1.0, [-0.9, -0.8], out=2, warmup=True),
    ]
    # Failed request's end_s is its sent time; window is 0.0 -> 2.0.
    run = summarize(LOAD, records, Slo(ttft_p99_ms=300.0, tpot_p99_ms=150.0))
    assert run.duration_s == pytest.approx(2.0)
    assert (run.completed, run.failed) == (3, 1)
    assert run.request_throughput == pytest.approx(1.5)
    assert run.output_throughput == pytest.approx(4.5)
    assert run.total_token_throughput == pytest.approx((30 + 9) / 2.0)
    assert run.ttft_ms.mean == pytest.approx(200.0)
    assert run.e2e_ms.p50 == pytest.approx(500.0)
    # Pooled chunk gaps: 100,100, 100,100, 200,200 ms.
    assert run.itl_ms.count == 6
    assert run.itl_ms.mean == pytest.approx(800 / 6)
    # Only request 0 meets both SLOs (1: TTFT 400 > 300; 3: TPOT 200 > 150; 2 failed).
    assert run.goodput_rps == pytest.approx(0.5)
    assert run.slo_attainment == pytest.approx(0.25)
    assert run.errors == {"http_500": 1}


def test_level_limits_give_the_run_a_verdict_and_leave_goodput_alone() -> None:
    records = [
        rec(0, 0.0, 0.0, [0.1, 0.2, 0.3], out=3),  # ttft 100, e2e 300, tpot 100
        rec(1, 0.5, 0.5, [0.9, 1.0, 1.1], out=3),  # ttft 400, e2e 600, tpot 100
        rec(3, 1.5, 1.5, [1.6, 1.8, 2.0], out=3),  # ttft 100, e2e 500, tpot 200
    ]
    per_request = summarize(LOAD, records, parse_slo("ttft_p99_ms=300"))
    assert per_request.slo_met is None and per_request.slo_violated == ()
    # ITL gaps 100,100,100,100,200,200 ms: p50 100 (met), mean 133; TTFT mean 200.
    run = summarize(
        LOAD, records, parse_slo("ttft_p99_ms=300,itl_p50_ms=101,itl_mean_ms=120,ttft_mean_ms=150")
    )
    assert (run.slo_met, run.slo_violated) == (False, ("itl_mean_ms", "ttft_mean_ms"))
    # Goodput still counts the requests within the per-request limit (ttft 300): 0 and 3.
    assert run.goodput_rps == pytest.approx(per_request.goodput_rps) == pytest.approx(2 / 2.0)
    met = summarize(LOAD, records, parse_slo("itl_p99_ms=200"))
    assert (met.slo_met, met.slo_violated) == (True, ())
    # No per-request limit: every completed request is good.
    assert met.goodput_rps == pytest.approx(met.request_throughput)


def test_no_slo_means_every_completed_request_is_good() -> None:
    records = [rec(0, 0.0, 0.0, [0.1, 1.0], out=2), rec(1, 0.0, 0.0, [], out=None, error="x")]
    run = summarize(LOAD, records, Slo())
    assert run.goodput_rps == pytest.approx(run.request_throughput)
    assert run.slo_attainment == pytest.approx(0.5)


def test_a_run_where_everything_failed_does_not_divide_by_zero() -> None:
    run = summarize(LOAD, [rec(0, 0.0, 0.0, [], out=None, error="connect")], Slo())
    assert run.completed == 0 and run.failed == 1
    assert run.request_throughput == 0.0 and run.ttft_ms.p99 is None


def test_soak_windows_split_by_end_time() -> None:
    records = [rec(i, i * 0.5, i * 0.5, [i * 0.5 + 0.1, i * 0.5 + 0.2], out=2) for i in range(8)]
    # Requests end at 0.2, 0.7, ..., 3.7: two per 1-second window.
    got = windows(records, 1.0, [100, 200, 300, None])
    assert [w.completed for w in got] == [2, 2, 2, 2]
    assert [w.resident_memory_bytes for w in got] == [100, 200, 300, None]
    assert got[0].request_throughput == pytest.approx(2.0)
    assert got[0].e2e_p99_ms == pytest.approx(200.0)
