"""Goodput under a TTFT SLO of the gateway's routing policies, next to vllm-router's cache_aware.

`servepilot up` starts two vLLM-CPU replicas with prefix caching, one core each (cpu_threads 1).
Each run puts a fresh `servepilot gateway --policy P` (round_robin, prefix_affinity, hybrid,
predicted_latency: given the replicas' fleet.yaml, from which it derives their step times) or
`vllm-router --policy cache_aware` in front of the replicas' own URLs (up's gateway idles), and
`servepilot bench` sends a shared_prefix workload through it. Routers and load generator float.

Sizing: vLLM-CPU keeps 46,080 bytes of KV per token of SmolLM2-135M in float32 (what
`engine.dtype: auto` runs on a CPU without native bfloat16, like these AVX2 machines; 23,040 in
bfloat16): --kv-cache-gib 0.5 is ~11,630 tokens a replica. 16 prefixes of 1,000 tokens (~16.4k
with the chat template) overflow one replica: behind round_robin each sees all 16 and its LRU
keeps ~10 (~60% hits). Half of them (8.2k) fits in each with room for the requests in flight,
so a router keeping each prefix on one replica hits ~100% once warm. Suffixes (64) and answers
(16 tokens) are short: a miss costs a 1,000-token prefill on one core, a hit ~100 tokens.

Load: closed loop, --concurrency 4 (two per replica): no calibration needed on an unknown,
shared machine, where an open-loop rate above round_robin's capacity grows its queue (and run)
without bound and one below every policy's hides the differences. A faster policy shows as
more requests/s and fewer SLO misses. The first --warmup requests (3 x prefixes, so nearly
every prefix has been seen) are not measured.

SLO: --slo-ttft-ms 2000 per request: a hit prefills in a few hundred ms, even behind another
hit; a miss, or a hit queued behind one, takes seconds. A probe on one replica first measures
the unloaded TTFT of a miss and of a hit and warns if the SLO is not between them (`auto` takes
their geometric mean). Goodput: requests/s that met the SLO, as servepilot bench counts it.

Fairness: each run has its own --seed (fresh prefixes, same shape), emptied prefix caches (POST
/reset_prefix_cache: VLLM_SERVER_DEV_MODE=1 is set in the fleet.yaml written here) and a fresh
router. --rounds N rotates the order each round; the table shows medians. "vLLM hit" is the
replicas' measured prefix cache hit rate (tokens, warm-up included), "gw est" the gateway's
estimate, "r0 share" the first replica's share of prompt tokens. Each run writes
OUT/NN-policy/{results.json,requests.csv,*.log}.

    python benchmarks/bench_routing.py [--only round_robin,hybrid] [--rounds 1] [--out DIR]
    python benchmarks/bench_routing.py --stub --requests 40 --warmup 8   # stubs: smoke test only
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_client import TOKENIZER, start_stub
from bench_gateway import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
POLICIES = ("round_robin", "prefix_affinity", "hybrid", "predicted_latency", "cache_aware")
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
SERVEPILOT, ROUTER = str(BIN / "servepilot"), str(BIN / "vllm-router")
Row = dict[str, Any]


@dataclass
class Bench:
    """What every run shares."""

    args: argparse.Namespace
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)
    model: str = "smollm2"
    slo_ms: float = 0.0
    probe_ms: dict[str, float] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RUST_LOG": "warn"}
    with log.open("ab") as sink:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    if proc.poll() is None:
        proc.terminate()  # gateway and `up` drain on SIGTERM; `up` then stops its replicas
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def vllm_replicas(b: Bench, engine: str | None = None) -> list[str]:
    """Start the fleet with `servepilot up`; its replicas' URLs, from its fleet record.
    `engine`: the fleet.yaml's engine section instead of two vLLM-CPU replicas'."""
    from servepilot.fleet.state import record_path

    out, port = b.args.out, free_port()
    (out / "fleet.yaml").write_text(
        "model:\n  source: smollm2\n  served_name: smollm2\n"
        + (engine or "engine:\n  enable_prefix_caching: true\n  cpu_threads: 1\n"
           f"  cpu_kv_cache_space_gib: {b.args.kv_cache_gib}\n"
           f"  max_model_len: {b.args.max_model_len}\n"
           '  env:\n    VLLM_SERVER_DEV_MODE: "1"\n')  # for POST /reset_prefix_cache
        + "replicas:\n  count: 2\n"
    )  # fmt: skip
    up = spawn([SERVEPILOT, "up", "-c", str(out / "fleet.yaml"), "--port", str(port)],
               out / "up.log")  # fmt: skip
    b.procs.append(up)
    print(f"starting 2 {'simulated' if engine else 'vLLM'} replicas (log: {out / 'up.log'})",
          flush=True)  # fmt: skip
    deadline = time.monotonic() + b.args.startup_timeout
    while time.monotonic() < deadline:
        if up.poll() is not None:  # e.g. a replica failed: up stops and says which, with its log
            raise SystemExit(f"servepilot up exited with {up.returncode}:\n{tail(out / 'up.log')}")
        path = record_path(port)
        record = json.loads(path.read_text()) if path.exists() else {}
        # The record is written as the replicas launch (state "starting"); wait until served.
        if record.get("pid") == up.pid and record.get("state") == "serving":
            return [replica["url"] for replica in record["replicas"]]
        time.sleep(1.0)
    raise SystemExit(f"the replicas were not ready in {b.args.startup_timeout:.0f} s: see up.log")


def scrape(url: str) -> dict[str, float]:
    """Prometheus samples of url/metrics summed by name; empty when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = defaultdict(float)
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
            for family in text_string_to_metric_families(answer.read().decode()):
                for sample in family.samples:
                    totals[sample.name] += sample.value
    except (OSError, ValueError):
        return {}
    return totals


