"""A replica's concurrency budget: how many requests the gateway lets it hold at once."""

from __future__ import annotations

from servepilot.core.config import FleetConfig
from servepilot.core.vllm_defaults import VllmDefaults


def max_num_seqs(config: FleetConfig, defaults: VllmDefaults) -> int:
    """The batch size each replica runs with: engine.max_num_seqs, else vLLM's default on the
    replica's accelerator (`defaults`: plan.request.fleet_vllm_defaults)."""
    return config.engine.max_num_seqs or defaults.max_num_seqs


def replica_capacity(
    config: FleetConfig, defaults: VllmDefaults, kv_capacity_tokens: int | None
) -> int:
    """min(max_num_seqs, KV tokens / tokens_per_request): more in flight than the batch holds
    only queues inside vLLM, where priorities cannot act; more than the KV cache holds makes
    vLLM preempt and recompute. `kv_capacity_tokens`: what the replica's KV cache holds (its
    startup log says), None when unknown."""
    seqs = max_num_seqs(config, defaults)
    if kv_capacity_tokens is None:
        return seqs
    per_request = config.gateway.admission.tokens_per_request
    return max(1, min(seqs, kv_capacity_tokens // per_request))
