"""`plan` of replicas sharing a GPU (hardware.replicas_per_gpu): each replica's KV cache at its
own memory share (its weights counted once per replica), the GPUs and cost of the fleet, the
command and the fleet.yaml it writes, which plans again to the same answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.config import parse_config
from servepilot.fleet.launched import launched_fleet
from servepilot.fleet.serve import fleet_facts
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.report import headline, memory_table
from servepilot.plan.request import PlanRequest
from servepilot.tune.planspace import build_space
from servepilot.tune.space import Knob

KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama-3.1-8B, bf16 KV


def llama_8b(count: int = 1, **hardware: Any) -> Plan:
    config = parse_config(
        {
            "model": {"source": "llama-3.1-8b"},
            "hardware": {"device": "gpu", "accelerator": "h200-141", "count": count, **hardware},
            "traffic": {"target_qps": 20},
        },
        origin="t",
    )
    return make_plan(PlanRequest.from_fleet(config, frozenset()))


def test_two_replicas_at_045_each_hold_less_kv_than_one_at_09_by_a_models_weights() -> None:
    one, shared = llama_8b(), llama_8b(replicas_per_gpu=2)
    assert shared.knobs.gpu_memory_utilization.value == 0.45
    assert (one.option.replicas, shared.option.replicas) == (1, 2)
    assert (one.option.kv_capacity_tokens, shared.option.kv_capacity_tokens) == (892_176, 376_816)
    # The two halves lose what the second replica loads for itself: weights, activations,
    # runtime (up to ceil's rounding of the two budgets and whole KV blocks).
    mem = shared.option.memory
    second_copy = mem.weights_bytes + mem.activation_bytes + mem.runtime_bytes
    lost = one.option.memory.kv_bytes - 2 * mem.kv_bytes
    assert abs(lost - second_copy) <= 2
    lost_tokens = one.option.kv_capacity_tokens - 2 * shared.option.kv_capacity_tokens
    assert lost_tokens == 138_544
    assert abs(lost_tokens * KV_BYTES_PER_TOKEN - second_copy) < 16 * KV_BYTES_PER_TOKEN * 2


def test_sharing_replicas_take_turns_on_the_gpu_so_the_fleet_carries_the_same() -> None:
    one, shared = llama_8b(), llama_8b(replicas_per_gpu=2)
    assert one.estimates is not None and shared.estimates is not None
    # Both at max_num_seqs 256, so each shared replica runs at half the GPU's speed.
    assert shared.estimates.capacity.requests_per_s == pytest.approx(
        one.estimates.capacity.requests_per_s / 2
    )
    assert shared.estimates.fleet_requests_per_s == pytest.approx(
        one.estimates.fleet_requests_per_s
    )
    assert shared.estimates.idle == one.estimates.idle
    assert shared.cost.usd_per_hour == one.cost.usd_per_hour  # the same one GPU


def test_the_gpus_of_four_shared_replicas_and_their_cost() -> None:
    plan = llama_8b(count=2, replicas_per_gpu=2)
    assert plan.option.replicas == 4
    assert plan.cost.usd_per_hour == pytest.approx(2 * plan.request.accelerator.price_usd_per_hour)
    assert headline(plan) == "llama-3.1-8b on 1 x 2 h200-141: TP1, 4 replica(s), 2 replicas per GPU"
    assert memory_table(plan).title == (
        "memory per device, one replica's share (2 replicas per GPU)"
    )


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", *args, "--json"])
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, data


def test_the_command_and_the_written_fleet_yaml_carry_each_replicas_share(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = tmp_path / "given.yaml"
    given.write_text(
        "model: {source: llama-3.1-8b}\n"
        "hardware: {device: gpu, accelerator: h200-141, count: 1, replicas_per_gpu: 2}\n"
    )
    out = tmp_path / "fleet.yaml"
    code, first = plan_json(capsys, "-c", str(given), "--out", str(out))
    assert code == 0
    assert "--gpu-memory-utilization 0.45 " in first["vllm_command"]
    assert (first["layout"]["replicas_per_gpu"], first["layout"]["replicas"]) == (2, 2)
    assert first["knobs"]["gpu_memory_utilization"]["value"] == 0.45
    written = yaml.safe_load(out.read_text())
    assert written["hardware"]["replicas_per_gpu"] == 2
    assert written["engine"]["gpu_memory_utilization"] == 0.45
    assert written["replicas"]["count"] == 2
    code, again = plan_json(capsys, "-c", str(out))
    assert code == 0
    assert again["vllm_command"] == first["vllm_command"]
    assert again["kv_capacity_tokens"] == first["kv_capacity_tokens"]
    assert again["layout"]["replicas"] == 2


def test_plan_refuses_shares_over_the_gpu_naming_both_fields(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    given = tmp_path / "fleet.yaml"
    given.write_text(
        "model: {source: llama-3.1-8b}\n"
        "hardware: {device: gpu, accelerator: h200-141, count: 1, replicas_per_gpu: 3}\n"
        "engine: {gpu_memory_utilization: 0.4}\n"
    )
    assert main(["plan", "-c", str(given)]) != 0
    err = " ".join(capsys.readouterr().err.split())  # the terminal wraps long lines
    assert "3 replicas share each GPU at engine.gpu_memory_utilization 0.4 each: 120%" in err
    assert "set engine.gpu_memory_utilization to 0.3 or less" in err


def test_tune_tries_each_replicas_share_and_keeps_the_replicas_per_gpu() -> None:
    config = parse_config(
        {"model": {"source": "llama-3.1-8b"},
         "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 2,
                      "replicas_per_gpu": 2}},
        origin="t",
    )  # fmt: skip
    space = build_space(
        config, PlanRequest.from_fleet(config, frozenset()), longest_request_tokens=3000
    )
    axis = space.space.axis(Knob.GPU_MEMORY_UTILIZATION)
    assert axis is not None and axis.values == (0.4, 0.425, 0.45, 0.475)
    fleet = space.fleet(space.space.default.with_value(Knob.GPU_MEMORY_UTILIZATION, 0.475))
    assert (fleet.engine.gpu_memory_utilization, fleet.replicas.count) == (0.475, 4)
    tp2 = space.fleet(space.space.default.with_value(Knob.TENSOR_PARALLEL_SIZE, 2))
    assert tp2.replicas.count == 2  # one TP2 group, shared by two replicas


def test_a_shared_replica_pays_for_its_share_of_the_gpu() -> None:
    config = parse_config(
        {"hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8,
                      "replicas_per_gpu": 2}},
        origin="t",
    )  # fmt: skip
    assert fleet_facts(config).replica_usd_per_hour == pytest.approx(6.155 / 2)


def test_up_launches_the_planned_share_for_each_replica() -> None:
    config = parse_config(
        {"model": {"source": "llama-3.1-8b", "weights": "dummy"},
         "hardware": {"device": "gpu", "accelerator": "h200-141", "count": 1,
                      "replicas_per_gpu": 2},
         "replicas": {"count": 2}},
        origin="t",
    )  # fmt: skip
    launched = launched_fleet(config)
    assert launched.note is None
    assert launched.config.engine.gpu_memory_utilization == 0.45
    assert launched.config.hardware.replicas_per_gpu == 2
