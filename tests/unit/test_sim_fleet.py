"""The fleet simulator (servepilot/sim/fleet/simulator.py and friends): answers known in advance.

Each test builds a small fleet with a linear cost model whose step times can be written down,
so latencies come out as sums of hops and step times, queueing as queueing theory says, and
routing as the gateway's own policy objects decide.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.config import AdmissionConfig, GatewayConfig, PolicyName
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import Slot
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from servepilot.plan.costmodel import CostModel
from servepilot.routing import LeastLoad, PrefixAffinity, RoundRobin, make_policy
from servepilot.routing.admission import (
    SHARED_TENANT,
    AdmissionController,
    AdmissionQueue,
    free_slots,
)
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason
from servepilot.scaling.target_utilisation import TargetUtilisation
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest
from servepilot.sim.fleet.collect import WeightedHistogram
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.requests import RequestFactory
from servepilot.sim.fleet.session import level_jobs
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec, LevelOutcome
from servepilot.sim.fleet.traffic import Job, JobTable

COST = CostModel(
    base_s=0.01,
    per_prefill_token_s=1e-4,
    per_prefill_seq_s=1e-3,
    per_decode_seq_s=2e-3,
    per_context_token_s=1e-6,
    per_prefill_pair_s=0.0,
    source="test",
)
NO_NETWORK = NetworkConfig(cross_node=Delay())


def _scheduler(**changes: Any) -> SchedulerConfig:
    fields: dict[str, Any] = dict(
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        max_model_len=2048,
        block_size=16,
        num_blocks=4000,
    )
    return SchedulerConfig(**(fields | changes))


def _spec(replicas: int = 1, *, policy: str = "round_robin", **changes: Any) -> FleetSpec:
    gateway = changes.pop("gateway", GatewayConfig(policy=PolicyName(policy)))
    fields: dict[str, Any] = dict(
        scheduler=changes.pop("scheduler", _scheduler()),
        cost=COST,
        replicas=replicas,
        capacity=64,
        gateway=gateway,
        network=NO_NETWORK,
    )
    return FleetSpec(**(fields | changes))


def _rate(value: float, requests: int) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.RATE, value=value), max_requests=requests)


def _closed(value: int, requests: int) -> LoadPlan:
    return LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=value), max_requests=requests)


def _run_open(
    spec: FleetSpec, jobs: list[Job], offsets: Iterator[float], requests: int, **kw: Any
) -> tuple[FleetSim, LevelOutcome]:
    sim = FleetSim(spec, **kw)
    out = sim.run(_rate(1.0, requests), JobTable(jobs), Slo(), offsets=offsets)
    return sim, out


def _alone(prompt: int, output: int) -> list[float]:
    """Step times of one request alone on one replica, from time 0."""
    model = ReplicaModel(_scheduler(), COST)
    model.add(SimRequest(0, prompt, output, 0.0))
    now, durations = 0.0, []
    while (result := model.step(now)) is not None:
        durations.append(result.duration_s)
        now = result.end_s
    return durations


# ---- one request: latencies are hops plus steps ------------------------------------------


@pytest.mark.parametrize(("hop", "client"), [(0.0, 0.0), (0.004, 0.0), (0.004, 0.0015)])
def test_one_request_ttft_is_hops_plus_the_prefill_step(hop: float, client: float) -> None:
    network = NetworkConfig(client_gateway_s=client, same_node=Delay(hop, hop))
    spec = _spec(network=network)
    _, out = _run_open(spec, [Job(100, 5)], iter([0.0]), 1)
    steps = _alone(100, 5)
    prefill = 0.01 + 100 * 1e-4 + 1e-3
    assert steps[0] == pytest.approx(prefill)
    # Sent at 0: client -> gateway -> replica, one prefill step, and back the same way.
    ttft = client + hop + steps[0] + hop + client
    assert out.run.ttft_ms.p50 == pytest.approx(ttft * 1000, rel=1e-12)
    e2e = client + hop + sum(steps) + hop + client
    assert out.run.e2e_ms.p50 == pytest.approx(e2e * 1000, rel=1e-12)
    assert out.run.tpot_ms.p50 == pytest.approx((e2e - ttft) / 4 * 1000, rel=1e-9)
    # The four decode steps are the four gaps between tokens.
    assert out.run.itl_ms.count == 4
    assert out.run.itl_ms.mean == pytest.approx(sum(steps[1:]) / 4 * 1000, rel=1e-9)
    assert out.run.completed == 1 and out.run.failed == 0


def test_cross_node_hops_apply_to_replicas_off_the_gateways_node() -> None:
    network = NetworkConfig(
        same_node=Delay(0.001, 0.001), cross_node=Delay(0.02, 0.02), replicas_per_node=1
    )
    spec = _spec(2, network=network)
    _, out = _run_open(spec, [Job(100, 1)] * 2, iter([0.0, 10.0]), 2)
    prefill = _alone(100, 1)[0]
    # Round robin: r0 (node 0, same node) then r1 (node 1, across the network).
    expected = sorted([(0.002 + prefill) * 1000, (0.04 + prefill) * 1000])
    assert out.run.ttft_ms.p50 == pytest.approx(sum(expected) / 2)
    assert out.run.ttft_ms.mean == pytest.approx(sum(expected) / 2)


def test_closed_loop_concurrency_one_runs_at_one_over_e2e() -> None:
    spec = _spec()
    sim = FleetSim(spec)
    out = sim.run(_closed(1, 50), JobTable([Job(300, 20)]), Slo())
    e2e_s = sum(_alone(300, 20))
    assert out.run.completed == 50
    assert out.run.e2e_ms.p99 == pytest.approx(e2e_s * 1000)
    assert out.run.request_throughput == pytest.approx(1 / e2e_s)
    assert out.run.output_throughput == pytest.approx(20 / e2e_s)


# ---- queueing ------------------------------------------------------------------------------


def _one_at_a_time() -> FleetSpec:
    """One replica serving one single-token request at a time: a deterministic server of
    service time S = one prefill step."""
    scheduler = _scheduler(max_num_seqs=1, max_num_batched_tokens=1024)
    return _spec(scheduler=scheduler)


def test_a_burst_queues_each_request_behind_those_before_it() -> None:
    service = _alone(200, 1)[0]
    n = 20
    _, out = _run_open(_one_at_a_time(), [Job(200, 1)], iter([0.0] * n), n)
    # The k-th request (k = 1..n) waits for k - 1 services, then takes its own.
    assert out.run.ttft_ms.mean == pytest.approx(service * (n + 1) / 2 * 1000)
    assert out.run.e2e_ms.p50 == pytest.approx(service * (n + 1) / 2 * 1000)


def test_poisson_arrivals_queue_as_m_d_1() -> None:
    service = _alone(200, 1)[0]
    rho = 0.6
    rate = rho / service
    rng = random.Random(7)
    offsets = itertools.accumulate(rng.expovariate(rate) for _ in itertools.count())
    n = 40_000
    _, out = _run_open(_one_at_a_time(), [Job(200, 1)], offsets, n)
    # Pollaczek-Khinchine for M/D/1: mean wait = rho S / (2 (1 - rho)).
    wait = rho * service / (2 * (1 - rho))
    assert out.run.ttft_ms.mean == pytest.approx((wait + service) * 1000, rel=0.04)
    assert out.run.request_throughput == pytest.approx(rate, rel=0.03)


# ---- routing: the gateway's own policy objects ---------------------------------------------


def test_the_policy_and_admission_are_the_gateways_classes() -> None:
    for name, cls in [("round_robin", RoundRobin), ("least_load", LeastLoad),
                      ("prefix_affinity", PrefixAffinity)]:  # fmt: skip
        sim = FleetSim(_spec(2, policy=name))
        assert type(sim.policy) is cls
        assert type(sim.policy) is type(make_policy(PolicyName(name)))
    assert isinstance(sim.gateway.controller, AdmissionController)
    assert isinstance(sim.gateway.queue, AdmissionQueue)


def test_round_robin_spreads_requests_exactly_evenly() -> None:
    sim, out = _run_open(_spec(4), [Job(50, 3)], (i * 0.01 for i in itertools.count()), 400)
    assert [r.dispatched for r in sim.replicas] == [100, 100, 100, 100]
    assert out.run.completed == 400


def test_prefix_affinity_keeps_a_prefix_on_one_replica_and_hits_its_cache() -> None:
    jobs = [Job(600, 4, prefix_group=g, prefix_tokens=512) for g in range(2)]
    offsets = (i * 0.05 for i in itertools.count())
    sim, out = _run_open(_spec(4, policy="prefix_affinity"), jobs, offsets, 200)
    used = [r for r in sim.replicas if r.dispatched]
    assert 1 <= len(used) <= 2  # one replica per prefix (two prefixes may share one)
    # After each prefix's first request, 512 of 600 prompt tokens come from the cache.
    assert out.stats.prefix_hit_rate == pytest.approx(512 / 600 * 198 / 200, rel=1e-9)
    # The gateway hashes 600 x 4 characters in 256-character blocks: 9 blocks, the first 8
    # inside the prefix; every request but each prefix's first matches those 8.
    stats = sim.policy.stats()
    assert stats["prefix_blocks_total"] == 9 * 200
    assert stats["prefix_blocks_matched"] == 8 * 198


def test_round_robin_scatters_the_same_prefixes() -> None:
    jobs = [Job(600, 4, prefix_group=g, prefix_tokens=512) for g in range(2)]
    offsets = (i * 0.05 for i in itertools.count())
    sim, out = _run_open(_spec(4), jobs, offsets, 200)
    assert all(r.dispatched == 50 for r in sim.replicas)
    # Each replica misses each prefix once (4 x 2 misses instead of 2).
    assert out.stats.prefix_hit_rate < 512 / 600 * 198 / 200


# ---- admission ---------------------------------------------------------------------------


def test_capacity_budget_queues_in_the_gateway_and_sheds_past_the_budget() -> None:
    gateway = GatewayConfig(
        policy=PolicyName.ROUND_ROBIN,
        admission=AdmissionConfig(queue_budget_ms=(100.0, 100.0, 100.0)),
    )
    spec = _spec(gateway=gateway, capacity=2)
    sim = FleetSim(spec)
    out = sim.run(_rate(1, 40), JobTable([Job(200, 50)]), Slo(), offsets=iter([0.0] * 40))
    assert sim.replicas[0].model.num_running == 0
    assert out.stats.queued > 0
    assert out.run.errors.get("http_429", 0) > 0
    assert out.run.completed + out.run.failed == 40


class _Order:
    """A routing policy that notes the class of each request it routes (first candidate)."""

    name = "order"
    uses_prefix = False

    def __init__(self) -> None:
        self.priorities: list[int] = []

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        self.priorities.append(request.priority)
        return candidates[0].replica_id

    def forget(self, replica_id: str) -> None:
        return None

    def stats(self) -> Mapping[str, float]:
        return {}


def test_waiting_requests_leave_the_gateway_queue_most_urgent_first() -> None:
    order = _Order()
    jobs = [Job(100, 2, priority=p) for p in (2, 0, 1)]
    _run_open(_spec(capacity=1), jobs, iter([0.0] * 12), 12, policy=order)
    # The first goes at once; the rest waited together and leave P0, then P1, then P2.
    assert order.priorities == [2] + [0] * 4 + [1] * 4 + [2] * 3


def test_free_slots_match_the_admission_snapshots_own_count() -> None:
    spec = _spec(3, capacity=4, policy="least_load")
    checks: list[tuple[int, int]] = []

    class Checking(LeastLoad):
        """Compares the gateway's running count with a recount at every decision (through
        the policy: the compiled simulator's methods cannot be patched)."""

        def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
            checks.append((sim.gateway.free_slots, free_slots(candidates, 0.95)))
            ready = [r.view for r in sim.gateway.replicas.values() if r.view is not None]
            assert len(ready) >= len(candidates)
            return super().choose(request, candidates)

    sim = FleetSim(spec, policy=Checking(random.Random(0)))
    offsets = (i * 0.002 for i in itertools.count())
    sim.run(_rate(1, 300), JobTable([Job(100, 30)]), Slo(), offsets=offsets)
    assert checks and all(a == b for a, b in checks)


