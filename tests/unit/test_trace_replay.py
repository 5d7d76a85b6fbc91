"""A trace replays at its timestamps, all of it, unless told otherwise (issue 37): the level
plan bench and sim share, and the simulated fleet it drives."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from servepilot.core.config import GatewayConfig
from servepilot.core.results import LoadMode
from servepilot.core.slo import Slo
from servepilot.load.flags import LoadFlags, WorkloadFlags
from servepilot.load.levels import pool_size
from servepilot.plan.costmodel import CostModel
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.session import level_jobs, level_offsets
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec

LINES = 300
COST = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 0.0, source="test")


def _trace(tmp_path: Path) -> tuple[Path, list[float]]:
    """300 lines, irregular gaps of 0-0.5 s: about 4 requests a second for 75 s (the default
    count at that rate, max(100, 30 x rate), is 120: the replay used to stop there)."""
    rng = random.Random(3)
    stamps, t = [], 100.0  # any origin: replay is relative to the first line
    for _ in range(LINES):
        stamps.append(round(t, 3))
        t += rng.uniform(0.0, 0.5)
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(
        f'{{"timestamp": {s}, "input_tokens": 50, "output_tokens": 4}}\n' for s in stamps
    ))  # fmt: skip
    return path, [s - stamps[0] for s in stamps]


def _flags(trace: Path, **given: object) -> tuple[LoadFlags, WorkloadFlags]:
    load = LoadFlags(concurrency=None, rate=None, sweep=False, requests=None, duration=None,
                     warmup=0, arrival="poisson", burstiness=1.0)  # fmt: skip
    load = LoadFlags(**({n: getattr(load, n) for n in LoadFlags.__dataclass_fields__} | given))
    workload = WorkloadFlags(
        workload="trace", input_tokens=1, output_tokens=1, seed=0, long_fraction=0.0,
        long_input_tokens=None, num_prefixes=1, prefix_tokens=None, turns=1,
        active_sessions=1, trace=trace, priority_mix=None, sessions=None,
    )  # fmt: skip
    return load, workload


class _Clock:
    """Routes to the first replica and notes when (the simulated clock) each request came."""

    name = "clock"
    uses_prefix = False

    def __init__(self) -> None:
        self.sim: FleetSim | None = None
        self.at_s: list[float] = []

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        assert self.sim is not None
        self.at_s.append(self.sim.now_s)
        return candidates[0].replica_id

    def forget(self, replica_id: str) -> None:
        return None

    def stats(self) -> Mapping[str, float]:
        return {}


def _replay(load: LoadFlags, workload: WorkloadFlags) -> tuple[int, list[float]]:
    """Requests sent and the times they reached the gateway, on a fleet with no network."""
    levels = load.levels(workload.spec())
    (level,) = levels.loads
    plan = levels.plan(level, seed=0)
    jobs = level_jobs(levels.workload, pool_size(plan), 0)
    spec = FleetSpec(
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                  max_model_len=2048, block_size=16, num_blocks=4000),
        cost=COST, replicas=1, capacity=64, gateway=GatewayConfig(),
        network=NetworkConfig(cross_node=Delay()),
    )  # fmt: skip
    clock = _Clock()
    sim = FleetSim(spec, policy=clock)
    clock.sim = sim
    run = sim.run(plan, jobs, Slo(), offsets=level_offsets(plan, jobs)).run
    return run.completed + run.failed, clock.at_s


def test_a_trace_with_no_load_flags_replays_every_line_at_its_timestamp(tmp_path: Path) -> None:
    trace, offsets = _trace(tmp_path)
    load, workload = _flags(trace)
    levels = load.levels(workload.spec())
    assert levels.loads[0].mode is LoadMode.RATE
    sent, at_s = _replay(load, workload)
    assert sent == LINES
    assert len(at_s) == LINES
    assert max(abs(a - b) for a, b in zip(at_s, offsets, strict=True)) < 1e-9


def test_a_rate_names_the_level_and_still_replays_the_whole_trace(tmp_path: Path) -> None:
    trace, offsets = _trace(tmp_path)
    sent, at_s = _replay(*_flags(trace, rate="1"))
    assert sent == LINES and at_s == offsets


def test_requests_and_warmup_cut_the_replay_as_told(tmp_path: Path) -> None:
    trace, offsets = _trace(tmp_path)
    sent, at_s = _replay(*_flags(trace, requests=50))
    assert sent == 50 and at_s == offsets[:50]
    # Warm-up lines are sent first and left out of the results: still every line once.
    load, workload = _flags(trace, warmup=20)
    assert load.levels(workload.spec()).requests == LINES - 20
    sent, at_s = _replay(load, workload)
    assert sent == LINES - 20 and at_s == offsets
