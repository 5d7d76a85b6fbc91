"""The agentic workload in the fleet simulator (sim/fleet/agentic.py): a session's next turn
is sent only after its previous answer reached the client, plus the turn's wait; its prompt
is the previous one, the answer and a new message; it hits the previous turn's blocks."""

from __future__ import annotations

import pytest

from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.agentic import AgenticSpec
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sessions import session_script
from servepilot.load.slots import send_times
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from servepilot.plan.costmodel import CostModel
from servepilot.sim import SchedulerConfig
from servepilot.sim.fleet.agentic import SessionFeed
from servepilot.sim.fleet.network import Delay, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec, LevelOutcome

COST = CostModel(
    base_s=0.01, per_prefill_token_s=1e-4, per_prefill_seq_s=1e-3, per_decode_seq_s=2e-3,
    per_context_token_s=1e-6, per_prefill_pair_s=0.0, source="test",
)  # fmt: skip
OVERHEAD = 10


def _fleet(replicas: int, policy: str = "round_robin", blocks: int = 4000) -> FleetSpec:
    scheduler = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                max_model_len=8192, block_size=16, num_blocks=blocks)  # fmt: skip
    return FleetSpec(
        scheduler=scheduler, cost=COST, replicas=replicas, capacity=64,
        gateway=GatewayConfig(policy=PolicyName(policy)),
        network=NetworkConfig(cross_node=Delay()),
    )  # fmt: skip


def _workload(turns: int, **agentic: float) -> WorkloadSpec:
    return WorkloadSpec(
        kind=WorkloadKind.AGENTIC, input_tokens=96, output_tokens=8, turns=turns, seed=1,
        agentic=AgenticSpec(system_prompt_tokens=256, tool_tokens=64, **agentic),  # type: ignore[arg-type]
    )  # fmt: skip


def _run(
    fleet: FleetSpec, workload: WorkloadSpec, plan: LoadPlan
) -> tuple[SessionFeed, LevelOutcome]:
    feed = SessionFeed(plan, workload, OVERHEAD)
    offsets = None if plan.closed else send_times(plan, None)
    outcome = FleetSim(fleet).run(plan, feed.jobs, Slo(), offsets=offsets, sessions=feed)
    return feed, outcome


def test_one_session_waits_for_each_answer_and_its_prompt_grows_by_it() -> None:
    workload = _workload(4, think_s=3.0, tool_s=2.0, return_fraction=0.0)
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=1), max_requests=4)
    feed, outcome = _run(_fleet(1), workload, plan)
    script = session_script(workload, 0)
    assert outcome.run.completed == 4
    prompts = list(feed.jobs.prompt)
    assert prompts == [script.prompt_tokens(t) + OVERHEAD for t in range(4)]
    assert prompts[1] - prompts[0] == 8 + script.turns[1].new_tokens
    waits = sum(t.wait_s for t in script.turns)
    # The session's time is its waits plus four answers, each well under a second here.
    assert waits < outcome.stats.sim_s < waits + 4 * 1.0
    # Turns 1-3 find their previous prompt's full blocks cached (one replica, room to spare).
    hits = sum((p + OVERHEAD) // 16 * 16 for p in (script.prompt_tokens(t) for t in range(3)))
    queried = sum(p + OVERHEAD for p in (script.prompt_tokens(t) for t in range(4)))
    assert outcome.stats.prefix_hit_rate == pytest.approx(hits / queried, abs=0.01)


def test_the_closed_loop_keeps_its_sessions_live_and_counts_turns() -> None:
    workload = _workload(3, think_s=0.2, tool_s=0.1)
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=4), max_requests=30, warmup_requests=4)
    feed, outcome = _run(_fleet(2), workload, plan)
    assert outcome.run.completed == 30
    assert len(feed.jobs) == 34  # warm-up turns made and sent too
    assert feed.loop.peak_live == 4 and outcome.run.load_reached
    assert feed.loop.started >= 34 // 3


def test_the_open_loop_starts_sessions_at_its_rate() -> None:
    workload = _workload(3, think_s=0.2, tool_s=0.1)
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=2.0), max_requests=30)
    feed, outcome = _run(_fleet(2), workload, plan)
    assert outcome.run.completed == 30
    # At least ten sessions of three turns; more when new ones start while others are on
    # their second turn, and the level's 30th turn cuts those short.
    assert 10 <= feed.loop.started < 30 and feed.loop.stopped


def test_keeping_sessions_on_one_replica_hits_more_than_round_robin_under_kv_pressure() -> None:
    workload = _workload(8, think_s=0.5, tool_s=0.2, return_fraction=0.0)
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=12), max_requests=200)
    rates = {
        policy: _run(_fleet(2, policy, blocks=600), workload, plan)[1].stats.prefix_hit_rate
        for policy in ("round_robin", "session")
    }
    assert rates["session"] > rates["round_robin"] + 0.1
