"""The simulated replicas' KV events (sim/fleet/kvevents.py): what each replica's block pool
stores and evicts reaches the gateway's exact index (`routing.kv_index.KvIndex`), one batch per
step, a configurable delay after the step; the prefix-aware policies route on it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from servepilot.core.config import GatewayConfig, PolicyName, RoutingConfig
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.plan.costmodel import CostModel
from servepilot.routing import PrefixAffinity, RequestView
from servepilot.routing.base import ReplicaView
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest
from servepilot.sim.fleet.kvevents import KvEventFeed, prompt_keys
from servepilot.sim.fleet.members import FleetReplica
from servepilot.sim.fleet.network import Delay, HopSampler, NetworkConfig
from servepilot.sim.fleet.simulator import FleetSim, FleetSpec
from servepilot.sim.fleet.traffic import Job, JobTable

COST = CostModel(
    base_s=0.01, per_prefill_token_s=1e-4, per_prefill_seq_s=1e-3, per_decode_seq_s=2e-3,
    per_context_token_s=1e-6, per_prefill_pair_s=0.0, source="test",
)  # fmt: skip
BS = 16
SMALL = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=320,
                        block_size=BS, num_blocks=21)  # fmt: skip
"""20 usable blocks of 16 tokens."""


class _Edge:
    """A feed whose batches are applied as soon as they are published (delay 0)."""

    def __init__(self, replicas: int = 1) -> None:
        self.pushed: list[tuple[float, object]] = []
        self.feed = KvEventFeed(BS, self._push, 10, NetworkConfig(), delay_s=0.0)
        rng = random.Random(0)
        self.replicas = [
            FleetReplica(i, ReplicaModel(SMALL, COST), 8, HopSampler(Delay(), rng), ready=True)
            for i in range(replicas)
        ]
        for replica in self.replicas:
            self.feed.attach(replica)
        self.now_s = 0.0

    def _push(self, at_s: float, kind: int, obj: object) -> None:
        self.pushed.append((at_s, obj))

    def serve(self, replica: int, request: SimRequest) -> None:
        """Run `request` alone on the replica to its end, applying each step's events."""
        model = self.replicas[replica].model
        model.add(request)
        while (result := model.step(self.now_s)) is not None:
            self.now_s += result.duration_s
            self.feed.published(self.replicas[replica], self.now_s)
            for _, batch in self.pushed:
                self.feed.deliver(batch)  # type: ignore[arg-type]
            self.pushed.clear()

    def cached(self, replica: int, group: int, prompt: int) -> int:
        keys = prompt_keys(group, prompt, prompt, BS)
        return self.feed.index.cached_prefix_tokens(f"r{replica}", keys)


def _request(rid: int, group: int, prompt: int, output: int = 2) -> SimRequest:
    return SimRequest(rid, prompt, output, 0.0, prefix_group=group, prefix_tokens=prompt)


def test_after_a_prefill_the_index_holds_exactly_the_prompts_full_blocks() -> None:
    edge = _Edge()
    edge.serve(0, _request(1, group=7, prompt=165))
    index = edge.feed.index
    assert index.is_exact("r0") and index.blocks_held("r0") == 165 // BS
    assert edge.cached(0, 7, 165) == 160
    assert edge.cached(0, 8, 165) == 0  # another prefix
    # A longer prompt of the same prefix finds the 10 blocks and stops at the 11th.
    assert edge.cached(0, 7, 300) == 160


def test_evicted_blocks_leave_the_index_and_it_agrees_with_the_replicas_own_lookup() -> None:
    edge = _Edge()
    edge.serve(0, _request(1, group=7, prompt=165))
    # 19 blocks for the next prompt: the 10 never used, then 9 of group 7's 10 cached blocks,
    # the top of its chain first.
    edge.serve(0, _request(2, group=9, prompt=304, output=1))
    assert edge.cached(0, 7, 165) == 16
    assert edge.cached(0, 9, 304) == 288  # the last token's block is always computed
    assert edge.feed.index.blocks_held("r0") == 1 + 19
    model = edge.replicas[0].model
    predicted = edge.cached(0, 7, 165)
    before = model.prefix_cache_hits
    edge.serve(0, _request(3, group=7, prompt=165))
    assert model.prefix_cache_hits - before == predicted


