"""How fast the fleet simulator runs: simulated requests per second of CPU and wall time.

The target (issue 6): one hour of an 80-replica fleet at 5,000 QPS (18 million requests) in
under 60 s. This runs the whole simulator (servepilot.sim.FleetSim: open-loop Poisson
arrivals, client and network hops, the gateway's admission controller and routing policy,
80 ReplicaModels, streaming metrics) on 80 replicas of Llama-3.1-8B on H100s (the planner's
roofline cost model and KV cache, vLLM's H100 defaults: max_num_seqs 1024, 8,192 batched
tokens, async scheduling), 8 replicas per node with the seed's cross-node hops, at --rate
requests/s for --duration simulated seconds, and prints the simulated requests per second
of wall and CPU time, and what that makes of the full hour.

By default it simulates 60 s (300,000 requests) and extrapolates to 3,600 s, saying so; the
work per request does not grow with the length of the run (O(1) per request and per step), so
the extrapolation is linear. --duration 3600 runs the full hour.

Requests: prompts of 100-1,000 tokens and 20-300 output tokens (uniform, seeded), 20% of them
starting with one of 20 shared 512-token system prompts, as benchmarks/bench_sim_replica.py.

    python benchmarks/bench_sim_speed.py [--duration 60] [--rate 5000] [--replicas 80]
    python benchmarks/bench_sim_speed.py --policy round_robin     # an O(replicas) policy
    python benchmarks/bench_sim_speed.py --profile                # cProfile's top functions
    python benchmarks/bench_sim_speed.py --policy prefix_affinity --kv-events  # exact index

It runs the compiled simulator when `make sim-fast` has built it for the current sources
(the first line says which); SERVEPILOT_SIM_PURE=1 measures the pure-Python one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from servepilot.core import accel  # noqa: E402
from servepilot.core.config import (  # noqa: E402
    GatewayConfig,
    PolicyName,
    parse_config,
)
from servepilot.core.results import Load, LoadMode  # noqa: E402
from servepilot.core.slo import Slo  # noqa: E402
from servepilot.engine.cpu import cpu_flags  # noqa: E402
from servepilot.load.arrivals import Arrival, iter_arrival_offsets_s  # noqa: E402
from servepilot.load.loadplan import LoadPlan  # noqa: E402
from servepilot.load.slots import Slot  # noqa: E402
from servepilot.routing import make_policy  # noqa: E402
from servepilot.sim.engine.replica import ReplicaModel  # noqa: E402
from servepilot.sim.fleet.gateway import SimGateway  # noqa: E402
from servepilot.sim.fleet.members import FleetReplica, FleetRequest  # noqa: E402
from servepilot.sim.fleet.network import HopSampler, NetworkConfig  # noqa: E402
from servepilot.sim.fleet.requests import RequestFactory  # noqa: E402
from servepilot.sim.fleet.setup import replica_setup  # noqa: E402
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec, LevelOutcome  # noqa: E402
from servepilot.sim.fleet.traffic import Job, JobTable  # noqa: E402

TARGET_S = 3600.0
TARGET_WALL_S = 60.0


def fleet(replicas: int, policy: str, seed: int, kv_events: bool = False) -> FleetSpec:
    config = parse_config(
        {
            "model": {"source": "llama-3.1-8b"},
            "hardware": {"device": "gpu", "accelerator": "h100", "count": 8},
            "engine": {"max_model_len": 4096, "max_num_seqs": 512},
            "replicas": {"count": replicas},
        },
        origin="bench_sim_speed",
    )
    setup = replica_setup(config, None, cpu_flags())
    return FleetSpec(
        scheduler=setup.scheduler,
        cost=setup.cost,
        replicas=replicas,
        capacity=setup.capacity,
        gateway=GatewayConfig(policy=PolicyName(policy)),
        network=NetworkConfig(replicas_per_node=8),
        kv_events=kv_events,
        seed=seed,
    )


def jobs(count: int, seed: int) -> JobTable:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        shared = rng.random() < 0.2
        prompt = rng.randint(100, 1000)
        out.append(
            Job(
                prompt_tokens=max(prompt, 513) if shared else prompt,
                output_tokens=rng.randint(20, 300),
                prefix_group=rng.randrange(20) if shared else None,
                prefix_tokens=512 if shared else 0,
            )
        )
    return JobTable(out)


class _Sink:
    """A gateway outlet that only hands the replica back: nothing downstream is simulated."""

    def send(self, request: FleetRequest, replica: FleetReplica, now_s: float) -> None:
        request.replica = replica

    def refuse(self, request: FleetRequest, status: str, now_s: float) -> None:
        raise AssertionError(f"refused ({status}): the floor run must not saturate")

    def queued(self, request: FleetRequest, now_s: float, cold_until_s: float | None) -> None:
        raise AssertionError("queued: the floor run must not saturate")


def gateway_floor(args: argparse.Namespace, requests: int = 1_000_000) -> float:
    """CPU seconds per request of the simulated gateway alone: the request's view
    (RequestFactory), `SimGateway.arrive` (admission snapshot, the AdmissionController, the
    routing policy's choice, the rate meter) and `release` (slot freed, the hard limit's
    sample), on the same 80 replicas, with --rate x 2 s of requests kept in flight and
    nothing else: no replica model, no network, no event heap, no statistics. What the
    issue's "policy objects imported as they are" costs before any engine is simulated."""
    spec = fleet(args.replicas, args.policy, args.seed)
    gw = spec.gateway
    policy = make_policy(gw.policy, gw.routing, seed=spec.seed)
    gateway = SimGateway(gw, policy, _Sink(), random.Random(args.seed))
    rng = random.Random(args.seed)
    for index in range(spec.replicas):
        hops = HopSampler(spec.network.replica_delay(index), rng)
        model = ReplicaModel(spec.scheduler, spec.cost)
        gateway.add(FleetReplica(index, model, spec.capacity, hops, ready=True))
    table = jobs(20_000, args.seed)
    factory = RequestFactory(table, gw.routing, spec.model_name, policy.uses_prefix)
    gap_s = 1.0 / args.rate
    in_flight: deque[FleetRequest] = deque()
    keep = int(args.rate * 2.0)
    cpu0 = time.process_time()
    for i in range(requests):
        now_s = i * gap_s
        request = factory.make(Slot(i % len(table), now_s, False), now_s)
        gateway.arrive(request, now_s)
        in_flight.append(request)
        if len(in_flight) > keep:
            gateway.release(in_flight.popleft(), now_s, 0.2)
    return (time.process_time() - cpu0) / requests


