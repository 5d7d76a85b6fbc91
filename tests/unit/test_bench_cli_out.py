"""`bench`/`sim --out` checked before any work; Ctrl-C after finished levels keeps them."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from servepilot.bench.token_times import read_token_times
from servepilot.cli.main import main
from servepilot.sim.fleet import session
from tests.support.stub_server import threaded_stub
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("out", ["/etc/passwd", "file"])
def test_bench_out_that_is_a_file_fails_before_the_first_request(
    out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if out == "file":
        out = str(tmp_path / "results.txt")
        Path(out).write_text("x")
    with threaded_stub() as stub:
        code = main(["bench", "--url", stub.url, "--model", "stub-model", "--concurrency", "1",
                     "--requests", "1", "--out", out])  # fmt: skip
        sent = stub.server.stats.requests
    err = capsys.readouterr().err
    assert code == 2 and sent == 0
    assert f"--out {out}: is a file, not a directory" in err and "Traceback" not in err


def test_bench_out_that_cannot_be_created_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_text("x")
    code = main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--out",
                 str(tmp_path / "f" / "sub")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"--out {tmp_path}/f/sub: cannot write there" in err


def test_sim_out_is_checked_before_simulating(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.perf_counter()
    code = main(["sim", "--concurrency", "1", "--requests", "1", "--out", "/etc/passwd"])
    err = capsys.readouterr().err
    assert code == 2 and "--out /etc/passwd: is a file, not a directory" in err
    assert time.perf_counter() - started < 5


def _gauges(url: str) -> tuple[float, float]:
    """(requests finished, requests running) on the simulated replica."""
    lines = httpx.get(f"{url}/metrics", timeout=5).text.splitlines()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name))

    return total("vllm:request_success_total"), total("vllm:num_requests_running")


def test_ctrl_c_after_a_finished_level_saves_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as sim:
        # Level c=1: two requests one after the other; level c=2 is cut short by Ctrl-C.
        # A suite started in the background by a non-interactive shell inherits SIGINT
        # ignored, and so would bench: a Python handler here is reset to the default at
        # exec, where an ignored signal would stay ignored.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "servepilot", "bench", "--url", sim.url, "--concurrency",
                 "1,2", "--requests", "2", "--input-tokens", "40", "--output-tokens", "60",
                 "--out", str(out)],
                cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            deadline = time.monotonic() + 120
            # Level c=1 finished (2 answers) and c=2 running: the time to press Ctrl-C.
            while (gauges := _gauges(sim.url))[0] < 2 or gauges[1] < 1:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted after 1 finished level:" in stderr
    data = json.loads((out / "results.json").read_text())
    assert data["interrupted"] is True
    assert [(r["load"]["value"], r["completed"]) for r in data["runs"]] == [(1, 2)]
    assert len((out / "requests.csv").read_text().splitlines()) == 1 + 2
    assert "interrupted" in (out / "report.html").read_text()


def test_ctrl_c_during_sim_keeps_the_finished_levels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = session.run_level
    calls = []

    def interrupted_second(*args: Any, **kw: Any) -> Any:
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second level runs
        return real(*args, **kw)

    monkeypatch.setattr(session, "run_level", interrupted_second)
    out = tmp_path / "sim"
    code = main(["sim", "--concurrency", "1,4,8", "--requests", "6", "--input-tokens", "32",
                 "--output-tokens", "4", "--out", str(out)])  # fmt: skip
    assert code == 130
    data = json.loads((out / "results.json").read_text())
    assert data["interrupted"] is True
    assert [r["load"]["value"] for r in data["runs"]] == [1]
    assert len(data["target"]["levels"]) == 1


def test_ctrl_c_before_any_sim_level_finished_stops_as_usual(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "run_level", interrupted)
    code = main(["sim", "--concurrency", "1", "--requests", "2", "--out", str(tmp_path / "s")])
    assert code == 130 and not (tmp_path / "s" / "results.json").exists()


def test_token_times_hold_every_token_at_the_replicas_step_pace(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as sim:
        code = main(["bench", "--url", sim.url, "--concurrency", "1", "--requests", "2",
                     "--input-tokens", "40", "--output-tokens", "20", "--token-times",
                     "--out", str(out)])  # fmt: skip
    assert code == 0
    lines = read_token_times(out / "token_times.jsonl.gz")
    assert [(t["load_mode"], t["load_value"], t["index"]) for t in lines] == [
        ("concurrency", 1.0, 0),
        ("concurrency", 1.0, 1),
    ]
    rows = (out / "requests.csv").read_text().splitlines()[1:]
    for line, row in zip(lines, rows, strict=True):
        chunks = line["chunk_s"]
        assert isinstance(chunks, list) and len(chunks) == 20
        # Every token is its own step: 20 ms base + 0.5 ms a sequence + ~50 context tokens,
        # no sooner. A busy machine (CI's four test workers) only makes the real-time replica's
        # steps later (a median of 36 ms seen there).
        gaps = sorted(b - a for a, b in itertools.pairwise(chunks))
        assert 0.0206 - 0.003 < gaps[len(gaps) // 2] < 0.2
        ttft_ms = float(row.split(",")[10])
        assert (chunks[0] - line["sent_s"]) * 1000 == pytest.approx(ttft_ms, abs=0.01)


def test_token_times_without_out_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--token-times"])
    err = capsys.readouterr().err
    assert code == 2 and "--token-times needs --out" in err
