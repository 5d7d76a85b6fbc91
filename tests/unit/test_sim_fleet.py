"""The fleet simulator (servepilot/sim/fleet/): answers known in advance.

Each test builds a small fleet with a linear cost model whose step times can be written down
(tests/unit/sim_fleet_support.py), so latencies come out as sums of hops and step times, and
queueing as queueing theory says. Here: one request's latencies, queueing, duration-bound
levels and the SLO, and vLLM's engine loop with async scheduling. Routing, admission and
tenants, scaling, and the histograms: the test_sim_fleet_*.py and test_sim_collect.py beside.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest

from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.sim import ReplicaModel, SimRequest
from servepilot.sim.engine.steps import StepResult
from servepilot.sim.fleet.members import (
    INTAKE_BATCHED_PROMPT_TOKENS,
    INTAKE_WAIT_S,
    STREAM_LOAD_MAX,
    FleetReplica,
    FleetRequest,
)
from servepilot.sim.fleet.network import Delay, HopSampler, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable
from tests.unit.sim_fleet_support import (
    alone_steps,
    closed_plan,
    fleet_spec,
    run_open,
    scheduler_config,
)
from tests.unit.sim_replica_support import COST

# ---- one request: latencies are hops plus steps ------------------------------------------


@pytest.mark.parametrize(("hop", "client"), [(0.0, 0.0), (0.004, 0.0), (0.004, 0.0015)])
def test_one_request_ttft_is_hops_plus_the_prefill_step(hop: float, client: float) -> None:
    network = NetworkConfig(client_gateway_s=client, same_node=Delay(hop, hop))
    spec = fleet_spec(network=network)
    _, out = run_open(spec, [Job(100, 5)], iter([0.0]), 1)
    steps = alone_steps(100, 5)
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
    spec = fleet_spec(2, network=network)
    _, out = run_open(spec, [Job(100, 1)] * 2, iter([0.0, 10.0]), 2)
    prefill = alone_steps(100, 1)[0]
    # Round robin: r0 (node 0, same node) then r1 (node 1, across the network).
    expected = sorted([(0.002 + prefill) * 1000, (0.04 + prefill) * 1000])
    assert out.run.ttft_ms.p50 == pytest.approx(sum(expected) / 2)
    assert out.run.ttft_ms.mean == pytest.approx(sum(expected) / 2)


def test_the_api_server_takes_prompts_in_in_batches_at_its_cost_per_token() -> None:
    """1 ms a prompt token: one request of 100 tokens reaches the engine 100 ms after the
    tokenizer's 2 ms wait. Two sent together are one batch (100 ms for the longest, 100 more
    for the other, under INTAKE_BATCHED_PROMPT_TOKENS) and reach the engine together; a third,
    sent while that batch runs, waits for the next."""
    assert INTAKE_BATCHED_PROMPT_TOKENS > 100
    spec = fleet_spec(intake_s_per_prompt_token=1e-3)
    prefill = alone_steps(100, 1)[0]
    _, one = run_open(spec, [Job(100, 1)], iter([0.0]), 1)
    assert one.run.ttft_ms.p50 == pytest.approx((INTAKE_WAIT_S + 0.1 + prefill) * 1000)
    batch_out = INTAKE_WAIT_S + 0.2
    # Both reach the idle engine at once: it starts a step with the first, then the second.
    together = [batch_out + prefill, batch_out + 2 * prefill]
    _, two = run_open(spec, [Job(100, 1)] * 2, iter([0.0, 0.0]), 2)
    assert two.run.ttft_ms.mean == pytest.approx(sum(together) / 2 * 1000)
    _, three = run_open(spec, [Job(100, 1)] * 3, iter([0.0, 0.0, 0.05]), 3)
    third_out = batch_out + INTAKE_WAIT_S + 0.1  # the engine idles by then
    third = third_out + prefill - 0.05
    assert three.run.ttft_ms.mean == pytest.approx((sum(together) + third) / 3 * 1000)
    with pytest.raises(ConfigError, match="intake_s_per_prompt_token"):
        fleet_spec(intake_s_per_prompt_token=-1.0)


def test_a_batch_of_intake_costs_its_longest_prompt_and_slows_beside_the_streaming() -> None:
    """A batch costs its longest prompt, and each other prompt up to
    INTAKE_BATCHED_PROMPT_TOKENS; over (1 - share)^2 of the time the last step's streaming
    left the API server, while that reading holds (two of that step's durations)."""
    rng = random.Random(0)
    replica = FleetReplica(0, ReplicaModel(scheduler_config(), COST), 8,
                           HopSampler(Delay(), rng), ready=True)  # fmt: skip
    cap = INTAKE_BATCHED_PROMPT_TOKENS
    requests = [FleetRequest(i, tokens, 1, 0.0) for i, tokens in enumerate((4000, 100, 2000))]
    assert replica.reach_api(requests[0]) and not replica.reach_api(requests[1])
    assert not replica.reach_api(requests[2])
    batch, took_s = replica.intake_batch(0.0, 1e-6)
    assert batch == requests and took_s == pytest.approx((4000 + 100 + cap) * 1e-6)
    assert replica.intake_batch(0.0, 1e-6) == ([], 0.0) and not replica.intake_pending
    # A step of 0.1 s whose 40 tokens took 1 ms each to stream: 40% of the server.
    step = replace(_one_step(replica), duration_s=0.1, tokens=40)
    replica.stream(step, 1.0, 1e-3, lambda request_id: None)
    assert replica.reach_api(requests[1])
    _, slowed = replica.intake_batch(1.1, 1e-6)
    assert slowed == pytest.approx(100e-6 / 0.6**2)
    replica.reach_api(requests[1])
    assert replica.intake_batch(1.3, 1e-6)[1] == pytest.approx(100e-6)  # the reading is old
    # Streaming that takes longer than its step counts as STREAM_LOAD_MAX of the server.
    replica.stream(replace(step, tokens=1000), 2.0, 1e-3, lambda request_id: None)
    replica.reach_api(requests[1])
    free = 1.0 - STREAM_LOAD_MAX
    assert replica.intake_batch(2.0, 1e-6)[1] == pytest.approx(100e-6 / free**2)


def _one_step(replica: FleetReplica) -> StepResult:
    replica.model.add(SimRequest(99, 10, 1, 0.0))
    result = replica.model.step(0.0)
    assert result is not None
    return result


def test_what_reached_a_busy_engine_is_scheduled_together_once_it_idles() -> None:
    """With async scheduling, B and C reach the engine while A's prefill runs: once A is
    done and the engine idles, its loop reads both in and schedules them in one step (before,
    B took a step alone and C waited for the one after)."""
    spec = fleet_spec(scheduler=scheduler_config(async_scheduling=True))
    _, out = run_open(spec, [Job(100, 1)] * 3, iter([0.0, 0.001, 0.001]), 3)
    alone = alone_steps(100, 1)[0]
    ttft = out.run.ttft_ms
    assert ttft.p99 is not None and ttft.p50 is not None
    # A alone; B and C together, both after A's step, in one step longer than A's.
    assert ttft.p50 == pytest.approx(ttft.p99)
    assert ttft.p50 > (2 * alone - 0.001) * 1000


def test_the_api_server_streams_each_steps_tokens_at_its_cost_per_token() -> None:
    """1 ms a streamed token, under every step: each token reaches the client 1 ms after its
    step. 50 ms, over every step: the API server is the bottleneck, and the tokens come one
    turn of it apart (TPOT 50 ms), from the prefill step's end on."""
    steps = alone_steps(100, 5)
    assert max(steps) < 0.05 and min(steps) > 0.001
    _, fast = run_open(fleet_spec(output_s_per_token=1e-3), [Job(100, 5)], iter([0.0]), 1)
    assert fast.run.ttft_ms.p50 == pytest.approx((steps[0] + 1e-3) * 1000, rel=1e-9)
    assert fast.run.e2e_ms.p50 == pytest.approx((sum(steps) + 1e-3) * 1000, rel=1e-9)
    _, slow = run_open(fleet_spec(output_s_per_token=0.05), [Job(100, 5)], iter([0.0]), 1)
    assert slow.run.ttft_ms.p50 == pytest.approx((steps[0] + 0.05) * 1000, rel=1e-9)
    assert slow.run.e2e_ms.p50 == pytest.approx((steps[0] + 5 * 0.05) * 1000, rel=1e-9)
    assert slow.run.tpot_ms.p50 == pytest.approx(50.0, rel=1e-9)
    with pytest.raises(ConfigError, match="output_s_per_token"):
        fleet_spec(output_s_per_token=-1.0)


def test_a_prompt_taken_in_beside_the_streaming_waits_longer_and_steps_stream_in_turn() -> None:
    """B's prompt (100 tokens at 1 ms) reaches the API server while it streams A's first token
    (0.5 s a token, over the whole of A's step: STREAM_LOAD_MAX of the server): B's intake
    takes (1 - STREAM_LOAD_MAX)^-2 times its 100 ms, and B's token waits for A's to be
    streamed."""
    spec = fleet_spec(intake_s_per_prompt_token=1e-3, output_s_per_token=0.5)
    prefill = alone_steps(100, 1)[0]
    a_out = INTAKE_WAIT_S + 0.1 + prefill
    b_sent = a_out + 0.01
    _, out = run_open(spec, [Job(100, 1)] * 2, iter([0.0, b_sent]), 2)
    a_first = a_out + 0.5  # one streaming turn
    b_intake = 0.1 / (1.0 - STREAM_LOAD_MAX) ** 2
    b_out = b_sent + INTAKE_WAIT_S + b_intake + prefill
    b_first = max(b_out, a_first) + 0.5
    assert out.run.ttft_ms.mean == pytest.approx((a_first + (b_first - b_sent)) / 2 * 1000)


def test_closed_loop_concurrency_one_runs_at_one_over_e2e() -> None:
    spec = fleet_spec()
    sim = FleetSim(spec)
    out = sim.run(closed_plan(1, 50), JobTable([Job(300, 20)]), Slo())
    e2e_s = sum(alone_steps(300, 20))
    assert out.run.completed == 50
    assert out.run.e2e_ms.p99 == pytest.approx(e2e_s * 1000)
    assert out.run.request_throughput == pytest.approx(1 / e2e_s)
    assert out.run.output_throughput == pytest.approx(20 / e2e_s)


# ---- queueing ------------------------------------------------------------------------------


def _one_at_a_time() -> FleetSpec:
    """One replica serving one single-token request at a time: a deterministic server of
    service time S = one prefill step."""
    scheduler = scheduler_config(max_num_seqs=1, max_num_batched_tokens=1024)
    return fleet_spec(scheduler=scheduler)


def test_a_burst_queues_each_request_behind_those_before_it() -> None:
    service = alone_steps(200, 1)[0]
    n = 20
    _, out = run_open(_one_at_a_time(), [Job(200, 1)], iter([0.0] * n), n)
    # The k-th request (k = 1..n) waits for k - 1 services, then takes its own.
    assert out.run.ttft_ms.mean == pytest.approx(service * (n + 1) / 2 * 1000)
    assert out.run.e2e_ms.p50 == pytest.approx(service * (n + 1) / 2 * 1000)


def test_poisson_arrivals_queue_as_m_d_1() -> None:
    service = alone_steps(200, 1)[0]
    rho = 0.6
    rate = rho / service
    rng = random.Random(7)
    offsets = itertools.accumulate(rng.expovariate(rate) for _ in itertools.count())
    n = 40_000
    _, out = run_open(_one_at_a_time(), [Job(200, 1)], offsets, n)
    # Pollaczek-Khinchine for M/D/1: mean wait = rho S / (2 (1 - rho)).
    wait = rho * service / (2 * (1 - rho))
    assert out.run.ttft_ms.mean == pytest.approx((wait + service) * 1000, rel=0.04)
    assert out.run.request_throughput == pytest.approx(rate, rel=0.03)


# ---- duration-bound levels and the SLO ----------------------------------------------------


def test_duration_bound_open_loop_cancels_what_outlives_the_grace() -> None:
    spec = fleet_spec(capacity=2)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=50), duration_s=2.0, grace_s=0.5)
    offsets = (i * 0.02 for i in itertools.count())
    out = FleetSim(spec).run(plan, JobTable([Job(100, 400)]), Slo(), offsets=offsets)
    assert out.run.completed + out.run.failed == 100
    assert out.run.errors.get("cancelled_at_end", 0) > 0


