"""Are this machine's cores independent? The same work on core 0, timed while core 1 idles and
while a plain Python loop spins on it, in alternating rounds (issue 22's validation suite).

The simulation validation pins vLLM-CPU's model thread to core 0 and its API server and the
client to core 1. If work on core 1 slows core 0 (cores that are hyperthreads of one physical
core, or a hypervisor's CPU quota shared by both), an engine step's length depends on how busy
the frontend is, which a step model fitted on quiet probes cannot see. Three workloads on core
0: a bf16 matmul of a SmolLM2-135M MLP's shape (the replica's kind of work, one thread), the
same in fp32, and a pure Python loop.

    python benchmarks/cpu_contention.py [--rounds 3] [--seconds 3]

Prints each workload's median time per batch under each condition and the slowdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

SPIN = "import os\nos.sched_setaffinity(0, {1})\nprint('ready', flush=True)\nwhile True: pass\n"


def timed(work: Callable[[], object], seconds: float) -> float:
    """Median seconds of one call of `work`, over `seconds` of calls."""
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def workloads() -> dict[str, Callable[[], object]]:
    import torch

    torch.set_num_threads(1)
    x = torch.randn(256, 576, dtype=torch.bfloat16)
    w = torch.randn(576, 1536, dtype=torch.bfloat16)
    xf, wf = x.float(), w.float()

    def python_loop() -> int:
        total = 0
        for i in range(100_000):
            total += i
        return total

    return {
        "bf16 matmul x20": lambda: [x @ w for _ in range(20)],
        "fp32 matmul x20": lambda: [xf @ wf for _ in range(20)],
        "python loop 1e5": python_loop,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per workload and condition")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        print("needs cores 0 and 1", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {0})
    works = workloads()
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for condition in ("core 1 idle", "core 1 spinning"):
            spinner = None
            if condition == "core 1 spinning":
                spinner = subprocess.Popen(
                    [sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True
                )
                assert spinner.stdout is not None
                spinner.stdout.readline()  # pinned and spinning before anything is timed
            try:
                for name, work in works.items():
                    seconds = timed(work, args.seconds)
                    results.setdefault((name, condition), []).append(seconds)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
        print(f"round {round_ + 1}/{args.rounds} done, load average {os.getloadavg()[0]:.1f}")
    print(f"{'workload on core 0':18} {'core 1 idle':>12} {'core 1 spinning':>16} {'slowdown':>9}")
    for name in works:
        idle = statistics.median(results[(name, "core 1 idle")]) * 1e3
        busy = statistics.median(results[(name, "core 1 spinning")]) * 1e3
        print(f"{name:18} {idle:9.2f} ms {busy:13.2f} ms {busy / idle:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
