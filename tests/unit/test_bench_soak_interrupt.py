"""Ctrl-C during `bench --soak` keeps the windows that finished, marked interrupted, and says
where they went: a real SIGINT to a real `servepilot bench` against the simulated replica, with
one client process and with several (the parent tells them to stop and takes what each
finished)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

# Long on the clock, light on the cores: handed out first (tests/integration/conftest.py).
pytestmark = pytest.mark.starts_first

ROOT = Path(__file__).resolve().parents[2]


def _answered(url: str) -> float:
    lines = httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("vllm:request_success_total")
    )


def _soak(url: str, out: Path, extra: list[str]) -> subprocess.Popen[str]:
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored,
    # and so would bench: a Python handler here is reset to the default at exec.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "servepilot", "bench", "--url", url, "--concurrency", "2",
             "--soak", "60s", "--window", "2s", "--input-tokens", "40", "--output-tokens", "8",
             "--out", str(out), *extra],
            cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("extra", [[], ["--processes", "2"]], ids=["one", "two-processes"])
def test_ctrl_c_during_a_soak_keeps_its_finished_windows(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "soak"
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as sim:
        proc = _soak(sim.url, out, extra)
        try:
            deadline = time.monotonic() + 120
            while _answered(sim.url) < 1:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(5.0)  # two windows of 2 s finished, the third under way
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    said = " ".join((stdout + stderr).split())
    assert "finished soak windows" in said and f"{out}/results.json" in said
    data = json.loads((out / "results.json").read_text())
    assert data["interrupted"] is True
    [run] = data["runs"]
    assert 2 <= len(run["windows"]) <= 3
    assert all(w["completed"] > 0 for w in run["windows"])
    # The run is its finished windows: no request ended after the last one's end.
    assert run["completed"] == sum(w["completed"] for w in run["windows"])
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) - 1 >= run["completed"]
    assert "interrupted" in (out / "report.html").read_text()
