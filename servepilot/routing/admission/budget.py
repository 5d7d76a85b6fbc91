"""A replica's concurrency budget: how many requests the gateway lets it hold at once."""

from __future__ import annotations

from servepilot.core.config import Device, FleetConfig

# vLLM 0.32's defaults for its OpenAI server when --max-num-seqs is not given
# (EngineArgs._get_default_max_num_batched_tokens_and_seqs): 128 on CPU; on GPU it depends on
# the device's memory, 256 being the value for most.
_VLLM_DEFAULT_MAX_NUM_SEQS = {Device.CPU: 128, Device.GPU: 256}


def max_num_seqs(config: FleetConfig) -> int:
    """The batch size each replica runs with: engine.max_num_seqs, else vLLM's default."""
    return config.engine.max_num_seqs or _VLLM_DEFAULT_MAX_NUM_SEQS[config.hardware.device]


def replica_capacity(config: FleetConfig, kv_capacity_tokens: int | None) -> int:
    """min(max_num_seqs, KV tokens / tokens_per_request): more in flight than the batch holds
    only queues inside vLLM, where priorities cannot act; more than the KV cache holds makes
    vLLM preempt and recompute. `kv_capacity_tokens`: what the replica's KV cache holds (its
    startup log says), None when unknown."""
    seqs = max_num_seqs(config)
    if kv_capacity_tokens is None:
        return seqs
    per_request = config.gateway.admission.tokens_per_request
    return max(1, min(seqs, kv_capacity_tokens // per_request))
