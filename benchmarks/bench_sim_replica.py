"""How fast one simulated vLLM engine (servepilot.sim.ReplicaModel) runs, in CPU time.

Pushes --requests requests (default 200,000) arriving as a Poisson process at --rate per
second through one ReplicaModel, the way the fleet simulator drives a replica: requests
whose arrival time has come are added, then one step runs, and the clock moves to the step's
end (or to the next arrival when the engine is idle). The engine is Llama-3.1-8B on one
H100 with the planner's roofline cost model, max_num_seqs 256, max_num_batched_tokens 8192,
block size 16 and 24,000 KV blocks (384k tokens, what ~50 GiB of KV holds); --prefix-share
of the requests start with one of 20 shared 512-token system prompts.

The default load (62.5 requests/s, prompts of 100-1,000 tokens, 20-300 output tokens) is
the fleet target's share per replica: 5,000 QPS over 80 replicas. Printed: simulated time,
steps and preemptions; CPU and wall time (the fastest of --repeat runs by CPU time: wall
time on a shared 2-core machine swings with whatever else runs); steps/s and requests/s;
microseconds per step and per request, split into the floor of a plain decode step (256
requests decoding, nothing else) and what each request adds on top; and what that projects
for the fleet target (80 replicas x 1 hour at 5,000 QPS) on one core, replica model only
(no arrivals, routing or metrics).

    python benchmarks/bench_sim_replica.py [--requests N] [--rate R] [--prefix-share F]
    python benchmarks/bench_sim_replica.py --profile     # cProfile's top functions too
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from servepilot.plan.costmodel import roofline_cost_model  # noqa: E402
from servepilot.plan.dtypes import KvDtype, WeightDtype  # noqa: E402
from servepilot.plan.hardware import get_accelerator  # noqa: E402
from servepilot.plan.kv import kv_cache_shape  # noqa: E402
from servepilot.plan.presets import load_preset  # noqa: E402
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest  # noqa: E402

FLEET_REQUESTS = 5_000 * 3_600


def build_replica(max_model_len: int = 8192, num_blocks: int = 24_000) -> ReplicaModel:
    spec = load_preset("llama-3.1-8b")
    kv = kv_cache_shape(spec, kv_dtype=KvDtype.AUTO, compute_dtype=WeightDtype.BF16)
    cost = roofline_cost_model(
        spec,
        get_accelerator("h100"),
        weights_dtype=WeightDtype.BF16,
        kv_bytes_per_token=kv.bytes_per_token,
    )
    config = SchedulerConfig(
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=max_model_len,
        block_size=16,
        num_blocks=num_blocks,
    )
    return ReplicaModel(config, cost)


def workload(count: int, rate: float, prefix_share: float, seed: int) -> list[SimRequest]:
    rng = random.Random(seed)
    requests = []
    now = 0.0
    for request_id in range(count):
        now += rng.expovariate(rate)
        shared = rng.random() < prefix_share
        prompt = rng.randint(100, 1000)
        requests.append(
            SimRequest(
                request_id,
                prompt_tokens=max(prompt, 513) if shared else prompt,
                output_tokens=rng.randint(20, 300),
                arrival_s=now,
                prefix_group=rng.randrange(20) if shared else None,
                prefix_tokens=512 if shared else 0,
            )
        )
    return requests


def drive(replica: ReplicaModel, requests: list[SimRequest]) -> tuple[float, int]:
    """Run every request to completion; returns (simulated seconds, finished)."""
    now = 0.0
    index, total = 0, len(requests)
    finished = 0
    step = replica.step
    add = replica.add
    while True:
        while index < total and requests[index].arrival_s <= now:
            add(requests[index])
            index += 1
        result = step(now)
        if result is None:
            if index == total:
                return now, finished
            now = requests[index].arrival_s
            continue
        finished += len(result.finished)
        now = result.start_s + result.duration_s


def decode_step_cost(running: int, steps: int) -> float:
    """Seconds of CPU per step with `running` requests decoding and nothing else happening:
    the floor every step pays."""
    length = steps + 200
    replica = build_replica(max_model_len=length, num_blocks=running * length // 16 + 10)
    for request_id in range(running):
        replica.add(SimRequest(request_id, 100, steps + 10, 0.0))
    now = 0.0
    for _ in range(5):  # prefill them all
        result = replica.step(now)
        assert result is not None
        now = result.start_s + result.duration_s
    step = replica.step
    started = time.process_time()
    for _ in range(steps):
        result = step(now)
        assert result is not None
        now = result.start_s + result.duration_s
    return (time.process_time() - started) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=5_000 / 80, help="requests per second")
    parser.add_argument("--prefix-share", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="report the fastest of N runs")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    best: tuple[float, float, float, ReplicaModel] | None = None
    profiler = cProfile.Profile() if args.profile else None
    for _ in range(1 if args.profile else args.repeat):
        requests = workload(args.requests, args.rate, args.prefix_share, args.seed)
        replica = build_replica()
        started, cpu_started = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        simulated_s, finished = drive(replica, requests)
        if profiler is not None:
            profiler.disable()
        wall_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        assert finished == len(requests), (finished, len(requests))
        if best is None or cpu_s < best[1]:
            best = (wall_s, cpu_s, simulated_s, replica)
    assert best is not None
    wall_s, cpu_s, simulated_s, replica = best

    steps = replica.steps
    print(f"requests      {len(requests):,} finished, {args.rate:g}/s offered")
    print(
        f"simulated     {simulated_s:,.0f} s, {steps:,} steps, "
        f"{replica.num_preemptions:,} preemptions, prefix hit rate {replica.prefix_hit_rate:.2f}"
    )
    print(
        f"time          {cpu_s:.2f} s CPU, {wall_s:.2f} s wall "
        f"({simulated_s / wall_s:,.0f}x real time); the fastest of {args.repeat} by CPU time"
    )
    print(f"speed         {steps / cpu_s:,.0f} steps/s, {len(requests) / cpu_s:,.0f} requests/s")
    print(
        f"cost          {cpu_s / steps * 1e6:.2f} us/step all-in, "
        f"{cpu_s / len(requests) * 1e6:.2f} us/request all-in"
    )
    floor = min(decode_step_cost(256, 50_000) for _ in range(args.repeat))
    per_request = (cpu_s - steps * floor) / len(requests)
    print(
        f"split         {floor * 1e6:.2f} us per plain decode step (256 running), "
        f"{per_request * 1e6:.2f} us per request on top (add, admit, first token, finish)"
    )
    fleet_steps = FLEET_REQUESTS * steps / len(requests)
    projected = FLEET_REQUESTS * cpu_s / len(requests)
    print(
        f"fleet target  80 replicas x 1 h x 5,000 QPS = {FLEET_REQUESTS / 1e6:.0f}M requests, "
        f"~{fleet_steps / 1e6:.1f}M steps at this workload: {projected:.0f} s of CPU "
        "(replica model alone)"
    )
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
