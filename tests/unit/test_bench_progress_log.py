"""bench's progress in a log: with stderr redirected, plain lines at a bounded rate, and the
run's length estimated before the first request, at the first answer and after each level."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servepilot.cli.console import err_console
from servepilot.cli.levels_view import PlainLevels
from servepilot.core.results import Load, LoadMode
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim
from tests.unit.test_bench_sweep import run

# Long on the clock, light on the cores: handed out first (tests/integration/conftest.py).
pytestmark = pytest.mark.starts_first

ROOT = Path(__file__).resolve().parents[2]


def test_a_redirected_bench_logs_its_progress_and_its_estimates(tmp_path: Path) -> None:
    log = tmp_path / "bench.log"
    out = tmp_path / "run"
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as sim, open(log, "w") as stderr:
        # About 1.7 s a request on this cost model: level c=1 takes about 14 s, so it logs
        # one progress line at 10 s; c=2 about 7 s, none.
        done = subprocess.run(
            [sys.executable, "-m", "servepilot", "bench", "--url", sim.url, "--concurrency",
             "1,2", "--requests", "8", "--input-tokens", "40", "--output-tokens", "80",
             "--out", str(out)],
            cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
            stderr=stderr, timeout=300, check=False,
        )  # fmt: skip
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    # The first line says how the chat template is sized (tests/unit/test_bench_prompts_chat.py).
    assert text.startswith("• the chat template adds 30 tokens to a message")
    lines = text.splitlines()[1:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    first_e2e_s = runs[0]["e2e_ms"]["p50"] / 1000

    # Before the first request: the size of the run, the time to follow.
    assert lines[0] == (
        "estimate: 2 levels left, 16 requests in all; their time is estimated once the "
        "first answer is in"
    )
    assert lines[1] == "level 1 · concurrency 1: started"
    # At the first answer: a range, from that answer's time.
    first = re.fullmatch(
        r"estimate: (\d+)-(\d+) s left for 2 levels, from concurrency 1's first answer in "
        r"([\d.]+) s \(the short end if throughput grows with the load, the long end if it "
        r"stays flat\)",
        lines[2],
    )
    assert first is not None, lines[2]
    answer_s = float(first[3])
    assert abs(answer_s - first_e2e_s) < 0.5
    # c=1: 8 answers one at a time; c=2: 8 more, two at a time (short) or one (long).
    assert int(first[1]) == round(12 * answer_s) and int(first[2]) == round(16 * answer_s)

    progress = [line for line in lines if re.match(r"level \d · [^:]*: \d+ ok", line)]
    tick = r"level (\d) · concurrency \d: (\d) ok · 0:00:(\d\d) elapsed · .+ left"
    ticks = [re.fullmatch(tick, p) for p in progress]
    assert all(t is not None for t in ticks), progress
    # c=1's 14 s give one line (at 10 s, with 4 to 7 answers in); never two within 10 s.
    first_level = [t for t in ticks if t is not None and t[1] == "1"]
    assert first_level and 3 <= int(first_level[0][2]) <= 7, progress
    assert re.fullmatch(r".* · 0:00:10 elapsed · \d+-\d+ s left", first_level[0][0])
    for level in {t[1] for t in ticks if t is not None}:
        times = [int(t[3]) for t in ticks if t is not None and t[1] == level]
        assert times[0] >= 10 and all(b - a >= 10 for a, b in itertools.pairwise(times))
    assert re.search(r"^level 1 · concurrency 1: done in 0:00:\d\d: 8 ok, 0 failed · ", text, re.M)
    assert re.search(r"^level 1 of 2 done; estimate: \d+-\d+ s left for 1 level, from the ", text,
                     re.M)  # fmt: skip
    assert re.search(r"^level 2 · concurrency 2: done in 0:00:\d\d: 8 ok, 0 failed · ", text, re.M)


def test_plain_lines_come_at_most_every_ten_seconds() -> None:
    now = [0.0]
    with err_console.capture() as captured:
        plain = PlainLevels(err_console, clock=lambda: now[0])
        load = Load(mode=LoadMode.CONCURRENCY, value=4)
        plain.start(load, 20)
        for t in range(1, 26):
            now[0] = float(t)
            plain.update(load, t, f"{t} ok", "about 1 min left")
        plain.finish(run(4, 100, 800))
    assert captured.get().splitlines() == [
        "level 1 · concurrency 4: started",
        "level 1 · concurrency 4: 10 ok · 0:00:10 elapsed · about 1 min left",
        "level 1 · concurrency 4: 20 ok · 0:00:20 elapsed · about 1 min left",
        "level 1 · concurrency 4: done in 0:00:25: 100 ok, 0 failed · 100.0 tok/s · P99 E2E 800 ms",
    ]
