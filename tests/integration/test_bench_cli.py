"""`servepilot bench` end to end against a real vLLM-CPU replica, through servepilot's gateway."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servepilot.core.results import SCHEMA, BenchResult
from tests.integration.fleetproc import cli, free_port, wait_until

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def gateway_url(vllm_replica_url: str) -> Iterator[str]:
    """`servepilot gateway` in front of the shared replica, as `make serve` would put it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "servepilot", "gateway", "--replica", vllm_replica_url,
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _ready(url), 30)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_sweep_through_the_gateway_finds_a_sweet_spot(gateway_url: str, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    result = cli(
        ["bench", "--url", gateway_url, "--sweep", "--input-tokens", "32", "--output-tokens",
         "8", "--requests", "16", "--out", str(out)],
        dict(os.environ), timeout_s=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == SCHEMA and data["source"] == "measured"
    bench = BenchResult.model_validate(data)
    assert len(bench.runs) >= 2
    levels = [r.load.value for r in bench.runs]
    assert levels == sorted(levels) and levels[0] == 1
    assert all(r.completed == 16 and r.failed == 0 for r in bench.runs)
    # Prompts were built with the replicas' tokenizer, through the gateway's /tokenize.
    first = bench.runs[0]
    assert first.output_tokens_mean == 8
    assert first.ttft_ms.p50 is not None and first.tpot_ms.p50 is not None
    assert bench.sweet_spot is not None and bench.sweet_spot.reason
    assert bench.sweet_spot.load in [r.load for r in bench.runs]
    # Batching on the replica: more concurrency gives more throughput than one at a time.
    assert max(r.output_throughput for r in bench.runs) > 1.2 * first.output_throughput
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16 * len(bench.runs)
    html = (out / "report.html").read_text()
    assert "<svg" in html and bench.sweet_spot.reason.split(";")[0][:40] in html
    assert "sweet spot" in result.stdout.lower()


def test_rate_levels_with_an_slo(vllm_replica_url: str, tmp_path: Path) -> None:
    out = tmp_path / "rate"
    result = cli(
        ["bench", "--url", vllm_replica_url, "--endpoint", "completions", "--rate", "4,8",
         "--requests", "20", "--input-tokens", "32", "--output-tokens", "8",
         "--slo", "ttft_p99_ms=60000,tpot_p99_ms=60000", "--out", str(out)],
        dict(os.environ), timeout_s=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    bench = BenchResult.model_validate_json((out / "results.json").read_text())
    assert [r.load.value for r in bench.runs] == [4, 8]
    for run in bench.runs:
        assert run.completed == 20
        # Generous SLOs: every request meets them, so goodput equals throughput.
        assert run.slo_attainment == 1.0
        assert run.goodput_rps == pytest.approx(run.request_throughput)
        assert run.client is not None and run.client.requested_rate == run.load.value
    assert bench.slo == {"ttft_p99_ms": 60000, "tpot_p99_ms": 60000}


def test_compare_two_results(tmp_path: Path, gateway_url: str) -> None:
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        result = cli(
            ["bench", "--url", gateway_url, "--concurrency", "2", "--requests", "10",
             "--input-tokens", "32", "--output-tokens", "8", "--out", str(out)],
            dict(os.environ), timeout_s=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        outs.append(out / "results.json")
    compared = cli(["bench", "compare", str(outs[0]), str(outs[1])], dict(os.environ))
    assert compared.returncode == 0, compared.stderr
    assert "c=2" in compared.stdout
    assert "(measured)" in compared.stdout


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    result = cli(["bench", "--url", f"http://127.0.0.1:{port}", "--requests", "2"],
                 dict(os.environ))  # fmt: skip
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