def test_routing_on_the_exact_index_follows_the_blocks_not_what_was_sent() -> None:
    edge = _Edge(replicas=2)
    edge.serve(1, _request(1, group=7, prompt=165))
    policy = PrefixAffinity(RoutingConfig(), random.Random(0), kv_index=edge.feed.index)
    keys = prompt_keys(7, 165, 165, BS)
    view = RequestView("m", prompt_tokens=165, prefix_hashes=(1, 2, 3), kv_block_hashes=keys)
    # r1 is busier than r0 but under the load line, and it holds the prefix.
    candidates = [ReplicaView("r0", in_flight=0), ReplicaView("r1", in_flight=1)]
    assert policy.choose(view, candidates) == "r1"
    edge.serve(1, _request(2, group=9, prompt=304, output=1))
    edge.serve(1, _request(3, group=10, prompt=304, output=1))  # group 7 evicted from r1
    assert edge.cached(1, 7, 165) == 0
    assert policy.choose(view, candidates) == "r0"
    # The guess still sends it where it sent it last.
    guess = PrefixAffinity(RoutingConfig(), random.Random(0))
    guess.choose(view, [ReplicaView("r1", in_flight=0)])
    assert guess.choose(view, candidates) == "r1"


def test_a_batch_reaches_the_index_its_delay_after_the_step() -> None:
    edge = _Edge()
    edge.feed = feed = KvEventFeed(BS, edge._push, 10, NetworkConfig(), delay_s=0.25)
    replica = edge.replicas[0]
    feed.attach(replica)
    replica.model.add(_request(1, group=7, prompt=165))
    result = replica.model.step(0.0)
    assert result is not None
    feed.published(replica, result.duration_s)
    ((at_s, batch),) = edge.pushed
    assert at_s == pytest.approx(result.duration_s + 0.25)
    assert edge.cached(0, 7, 165) == 0  # published, not yet received
    feed.deliver(batch)  # type: ignore[arg-type]
    assert edge.cached(0, 7, 165) == 160


def _fleet(delay_s: float | None, kv_events: bool = True) -> FleetSpec:
    scheduler = SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048,
                                max_model_len=8192, block_size=BS, num_blocks=4000)  # fmt: skip
    return FleetSpec(
        scheduler=scheduler, cost=COST, replicas=2, capacity=64,
        gateway=GatewayConfig(policy=PolicyName.PREFIX_AFFINITY),
        network=NetworkConfig(cross_node=Delay()), kv_events=kv_events,
        kv_events_delay_s=delay_s,
    )  # fmt: skip


def _dispatched(spec: FleetSpec) -> list[int]:
    """Three requests of one prefix, all in flight together: 800 tokens at 0 s, its first 320
    at 0.5 s and 800 again at 2 s (the first prefill ends at about 0.1 s)."""
    jobs = JobTable(
        [Job(800, 1000, 5, 800, at_s=0.0), Job(320, 1000, 5, 320, at_s=0.5),
         Job(800, 1000, 5, 800, at_s=2.0)]
    )  # fmt: skip
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=1.0), max_requests=3)
    sim = FleetSim(spec)
    outcome = sim.run(plan, jobs, Slo(), offsets=iter([0.0, 0.5, 2.0]))
    assert outcome.run.completed == 3
    assert outcome.stats.kv_exact == spec.kv_events
    return sorted(replica.dispatched for replica in sim.replicas)


def test_events_delayed_by_d_do_not_count_before_d() -> None:
    # Received at once: the second request follows the first one's blocks, as the third.
    assert _dispatched(_fleet(delay_s=0.0)) == [0, 3]
    # A second late, the index says no one holds the prefix at 0.5 s: least load sends the
    # second elsewhere; at 2 s both replicas' blocks are known and the longer holder wins.
    assert _dispatched(_fleet(delay_s=1.0)) == [1, 2]
    # The guess follows what it sent, whatever the delay.
    assert _dispatched(_fleet(delay_s=1.0, kv_events=False)) == [0, 3]


def test_the_default_delay_is_the_replicas_hop_and_policies_reading_no_index_pay_nothing() -> None:
    spec = _fleet(delay_s=None)
    network = NetworkConfig(cross_node=Delay(0.01, 0.03), replicas_per_node=1)
    feed = FleetSim(dataclasses.replace(spec, network=network)).kv_feed
    assert feed is not None
    assert feed.delay_s("r0") == 0.0 and feed.delay_s("r1") == pytest.approx(0.02)
    for name, reads in ((PolicyName.ROUND_ROBIN, False), (PolicyName.PREDICTED_LATENCY, True),
                        (PolicyName.HYBRID, True)):  # fmt: skip
        gateway = GatewayConfig(policy=name)
        sim = FleetSim(dataclasses.replace(spec, gateway=gateway))
        assert (sim.kv_feed is not None) is reads, name
