"""What `servepilot sim` says about its fleet and its levels, with known answers (Llama 3.1 8B on
H100s, whose setup does not depend on this machine's CPU)."""

from __future__ import annotations

import dataclasses

from servepilot.core.config import parse_config
from servepilot.sim.fleet import narration
from servepilot.sim.fleet.network import NetworkConfig
from servepilot.sim.fleet.records import FleetStats
from servepilot.sim.fleet.setup import fleet_spec, replica_setup
from tests.unit.tune_support import run

CONFIG = parse_config(
    {
        "model": {"source": "llama-3.1-8b"},
        "hardware": {"device": "gpu", "accelerator": "h100", "count": 2},
        "replicas": {"count": 2},
    },
    origin="test",
)


def test_describe_says_what_each_replica_is_and_where_its_step_times_come_from() -> None:
    setup = replica_setup(CONFIG, None, frozenset())
    spec = fleet_spec(CONFIG, setup, network=NetworkConfig(), seed=0)
    # CUDA graphs (on by default on GPUs) take their memory out of the KV pool. The budget is
    # the KV cache's 439,680 tokens over 1,024 per request: vLLM's 1024 sequences on an H100
    # (it was 256, a copy of vLLM's default that knew no GPU's memory).
    assert narration.describe(setup, spec) == (
        "2 x llama-3.1-8b: max_num_seqs 1024, max_num_batched_tokens 8,192, 27,480 KV blocks of "
        "16 (439,680 tokens), gateway budget 429 per replica",
        "step times: roofline (roofline: h100-80/llama-3.1-8b)",
    )  # no profile, so no word of a profile's prompt overhead


def test_a_profile_that_does_not_say_its_prompt_overhead_is_named() -> None:
    setup = dataclasses.replace(replica_setup(CONFIG, None, frozenset()), from_profile=True)
    lines = narration.describe(setup, fleet_spec(CONFIG, setup, network=NetworkConfig(), seed=0))
    assert lines[2] == "prompt overhead: 0 tokens per request (the profile does not say; 0 assumed)"


def test_describe_names_the_client_delay_and_whether_the_profile_measured_it() -> None:
    setup = dataclasses.replace(
        replica_setup(CONFIG, None, frozenset()),
        from_profile=True,
        prompt_overhead_tokens=12,
        request_overhead_s=0.004,
    )
    measured = fleet_spec(CONFIG, setup, network=NetworkConfig(client_gateway_s=0.002), seed=0)
    lines = narration.describe(setup, measured)
    assert lines[2] == "prompt overhead: 12 tokens per request"
    assert (
        lines[3] == "client delay: 2.0 ms each way (half the request overhead the profile measured)"
    )
    given = fleet_spec(CONFIG, setup, network=NetworkConfig(client_gateway_s=0.001), seed=0)
    assert narration.describe(setup, given)[3] == "client delay: 1.0 ms each way"


def test_level_stats_give_the_simulation_speed_and_what_the_fleet_did() -> None:
    stats = FleetStats(
        sim_s=1712.5,
        steps=16_770,
        preemptions=3,
        prefix_hit_rate=0.25,
        replicas_peak=2,
        replicas_end=2,
        shed={},
        queued=0,
        events=0,
        wall_s=2.0,
        cpu_s=2.0,
        cached_tokens_per_request=1234.4,
    )
    level = run(4, 1.0).model_copy(update={"completed": 980, "failed": 20})
    assert narration.level_stats(level, stats) == (
        "1,712.5 s simulated in 2.0 s (500 requests/s); 16,770 steps, 3 preemptions, "
        "prefix hit rate 25% (1,234 cached tokens per request)"
    )
    exact = dataclasses.replace(stats, kv_exact=True)
    assert narration.level_stats(level, exact).endswith(
        "(1,234 cached tokens per request; routed on the exact index of the KV events)"
    )
    instant = dataclasses.replace(stats, wall_s=0.0)
    assert "in 0.0 s (0 requests/s)" in narration.level_stats(level, instant)
    scaled = dataclasses.replace(stats, scale_events=5, replica_s=9_000.0)
    assert narration.level_stats(level, scaled).endswith(
        "prefix hit rate 25% (1,234 cached tokens per request); autoscaling: 5 scale events, "
        "2 replicas at most, 2.50 replica-hours"
    )
