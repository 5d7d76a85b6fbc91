"""Routing policies under KV pressure with the multi-turn agentic workload, side by side.

`servepilot up` starts two vLLM-CPU replicas (one core each: what this 2-core machine holds)
with prefix caching and a small KV cache. Each run puts a fresh `servepilot gateway --policy P`
(or `vllm-router --policy cache_aware`) in front of the replicas' own URLs and `servepilot
bench --workload agentic` sends the same sessions through it (same seed; the replicas'
prefix caches emptied before each run): sessions that share a few system prompts, whose
context grows by the real answers turn after turn, tool turns after short waits, user turns
after longer ones, and sessions that come back after a long gap.

Sizing: vLLM-CPU keeps 23,040 bytes of KV per token of SmolLM2-135M in bfloat16 (46,080 in
float32, on a CPU without native bfloat16: there the same --kv-cache-gib holds half), so
--kv-cache-gib 0.15 is ~7,000 tokens a replica. 10 live sessions of 8 turns reach ~1,700
tokens each by their last turn (4 shared system prompts of 512, user messages of 96, tool
results of 160, answers of 16): ~12k tokens of context live at a time. Behind round_robin
every replica sees every session and holds a part of each; a router that keeps each session
on one replica needs about half of it per replica, which about fits.

The same policies then run in `servepilot sim` (the fleet.yaml of the measured replicas) at
--sim-replicas (default 16 and 64) with as many sessions and turns per replica, to check
that the simulator orders the policies as the measurement does; step times from a quick
`servepilot calibrate` of the first replica after the measured runs, or --sim-profile.

The table: TTFT p50 (ms), throughput (requests/s and output tokens/s), goodput (requests/s
within the TTFT SLO), the replicas' prefix cache hit rate (vLLM's counters, warm-up included),
the first replica's share of prompt tokens, and the router's CPU per request (user and system
time of its process over the run, less what it spends idle at the same time, measured for 10 s
after the run, divided by the requests it answered; that idle CPU is shown too, as a share
of a core: where it is much larger than the requests' own, the difference is noisy).
Policies are named as
`servepilot gateway --policy` takes them, so new ones join with --policies; P+exact runs P
on the exact prefix index (the gateway tokenises each prompt and follows the replicas' KV
events, asking each replica where it publishes). --rounds N rotates the order each round; the
table shows medians.

    python benchmarks/bench_kv_routing.py [--policies round_robin,prefix_affinity] [--rounds 1]
    python benchmarks/bench_kv_routing.py --policies prefix_affinity,prefix_affinity+exact,\
        predicted_latency,predicted_latency+exact --rounds 2
    python benchmarks/bench_kv_routing.py --policies round_robin,prefix_affinity,cache_aware \
        --router PATH/vllm-router     # make bench-kv-routing installs it in the venv

With --engine sim the replicas are simulated (`servepilot up --engine sim`): they answer as
vLLM does at a fixed step time, taking little CPU, so the gateway's own CPU a request stands
out of the noise that two vLLM-CPU replicas on this machine's two cores make of it. They
publish KV events as vLLM does, but only for the blocks of the prefix chains their model can
reuse (fewer and smaller batches than vLLM's, which also publishes every prompt's and
answer's other full blocks): P+exact keys every prompt (the chat template, token ids, block
hashes) and follows them, so the run measures keying and a lighter feed than vLLM's (the feed
alone at vLLM's rate is benchmarks/kv_feed_cost.py's).

    python benchmarks/bench_kv_routing.py --engine sim --policies prefix_affinity,\
        prefix_affinity+exact --rounds 3 --sim-replicas ""
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import bench_routing
from bench_client import TOKENIZER
from bench_routing import (
    HITS,
    SERVEPILOT,
    Bench,
    bench,
    cache_stats,
    pct,
    reset_caches,
    scrape,
    start_router,
    stop,
    vllm_replicas,
)
from kv_routing_sim import EXACT, KvBench, calibrate, sim_table, simulate, workload
from router_cost import (
    answered,
    cpu_s,
    event_batches,
    idle_cpu,
    predicted_vs_reused,
    routing_stats,
)

ROOT = Path(__file__).resolve().parent.parent
Row = dict[str, Any]
BASELINES = ("round_robin", "prefix_affinity", "cache_aware")
"""What the issue's targets compare a new policy with: today's policies and vllm-router's."""
SIM_ENGINE = (
    "engine:\n  kind: sim\n  enable_prefix_caching: true\n  sim_step_ms: {step_ms}\n"
    f"  sim_tokenizer: {TOKENIZER}\n"
    '  env:\n    VLLM_SERVER_DEV_MODE: "1"\n'
)
"""--engine sim's replicas: vLLM's API timed by a fixed step, prompts counted by the embedded
model's tokenizer, POST /reset_prefix_cache served (as vLLM's dev mode) to empty them between
runs."""


