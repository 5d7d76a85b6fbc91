"""Batch jobs on idle capacity (issue 20): interactive P0 traffic at a fixed rate, with and
without a large concurrent batch, through one gateway in front of simulated replicas.

The replicas (servepilot/engine/simserver) have a cost model that makes capacity real: a
step takes 25 ms plus 0.02 ms per running sequence plus 10 us per prefilled token (a
GPU-like decode, nearly flat in the batch size), at most --max-num-seqs sequences a replica;
the gateway gives each replica as many slots (--capacity). Every request asks 64 tokens.

Phases, each --duration-s long, in one run:
  capacity     a batch alone, on a gateway with batch.reserve_share 0 and the window's
               ceiling at the fleet's slots: the output tokens/s the fleet gives batch work
  interactive  P0 streamed chats alone, open loop at --rate req/s (Poisson, seeded):
               TTFT p99 (from the intended send time) and its output tokens/s
  mixed        the same P0 arrivals while a large batch runs (the gateway's defaults)

Targets: P0 TTFT p99 (mixed) <= 1.10 x (interactive); batch tokens/s (mixed) >= 70% of
(capacity - interactive tokens/s), the capacity interactive traffic leaves idle. Printed as a
table, written to OUT/summary.json; exit status 1 when a target is missed.

    python benchmarks/bench_batch.py [--out runs/bench-batch] [--rate 6] [--duration-s 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from servepilot.engine.ports import free_port  # noqa: E402
from servepilot.gateway.batch.client import BatchClient  # noqa: E402

MODEL = "smollm2"
OUTPUT_TOKENS = 64
COSTS = {"base_s": 0.025, "per_decode_seq_s": 0.00002, "per_prefill_token_s": 0.00001}
TTFT_RISE_MAX = 0.10
IDLE_USE_MIN = 0.70
BATCH_LINES = 5_000  # more than any phase gets through: the batch outlasts it
WARM_S = 8.0  # the window's slow start, before a batch's throughput is measured


@dataclass(frozen=True)
class Interactive:
    sent: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class Summary:
    date: str
    replicas: int
    slots_per_replica: int
    rate_per_s: float
    duration_s: float
    capacity_tokens_per_s: float
    interactive_alone: Interactive
    interactive_mixed: Interactive
    batch_mixed_tokens_per_s: float
    idle_tokens_per_s: float
    idle_used: float
    ttft_p99_rise: float
    targets_met: bool


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-batch")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--rate", type=float, default=6.0, help="P0 requests per second")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    slots = args.replicas * args.max_num_seqs
    with tempfile.TemporaryDirectory() as scratch, replicas(args, Path(scratch)) as urls:
        work = Path(scratch)
        unreserved = {"reserve_share": 0.0, "max_concurrency": slots}
        with gateway(urls, args.max_num_seqs, work / "g1", unreserved) as url:
            capacity = batch_throughput(url, work / "cap.jsonl", args.duration_s)
        with gateway(urls, args.max_num_seqs, work / "g2", {}) as url:
            alone = asyncio.run(interactive(url, args.rate, args.duration_s, args.seed))
            mixed, batch_tps = mixed_run(url, work / "mix.jsonl", args)
    idle = capacity - alone.output_tokens_per_s
    summary = Summary(
        date=time.strftime("%Y-%m-%d"), replicas=args.replicas,
        slots_per_replica=args.max_num_seqs, rate_per_s=args.rate, duration_s=args.duration_s,
        capacity_tokens_per_s=capacity, interactive_alone=alone, interactive_mixed=mixed,
        batch_mixed_tokens_per_s=batch_tps, idle_tokens_per_s=idle,
        idle_used=batch_tps / idle if idle > 0 else 0.0,
        ttft_p99_rise=mixed.ttft_p99_ms / alone.ttft_p99_ms - 1.0,
        targets_met=False,
    )  # fmt: skip
    met = summary.ttft_p99_rise <= TTFT_RISE_MAX and summary.idle_used >= IDLE_USE_MIN
    summary = Summary(**{**asdict(summary), "interactive_alone": alone,
                         "interactive_mixed": mixed, "targets_met": met})  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    print(table(summary))
    return 0 if met else 1


def table(s: Summary) -> str:
    a, m = s.interactive_alone, s.interactive_mixed
    rows = [
        ("", "P0 TTFT p50", "P0 TTFT p99", "P0 tok/s", "batch tok/s"),
        ("batch alone (capacity)", "", "", "", f"{s.capacity_tokens_per_s:.0f}"),
        ("interactive alone", f"{a.ttft_p50_ms:.0f} ms", f"{a.ttft_p99_ms:.0f} ms",
         f"{a.output_tokens_per_s:.0f}", ""),
        ("interactive + batch", f"{m.ttft_p50_ms:.0f} ms", f"{m.ttft_p99_ms:.0f} ms",
         f"{m.output_tokens_per_s:.0f}", f"{s.batch_mixed_tokens_per_s:.0f}"),
    ]  # fmt: skip
    lines = ["  ".join(f"{cell:>22}" if i else f"{cell:<22}" for i, cell in enumerate(row))
             for row in rows]  # fmt: skip
    lines.append(
        f"P0 TTFT p99 rise {s.ttft_p99_rise:+.1%} (target <= +{TTFT_RISE_MAX:.0%}); batch used "
        f"{s.idle_used:.0%} of the idle {s.idle_tokens_per_s:.0f} tok/s (target >= "
        f"{IDLE_USE_MIN:.0%}); {'targets met' if s.targets_met else 'TARGET MISSED'}"
    )
    return "\n".join(lines)


@contextmanager
def replicas(args: argparse.Namespace, folder: Path) -> Iterator[list[str]]:
    procs, urls = [], []
    costs = [arg for name, value in COSTS.items() for arg in ("--cost", f"{name}={value}")]
    try:
        for i in range(args.replicas):
            port = free_port()
            log = (folder / f"replica{i}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "servepilot.engine.simserver.server", "--model", MODEL,
                 "--port", str(port), "--max-model-len", "2048",
                 "--max-num-seqs", str(args.max_num_seqs), *costs],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            ))  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(f"{url}/health")
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)


@contextmanager
def gateway(urls: list[str], slots: int, folder: Path, batch: dict[str, Any]) -> Iterator[str]:
    folder.mkdir(parents=True)
    settings = {"store": f"sqlite:///{folder / 'b.sqlite3'}", "files_dir": str(folder), **batch}
    fleet = folder / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"gateway": {"batch": settings,
                                                 "access_log": {"enabled": False}}}))  # fmt: skip
    port = free_port()
    argv = [sys.executable, "-m", "servepilot", "gateway", "-c", str(fleet), "--policy",
            "least_load", "--port", str(port), "--capacity", str(slots)]  # fmt: skip
    for url in urls:
        argv += ["--replica", url]
    with (folder / "gateway.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_for(f"http://127.0.0.1:{port}/ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(60)


def wait_for(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


def batch_file(path: Path, lines: int) -> Path:
    rng = random.Random(1)
    with path.open("w") as out:
        for i in range(lines):
            words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(60))
            out.write(
                json.dumps(
                    {
                        "custom_id": f"b{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": MODEL,
                            "max_tokens": OUTPUT_TOKENS,
                            "ignore_eos": True,
                            "messages": [{"role": "user", "content": words}],
                        },
                    }
                )
                + "\n"
            )
    return path  # fmt: skip


def batch_throughput(url: str, path: Path, duration_s: float) -> float:
    """Output tokens/s of a large batch over `duration_s`, after a warm-up (the window's
    slow start), measured from its completed count."""
    client = BatchClient(url)
    uploaded = client.upload(batch_file(path, BATCH_LINES))
    batch_id = client.create(uploaded["id"], "/v1/chat/completions", "24h")["id"]
    time.sleep(WARM_S)
    first = client.retrieve(batch_id)["request_counts"]["completed"]
    started = time.monotonic()
    time.sleep(duration_s)
    last = client.retrieve(batch_id)["request_counts"]["completed"]
    elapsed = time.monotonic() - started
    client_cancel(url, batch_id)
    return float(last - first) * OUTPUT_TOKENS / elapsed


def client_cancel(url: str, batch_id: str) -> None:
    request = urllib.request.Request(f"{url}/v1/batches/{batch_id}/cancel", method="POST")
    with urllib.request.urlopen(request, timeout=30):
        pass
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if BatchClient(url).retrieve(batch_id)["status"] == "cancelled":
            return
        time.sleep(0.2)


def mixed_run(url: str, path: Path, args: argparse.Namespace) -> tuple[Interactive, float]:
    client = BatchClient(url)
    uploaded = client.upload(batch_file(path, BATCH_LINES))
    batch_id = client.create(uploaded["id"], "/v1/chat/completions", "24h")["id"]
    time.sleep(WARM_S)
    first = client.retrieve(batch_id)["request_counts"]["completed"]
    started = time.monotonic()
    mixed = asyncio.run(interactive(url, args.rate, args.duration_s, args.seed))
    last = client.retrieve(batch_id)["request_counts"]["completed"]
    elapsed = time.monotonic() - started
    client_cancel(url, batch_id)
    return mixed, (last - first) * OUTPUT_TOKENS / elapsed


async def interactive(url: str, rate: float, duration_s: float, seed: int) -> Interactive:
    """P0 streamed chats, open loop (Poisson arrivals); TTFT from the intended send time."""
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(rate)
    while t < duration_s:
        offsets.append(t)
        t += rng.expovariate(rate)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(session, url, start + o) for o in offsets))
        elapsed = time.perf_counter() - start
    ttfts = sorted(r for r in results if r is not None)
    return Interactive(
        sent=len(offsets), failed=len(offsets) - len(ttfts),
        ttft_p50_ms=percentile(ttfts, 50) * 1000, ttft_p99_ms=percentile(ttfts, 99) * 1000,
        output_tokens_per_s=len(ttfts) * OUTPUT_TOKENS / elapsed,
    )  # fmt: skip


async def one(session: aiohttp.ClientSession, url: str, at: float) -> float | None:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    body = {
        "model": MODEL,
        "max_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "messages": [{"role": "user", "content": "an interactive question " * 15}],
    }
    ttft = None
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"X-Priority": "0"}) as resp:  # fmt: skip
            if resp.status != 200:
                return None
            async for line in resp.content:
                if ttft is None and b'"content":' in line and b'"content":""' not in line:
                    ttft = time.perf_counter() - at
    except aiohttp.ClientError:
        return None
    return ttft


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    index = min(len(values) - 1, max(0, math.ceil(pct / 100 * len(values)) - 1))
    return values[index]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
