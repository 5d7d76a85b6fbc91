"""Admission at the simulated gateway, as the gateway's own: the capacity budget's queue and
sheds, the queue's order by priority, its free-slot count, and the tenants' fair turns and
places (answers known in advance)."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from servepilot.core.config import AdmissionConfig, GatewayConfig, PolicyName
from servepilot.core.slo import Slo
from servepilot.load.slots import Slot
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from servepilot.routing import LeastLoad
from servepilot.routing.admission import (
    SHARED_TENANT,
    free_slots,
)
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.sim.fleet.requests import RequestFactory
from servepilot.sim.fleet.session import level_jobs
from servepilot.sim.fleet.simulator import FleetSim
from servepilot.sim.fleet.traffic import Job, JobTable
from tests.unit.sim_fleet_support import (
    fleet_spec,
    rate_plan,
    run_open,
)


def test_capacity_budget_queues_in_the_gateway_and_sheds_past_the_budget() -> None:
    gateway = GatewayConfig(
        policy=PolicyName.ROUND_ROBIN,
        admission=AdmissionConfig(queue_budget_ms=(100.0, 100.0, 100.0)),
    )
    spec = fleet_spec(gateway=gateway, capacity=2)
    sim = FleetSim(spec)
    out = sim.run(rate_plan(1, 40), JobTable([Job(200, 50)]), Slo(), offsets=iter([0.0] * 40))
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
    run_open(fleet_spec(capacity=1), jobs, iter([0.0] * 12), 12, policy=order)
    # The first goes at once; the rest waited together and leave P0, then P1, then P2.
    assert order.priorities == [2] + [0] * 4 + [1] * 4 + [2] * 3


def test_free_slots_match_the_admission_snapshots_own_count() -> None:
    spec = fleet_spec(3, capacity=4, policy="least_load")
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
    sim.run(rate_plan(1, 300), JobTable([Job(100, 30)]), Slo(), offsets=offsets)
    assert checks and all(a == b for a, b in checks)


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
    run_open(fleet_spec(capacity=1, gateway=gateway), jobs, iter([0.0] * 12), 12, policy=order)
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
    _, out = run_open(
        fleet_spec(capacity=1, gateway=gateway), jobs, iter([0.0] * 5), 5, policy=order
    )
    assert order.prompts == [100, 100, 101]
    assert out.run.errors == {"http_429": 2}