def run(args: argparse.Namespace) -> LevelOutcome:
    spec = fleet(args.replicas, args.policy, args.seed, args.kv_events)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=args.rate), duration_s=args.duration)
    offsets = iter_arrival_offsets_s(args.rate, Arrival.POISSON, seed=args.seed)
    return FleetSim(spec).run(plan, jobs(20_000, args.seed), Slo(), offsets=offsets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="simulated seconds")
    parser.add_argument("--rate", type=float, default=5000.0, help="requests per second")
    parser.add_argument("--replicas", type=int, default=80)
    parser.add_argument("--policy", default="least_load", choices=[p.value for p in PolicyName])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument(
        "--kv-events",
        action="store_true",
        help="the replicas' KV events keep the exact index (read by prefix-aware policies)",
    )
    parser.add_argument(
        "--skip-floor", action="store_true", help="leave out the gateway-alone floor run"
    )
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    outcome = run(args)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    report(args, outcome, wall, cpu)
    if not args.skip_floor:
        floor_s = gateway_floor(args)
        print(
            f"the gateway alone (request view, admission, routing, release; 1,000,000 requests, "
            f"nothing downstream): {floor_s * 1e6:.2f} us CPU per request -> "
            f"{floor_s * TARGET_S * args.rate:,.0f} s of the hour's {TARGET_WALL_S:.0f} s"
        )
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def report(args: argparse.Namespace, outcome: LevelOutcome, wall: float, cpu: float) -> None:
    run, stats = outcome.run, outcome.stats
    requests = run.completed + run.failed
    print(
        f"fleet: {args.replicas} x llama-3.1-8b on h100 (roofline), policy {args.policy}, "
        f"{args.rate:g} req/s Poisson for {args.duration:g} s simulated; "
        f"simulator: {accel.status(accel.SIM)}"
    )
    print(
        f"simulated: {requests:,} requests ({run.completed:,} ok, {run.failed:,} failed), "
        f"{stats.steps:,} steps, {stats.preemptions:,} preemptions, "
        f"TTFT p99 {run.ttft_ms.p99:,.0f} ms, E2E p99 {run.e2e_ms.p99:,.0f} ms"
    )
    print(
        f"time: {wall:.1f} s wall, {cpu:.1f} s CPU (setup included) -> "
        f"{requests / wall:,.0f} simulated requests/s wall, {requests / cpu:,.0f} per CPU s; "
        f"{cpu / requests * 1e6:.1f} us CPU per request, "
        f"{cpu / max(1, stats.steps) * 1e6:.1f} us CPU per step"
    )
    full = TARGET_S * args.rate
    projected = full / (requests / wall) if requests else float("inf")
    how = "measured" if args.duration >= TARGET_S else "extrapolated linearly from this run"
    print(
        f"one hour at {args.rate:g} QPS ({full:,.0f} requests): {projected:,.0f} s wall "
        f"({how}); target {TARGET_WALL_S:.0f} s"
    )


if __name__ == "__main__":
    main()