# ---- cold start and autoscaling ------------------------------------------------------------


def test_cold_start_delays_service_by_cold_start_s() -> None:
    spec = _spec(start_cold=True, cold_start_s=10.0, scrape_interval_s=1.0)
    sim, out = _run_open(spec, [Job(100, 1)], iter([0.0]), 1)
    service = _alone(100, 1)[0]
    assert sim.replicas[0].ready_s == pytest.approx(10.0)
    # Ready at the scrape at 10 s; the queued request goes at the next tick (20 ms apart).
    ttft_ms = out.run.ttft_ms.p50
    assert ttft_ms is not None
    assert 10.0 + service <= ttft_ms / 1000 <= 10.0 + 0.02 + service + 1e-9


def test_a_cold_start_longer_than_the_wait_fails_with_503() -> None:
    spec = _spec(start_cold=True, cold_start_s=100.0, scrape_interval_s=1.0)
    _, out = _run_open(spec, [Job(100, 1)], iter([0.0]), 1)
    assert out.run.errors == {"http_503": 1}
    assert out.run.duration_s == pytest.approx(60.0, abs=0.01)


class _Recorder:
    name = "recorder"

    def __init__(self, desired: int) -> None:
        self.desired = desired
        self.calls: list[FleetSnapshot] = []

    def decide(self, snapshot: FleetSnapshot, now_s: float) -> ScaleDecision:
        self.calls.append(snapshot)
        return ScaleDecision(self.desired, ScaleReason.HOLD)


