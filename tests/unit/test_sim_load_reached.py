"""`servepilot sim` records whether each level reached its load, as bench does: a closed loop
with fewer requests than its concurrency never does, is said so, and is never the sweet spot."""

from __future__ import annotations

from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.results import BenchResult, Load, LoadMode, load_result

SMALL = ["--input-tokens", "32", "--output-tokens", "4", "--warmup", "0"]


def _sim(tmp_path: Path, *flags: str) -> BenchResult:
    out = tmp_path / "out"
    assert main(["sim", *flags, *SMALL, "--out", str(out)]) == 0
    return load_result(out / "results.json")


def test_twelve_requests_never_reach_concurrency_16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _sim(tmp_path, "--concurrency", "4,16", "--requests", "12")
    c4, c16 = result.runs
    assert (c4.completed, c4.peak_in_flight, c4.load_reached) == (12, 4, True)
    # Every one of the 12 is sent (the 13th to 16th workers find no request and stop).
    assert (c16.completed, c16.failed, c16.peak_in_flight, c16.load_reached) == (12, 0, 12, False)
    assert result.sweet_spot is not None
    assert result.sweet_spot.load == Load(mode=LoadMode.CONCURRENCY, value=4)
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "warning: concurrency 16 never reached its load: at most 12 requests were in flight, "
        "only 12 requests were sent (give --requests at least 16)"
    ) in err


def test_the_sweep_stops_at_the_first_level_that_never_reached_its_load(tmp_path: Path) -> None:
    result = _sim(tmp_path, "--sweep", "--requests", "12")
    loads = [run.load.value for run in result.runs]
    assert loads == [1, 2, 4, 8, 16]
    assert [run.peak_in_flight for run in result.runs] == [1, 2, 4, 8, 12]
    assert [run.load_reached for run in result.runs] == [True, True, True, True, False]
    assert result.sweet_spot is not None and result.sweet_spot.load.value != 16


def test_a_closed_loop_with_as_many_requests_as_workers_reaches_its_load(tmp_path: Path) -> None:
    (run,) = _sim(tmp_path, "--concurrency", "6", "--requests", "6").runs
    assert (run.completed, run.peak_in_flight, run.load_reached) == (6, 6, True)


def test_an_open_loop_always_runs_at_its_rate(tmp_path: Path) -> None:
    # The simulated client sends on its schedule: bench's shortfall (a client falling behind)
    # cannot happen, so the rate counts as reached.
    (run,) = _sim(tmp_path, "--rate", "50", "--requests", "12").runs
    assert run.load_reached is True
    assert run.peak_in_flight is not None and 1 <= run.peak_in_flight <= 12
