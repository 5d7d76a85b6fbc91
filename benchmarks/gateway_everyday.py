"""The gateway at an everyday load, next to vllm-router: `bench_gateway.py`'s second point.

Saturation (bench_gateway.py's first point) pushes as many requests as the router takes, each
answer in one write. An everyday load is different: about 1,000 requests/s, paced (the i-th
sent at i / rate, never more than 16 in flight), each answer streamed the way vLLM streams it,
one write per token (the stub pauses `--everyday-delay-ms` before each, so that a request lasts
about 16 ms and some 16 are in flight), and a client that is not ours (aiohttp, reading the
stream line by line as an OpenAI client does). Per token a router then pays a read, a write
and a wake-up instead of sharing them with the rest of the answer.

Per round: the stubs called directly, then each router (servepilot's gateway, vllm-router),
the order reversed every other round, each after a 2 s warm-up. Reported: the router's CPU
time per request (its process's user + system time from /proc over the measured run), the
requests/s reached and the mean in flight (a machine too busy to keep the pace shows here),
and the p50/p99 end-to-end latency it adds over the direct path; medians of the rounds.

The load generator runs in its own process (this file with `--run`), pinned to the load core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_client import run_child

START, END = "everyday: run starts", "everyday: run ended"
ROUTER_NAMES = ("servepilot gateway", "vllm-router")
BODY = {
    "model": "stub-model",
    "messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
    "max_tokens": 16,
    "stream": True,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--everyday-rate", type=float, default=1000.0,
                        help="requests/s of the everyday point's paced load")  # fmt: skip
    parser.add_argument("--everyday-concurrency", type=int, default=16,
                        help="most requests in flight at the everyday point")  # fmt: skip
    parser.add_argument("--everyday-s", type=float, default=10.0,
                        help="seconds of each measured everyday run")  # fmt: skip
    parser.add_argument("--everyday-delay-ms", type=float, default=1.0,
                        help="stub pause before each token at the everyday point")  # fmt: skip


# --- the load generator (its own process) ---------------------------------------------------


async def _one(session: Any, url: str, out: list[tuple[float, float]]) -> None:
    """One streamed chat completion; (TTFT, E2E) from its send time, in seconds."""
    sent_s = time.perf_counter()
    first = last = 0.0
    async with session.post(url, json=BODY) as answer:
        if answer.status != 200:
            await answer.read()
            return
        async for line in answer.content:
            if line.startswith(b"data: {"):
                last = time.perf_counter()
                first = first or last
    if first:
        out.append((first - sent_s, last - sent_s))


async def _paced(
    bases: str, rate: float, duration_s: float, concurrency: int, marks: bool
) -> dict[str, float]:
    """Requests sent at `rate` (the i-th at start + i / rate), never more than `concurrency`
    in flight: on a machine that falls behind, the load waits instead of piling up (a
    router that falls behind is then seen running below the rate)."""
    import aiohttp

    urls = [base + "/v1/chat/completions" for base in bases.split(",")]
    done: list[tuple[float, float]] = []
    total = int(rate * duration_s)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        # The connections first, so that the run measures steady keep-alive traffic.
        await asyncio.gather(*(_one(session, u, []) for u in urls for _ in range(concurrency)))
        slots = asyncio.Semaphore(concurrency)

        async def send(intended_s: float, url: str) -> None:
            async with slots:
                if (wait_s := intended_s - time.perf_counter()) > 0:
                    await asyncio.sleep(wait_s)
                await _one(session, url, done)

        if marks:
            print(START, flush=True)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(send(start + i / rate, urls[i % len(urls)]) for i in range(total)),
            return_exceptions=True,
        )
        elapsed = time.perf_counter() - start
        if marks:
            print(END, flush=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"{len(errors)} requests raised, e.g. {errors[0]!r}", file=sys.stderr)
    ttft = sorted(t for t, _ in done)
    e2e = sorted(e for _, e in done)
    return {
        "requests": float(total), "failed": float(total - len(done)),
        "rps": len(done) / elapsed, "ttft_p50_ms": _pct(ttft, 50),
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99),
        "in_flight": len(done) / elapsed * statistics.fmean(e2e) if e2e else 0.0,
    }  # fmt: skip


def _pct(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))] * 1000.0


def run_load(args: argparse.Namespace) -> None:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        # Warm-up: connection pools, caches, the router's own first requests.
        warm_s = min(2.0, args.duration_s)
        runner.run(_paced(args.url, args.rate, warm_s, args.concurrency, marks=False))
        result = runner.run(_paced(args.url, args.rate, args.duration_s, args.concurrency, True))
    args.out.write_text(json.dumps(result))


# --- the rounds (in bench_gateway.py's process) ---------------------------------------------


def _load(url: str, args: argparse.Namespace, tmp: Path, probe_pid: int | None) -> dict[str, Any]:
    out = tmp / "everyday.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--run", url, "--out", str(out),
            "--rate", str(args.everyday_rate), "--duration-s", str(args.everyday_s),
            "--concurrency", str(args.everyday_concurrency)]  # fmt: skip
    result, cpu = run_child(argv, args.load_core, out, START, END, probe_pid)
    if probe_pid is not None:
        result["cpu_us"] = cpu / result["requests"] * 1e6
    return result


def one_round(
    stubs: list[str],
    args: argparse.Namespace,
    tmp: Path,
    index: int,
    start: Callable[[str], tuple[subprocess.Popen[bytes], str]],
    stop: Callable[[subprocess.Popen[bytes]], None],
) -> dict[str, dict[str, Any]]:
    """The direct path, then each router (reversed every other round); `start(name)` gives
    a router's ready process and URL."""
    # Direct: the requests alternate between the stubs, as a router's round robin spreads them.
    rows = {"direct": _load(",".join(stubs), args, tmp, None)}
    for name in ROUTER_NAMES[::-1] if index % 2 else ROUTER_NAMES:
        proc, url = start(name)
        try:
            rows[name] = _load(url, args, tmp, proc.pid)
        finally:
            stop(proc)
    return rows


