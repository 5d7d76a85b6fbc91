"""gpu_step_times.py: a step's emission told from every token's arrival."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gpu_step_times import emissions, gap_table, report
from servepilot.bench.records import RequestRecord
from servepilot.bench.token_times import FILE_NAME, read_token_times, write_token_times
from servepilot.core.results import Load, LoadMode


def _records() -> list[tuple[Load, RequestRecord]]:
    """Two requests decoding in 10 ms steps; a third arrives, and its prefill makes one step
    60 ms long; the streams' chunks of a step land up to 0.3 ms apart. Step ends: 10, 20,
    30, 90, 100, 110 ms."""
    ends = [0.010, 0.020, 0.030, 0.090, 0.100, 0.110]
    load = Load(mode=LoadMode.CONCURRENCY, value=3.0)
    a = RequestRecord(0, 0.0, 0.0, chunk_s=tuple(ends))
    b = RequestRecord(1, 0.0, 0.0, chunk_s=tuple(t + 0.0003 for t in ends))
    c = RequestRecord(2, 0.025, 0.025, chunk_s=tuple(t + 0.0001 for t in ends[3:]))
    warm = RequestRecord(3, 0.0, 0.0, chunk_s=(0.001, 0.002), warmup=True)
    return [(load, a), (load, b), (load, c), (load, warm)]


def test_emissions_are_the_steps_and_gaps_are_their_lengths(tmp_path: Path) -> None:
    write_token_times(tmp_path / FILE_NAME, _records())
    lines = read_token_times(tmp_path / FILE_NAME)
    found = emissions(lines, 3.0)
    assert [e.tokens for e in found] == [2, 2, 2, 3, 3, 3]
    assert [e.first_tokens for e in found] == [2, 0, 0, 1, 0, 0]
    # Each emission at its chunks' median: of two streams, halfway; of three, the third's.
    at = [0.01015, 0.02015, 0.03015, 0.0901, 0.1001, 0.1101]
    assert [e.at_s for e in found] == pytest.approx(at, abs=1e-9)
    table = gap_table(found)
    # The 60 ms gap is the step that carried the first token; the gap before it, 10 ms,
    # is the step before, whose next carried one.
    assert table[("1", "0")] == [pytest.approx(59.95)]
    assert table[("0", "1")] == [pytest.approx(10.0)]
    assert table[("0", "0")] == [pytest.approx(10.0), pytest.approx(10.0)]  # 10-20, 90-100
    assert "level 3: 6 emissions" in report(tmp_path)