def test_autoscaler_is_asked_and_a_new_replica_serves_after_its_cold_start() -> None:
    recorder = _Recorder(desired=2)
    spec = _spec(cold_start_s=30.0, scrape_interval_s=1.0, autoscale_interval_s=5.0)
    offsets = (i * 0.1 for i in itertools.count())
    sim, out = _run_open(spec, [Job(100, 5)], offsets, 1000, autoscaler=recorder)
    assert recorder.calls and recorder.calls[0].now_s == 5.0
    assert recorder.calls[0].ready == 1
    assert any(s.starting == 1 for s in recorder.calls)
    new = sim.replicas[1]
    assert new.launched_s == 5.0
    assert new.ready_s == pytest.approx(35.0)
    assert new.dispatched > 0 and out.stats.replicas_peak == 2


def test_autoscaler_adds_replicas_under_load() -> None:
    spec = _spec(capacity=8, cold_start_s=5.0, scrape_interval_s=1.0, autoscale_interval_s=2.0)
    offsets = (i * 0.01 for i in itertools.count())
    sim, out = _run_open(
        spec, [Job(200, 40)], offsets, 3000, autoscaler=TargetUtilisation(max_replicas=6)
    )
    assert out.stats.replicas_peak > 1
    assert sum(r.dispatched for r in sim.replicas[1:]) > 0


