"""The chaos benchmark's bookkeeping, with known answers: the seeded fault schedule, the
verdict on each stream (what counts as completed, duplicated, failed, cut), and the p99."""

from __future__ import annotations

from benchmarks.bench_chaos import schedule
from benchmarks.chaos_load import Stream
from benchmarks.chaos_report import p99

MAX = 4


def _stream(**changes: object) -> Stream:
    s = Stream(index=0, chat=False, started_s=0.0)
    s.token_s = [0.1, 0.2, 0.3, 0.4]
    s.ids, s.created = {"cmpl-A"}, {100}
    s.finishes, s.completion_tokens, s.dones = ["length"], MAX, 1
    for name, value in changes.items():
        setattr(s, name, value)
    return s


def test_the_schedule_is_the_seeds_spread_over_the_run_with_every_kind() -> None:
    kinds = ["kill", "hang", "restart", "gateway"]
    faults = schedule(8, 900, 2, kinds, seed=3)
    assert faults == schedule(8, 900, 2, kinds, seed=3)  # the seed decides it
    assert faults != schedule(8, 900, 2, kinds, seed=4)
    assert sorted(f.kind for f in faults) == sorted(kinds * 2)
    # The k-th at k/9 of the streams, give or take a tenth of the gap between two.
    assert all(abs(f.at_stream - (k + 1) * 100) <= 10 for k, f in enumerate(faults))
    assert {f.replica for f in faults} <= {0, 1}


def test_a_whole_answer_is_completed_even_with_tokens_merged_into_fewer_events() -> None:
    assert _stream().verdict(MAX) == "completed"
    assert _stream(token_s=[0.1, 0.3, 0.4]).verdict(MAX) == "completed"  # vLLM fell behind


def test_a_second_done_a_second_finish_or_more_events_than_tokens_is_a_duplicate() -> None:
    assert _stream(dones=2).verdict(MAX) == "duplicated"
    assert _stream(finishes=["length", "length"]).verdict(MAX) == "duplicated"
    assert _stream(token_s=[0.1, 0.2, 0.3, 0.4, 0.5]).verdict(MAX) == "duplicated"


def test_an_error_a_short_answer_or_a_seam_is_a_failure_and_a_dead_gateways_a_cut() -> None:
    assert _stream(error="APIError: upstream_interrupted").verdict(MAX) == "failed"
    assert _stream(completion_tokens=3, token_s=[0.1, 0.2, 0.3]).verdict(MAX) == "failed"
    assert _stream(ids={"cmpl-A", "cmpl-B"}).verdict(MAX) == "failed"
    assert _stream(dones=0).verdict(MAX) == "failed"
    assert _stream(error="APIConnectionError", cut=True).verdict(MAX) == "cut"
    assert _stream(error="InternalServerError: 503", refused=True).verdict(MAX) == "refused"


def test_ttft_tpot_and_theirp99() -> None:
    s = _stream()
    assert s.ttft_s == 0.1 and abs((s.tpot_s or 0) - 0.1) < 1e-9
    streams = [_stream(token_s=[i / 1000, 1.0]) for i in range(1, 101)]
    assert p99(streams, "ttft_s") == 100.0  # ms: the 99th of 1..100 ms, 0-based
    assert p99([], "ttft_s") is None