def table(rounds: list[dict[str, dict[str, Any]]], args: argparse.Namespace) -> str:
    def med(name: str, metric: str) -> float:
        return statistics.median(r[name][metric] for r in rounds)

    names = [n for n in rounds[0] if n != "direct"] if rounds else []
    lines = [
        f"everyday point: {args.everyday_rate:g} requests/s paced, at most "
        f"{args.everyday_concurrency} in flight, for "
        f"{args.everyday_s:g} s, 16 tokens each written alone ({args.everyday_delay_ms:g} ms "
        f"apart), aiohttp client; median of {len(rounds)} rounds",
        f"{'router':<20} {'CPU us/req':>10} {'requests/s':>10} {'in flight':>9} "
        f"{'+p50 e2e ms':>12} {'+p99 e2e ms':>12}   rounds (CPU us/req)",
    ]
    for name in names:
        each = ", ".join(f"{r[name]['cpu_us']:.0f}" for r in rounds)
        added50 = med(name, "e2e_p50_ms") - med("direct", "e2e_p50_ms")
        added99 = med(name, "e2e_p99_ms") - med("direct", "e2e_p99_ms")
        lines.append(f"{name:<20} {med(name, 'cpu_us'):>10.0f} {med(name, 'rps'):>10.0f} "
                     f"{med(name, 'in_flight'):>9.1f} {added50:>12.2f} {added99:>12.2f}   "
                     f"{each}")  # fmt: skip
    if rounds:
        lines.append(f"{'direct (no router)':<20} {med('direct', 'rps'):>21.0f} "
                     f"{med('direct', 'in_flight'):>9.1f}  p50 {med('direct', 'e2e_p50_ms'):.2f}"
                     f" ms, p99 {med('direct', 'e2e_p99_ms'):.2f} ms")  # fmt: skip
    ours, theirs = ROUTER_NAMES
    if ours in names and theirs in names:
        added = {n: med(n, "e2e_p99_ms") - med("direct", "e2e_p99_ms") for n in (ours, theirs)}
        ratio = med(ours, "cpu_us") / med(theirs, "cpu_us")
        lines.append(
            f"servepilot / vllm-router: CPU per request x{ratio:.2f} (target <= 1), added p99 "
            f"{added[ours]:.2f} vs {added[theirs]:.2f} ms "
            "(target: no worse)"
        )
    failed = sum(r[n]["failed"] for r in rounds for n in r)
    if failed:
        lines.append(f"WARNING: {failed:.0f} requests failed")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", dest="url", required=True,
                        help="base URL to load (several, comma-separated: in turn)")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    run_load(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