# ---- duration-bound levels and metrics -----------------------------------------------------


def test_duration_bound_open_loop_cancels_what_outlives_the_grace() -> None:
    spec = _spec(capacity=2)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=50), duration_s=2.0, grace_s=0.5)
    offsets = (i * 0.02 for i in itertools.count())
    out = FleetSim(spec).run(plan, JobTable([Job(100, 400)]), Slo(), offsets=offsets)
    assert out.run.completed + out.run.failed == 100
    assert out.run.errors.get("cancelled_at_end", 0) > 0


def test_slo_goodput_and_attainment() -> None:
    e2e_ms = sum(_alone(300, 20)) * 1000
    slo = Slo(e2e_p99_ms=e2e_ms * 1.5)
    out = FleetSim(_spec()).run(_closed(2, 40), JobTable([Job(300, 20)]), slo)
    assert 0.0 < out.run.slo_attainment <= 1.0
    assert out.run.goodput_rps == pytest.approx(out.run.request_throughput * out.run.slo_attainment)


def test_weighted_histogram_percentiles_match_numpy_on_the_expanded_sample() -> None:
    import numpy as np

    rng = random.Random(3)
    hist = WeightedHistogram()
    expanded: list[float] = []
    for _ in range(500):
        value, weight = rng.uniform(0.001, 0.2), rng.randint(1, 30)
        hist.add(value, weight)
        expanded += [value] * weight
    stats = hist.stats_ms()
    p50, p90, p99 = np.percentile(np.array(expanded) * 1000, [50, 90, 99])
    assert stats.p50 == pytest.approx(p50) and stats.p90 == pytest.approx(p90)
    assert stats.p99 == pytest.approx(p99)
    assert stats.mean == pytest.approx(float(np.mean(expanded)) * 1000)


def test_weighted_histogram_bins_many_distinct_values_within_their_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import servepilot.sim.fleet.collect as collect

    monkeypatch.setattr(collect, "EXACT_VALUES", 100)
    hist = WeightedHistogram()
    values = [0.01 + i * 1e-5 for i in range(5000)]
    for v in values:
        hist.add(v, 1)
    stats = hist.stats_ms()
    assert stats.p50 == pytest.approx(float(sorted(values)[2499] * 1000), rel=2e-4)
    assert stats.count == 5000
    assert not math.isnan(stats.p99 or math.nan)


