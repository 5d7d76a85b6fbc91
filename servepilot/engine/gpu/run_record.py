"""Record one GPU run: RUNS/<date>-<name>.json (by default benchmarks/gpu_runs/ of the checkout
it runs in), its logs and commands beside it.

The figures vLLM reports (KV tokens, weights, CUDA graphs) are read from the replica's startup
log with servepilot's own parser (engine/startup_log.py), never typed in; what `up`, `plan` and
the measurements report comes in as flags. The record is checked against the schema in
benchmarks/gpu_runs/README.md before anything is written.

    python -m servepilot.engine.gpu.run_record --name llama-8b-dummy --model llama-3.1-8b \\
        --weights dummy --gpu "NVIDIA H200" --vllm-version 0.22.0 --dtype bfloat16 \\
        --kv-tokens-planned 893712 --ready-s 95 --log runs/r0.log --command "servepilot up ..."
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from servepilot.engine.startup_log import GpuStartup, parse_gpu_startup

RUNS = Path("benchmarks/gpu_runs")
"""Where the records go, from the root of a checkout (--runs)."""
SCHEMA = "servepilot.gpu_run/v1"
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,), "date": (str,), "name": (str,), "vllm_version": (str,), "gpu": (str,),
    "model": (str,), "weights": (str,), "dtype": (str,), "quantization": (str, type(None)),
    "kv_cache_dtype": (str,), "replicas_per_gpu": (int,), "kv_tokens_reported": (int,),
    "kv_tokens_planned": (int, type(None)), "ready_s": (int, float), "commands": (list,),
    "logs": (list,),
}  # fmt: skip
OPTIONAL: dict[str, tuple[str, ...]] = {
    "sleep": ("sleep_s", "wake_s", "cold_start_s"),
    "offload": ("cpu_kv_gib", "ttft_p50_ms_with", "ttft_p50_ms_without"),
    "soak": ("requests", "gpu_mib_per_request"),
}


def validate(record: dict[str, Any]) -> list[str]:
    """Every problem with `record`, each naming its field; empty when it is valid."""
    problems = [f"{k}: missing" for k in REQUIRED if k not in record]
    for key, types in REQUIRED.items():
        if key in record and not isinstance(record[key], types):
            problems.append(f"{key}: {record[key]!r} is not {'/'.join(t.__name__ for t in types)}")
    if record.get("weights") not in ("real", "dummy"):
        problems.append(f"weights: {record.get('weights')!r} is not 'real' or 'dummy'")
    if record.get("schema") != SCHEMA:
        problems.append(f"schema: expected {SCHEMA}")
    for section, fields in OPTIONAL.items():
        value = record.get(section)
        if value is None:
            continue
        if not isinstance(value, dict) or set(value) != set(fields):
            problems.append(f"{section}: needs exactly {', '.join(fields)}")
        elif not all(isinstance(v, (int, float)) for v in value.values()):
            problems.append(f"{section}: every value must be a number")
    unknown = set(record) - set(REQUIRED) - set(OPTIONAL) - {"startup", "notes", "kv_error"}
    problems += [f"{key}: not in the schema" for key in sorted(unknown)]
    return problems


def build_record(args: argparse.Namespace, log_text: str) -> dict[str, Any]:
    startup = parse_gpu_startup(log_text)
    if startup.kv_tokens is None:
        raise SystemExit(f"{args.log[0]}: no 'GPU KV cache size' line: not a GPU startup log")
    record: dict[str, Any] = {
        "schema": SCHEMA, "date": args.date, "name": args.name,
        "vllm_version": args.vllm_version, "gpu": args.gpu, "model": args.model,
        "weights": args.weights, "dtype": args.dtype, "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype, "replicas_per_gpu": args.replicas_per_gpu,
        "kv_tokens_reported": startup.kv_tokens, "kv_tokens_planned": args.kv_tokens_planned,
        "ready_s": args.ready_s, "commands": list(args.command),
        "logs": [f"{args.date}-{args.name}/{Path(p).name}" for p in args.log],
        "startup": _startup(startup),
    }  # fmt: skip
    if args.kv_tokens_planned:
        error = args.kv_tokens_planned / startup.kv_tokens - 1
        record["kv_error"] = round(error, 4)
    for section, fields in OPTIONAL.items():
        values = getattr(args, section)
        if values is not None:
            record[section] = dict(zip(fields, values, strict=True))
    return record


def _startup(startup: GpuStartup) -> dict[str, float | None]:
    return {
        "weights_gib": startup.weights_gib,
        "cuda_graph_capture_s": startup.cuda_graph_capture_s,
        "cuda_graph_gib": startup.cuda_graph_gib,
        "kv_cache_gib": startup.kv_cache_gib_per_gpu,
        "max_concurrency": startup.max_concurrency,
    }


def write(record: dict[str, Any], logs: list[Path], runs: Path) -> Path:
    problems = validate(record)
    if problems:
        raise SystemExit("the record is not valid:\n  " + "\n  ".join(problems))
    stem = f"{record['date']}-{record['name']}"
    (runs / stem).mkdir(parents=True, exist_ok=True)
    for log in logs:
        shutil.copyfile(log, runs / stem / log.name)
    path = runs / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="short run name: the file is <date>-<name>.json")
    p.add_argument("--date", default=dt.date.today().isoformat())
    p.add_argument("--vllm-version", required=True)
    p.add_argument("--gpu", required=True, help='as nvidia-smi names it, e.g. "NVIDIA H200"')
    p.add_argument("--model", required=True, help="model.source as given to up")
    p.add_argument("--weights", choices=("real", "dummy"), required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--quantization", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--replicas-per-gpu", type=int, default=1)
    p.add_argument("--kv-tokens-planned", type=int, default=None, help="what `plan` printed")
    p.add_argument("--ready-s", type=float, required=True, help="process start to /health")
    p.add_argument("--log", action="append", required=True, help="replica log (first: its startup)")
    p.add_argument("--command", action="append", required=True, help="each command as run")
    p.add_argument("--sleep", type=float, nargs=3, metavar=("SLEEP_S", "WAKE_S", "COLD_START_S"))
    p.add_argument("--offload", type=float, nargs=3, metavar=("CPU_KV_GIB", "WITH", "WITHOUT"))
    p.add_argument("--soak", type=float, nargs=2, metavar=("REQUESTS", "GPU_MIB_PER_REQUEST"))
    p.add_argument("--runs", type=Path, default=RUNS, help="the folder of the records")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs = [Path(p) for p in args.log]
    record = build_record(args, logs[0].read_text(encoding="utf-8", errors="replace"))
    print(write(record, logs, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