def reset_caches(replicas: list[str]) -> bool:
    """Empty each replica's prefix cache; False where the (dev) endpoint is missing or refuses
    (vLLM refuses while blocks are held: never here, as a run ends with no request left)."""
    ok = True
    for url in replicas:
        request = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                ok = ok and bool(json.loads(answer.read() or b"{}").get("success", True))
        except (OSError, ValueError):
            ok = False
    return ok


def workload(args: argparse.Namespace) -> dict[str, object]:
    return {
        "--workload": "shared_prefix", "--num-prefixes": args.prefixes,
        "--prefix-tokens": args.prefix_tokens, "--output-tokens": args.output_tokens,
        "--input-tokens": args.prefix_tokens + args.suffix_tokens,
        "--concurrency": args.concurrency, "--requests": args.requests, "--warmup": args.warmup,
    }  # fmt: skip


def bench(url: str, model: str, flags: dict[str, object], run_dir: Path) -> dict[str, Any]:
    """One `servepilot bench` run into run_dir; the first run of its results.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    argv = [SERVEPILOT, "bench", "--url", url, "--model", model,
            "--tokenizer", str(TOKENIZER), "--out", str(run_dir)]  # fmt: skip
    argv += [str(item) for pair in flags.items() for item in pair]
    proc = spawn(argv, run_dir / "bench.log")
    try:
        code = proc.wait()
    finally:
        stop(proc)  # only does something when we are interrupted
    if code != 0:
        raise SystemExit(f"servepilot bench failed against {url}:\n{tail(run_dir / 'bench.log')}")
    run: dict[str, Any] = json.loads((run_dir / "results.json").read_text())["runs"][0]
    return run


def probe(b: Bench) -> tuple[float, float]:
    """Unloaded TTFT (ms) of a miss and of a hit: one prefix, 4 requests one at a time. Done
    twice (fresh prefix each), keeping the second: the first pays any one-off server costs."""
    flags = {**workload(b.args), "--num-prefixes": 1, "--requests": 4, "--warmup": 0,
             "--concurrency": 1}  # fmt: skip
    out = b.args.out / "probe"
    for seed in (b.args.seed + 10_000, b.args.seed + 10_001):
        bench(b.replicas[0], b.model, {**flags, "--seed": seed}, out)
        with (out / "requests.csv").open() as f:
            rows = sorted(csv.DictReader(f), key=lambda row: int(row["index"]))
        ttfts = [float(row["ttft_ms"]) for row in rows if row["ttft_ms"]]
        if len(ttfts) != 4:
            raise SystemExit(f"the probe failed: see {out}")
    return ttfts[0], statistics.median(ttfts[1:])


def start_router(
    policy: str,
    b: Bench,
    run_dir: Path,
    config: Path | None = None,
    *,
    upstreams: list[str] | None = None,
    log: str = "router.log",
) -> str:
    """A fresh router for one run, ready, with every upstream healthy; its URL. `config`: the
    servepilot gateway's fleet.yaml (default: --gateway-config, else the fleet's for
    predicted_latency); `upstreams`: what it routes to (default: the replicas; other
    gateways, for a balancer in front of several)."""
    port = free_port()
    upstreams = b.replicas if upstreams is None else upstreams
    if policy == "cache_aware":
        argv = [ROUTER, "--worker-urls", *upstreams, "--policy", policy,
                "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                "--prometheus-port", str(free_port()),
                "--worker-startup-check-interval", "1"]  # fmt: skip
    else:
        argv = [SERVEPILOT, "gateway", "--policy", policy, "--port", str(port)]
        # predicted_latency predicts from the replicas' fleet.yaml (model, KV, step budget).
        fleet = b.args.out / "fleet.yaml"
        derives = policy == "predicted_latency" and fleet.exists()
        config = config or b.args.gateway_config or (fleet if derives else None)
        argv += ["-c", str(config)] if config else []
        argv += [flag for url in upstreams for flag in ("--replica", url)]
    b.procs.append(proc := spawn(argv, run_dir / log))
    url = f"http://127.0.0.1:{port}"
    # vllm-router checks its workers before it serves; our gateway is ready with one of them.
    wait_ready(url + ("/health" if policy == "cache_aware" else "/ready"), proc)
    for _ in range(0 if policy == "cache_aware" else 100):
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as answer:
            if json.loads(answer.read())["ready_replicas"] >= len(upstreams):
                break
        time.sleep(0.2)
    return url


def one_run(policy: str, seed: int, b: Bench, run_dir: Path) -> Row:
    run_dir.mkdir(parents=True)
    running = len(b.procs)
    try:
        url = start_router(policy, b, run_dir)
        before = [scrape(r) for r in b.replicas]
        flags = {**workload(b.args), "--seed": seed, "--slo": f"ttft_p99_ms={b.slo_ms:.1f}"}
        run = bench(url, b.model, flags, run_dir)
        after = [scrape(r) for r in b.replicas]
        estimate = scrape(url).get("servepilot_prefix_hit_rate_estimate")
    finally:
        while len(b.procs) > running:  # this run's router only
            stop(b.procs.pop())
    hit, share = cache_stats(before, after)
    return {
        "policy": policy, "seed": seed, "dir": str(run_dir), "goodput": run["goodput_rps"],
        "attainment": run["slo_attainment"], "ttft_p50": run["ttft_ms"]["p50"],
        "ttft_p99": run["ttft_ms"]["p99"], "failed": run["failed"], "vllm_hit": hit,
        "estimate": estimate, "r0_share": share,
    }  # fmt: skip


def cache_stats(before: list[dict[str, float]], after: list[dict[str, float]]) -> tuple[Any, Any]:
    """(prefix cache hit rate, r0's share of prompt tokens) over a run, from vLLM's counters."""
    pairs = list(zip(before, after, strict=True))
    queried = [a.get(QUERIES, math.nan) - b.get(QUERIES, math.nan) for b, a in pairs]
    hits = sum(a.get(HITS, math.nan) - b.get(HITS, math.nan) for b, a in pairs)
    total = sum(queried)
    return (None, None) if math.isnan(total) or total <= 0 else (hits / total, queried[0] / total)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def table(b: Bench) -> str:
    def med(policy: str, key: str) -> float | None:
        values = [r[key] for r in b.rows if r["policy"] == policy and r[key] is not None]
        return statistics.median(values) if values else None

    done = [p for p in POLICIES if any(r["policy"] == p for r in b.rows)]
    rr, ca = med("round_robin", "goodput"), med("cache_aware", "goodput")
    lines = [f"TTFT SLO {b.slo_ms:.0f} ms; medians over {b.args.rounds} round(s)",
             f"{'policy':<16} {'goodput/s':>9} {'SLO met':>7} {'p50 TTFT':>9} {'p99 TTFT':>9} "
             f"{'vLLM hit':>8} {'gw est':>6} {'r0 share':>8} {'x RR':>5}"]  # fmt: skip
    for p in done:
        good = med(p, "goodput") or 0.0
        lines.append(f"{p:<16} {good:>9.2f} {pct(med(p, 'attainment')):>7} "
                     f"{med(p, 'ttft_p50') or 0:>9.0f} {med(p, 'ttft_p99') or 0:>9.0f} "
                     f"{pct(med(p, 'vllm_hit')):>8} {pct(med(p, 'estimate')):>6} "
                     f"{pct(med(p, 'r0_share')):>8} "
                     f"{f'{good / rr:.2f}' if rr else '-':>5}")  # fmt: skip
    for p in ("hybrid", "prefix_affinity"):
        if (ours := med(p, "goodput")) is not None and rr and ca:
            verdict = "met" if ours >= 1.3 * rr and ours >= ca else "NOT met"
            lines.append(f"target {p}: x{ours / rr:.2f} round_robin (>= 1.3), "
                         f"x{ours / ca:.2f} cache_aware (>= 1): {verdict}")  # fmt: skip
    if failed := sum(r["failed"] for r in b.rows):
        lines.append(f"WARNING: {failed} requests failed (see each run's bench.log)")
    return "\n".join(lines)


def run_all(b: Bench) -> None:
    order = [p for p in POLICIES if p in b.args.only]
    total, warned = b.args.rounds * len(order), False
    for round_ in range(b.args.rounds):
        shift = round_ % len(order)  # rotate, so no policy always runs first or last
        for policy in order[shift:] + order[:shift]:
            if not reset_caches(b.replicas) and not warned:
                print("prefix caches not reset: the fresh seed of each run keeps it cold")
                warned = True
            started, index = time.monotonic(), len(b.rows) + 1
            row = one_run(policy, b.args.seed + index, b, b.args.out / f"{index:02d}-{policy}")
            b.rows.append(row)
            print(f"run {index}/{total} {policy}: goodput {row['goodput']:.2f} req/s, SLO met "
                  f"{pct(row['attainment'])}, p99 TTFT {row['ttft_p99'] or 0:.0f} ms, "
                  f"vLLM hit {pct(row['vllm_hit'])} ({time.monotonic() - started:.0f} s)",
                  flush=True)  # fmt: skip


def setup(b: Bench) -> None:
    """The replicas (vLLM, or stubs one core each like them), the probe and the SLO."""
    if b.args.stub:
        for core in ("0", "1"):
            proc, url = start_stub(b.args.output_tokens, b.args.stub_delay_ms, core)
            b.procs.append(proc)
            b.replicas.append(url)
        b.model = "stub-model"
    else:
        b.replicas = vllm_replicas(b)
    reset_caches(b.replicas)
    miss, hit = probe(b)
    b.probe_ms = {"miss": miss, "hit": hit}
    b.slo_ms = math.sqrt(miss * hit) if b.args.slo_ttft_ms == "auto" else float(b.args.slo_ttft_ms)
    print(f"replicas {' '.join(b.replicas)}; unloaded TTFT: miss {miss:.0f} ms, hit {hit:.0f} "
          f"ms; SLO {b.slo_ms:.0f} ms", flush=True)  # fmt: skip
    if not hit < b.slo_ms < miss:
        print("WARNING: the SLO is not between a hit's and a miss's TTFT: see --slo-ttft-ms")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--only", type=lambda s: s.split(","), default=list(POLICIES),
        help=f"comma-separated subset of {','.join(POLICIES)}")  # fmt: skip
    add("--rounds", type=int, default=1, help="rounds over the policies")
    add("--prefixes", type=int, default=16, help="distinct shared prefixes")
    add("--prefix-tokens", type=int, default=1000)
    add("--suffix-tokens", type=int, default=64, help="per-request tokens after the prefix")
    add("--output-tokens", type=int, default=16)
    add("--concurrency", type=int, default=4, help="requests in flight (closed loop)")
    add("--requests", type=int, default=160, help="measured requests per run")
    add("--warmup", type=int, help="unmeasured requests first (default 3 x prefixes)")
    add("--slo-ttft-ms", default="2000", help="per-request TTFT limit, or `auto`")
    add("--seed", type=int, default=0, help="run i uses seed + i")
    add("--kv-cache-gib", type=float, default=0.5, help="KV cache per replica")
    add("--max-model-len", type=int, default=2048)
    add("--startup-timeout", type=float, default=900.0, help="seconds for the replicas")
    add("--gateway-config", type=Path, help="fleet.yaml for the servepilot gateways")
    add("--stub", action="store_true", help="stub replicas instead of vLLM (smoke test)")
    add("--stub-delay-ms", type=float, default=5.0, help="stub pause before each token")
    add("--out", type=Path, default=ROOT / "out" / "bench-routing" / time.strftime("%Y%m%d-%H%M%S"))
    args = p.parse_args()
    if unknown := set(args.only) - set(POLICIES):
        p.error(f"--only: unknown {', '.join(sorted(unknown))}")
    args.warmup = 3 * args.prefixes if args.warmup is None else args.warmup
    return args


def main() -> None:
    b = Bench(parse_args())
    if not TOKENIZER.is_dir():
        raise SystemExit(f"{TOKENIZER} is missing: run `make model` first")
    for exe in (SERVEPILOT, ROUTER) if "cache_aware" in b.args.only else (SERVEPILOT,):
        if not Path(exe).exists():
            raise SystemExit(f"{exe} is missing: run with the venv's python (make bench-routing)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the children
    b.args.out.mkdir(parents=True, exist_ok=True)
    try:
        setup(b)
        run_all(b)
    finally:
        for proc in reversed(b.procs):
            stop(proc, 120.0)  # `up`: drain, then its replicas' own stop grace
        if b.rows:  # also after a failure: the runs that finished
            settings = {k: str(v) for k, v in vars(b.args).items()}
            summary = {"settings": settings, "slo_ttft_ms": b.slo_ms,
                       "probe_ttft_ms": b.probe_ms, "runs": b.rows}  # fmt: skip
            (b.args.out / "summary.json").write_text(json.dumps(summary, indent=2))
            print(f"{table(b)}\nresults: {b.args.out}/NN-policy/results.json, summary.json")


if __name__ == "__main__":
    main()
