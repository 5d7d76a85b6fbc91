"""A replica's concurrency budget from max_num_seqs and its KV capacity."""

from __future__ import annotations

from typing import Any

from servepilot.core.config import FleetConfig
from servepilot.fleet.serve import fleet_facts
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.knobs import engine_defaults
from servepilot.plan.request import fleet_vllm_defaults
from servepilot.routing.admission.budget import replica_capacity


def _budget(fleet: dict[str, Any], kv_capacity_tokens: int | None) -> int:
    """The budget `up` hands the gateway for one replica of `fleet`."""
    config = FleetConfig.model_validate(fleet)
    return replica_capacity(config, fleet_vllm_defaults(config), kv_capacity_tokens)


def test_the_kv_cache_bounds_the_budget() -> None:
    # 46,592 KV tokens / 1,024 tokens per request: 45 requests, under vLLM-CPU's 128 seqs.
    assert _budget({}, 46_592) == 45


def test_max_num_seqs_bounds_the_budget() -> None:
    assert _budget({"engine": {"max_num_seqs": 8}}, 46_592) == 8


def test_without_a_kv_report_vllms_default_batch_size_is_the_budget() -> None:
    assert _budget({}, None) == 128
    assert _budget({"hardware": {"device": "gpu", "accelerator": "l40s"}}, None) == 256
    # vLLM keeps A100s at 256 (larger batches cost them throughput).
    assert _budget({"hardware": {"device": "gpu", "accelerator": "a100-80"}}, None) == 256
    # An accelerator the catalog lacks: vLLM's smallest GPU default, unless its memory is given.
    unknown = {"device": "gpu", "accelerator": "mi300x"}
    assert _budget({"hardware": unknown}, None) == 256
    assert _budget({"hardware": {**unknown, "memory_gib": 192}}, None) == 1024


def test_a_large_gpus_budget_is_the_1024_vllm_runs_and_plan_says() -> None:
    """The bug of issue 33: with no engine.max_num_seqs, vLLM runs 1024 sequences on a GPU of
    70 GiB or more (an H200: 141 GiB), and so do plan and the simulator; the gateway's budget
    used to be 256 for every GPU (routing/admission/budget.py kept its own table keyed by
    device only), and so did the batch utilisation gauge's max_num_seqs."""
    h200 = {"hardware": {"device": "gpu", "accelerator": "h200-141"}}
    assert _budget(h200, None) == 1024
    assert _budget(h200, 10_000_000) == 1024
    assert fleet_facts(FleetConfig.model_validate(h200)).max_num_seqs == 1024
    assert engine_defaults(get_accelerator("h200-141")).max_num_seqs == 1024


def test_a_tiny_cache_still_gets_one_request() -> None:
    assert _budget({}, 100) == 1
    assert _budget({"gateway": {"admission": {"tokens_per_request": 64}}}, 640) == 10
