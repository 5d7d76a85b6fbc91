"""Serve each bring-up config on a GPU with `servepilot up`, as a user would, and keep what it
printed: the fleet file, `plan`'s JSON for it, `up`'s output, a short `bench` at concurrency 1
and 32, `status`, and the replica's log. Runs on the GPU machine after the kit's install
(docs/gpu.md); `python -m servepilot.engine.gpu.run_record` turns each case's folder into a
record here.

    python3 benchmarks/gpu_bringup.py --out "$OUT" llama-8b smollm2-real ...

Each case is started, measured and stopped before the next; a case that fails is logged and the
next one runs. Times are wall-clock seconds on that machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

# Without flashinfer (the kit leaves it out) and with NVLink multicast off (docs/gpu.md).
GPU_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
DUMMY = {"weights": "dummy"}
CASES: dict[str, dict[str, Any]] = {
    "smollm2-real": {"model": {"source": "smollm2"}, "engine": {"max_model_len": 2048}},
    "llama-8b": {"model": {"source": "llama-3.1-8b", **DUMMY}, "engine": {"max_model_len": 8192}},
    "llama-8b-fp8": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "engine": {"max_model_len": 8192, "quantization": "fp8"},
    },
    "llama-8b-fp8kv": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "engine": {"max_model_len": 8192, "kv_cache_dtype": "fp8"},
    },
    "qwen2.5-32b": {"model": {"source": "qwen2.5-32b", **DUMMY}, "engine": {"max_model_len": 8192}},
    "deepseek-v2-lite": {
        "model": {"source": "deepseek-v2-lite", **DUMMY},
        "engine": {"max_model_len": 8192},
    },
    # vLLM's sleep mode (seed 000's preloaded replicas): its /sleep and /wake_up endpoints
    # exist only with VLLM_SERVER_DEV_MODE=1.
    "llama-8b-sleep": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "engine": {
            "max_model_len": 8192,
            "extra_args": ["--enable-sleep-mode"],
            "env": {"VLLM_SERVER_DEV_MODE": "1"},
        },
        "sleep_cycles": 3,
    },
    # A tiered KV cache: the GPU's KV pool kept small (gpu_memory_utilization 0.15: about
    # 27k tokens) under 16 multi-turn sessions whose histories reach ~6k tokens each, so a
    # returning turn's prefix has left the GPU; with the CPU tier it comes back from host
    # memory instead of being recomputed. The same run without the tier is `llama-8b-small-kv`.
    "llama-8b-offload": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "engine": {"max_model_len": 8192, "gpu_memory_utilization": 0.15, "kv_offload_gib": 16},
        "benches": ["multi_turn"],
    },
    "llama-8b-small-kv": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "engine": {"max_model_len": 8192, "gpu_memory_utilization": 0.15},
        "benches": ["multi_turn", "soak"],
    },
    # Two replicas sharing the GPU (gpu_memory_utilization left out: 0.45 each), the second
    # held asleep as a warm pool, then woken and put back to sleep with servepilot's CLI.
    "llama-8b-pair": {
        "model": {"source": "llama-3.1-8b", **DUMMY},
        "hardware": {"replicas_per_gpu": 2},
        "replicas": {"count": 2, "asleep": 1},
        "engine": {"max_model_len": 8192, "sleep_mode": True},
        "warm_pool": "r1",
    },
}
# 16 conversations interleaved turn by turn (bench's multi_turn: waves of 16), 4 turns of
# 1,500 prompt tokens and 100 output tokens, two waves: 128 requests, 4 in flight.
BENCHES: dict[str, list[str]] = {
    "c1": ["--concurrency", "1", "--requests", "8", "--input-tokens", "1000",
           "--output-tokens", "200", "--warmup", "1"],
    "c32": ["--concurrency", "32", "--requests", "64", "--input-tokens", "1000",
            "--output-tokens", "200", "--warmup", "1"],
    "multi_turn": ["--workload", "multi_turn", "--turns", "4", "--concurrency", "4",
                   "--requests", "128", "--input-tokens", "1500", "--output-tokens", "100"],
    # The seeds' leak rule (2 MB a request at most), the GPU read through NVML each window.
    "soak": ["--concurrency", "32", "--input-tokens", "1000", "--output-tokens", "200",
             "--soak", "120s", "--window", "20s"],
}  # fmt: skip
PORT = 8000


def fleet_yaml(case: dict[str, Any]) -> dict[str, Any]:
    engine = {**case["engine"], "env": {**GPU_ENV, **case["engine"].get("env", {})}}
    hardware = {"device": "gpu", "accelerator": "h200-141", "count": 1, **case.get("hardware", {})}
    fleet = {"model": case["model"], "hardware": hardware, "engine": engine}
    return {**fleet, "replicas": case.get("replicas", {"count": 1}), "gateway": {"port": PORT}}


def sp(args: list[str], log: Path, timeout_s: float) -> tuple[int, float]:
    """Runs `servepilot ARGS`, its output into `log`; (exit code, seconds)."""
    start = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "servepilot", *args],
                stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = 124
    took = time.monotonic() - start
    print(f"  servepilot {' '.join(args)}: exit {code} in {took:.1f} s", flush=True)
    return code, took


def run_case(name: str, out: Path) -> dict[str, Any]:
    import yaml

    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(fleet_yaml(CASES[name]), sort_keys=False))
    print(f"== {name}", flush=True)
    summary: dict[str, Any] = {"name": name}
    sp(["plan", "-c", str(fleet), "--json"], folder / "plan.json", 120)
    code, ready_s = sp(["up", "-c", str(fleet), "--detach"], folder / "up.txt", 540)
    summary["up_exit"], summary["up_s"] = code, round(ready_s, 1)
    if code == 0:
        url = f"http://127.0.0.1:{PORT}"
        sp(["status"], folder / "status.txt", 60)
        for bench in CASES[name].get("benches", ["c1", "c32"]):
            sp(["bench", "--url", url, *BENCHES[bench], "--out", str(folder / f"bench-{bench}")],
               folder / f"bench-{bench}.txt", 300)  # fmt: skip
        if CASES[name].get("sleep_cycles"):
            summary["sleep"] = sleep_cycles(url, CASES[name]["sleep_cycles"], folder)
        if CASES[name].get("warm_pool"):
            summary["warm_pool"] = warm_pool(CASES[name]["warm_pool"], url, folder)
    sp(["down", "--port", str(PORT)], folder / "down.txt", 120)
    for replica in ("r0", "r1") if CASES[name].get("replicas") else ("r0",):
        sp(["logs", replica, "--port", str(PORT)], folder / f"{replica}.log", 60)
    sp(["logs", "gateway", "--port", str(PORT)], folder / "gateway.log", 60)
    summary.update(_figures(folder))
    print(f"   {json.dumps(summary)}", flush=True)
    return summary


def sleep_cycles(url: str, cycles: int, folder: Path) -> list[dict[str, float]]:
    """Puts the replica to sleep (level 1: weights to host memory, KV cache dropped) and wakes
    it `cycles` times: seconds for each, GPU memory in use around them, and the first answer
    through the gateway after waking."""
    replica = json.loads(urlopen(f"{url}/admin/replicas", timeout=10).read())[0]["url"]
    rows = []
    for _ in range(cycles):
        row = {"awake_gpu_mib": _gpu_used_mib()}
        row["sleep_s"] = _post_s(f"{replica.rstrip('/')}/sleep?level=1")
        row["asleep_gpu_mib"] = _gpu_used_mib()
        row["wake_s"] = _post_s(f"{replica.rstrip('/')}/wake_up")
        row["first_answer_s"] = _post_s(f"{url}/v1/completions",
                                        {"prompt": "Hello", "max_tokens": 8})  # fmt: skip
        row["woken_gpu_mib"] = _gpu_used_mib()
        rows.append(row)
        print(f"   sleep cycle: {json.dumps(row)}", flush=True)
    (folder / "sleep.json").write_text(json.dumps(rows, indent=2))
    return rows


def warm_pool(replica: str, url: str, folder: Path) -> list[dict[str, float | str]]:
    """The warm pool through servepilot's own commands: the GPU's memory with `replica`
    asleep, `servepilot wake`, a bench over both replicas, `servepilot sleep`, twice."""
    rows: list[dict[str, float | str]] = []
    for cycle in (1, 2):
        row: dict[str, float | str] = {"asleep_gpu_mib": _gpu_used_mib()}
        _, row["wake_cli_s"] = sp(["wake", replica, "--port", str(PORT)],
                                  folder / f"wake-{cycle}.txt", 120)  # fmt: skip
        row["woken_gpu_mib"] = _gpu_used_mib()
        sp(["status"], folder / f"status-woken-{cycle}.txt", 60)
        sp(["bench", "--url", url, *BENCHES["c32"], "--out", str(folder / f"bench-both-{cycle}")],
           folder / f"bench-both-{cycle}.txt", 300)  # fmt: skip
        _, row["sleep_cli_s"] = sp(["sleep", replica, "--port", str(PORT)],
                                   folder / f"sleep-{cycle}.txt", 120)  # fmt: skip
        row["said"] = " | ".join(
            (folder / f"{verb}-{cycle}.txt").read_text().strip().splitlines()[-1][:120]
            for verb in ("wake", "sleep")
        )
        rows.append(row)
        print(f"   warm pool cycle: {json.dumps(row)}", flush=True)
    (folder / "warm-pool.json").write_text(json.dumps(rows, indent=2))
    return rows


def _post_s(url: str, body: dict[str, Any] | None = None) -> float:
    data = json.dumps(body or {}).encode()
    request = Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    urlopen(request, timeout=300).read()
    return round(time.monotonic() - start, 3)


def _gpu_used_mib() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    return float(out.split()[0]) if out.split() else -1.0


def _figures(folder: Path) -> dict[str, Any]:
    """What the case's files say: plan's KV tokens, vLLM's, and bench's TPOT and throughput."""
    found: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, KeyError):
        found["kv_planned"] = json.loads((folder / "plan.json").read_text())["kv_capacity_tokens"]
    log = (folder / "r0.log").read_text(errors="replace") if (folder / "r0.log").exists() else ""
    found["vllm_lines"] = [
        line.split("] ", 1)[-1].strip()[:160]
        for line in log.splitlines()
        if any(k in line for k in ("KV cache size", "Maximum concurrency", "Available KV",
                                   "Graph capturing finished", "torch.compile takes",
                                   "Model loading took", "init engine"))
    ]  # fmt: skip
    for bench in BENCHES:
        try:
            run = json.loads((folder / f"bench-{bench}" / "results.json").read_text())["runs"][0]
            found[bench] = {
                "tpot_p50_ms": run["tpot_ms"]["p50"],
                "ttft_p50_ms": run["ttft_ms"]["p50"],
                "output_tok_s": run["output_throughput"],
            }
        except (OSError, ValueError, KeyError, IndexError):
            pass
    if (folder / "bench-multi_turn" / "requests.csv").exists():
        found["ttft_by_turn"] = ttft_by_turn(folder / "bench-multi_turn" / "requests.csv")
    return found


def ttft_by_turn(csv_path: Path) -> dict[str, float | int | None]:
    """TTFT p50 of first turns and of returning ones, from a multi_turn bench's requests.csv
    (the turn of request i from bench's own send order: load/shapes.py turn_order)."""
    import csv
    import statistics

    from servepilot.load.shapes import turn_order
    from servepilot.load.workload import WorkloadKind, WorkloadSpec

    sent = [r for r in csv.DictReader(csv_path.open()) if r["warmup"] == "false"]
    rows = [r for r in sent if r["ttft_ms"]]
    # The order of everything sent (failures too): a wave's size depends on the count.
    order = turn_order(WorkloadSpec(kind=WorkloadKind.MULTI_TURN, turns=4), len(sent))
    first = [float(r["ttft_ms"]) for r in rows if order[int(r["index"])][1] == 0]
    later = [float(r["ttft_ms"]) for r in rows if order[int(r["index"])][1] > 0]
    return {
        "first_p50_ms": round(statistics.median(first), 1) if first else None,
        "returning_p50_ms": round(statistics.median(later), 1) if later else None,
        "first": len(first),
        "returning": len(later),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("cases", nargs="+", choices=sorted(CASES))
    args = parser.parse_args()
    os.environ.update(GPU_ENV)
    summaries = [run_case(name, args.out) for name in args.cases]
    (args.out / "summary.json").write_text(json.dumps(summaries, indent=2))
    print(json.dumps(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
