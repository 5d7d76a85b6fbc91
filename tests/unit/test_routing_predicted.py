"""predicted_latency: predictions worked out by hand, the choice they make, and the step
model's chunked prefill against the same chunks stepped one by one."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from servepilot.core.config import PolicyName, RoutingConfig
from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs
from servepilot.plan.step_latency import StepLatency
from servepilot.routing import PredictedLatency, make_policy
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.kv_index import (
    Applied,
    BlockHashing,
    BlockStored,
    KvIndex,
    external_hash,
    prompt_block_hashes,
)
from servepilot.routing.prefix_table import GuessedPrefixIndex

# 10 ms a step, 1 ms a prefill token, 2 ms a decoding sequence: easy to add up by hand.
SIMPLE = CostModel(0.010, 0.001, 0.0, 0.002, 0.0, 0.0, source="test")
MODEL = StepLatency(SIMPLE, max_num_batched_tokens=512)
CONFIG = RoutingConfig()  # P1 targets: TTFT 2 s, TPOT 200 ms


class Cached:
    """A `PrefixIndex` that knows exactly what each replica holds (as a KV-event index)."""

    def __init__(self, tokens: Mapping[str, int]) -> None:
        self.tokens = dict(tokens)

    def cached_tokens(self, request: RequestView) -> Mapping[str, int]:
        return self.tokens


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def policy(index: Cached | None, clock: Clock, seed: int = 0) -> PredictedLatency:
    return PredictedLatency(CONFIG, random.Random(seed), clock, lambda _: MODEL, index)


def request(prompt_tokens: int = 1000, priority: int = 1) -> RequestView:
    return RequestView(model="m", prompt_tokens=prompt_tokens, priority=priority)


def test_a_cached_prefix_beats_an_idle_replica_by_hand() -> None:
    # r0 holds 768 of the 1,000 prompt tokens and runs 2 requests; r1 is idle and cold.
    views = [ReplicaView("r0", in_flight=2), ReplicaView("r1", in_flight=0)]
    chooser = policy(Cached({"r0": 768}), Clock(100.0))
    by_id = {p.replica_id: p for p in chooser.predict(request(), views)}
    # r0: 232 new tokens in one step (budget 512 - 2 decoding) beside 2 decoding sequences:
    # 10 + 232 + 2 x 2 = 246 ms; a decode step with 3 sequences: 10 + 3 x 2 = 16 ms.
    assert by_id["r0"].ttft_s == pytest.approx(0.246)
    assert by_id["r0"].tpot_s == pytest.approx(0.016)
    # r1: 1,000 new tokens in 2 steps of 512: 2 x 10 + 1,000 = 1,020 ms; decode 12 ms.
    assert by_id["r1"].ttft_s == pytest.approx(1.020)
    assert by_id["r1"].tpot_s == pytest.approx(0.012)
    # Both meet the P1 targets. Costs, (TTFT + the prefill again) / 2 s + TPOT / 200 ms:
    # 0.492 / 2 + 0.016 / 0.2 = 0.326 against 2.04 / 2 + 0.012 / 0.2 = 1.08.
    assert by_id["r0"].meets_targets and by_id["r1"].meets_targets
    assert by_id["r0"].cost == pytest.approx(0.326)
    assert by_id["r1"].cost == pytest.approx(1.08)
    assert chooser.choose(request(), views) == "r0"


def test_a_long_queue_outweighs_the_cached_prefix_by_hand() -> None:
    # The same, but vLLM reports 5 requests waiting on r0: each a mean prompt (1,000 tokens)
    # in 2 steps beside the 2 decoding: 2 x 10 + 1,000 + 2 x 2 x 2 = 1,028 ms.
    views = [
        ReplicaView("r0", in_flight=2, num_requests_waiting=5),
        ReplicaView("r1", in_flight=0),
    ]
    chooser = policy(Cached({"r0": 768}), Clock(100.0))
    by_id = {p.replica_id: p for p in chooser.predict(request(), views)}
    assert by_id["r0"].queue_s == pytest.approx(5 * 1.028)
    assert by_id["r0"].ttft_s == pytest.approx(5 * 1.028 + 0.246)  # past the 2 s target
    assert not by_id["r0"].meets_targets
    assert by_id["r1"].meets_targets
    assert chooser.choose(request(), views) == "r1"


def test_the_prefill_it_sent_is_the_queue_of_the_next_request() -> None:
    clock = Clock(100.0)
    chooser = policy(Cached({"r0": 768}), clock)
    views = [ReplicaView("r0", in_flight=2), ReplicaView("r1", in_flight=0)]
    assert chooser.choose(request(), views) == "r0"  # busy with it until 100.246
    clock.now_s = 100.1
    views = [ReplicaView("r0", in_flight=3), ReplicaView("r1", in_flight=0)]
    r0 = chooser.predict(request(), views)[0]
    assert r0.queue_s == pytest.approx(0.146)
    # 232 new tokens beside 3 decoding: 10 + 232 + 6 = 248 ms after the queue.
    assert r0.ttft_s == pytest.approx(0.146 + 0.248)
    clock.now_s = 200.0  # long done: no queue left
    assert chooser.predict(request(), views)[0].queue_s == 0.0


def test_a_prefill_answered_sooner_than_booked_leaves_no_queue() -> None:
    clock = Clock(100.0)
    chooser = policy(Cached({"r0": 768}), clock)
    views = [ReplicaView("r0", in_flight=0), ReplicaView("r1", in_flight=0)]
    assert chooser.choose(request(), views) == "r0"  # booked until 100.242
    clock.now_s = 100.05
    # Its request already answered (nothing in flight there): the booking is over.
    assert chooser.predict(request(), views)[0].queue_s == 0.0
    views = [ReplicaView("r0", in_flight=1), ReplicaView("r1", in_flight=0)]
    assert chooser.predict(request(), views)[0].queue_s == pytest.approx(0.192)


def test_it_waits_for_the_cached_replica_rather_than_recompute_the_prefix() -> None:
    chooser = policy(Cached({"r0": 768}), Clock(0.0))
    # A long prompt first: 932 new tokens on r0 in 2 steps beside 2 decoding (20 + 932 +
    # 8 = 960 ms) against 1,700 in 4 steps on r1 (1,740 ms).
    views = [ReplicaView("r0", in_flight=2), ReplicaView("r1", in_flight=0)]
    assert chooser.choose(request(1700), views) == "r0"
    # Then 1,000 tokens: r0's first token after 960 + 248 = 1,208 ms is later than r1's
    # 1,020 ms, but r1 would compute 1,000 tokens where r0 computes 232. Costs: (1.208 +
    # 0.248) / 2 + 0.018 / 0.2 = 0.818 against (1.02 + 1.02) / 2 + 0.012 / 0.2 = 1.08.
    views = [ReplicaView("r0", in_flight=3), ReplicaView("r1", in_flight=0)]
    by_id = {p.replica_id: p for p in chooser.predict(request(), views)}
    assert by_id["r0"].ttft_s == pytest.approx(1.208)
    assert by_id["r1"].ttft_s == pytest.approx(1.020)
    assert by_id["r0"].cost == pytest.approx(0.818)
    assert by_id["r1"].cost == pytest.approx(1.08)
    assert chooser.choose(request(), views) == "r0"


def test_the_class_targets_decide_between_fast_first_token_and_fast_decoding() -> None:
    # r0: cached, so a quick first token, but a big batch decodes slowly (10 + 2 x 41 =
    # 92 ms a token); r1: cold (1,020 ms to the first token) and idle (12 ms a token).
    views = [ReplicaView("r0", in_flight=40), ReplicaView("r1", in_flight=0)]
    config = RoutingConfig(ttft_target_ms=(300.0, 5_000.0, 30_000.0),
                           tpot_target_ms=(1_000.0, 50.0, 1_000.0))  # fmt: skip
    chooser = PredictedLatency(
        config, random.Random(0), Clock(0.0), lambda _: MODEL, Cached({"r0": 999})
    )
    # P0 (TTFT within 300 ms): r0 (10 + 1 + 80 = 91 ms) meets it, r1 (1,020 ms) does not.
    assert chooser.choose(request(priority=0), views) == "r0"
    chooser = PredictedLatency(
        config, random.Random(0), Clock(0.0), lambda _: MODEL, Cached({"r0": 999})
    )
    # P1 (TPOT within 50 ms): only r1 decodes fast enough.
    assert chooser.choose(request(priority=1), views) == "r1"


def test_exact_ties_are_spread_at_random() -> None:
    views = [ReplicaView(f"r{i}", in_flight=0) for i in range(4)]
    chosen = {
        policy(Cached({}), Clock(0.0), seed=seed).choose(request(), views) for seed in range(40)
    }
    assert chosen == {"r0", "r1", "r2", "r3"}


def test_the_guessed_index_learns_where_it_sent_a_prefix() -> None:
    config = RoutingConfig(prefix_block_chars=64, chars_per_token=4.0)  # 16 tokens a block
    clock = Clock(0.0)
    chooser = PredictedLatency(config, random.Random(0), clock, lambda _: MODEL)
    first = RequestView(model="m", prompt_tokens=100, prefix_hashes=(1, 2, 3, 4))
    sent_to = chooser.choose(first, [ReplicaView("r0", 0), ReplicaView("r1", 0)])
    other = "r1" if sent_to == "r0" else "r0"
    clock.now_s = 1.0  # its prefill is done; both replicas run one request
    again = RequestView(model="m", prompt_tokens=100, prefix_hashes=(1, 2, 3, 9))
    views = [ReplicaView(sent_to, 1), ReplicaView(other, 1)]
    by_id = {p.replica_id: p for p in chooser.predict(again, views)}
    assert by_id[sent_to].cached_tokens == 48 and by_id[other].cached_tokens == 0
    assert chooser.choose(again, views) == sent_to
    chooser.forget(sent_to)
    assert chooser.predict(again, views)[0].cached_tokens == 0


def test_guessed_index_counts_tokens_at_the_routing_estimate() -> None:
    index = GuessedPrefixIndex(RoutingConfig(prefix_block_chars=256, chars_per_token=4.0))
    index.record(RequestView(model="m", prefix_hashes=(7, 8)), "r3")
    assert index.cached_tokens(RequestView(model="m", prefix_hashes=(7, 8, 9))) == {"r3": 128}


# A GPU profile's token operators, to the step budget: a floor of 3 ms up to 300 tokens.
TABLE = tuple(max(3e-3, 1e-5 * t) for t in range(257))


@pytest.mark.parametrize("table", [(), TABLE], ids=["linear", "token table"])
def test_a_chunked_prefill_is_its_chunks_stepped_one_by_one(table: tuple[float, ...]) -> None:
    cost = CostModel(0.004, 2e-4, 3e-4, 5e-4, 1e-6, 1e-9, source="test", token_table_s=table)
    model = StepLatency(cost, max_num_batched_tokens=256)
    new, cached, decode, context = 1100, 300, 6, 4000  # four full chunks and a short one
    chunk, done, stepped = 256 - decode, 0, 0.0
    while done < new:
        size = min(chunk, new - done)
        computed = cached + done
        stepped += cost.step_time_s(
            StepShape(size, 1, decode, context + computed, prefill_pairs(size, computed))
        )
        done += size
    assert model.prefill_s(new, cached, decode, context) == pytest.approx(stepped, rel=1e-12)
    floor = 3e-3 if table else 0.0
    assert model.decode_step_s(7, 5000) == pytest.approx(0.004 + 7 * 5e-4 + 5000 * 1e-6 + floor)


def test_make_policy_needs_the_step_model() -> None:
    with pytest.raises(ConfigError, match="step-time model"):
        make_policy(PolicyName.PREDICTED_LATENCY, CONFIG)
    made = make_policy(
        PolicyName.PREDICTED_LATENCY, CONFIG, seed=1, clock=Clock(0.0), step_model=lambda _: MODEL
    )
    assert made.name == "predicted_latency"


def test_replicas_whose_kv_events_flow_are_counted_exactly_the_rest_guessed() -> None:
    """r1 publishes its KV events and holds the first two of this prompt's three blocks; r2
    publishes and holds none of them (though the gateway once sent it the prefix); r3 does
    not publish, so the gateway's guess stands for it."""
    hashing = BlockHashing(block_size=4)
    prompt = list(range(12))
    blocks = prompt_block_hashes([*prompt, 0], hashing)[:3]
    exact = KvIndex(hashing)
    for replica in ("r1", "r2"):
        exact.attach(replica)
    stored = BlockStored(tuple(external_hash(d) for d in blocks[:2]), None, tuple(prompt[:8]),
                         4, "GPU")  # fmt: skip
    assert exact.apply("r1", 0, [stored]) is Applied.OK
    index = GuessedPrefixIndex(RoutingConfig(), exact)
    sent = RequestView(model="m", prefix_hashes=(7, 8))
    index.record(sent, "r2")
    index.record(sent, "r3")
    request = RequestView(model="m", prefix_hashes=(7, 8, 9), kv_block_hashes=tuple(blocks))
    assert index.cached_tokens(request) == {"r1": 8, "r3": 128}
