"""benchmarks/bench_tune.py on the simulator: servepilot tune against an auto_tune-style grid,
in seconds (moved from tests/integration/test_tune_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_tune


def test_bench_tune_on_the_simulator_compares_with_the_grid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--engine", "sim", "--grid-seqs", "8,32,128", "--grid-batched", "1024,2048,4096",
            "--out", str(tmp_path)]  # fmt: skip
    assert bench_tune.main(argv) == 0
    out = capsys.readouterr().out
    assert "grid (auto_tune style)" in out and "servepilot tune" in out and "PASS" in out
    summary = json.loads((tmp_path / "bench_tune.json").read_text())
    assert summary["passed"] and summary["tune"]["trials"] <= summary["grid"]["trials"] // 2
