"""Measure the GPU validation suite (benchmarks/gpu_sim_cases.py) with real vLLM on the GPU.

Runs on the GPU machine after the bring-up kit's install (docs/gpu.md):

    python3 benchmarks/gpu_sim_validate.py --out "$OUT/sv" --deadline-s 560 llama-8b qwen2.5-32b

For each config: `servepilot profile` of its model where asked (--profile), `servepilot up`
(dummy weights), every run of the config once, then every run again (the second measurement,
apart in time from the first, gives the floor), `servepilot down`. Before each bench it checks
that the run still fits the deadline (the device's per-call limit), so what was measured comes
back; a run left out is printed as such. Each measurement keeps bench's results.json and its
output; `benchmarks/gpu_sim_report.py` predicts the same cases with `servepilot sim` here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_bringup import GPU_ENV, PORT, sp
from benchmarks.gpu_sim_cases import CONFIGS, PROFILES, RUNS, Run, longtail_trace

RUN_S_GUESS = 45.0
"""Seconds one measurement is allowed to need before the deadline: a run that would end after
it is left out."""


CATALOG_NAMES = {"H200": "h200-141", "H100": "h100-80"}
"""nvidia-smi's GPU name -> the catalog's entry: a loan may give either card."""


def gpu_name() -> str:
    import subprocess

    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout  # fmt: skip
    return out.splitlines()[0].strip() if out.strip() else "unknown"


def accelerator(name: str) -> str:
    for key, entry in CATALOG_NAMES.items():
        if key in name:
            return entry
    raise SystemExit(f"no catalog entry for the GPU {name!r}: add it to CATALOG_NAMES")


CARD_ENGINE: dict[tuple[str, str], dict[str, Any]] = {
    # Qwen2.5-32B's 61 GiB of weights leave too little of an 80 GB card at vLLM's default 0.9
    # for one 32,768-token request's KV (8 GiB); at 0.95 about 11 GiB remain.
    ("h100-80", "qwen2.5-32b"): {"gpu_memory_utilization": 0.95},
}
"""Engine settings a config needs on one card only (the cases stay the same)."""


def fleet_yaml(config: str, gpu: str) -> dict[str, Any]:
    case = CONFIGS[config]
    card = accelerator(gpu)
    engine = {**case["engine"], **CARD_ENGINE.get((card, config), {}), "env": dict(GPU_ENV)}
    hardware = {"device": "gpu", "accelerator": card, "count": 1}
    return {"model": case["model"], "hardware": hardware, "engine": engine,
            "replicas": {"count": 1}, "gateway": {"port": PORT}}  # fmt: skip


def run_seed(run: Run, rep: int, direct: bool = False) -> int:
    """bench's --seed for one measurement: its own prompts. bench gives level i of seed s the
    prompts of seed s + i, so a measurement that repeated an earlier one's seed (bench's
    default, 0) would be served from the prefix cache the earlier one filled: on 2026-12-06
    99% of closed-short's prompt tokens were, after the warm-up. The simulator's cache starts
    empty; so must the measurement's."""
    index = RUNS.index(run)
    return 100_000 + 1_000 * index + 100 * rep + (50 if direct else 0)


def measure(
    run: Run,
    folder: Path,
    url: str,
    deadline: float,
    seed: int,
    target: str | None = None,
    token_times: bool = False,
) -> dict[str, Any]:
    """One bench of `run` through the gateway at `url`, or straight at `target` (a replica's
    URL: what the gateway adds to a TTFT is the difference), with prompts from `seed`."""
    if (folder / "results.json").exists():
        return {"run": run.name, "exit": 0, "s": 0.0, "kept": True}
    folder.mkdir(parents=True, exist_ok=True)
    trace = None
    if run.trace is not None:
        trace = folder / "trace.jsonl"
        trace.write_text("\n".join(longtail_trace(**run.trace)) + "\n")
    args = ["bench", "--url", target or url, *run.bench_flags(trace), "--seed", str(seed),
            "--out", str(folder), *(["--token-times"] if token_times else [])]  # fmt: skip
    # vLLM's own histograms (queue time, prefill time, TTFT inside the server) before and
    # after: their difference splits a TTFT between the API server, the queue and the GPU.
    _scrape(url, folder / "vllm-before.txt")
    # Never past the deadline: what was measured must come back within the call's limit.
    code, took = sp(args, folder / "bench.txt", max(30.0, deadline - time.monotonic()))
    _scrape(url, folder / "vllm-after.txt")
    (folder / "command.txt").write_text("servepilot " + " ".join(args) + "\n")
    return {"run": run.name, "exit": code, "s": round(took, 1)}


WARMUP = (
    ["--requests", "96", "--input-tokens", "1000", "--output-tokens", "16",
     "--concurrency", "1,4,16,64"],
    ["--requests", "8", "--input-tokens", "4000", "--output-tokens", "16", "--concurrency", "1,8"],
)  # fmt: skip
"""Thrown away after each start: the first pass over new batch shapes pays vLLM's Triton
compilations (a 4-request burst on DeepSeek-V2-Lite took 639 ms the first time, 28 ms the
second), which a one-request --warmup does not reach."""


def warm_up(url: str, folder: Path) -> None:
    for i, flags in enumerate(WARMUP):
        # Seeds no measurement uses (run_seed's are 100,000 and up): nothing warm in the cache.
        sp(["bench", "--url", url, *flags, "--seed", str(10_000 * (i + 1)), "--out",
            str(folder / f"warmup{i}")], folder / f"warmup{i}.txt", 120)  # fmt: skip