def test_slo_goodput_and_attainment() -> None:
    e2e_ms = sum(alone_steps(300, 20)) * 1000
    slo = Slo(e2e_p99_ms=e2e_ms * 1.5)
    out = FleetSim(fleet_spec()).run(closed_plan(2, 40), JobTable([Job(300, 20)]), slo)
    assert 0.0 < out.run.slo_attainment <= 1.0
    assert out.run.goodput_rps == pytest.approx(out.run.request_throughput * out.run.slo_attainment)


# ---- vLLM's engine loop with async scheduling ---------------------------------------------


def test_async_scheduling_admits_a_request_two_steps_after_it_arrives_mid_step() -> None:
    """vLLM schedules step k+1 when step k starts (EngineCore.step_with_batch_queue): a
    request reaching the engine during step k waits for step k+2, one step more than a
    synchronous engine makes it wait."""
    first = alone_steps(1000, 20)
    arrive_s = first[0] / 2  # during the long request's prefill step
    ttft_ms = {}
    for async_scheduling in (False, True):
        spec = fleet_spec(scheduler=scheduler_config(async_scheduling=async_scheduling))
        _, out = run_open(spec, [Job(1000, 20), Job(100, 1)], iter([0.0, arrive_s]), 2)
        assert out.run.completed == 2
        # The mean of the two: the long request's own TTFT is its prefill step either way.
        ttft_ms[async_scheduling] = 2 * out.run.ttft_ms.mean - first[0] * 1000
    # The extra step is the long request's first decode step, alone (its context one token
    # longer in the step after: per_context_token_s).
    extra_ms = ttft_ms[True] - ttft_ms[False]
    assert extra_ms == pytest.approx((first[1] + 1e-6) * 1000, abs=1e-6)