class _Prompts(_Order):
    """Notes the prompt length of each request it routes (it tells the tenants apart here)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[int] = []

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        self.prompts.append(request.prompt_tokens)
        return candidates[0].replica_id


@pytest.mark.parametrize("fair", [True, False])
def test_tenants_of_the_workload_take_fair_turns_at_the_simulated_gateway(fair: bool) -> None:
    # a (prompts of 100 tokens) sends nine at once, b (101) three just behind: the first
    # goes at once, then the queue serves a, b, a, b, a, b and the rest of a's, as the
    # gateway's own queue would (test_admission_fair.py); without fair shares, a's all first.
    jobs = [Job(100, 2, tenant="a")] * 9 + [Job(101, 2, tenant="b")] * 3
    order = _Prompts()
    gateway = GatewayConfig(admission=AdmissionConfig(fair_shares=fair))
    _run_open(_spec(capacity=1, gateway=gateway), jobs, iter([0.0] * 12), 12, policy=order)
    a, b = 100, 101
    expected = [a, a, b, a, b, a, b, a, a, a, a, a] if fair else [a] * 9 + [b] * 3
    assert order.prompts == expected


def test_a_traces_tenants_reach_the_simulated_requests(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0.0, "input_tokens": 10, "output_tokens": 2, "tenant": "a"},
        {"timestamp": 0.1, "input_tokens": 10, "output_tokens": 2},
        {"timestamp": 0.2, "input_tokens": 10, "output_tokens": 2, "tenant": "b"},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    jobs = level_jobs(WorkloadSpec(kind=WorkloadKind.TRACE, trace_path=trace), 3, 0)
    assert jobs.tenants == ["a", None, "b"]
    assert [jobs.job(i).tenant for i in range(3)] == ["a", None, "b"]
    factory = RequestFactory(jobs, GatewayConfig().routing, "m", uses_prefix=False)
    made = [factory.make(Slot(i, float(i), False), 0.0).tenant for i in range(3)]
    assert made == ["a", SHARED_TENANT, "b"]
    untagged = level_jobs(WorkloadSpec(kind=WorkloadKind.RANDOM), 3, 0)
    assert untagged.tenants is None


def test_a_full_simulated_queue_makes_room_for_a_tenant_under_its_share() -> None:
    # One slot, two places: a1 goes, a2 and a3 wait, a4 is refused (a holds every place);
    # b1 has no place of its own, so a3 leaves for it (429).
    jobs = [Job(100, 2, tenant="a")] * 4 + [Job(101, 2, tenant="b")]
    order = _Prompts()
    gateway = GatewayConfig(admission=AdmissionConfig(max_queued=2))
    _, out = _run_open(_spec(capacity=1, gateway=gateway), jobs, iter([0.0] * 5), 5, policy=order)
    assert order.prompts == [100, 100, 101]
    assert out.run.errors == {"http_429": 2}


# ---- vLLM's engine loop with async scheduling ---------------------------------------------


def test_async_scheduling_admits_a_request_two_steps_after_it_arrives_mid_step() -> None:
    """vLLM schedules step k+1 when step k starts (EngineCore.step_with_batch_queue): a
    request reaching the engine during step k waits for step k+2, one step more than a
    synchronous engine makes it wait."""
    first = _alone(1000, 20)
    arrive_s = first[0] / 2  # during the long request's prefill step
    ttft_ms = {}
    for async_scheduling in (False, True):
        spec = _spec(scheduler=_scheduler(async_scheduling=async_scheduling))
        _, out = _run_open(spec, [Job(1000, 20), Job(100, 1)], iter([0.0, arrive_s]), 2)
        assert out.run.completed == 2
        # The mean of the two: the long request's own TTFT is its prefill step either way.
        ttft_ms[async_scheduling] = 2 * out.run.ttft_ms.mean - first[0] * 1000
    # The extra step is the long request's first decode step, alone (its context one token
    # longer in the step after: per_context_token_s).
    extra_ms = ttft_ms[True] - ttft_ms[False]
    assert extra_ms == pytest.approx((first[1] + 1e-6) * 1000, abs=1e-6)