def _replica_url(gateway_url: str) -> str:
    from urllib.request import urlopen

    replicas = json.loads(urlopen(f"{gateway_url}/admin/replicas", timeout=10).read())
    return str(replicas[0]["url"]).rstrip("/")


def _scrape(gateway_url: str, path: Path) -> None:
    """vLLM's metrics and the gateway's own (its admission queue is part of a TTFT too)."""
    from urllib.request import urlopen

    lines = []
    try:
        replica = json.loads(urlopen(f"{gateway_url}/admin/replicas", timeout=10).read())[0]
        text = urlopen(f"{replica['url'].rstrip('/')}/metrics", timeout=10).read().decode()
        text += urlopen(f"{gateway_url}/metrics", timeout=10).read().decode()
        lines = [line for line in text.splitlines() if line.startswith(("vllm:", "servepilot_"))]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        lines = [f"# not read: {exc}"]
    path.write_text("\n".join(lines) + "\n")


def serve_config(
    config: str,
    out: Path,
    deadline: float,
    profile: bool,
    reuse: bool,
    keep_up: bool = False,
    direct: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    token_times: bool = False,
) -> dict[str, Any]:
    import yaml

    folder = out / config
    folder.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"config": config, "runs": []}
    if profile:
        model, dtype = PROFILES[config]
        sp(["profile", "--model", model, "--dtype", dtype, "--out",
            str(folder / "profile.json")], folder / "profile.txt", 300)  # fmt: skip
    gpu = gpu_name()
    (folder / "gpu.txt").write_text(gpu + "\n")
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_yaml(config, gpu), sort_keys=False))
    sp(["plan", "-c", str(fleet), "--json"], folder / "plan.json", 120)
    # --reuse: the fleet an earlier call started (cut off by the call's limit) is still up.
    code, ready_s = (0, 0.0) if reuse else sp(["up", "-c", str(fleet), "--detach"],
                                              folder / "up.txt", 400)  # fmt: skip
    summary.update(up_exit=code, up_s=round(ready_s, 1))
    if code == 0:
        url = f"http://127.0.0.1:{PORT}"
        if not reuse:
            warm_up(url, folder)
        runs = [r for r in RUNS if r.config == config]
        if only:  # a loan's order: what it needs most first
            runs = sorted((r for r in runs if r.name in only), key=lambda r: only.index(r.name))
        for rep in (1, 2):
            for run in runs:
                if time.monotonic() + RUN_S_GUESS > deadline:
                    print(f"  left out (deadline): {run.name} rep {rep}", flush=True)
                    summary["runs"].append({"run": run.name, "rep": rep, "left_out": True})
                    continue
                row = measure(run, folder / run.name / f"rep{rep}", url, deadline,
                              run_seed(run, rep), token_times=token_times)  # fmt: skip
                summary["runs"].append({**row, "rep": rep})
                if run.name in direct and time.monotonic() + RUN_S_GUESS < deadline:
                    row = measure(run, folder / f"{run.name}-direct" / f"rep{rep}", url,
                                  deadline, run_seed(run, rep, direct=True),
                                  target=_replica_url(url))  # fmt: skip
                    summary["runs"].append({**row, "rep": rep, "direct": True})
    if keep_up:  # the next call measures the rest with --reuse
        print("   fleet left up (--keep-up)", flush=True)
    else:
        sp(["down", "--port", str(PORT)], folder / "down.txt", 120)
        sp(["logs", "r0", "--port", str(PORT)], folder / "r0.log", 60)
    print(f"   {json.dumps(summary)}", flush=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=560.0,
        help="stop starting measurements this many seconds after start",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run `servepilot profile` of each config's model first",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure against the fleet already up (the first config only)",
    )
    parser.add_argument(
        "--keep-up",
        action="store_true",
        help="leave the last config's fleet up (a later call goes on with --reuse)",
    )
    parser.add_argument(
        "--direct",
        default="",
        help="comma-separated runs measured a second time straight at vLLM, without the "
        "gateway (its share of a TTFT is the difference); their folders end in -direct",
    )
    parser.add_argument(
        "--runs",
        default="",
        help="comma-separated run names: measure only these, in this order (default: every "
        "run of the config, in gpu_sim_cases.py's order)",
    )
    parser.add_argument(
        "--token-times",
        action="store_true",
        help="bench --token-times on each measurement: every token's arrival, from which "
        "gpu_step_times.py reads the engine's steps under load",
    )
    parser.add_argument("configs", nargs="+", choices=sorted(CONFIGS))
    args = parser.parse_args()
    os.environ.update(GPU_ENV)
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    summaries = []
    direct = tuple(filter(None, args.direct.split(",")))
    only = tuple(filter(None, args.runs.split(",")))
    known = {run.name for run in RUNS}
    if unknown := [name for name in only if name not in known]:
        names = ", ".join(sorted(known))
        parser.error(f"--runs: no run named {', '.join(unknown)} (runs: {names})")
    for config in args.configs:
        if time.monotonic() + 150 > deadline:
            print(f"== {config}: left out (deadline)", flush=True)
            continue
        print(f"== {config}", flush=True)
        last = config == args.configs[-1]
        summaries.append(serve_config(config, args.out, deadline, args.profile, args.reuse,
                                      keep_up=args.keep_up and last, direct=direct,
                                      only=only, token_times=args.token_times))  # fmt: skip
        args.reuse = False
    (args.out / f"summary-{int(time.time())}.json").write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