def one_run(policy: str, b: Bench, run_dir: Path) -> Row:
    run_dir.mkdir(parents=True)
    running = len(b.procs)
    name, exact = policy.removesuffix(EXACT), policy.endswith(EXACT)
    gateways = 1 if name == "cache_aware" else b.args.gateways
    try:
        config = exact_config(b) if exact else None
        urls = [start_router(name, b, run_dir, config, log=f"router{i or ''}.log")
                for i in range(gateways)]  # fmt: skip
        routers = [proc.pid for proc in b.procs[-gateways:]]
        if exact:
            for url in urls:
                wait_exact(url, len(b.replicas))
        # Several gateways share the traffic as a load balancer spreads it over gateway pods:
        # request by request, so a session's turns land on any of them.
        front = urls[0] if gateways == 1 else start_router(
            "round_robin", b, run_dir, upstreams=urls, log="balancer.log")  # fmt: skip
        stats_before = [routing_stats(url) for url in urls]
        batches_before = sum(event_batches(url) for url in urls)
        before = [scrape(r) for r in b.replicas]
        cpu_before, sent_before = cpu_s(routers), sum(map(answered, urls))
        started = time.monotonic()
        run = bench(front, b.model, workload(b.args), run_dir)
        run_cpu_s, run_s = cpu_s(routers) - cpu_before, time.monotonic() - started
        requests = sum(map(answered, urls)) - sent_before
        # Idle after the run, not before it: what a gateway does once at its start (the exact
        # index's first tokenisations, its first probes of the replicas) is not idle, and
        # measured before, it put the exact router's CPU a request below 0 on light replicas.
        idle_s_per_s = idle_cpu(routers)
        busy_s = run_cpu_s - idle_s_per_s * run_s
        after = [scrape(r) for r in b.replicas]
        stats_after = [routing_stats(url) for url in urls]
        batches = sum(event_batches(url) for url in urls) - batches_before
    finally:
        while len(b.procs) > running:  # this run's routers only
            stop(b.procs.pop())
    hit, share = cache_stats(before, after)
    reused = sum(a.get(HITS, 0.0) - b.get(HITS, 0.0) for b, a in zip(before, after, strict=True))
    predicted = predicted_vs_reused(name, summed(stats_before), summed(stats_after), reused,
                                    requests)  # fmt: skip
    return {
        **predicted, "policy": policy, "dir": str(run_dir), "ttft_p50": run["ttft_ms"]["p50"],
        "router_cpu_ms": busy_s * 1000 / requests if requests else None,
        "router_idle_pct": idle_s_per_s * 100,
        "event_batches_per_req": batches / requests if requests else None,
        "ttft_p50_returning": (run.get("ttft_ms_returning") or {}).get("p50"),
        "rps": run["request_throughput"], "out_tps": run["output_throughput"],
        "goodput": run["goodput_rps"], "attainment": run["slo_attainment"],
        "failed": run["failed"], "vllm_hit": hit, "r0_share": share, "gateways": gateways,
    }  # fmt: skip


def summed(stats: list[dict[str, float]]) -> dict[str, float]:
    """Several gateways' routing stats, added up by stat."""
    total: dict[str, float] = {}
    for one in stats:
        for key, value in one.items():
            total[key] = total.get(key, 0.0) + value
    return total


def exact_config(b: Bench) -> Path:
    """The fleet's fleet.yaml with the gateway's exact prefix index on: the embedded model's
    tokenizer and vLLM-CPU's block size (the replicas say where they publish)."""
    path = b.args.out / "fleet-exact.yaml"
    if not path.exists():
        fleet = (b.args.out / "fleet.yaml").read_text()
        index = f"gateway:\n  kv_index:\n    tokenizer: {TOKENIZER}\n    block_size: 128\n"
        path.write_text(fleet + index)
    return path


