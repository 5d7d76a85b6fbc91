"""A multi_turn bench splits TTFT into first turns and returning ones (turn 2 on): the figure
that tells a run with a CPU tier of the KV cache from one without. Against the simulated
replica (which caches prefixes as vLLM does) over real sockets on 127.0.0.1."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from servepilot.bench.compare import compare_results, render_comparison
from servepilot.bench.console import render_runs_table, terminal_columns
from servepilot.bench.metrics import summarize
from servepilot.bench.records import RequestRecord
from servepilot.cli.main import main
from servepilot.core.results import BenchResult, Load, LoadMode, Source
from servepilot.core.slo import Slo
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

LOAD = Load(mode=LoadMode.CONCURRENCY, value=2)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as sim:
        yield sim.url


def _record(index: int, ttft_s: float, turn: int | None, *, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        index=index, intended_s=0.0, sent_s=0.0, chunk_s=(ttft_s, ttft_s + 0.1), end_s=1.0,
        output_tokens=2, turn=turn, warmup=warmup,
    )  # fmt: skip


def test_summary_splits_ttft_by_turn_and_leaves_other_workloads_alone() -> None:
    records = [
        _record(0, 0.300, 0),
        _record(1, 0.500, 0),
        _record(2, 0.100, 1),
        _record(3, 0.050, 2),
        _record(4, 9.000, 1, warmup=True),  # left out, as from every figure
    ]
    run = summarize(LOAD, records, Slo())
    first, returning = run.ttft_ms_first_turn, run.ttft_ms_returning
    assert first is not None and returning is not None
    assert (first.count, first.p50) == (2, pytest.approx(400.0))
    assert (returning.count, returning.p50) == (2, pytest.approx(75.0))
    assert run.ttft_ms.count == 4
    plain = summarize(LOAD, [_record(0, 0.3, None)], Slo())
    assert plain.ttft_ms_first_turn is None and plain.ttft_ms_returning is None


def test_the_terminal_table_shows_both_columns_only_for_multi_turn_and_fits_120() -> None:
    records = [_record(i, 0.2 + i, i % 3) for i in range(6)]
    run = summarize(LOAD, records, Slo())
    result = BenchResult(source=Source.MEASURED, target={}, workload={}, runs=(run,))
    headers = [c.header for c in terminal_columns(result)]
    at = headers.index("TTFT p99")
    assert headers[at + 1 : at + 3] == ["TTFT p50 1st turn", "TTFT p50 returning"]
    console = Console(record=True, width=120)
    console.print(render_runs_table(result))
    text = console.export_text()
    assert "…" not in text and "returning" in text
    plain = summarize(LOAD, [_record(0, 0.3, None)], Slo())
    without = BenchResult(source=Source.MEASURED, target={}, workload={}, runs=(plain,))
    assert "TTFT p50 returning" not in [c.header for c in terminal_columns(without)]


def test_bench_counts_four_first_turns_and_eight_returning_ones(
    sim_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 conversations x 3 turns, interleaved 4 at a time: turns 0, 0, 0, 0, 1, ..., 2.
    code = main(["bench", "--url", sim_url, "--workload", "multi_turn", "--turns", "3",
                 "--active-sessions", "4", "--requests", "12", "--concurrency", "2",
                 "--input-tokens", "64", "--output-tokens", "4",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["completed"] == 12
    assert run["ttft_ms_first_turn"]["count"] == 4
    assert run["ttft_ms_returning"]["count"] == 8
    assert set(run["ttft_ms_returning"]) == set(run["ttft_ms"])  # the same Stats shape
    with (tmp_path / "requests.csv").open() as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: int(row["index"]))
    assert [int(row["turn"]) for row in rows] == [0] * 4 + [1] * 4 + [2] * 4
    # A returning turn carries its history: the server counts more prompt tokens for it.
    prompt = [int(row["input_tokens"]) for row in rows]
    assert prompt[0] < prompt[4] < prompt[8]
    assert "returning" in capsys.readouterr().out


def test_other_workloads_write_no_turn_split(sim_url: str, tmp_path: Path) -> None:
    code = main(["bench", "--url", sim_url, "--requests", "2", "--concurrency", "1",
                 "--input-tokens", "32", "--output-tokens", "2",
                 "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["ttft_ms_first_turn"] is None and run["ttft_ms_returning"] is None


def _result(returning_ttft_s: float | None) -> BenchResult:
    turns = [None] * 4 if returning_ttft_s is None else [0, 0, 1, 1]
    times = [0.4, 0.4, returning_ttft_s or 0.4, returning_ttft_s or 0.4]
    records = [_record(i, t, turn) for i, (t, turn) in enumerate(zip(times, turns, strict=True))]
    run = summarize(LOAD, records, Slo())
    return BenchResult(source=Source.MEASURED, target={}, workload={}, runs=(run,))


def test_compare_holds_returning_turns_of_two_runs_against_each_other() -> None:
    # Without a CPU tier the returning turns took 300 ms, with it 100 ms.
    (run,) = compare_results(_result(0.3), _result(0.1)).matched
    returning = run.metric("ttft_returning_p50")
    assert (returning.a, returning.b, returning.verdict) == (
        pytest.approx(300.0),
        pytest.approx(100.0),
        "better",
    )
    assert run.metric("ttft_first_turn_p50").verdict == "same"
    console = Console(record=True, width=120)
    console.print(render_comparison(compare_results(_result(0.3), _result(0.1))))
    assert "TTFT p50 returning" in console.export_text()
    plain = Console(record=True, width=120)
    plain.print(render_comparison(compare_results(_result(None), _result(None))))
    assert "returning" not in plain.export_text()
