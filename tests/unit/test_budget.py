"""A replica's concurrency budget from max_num_seqs and its KV capacity."""

from __future__ import annotations

from servepilot.core.config import FleetConfig
from servepilot.routing.admission.budget import replica_capacity


def test_the_kv_cache_bounds_the_budget() -> None:
    # 46,592 KV tokens / 1,024 tokens per request: 45 requests, under vLLM-CPU's 128 seqs.
    assert replica_capacity(FleetConfig(), 46_592) == 45


def test_max_num_seqs_bounds_the_budget() -> None:
    config = FleetConfig.model_validate({"engine": {"max_num_seqs": 8}})
    assert replica_capacity(config, 46_592) == 8


def test_without_a_kv_report_vllms_default_batch_size_is_the_budget() -> None:
    assert replica_capacity(FleetConfig(), None) == 128
    gpu = FleetConfig.model_validate({"hardware": {"device": "gpu"}})
    assert replica_capacity(gpu, None) == 256


def test_a_tiny_cache_still_gets_one_request() -> None:
    assert replica_capacity(FleetConfig(), 100) == 1
    per_request = FleetConfig.model_validate({"gateway": {"admission": {"tokens_per_request": 64}}})
    assert replica_capacity(per_request, 640) == 10