def wait_exact(url: str, replicas: int, timeout_s: float = 60.0) -> None:
    """Until the gateway follows every replica's KV events (it asks each where it publishes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/admin/replicas", timeout=5) as answer:
            listed = json.loads(answer.read())
        if sum(r.get("prefix_index") == "exact" for r in listed) >= replicas:
            return
        time.sleep(0.2)
    raise SystemExit(f"the gateway at {url} does not follow the replicas' KV events: {listed}")


def table(b: Bench, policies: list[str]) -> str:
    def med(policy: str, key: str) -> float | None:
        values = [r[key] for r in b.rows if r["policy"] == policy and r[key] is not None]
        return statistics.median(values) if values else None

    lines = [
        f"TTFT SLO {b.args.slo_ttft_ms:.0f} ms; medians over {b.args.rounds} round(s)",
        f"{'policy':<18} {'TTFT p50':>8} {'p50 ret':>8} {'req/s':>6} {'out tok/s':>9} "
        f"{'goodput/s':>9} {'SLO met':>7} {'vLLM hit':>8} {'r0 share':>8} {'gw CPU/req':>10} "
        f"{'gw idle':>7}",
    ]
    for p in (p for p in policies if any(r["policy"] == p for r in b.rows)):
        lines.append(
            f"{p:<18} {med(p, 'ttft_p50') or 0:>8.0f} {med(p, 'ttft_p50_returning') or 0:>8.0f} "
            f"{med(p, 'rps') or 0:>6.2f} {med(p, 'out_tps') or 0:>9.1f} "
            f"{med(p, 'goodput') or 0:>9.2f} {pct(med(p, 'attainment')):>7} "
            f"{pct(med(p, 'vllm_hit')):>8} {pct(med(p, 'r0_share')):>8} "
            f"{med(p, 'router_cpu_ms') or 0:>7.2f} ms {med(p, 'router_idle_pct') or 0:>6.1f}%"
        )
    # The targets, for each policy that is not a baseline.
    rr, today = med("round_robin", "ttft_p50"), med("prefix_affinity", "ttft_p50")
    router = med("cache_aware", "goodput")
    for p in (p for p in policies if p not in BASELINES):
        if (ours := med(p, "ttft_p50")) is not None and rr and today:
            lines.append(f"target {p}: TTFT p50 {ours / rr - 1:+.0%} vs round_robin (<= -40%), "
                         f"{ours / today - 1:+.0%} vs prefix_affinity (<= -15%)")  # fmt: skip
        if (good := med(p, "goodput")) is not None and router:
            lines.append(f"target {p}: goodput x{good / router:.2f} vllm-router's cache_aware "
                         "(>= 1)")  # fmt: skip
    simulated = b.args.engine == "sim"  # its replicas' events: fewer than vLLM's
    for p in (p for p in policies if p.endswith(EXACT)):
        runs = [r for r in b.rows if r["policy"] == p and r.get("reused_tokens")]
        for r in runs:
            off = r["predicted_tokens"] / r["reused_tokens"] - 1
            lines.append(f"target {p}: cached tokens the index predicted "
                         f"{r['predicted_tokens']:,.0f} vs vLLM reused {r['reused_tokens']:,.0f} "
                         f"({off:+.1%}: {'met' if abs(off) <= 0.05 else 'MISSED'}, within 5%), "
                         f"{pct(r['on_index'])} of requests routed on the index")  # fmt: skip
        ours, guessed = med(p, "router_cpu_ms"), med(p.removesuffix(EXACT), "router_cpu_ms")
        if ours and guessed:
            what = "simulated replicas (fewer events than vLLM)" if simulated else "the target"
            lines.append(f"target {p}: gateway CPU per request x{ours / guessed:.2f} the "
                         f"guessed index's (<= 1.1), {what}")  # fmt: skip
        if (batches := med(p, "event_batches_per_req")) is not None:
            lines.append(f"{p}: {batches:.2f} KV event batches read per request")
    if failed := sum(r["failed"] for r in b.rows):
        lines.append(f"WARNING: {failed} requests failed (see each run's bench.log)")
    return "\n".join(lines)


def run_all(b: Bench, policies: list[str]) -> None:
    total = b.args.rounds * len(policies)
    for round_ in range(b.args.rounds):
        shift = round_ % len(policies)  # rotate, so no policy always runs first or last
        for policy in policies[shift:] + policies[:shift]:
            if not reset_caches(b.replicas):
                print("WARNING: prefix caches not reset: this run may start warm")
            started, index = time.monotonic(), len(b.rows) + 1
            row = one_run(policy, b, b.args.out / f"{index:02d}-{policy}")
            b.rows.append(row)
            print(f"run {index}/{total} {policy}: TTFT p50 {row['ttft_p50'] or 0:.0f} ms, "
                  f"{row['rps']:.2f} req/s, goodput {row['goodput']:.2f} req/s, vLLM hit "
                  f"{pct(row['vllm_hit'])} ({time.monotonic() - started:.0f} s)",
                  flush=True)  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = p.add_argument
    add("--policies", type=lambda s: s.split(","), default=["round_robin", "prefix_affinity"],
        help="comma-separated `servepilot gateway --policy` names, P+exact for P on the exact "
        "prefix index (the replicas' KV events); cache_aware is vllm-router's")  # fmt: skip
    add("--rounds", type=int, default=1, help="rounds over the policies")
    add("--sessions", type=int, default=10, help="sessions live at a time (closed loop)")
    add("--turns", type=int, default=8, help="turns per session")
    add("--requests", type=int, default=120, help="measured turns per run")
    add("--warmup", type=int, default=10, help="unmeasured turns first")
    add("--input-tokens", type=int, default=96, help="tokens of a user message")
    add("--output-tokens", type=int, default=16, help="tokens of an answer")
    add("--system-prompts", type=int, default=4)
    add("--system-prompt-tokens", type=int, default=512)
    add("--tool-tokens", type=int, default=160, help="tokens of a tool's result")
    add("--think-time", type=float, default=1.0, help="mean s before a user's turn")
    add("--tool-time", type=float, default=0.3, help="mean s before a tool's turn")
    add("--return-fraction", type=float, default=0.25)
    add("--return-gap", type=float, default=20.0, help="s a returning session stays away")
    add("--slo-ttft-ms", type=float, default=2000.0, help="per-request TTFT limit (goodput)")
    add("--seed", type=int, default=0, help="the sessions' seed (the same in every run)")
    add("--kv-cache-gib", type=float, default=0.15, help="KV cache per replica")
    add("--max-model-len", type=int, default=4096)
    add("--startup-timeout", type=float, default=900.0, help="seconds for the replicas")
    add("--gateway-config", type=Path, help="fleet.yaml for the servepilot gateways")
    add("--gateways", type=int, default=1,
        help="servepilot gateways per run, each with its own router state (the exact index "
        "follows the same KV events in each), behind a round-robin gateway that spreads the "
        "requests over them as a load balancer spreads them over gateway pods; their CPU is "
        "added up (the balancer's is left out)")  # fmt: skip
    add("--sim-replicas", type=lambda s: [int(v) for v in s.split(",") if v], default=[16, 64],
        help="replica counts to simulate the policies at, after the measured runs (empty: "
        "none)")  # fmt: skip
    add("--sim-profile", type=Path, help="step-time profile for the simulator (default: "
        "calibrate the first replica after the measured runs, quickly)")  # fmt: skip
    add("--engine", choices=("vllm", "sim"), default="vllm",
        help="sim: simulated replicas (`up --engine sim`, steps of --sim-step-ms, the embedded "
        "model's tokenizer), whose light CPU leaves the gateway's own to measure: they "
        "publish no KV events, so P+exact keys every prompt and follows nothing")  # fmt: skip
    add("--sim-step-ms", type=float, default=20.0, help="with --engine sim: each step's time")
    add("--router", type=Path, default=Path(bench_routing.ROUTER),
        help="the vllm-router executable (for cache_aware)")  # fmt: skip
    add("--out", type=Path,
        default=ROOT / "out" / "bench-kv-routing" / time.strftime("%Y%m%d-%H%M%S"))  # fmt: skip
    return p.parse_args()


def main() -> None:
    args = parse_args()
    b = KvBench(args)
    if not TOKENIZER.is_dir():
        raise SystemExit(f"{TOKENIZER} is missing: run `make model` first")
    bench_routing.ROUTER = str(args.router)  # what its start_router runs for cache_aware
    for exe in (SERVEPILOT, args.router) if "cache_aware" in args.policies else (SERVEPILOT,):
        if not Path(exe).exists():
            raise SystemExit(
                f"{exe} is missing: run with the venv's python (make bench-kv-routing)"
            )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the children
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        sim = SIM_ENGINE.format(step_ms=args.sim_step_ms) if args.engine == "sim" else None
        b.replicas = vllm_replicas(b, sim)
        print(f"replicas {' '.join(b.replicas)}", flush=True)
        run_all(b, args.policies)
        if args.sim_replicas and args.engine == "vllm":
            simulate(b, args.policies, args.sim_profile or calibrate(b))
    finally:
        for proc in reversed(b.procs):
            stop(proc, 120.0)  # `up`: drain, then its replicas' own stop grace
        if b.rows:  # also after a failure: the runs that finished
            settings = {k: str(v) for k, v in vars(args).items()}
            summary = {"settings": settings, "runs": b.rows, "simulated": b.sims}
            (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
            print(f"{table(b, args.policies)}\n{sim_table(b, args.policies)}\n"
                  f"results: {args.out}/NN-policy/, sim-N-policy/, summary.json")  # fmt: skip


if __name__ == "__main__":
    main()