def test_an_eager_steps_launch_holds_back_the_tokens_of_the_step_before() -> None:
    """vLLM's engine loop with async scheduling (two steps in flight) launches step k+1 once
    it has launched step k and handed out step k-1's tokens, and hands out step k's tokens
    only once step k+1 is launched. A step too large for a CUDA graph is launched kernel by
    kernel, the host's `eager_floor_s`, while the GPU runs what came before.

    A decodes alone in graph-sized steps; B (1,000 prompt tokens) reaches the engine during
    A's prefill and joins step 3, eager (0.2 s). Its launch starts when step 1's token is
    out (step 2 runs meanwhile) and ends 0.2 s later: step 2's token waits for it, step 3
    ends with it (its kernels, 0.11 s, run as launched), and step 3's token follows at
    once. Steps 1, 2, 4 and 5 take what they take alone."""
    # Step 3 carries A's decode: the mixed floor (a prefill alone would take 0.1 s).
    cost = replace(COST, eager_floor_s=0.1, eager_mixed_floor_s=0.2, graph_max_tokens=512)
    config = scheduler_config(async_scheduling=True)
    model = ReplicaModel(config, cost)
    model.add(SimRequest(0, 100, 5, 0.0))
    ends = [0.0]
    while (result := model.step(ends[-1])) is not None:
        ends.append(result.end_s)
        if len(ends) == 3:  # planned step 2; B was deferred to the step after
            model.add(SimRequest(1, 1000, 1, ends[1] / 2))
    d = [b - a for a, b in itertools.pairwise(ends)]  # each step alone (step 3 floored)
    assert len(d) == 5 and d[2] == pytest.approx(0.2) and d[1] < 0.02
    spec = fleet_spec(scheduler=config, cost=cost)
    _, out = run_open(spec, [Job(100, 5), Job(1000, 1)], iter([0.0, ends[1] / 2]), 2)
    assert out.run.completed == 2
    gaps = [0.2, 0.0, d[3], d[4]]  # A's tokens: step 2's with step 3's launch, then step 3's
    assert out.run.itl_ms.count == 4
    assert out.run.itl_ms.mean == pytest.approx(sum(gaps) / 4 * 1000, rel=1e-9)
    assert out.run.itl_ms.p99 == pytest.approx(np.percentile(gaps, 99) * 1000, rel=1e-9)
    assert out.run.itl_ms.p50 == pytest.approx(np.percentile(gaps, 50) * 1000, abs=1e-9)
    # B's first token: step 3's end, 0.2 s after step 1's (step 4 is a graph: no wait).
    ttfts = [d[0], d[0] + 0.2 - ends[1] / 2]
    assert out.run.ttft_ms.mean == pytest.approx(sum(ttfts) / 2 * 1000, rel=1e-9)
    # A ends step 2's length sooner than steps one after another would have it.
    e2es = [d[0] + 0.2 + d[3] + d[4], ttfts[1]]
    assert out.run.e2e_ms.p99 == pytest.approx(np.percentile(e2es, 99) * 1000, rel=1e-9)
    # vLLM's queue and prefill times, stamped as it does: B enters the scheduler when the
    # loop reads its input, once step 1's token is out, and is scheduled at once, as step
    # 3's launch starts; its prefill runs to its token, 0.2 s on. A: no queue, its step.
    assert out.stats.engine_queue_s == pytest.approx(0.0, abs=1e-12)
    assert out.stats.engine_prefill_s == pytest.approx((d[0] + 0.2) / 2, rel=1e-9)
