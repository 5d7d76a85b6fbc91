"""The four knobs (seed 004) and chunked prefill, each with the reason for its value."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.config import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    Device,
    shared_memory_utilization,
)
from servepilot.core.vllm_defaults import VllmDefaults, vllm_defaults
from servepilot.plan.hardware import Accelerator, AcceleratorKind

# The seed's starting point for the concurrency knob on an 8-GPU node ("--max-num-seqs 256");
# on CPU, vLLM-CPU's default.
_START_MAX_NUM_SEQS = {
    AcceleratorKind.GPU: 256,
    AcceleratorKind.CPU: vllm_defaults(Device.CPU, 0).max_num_seqs,
}
# A prompt this long on average makes max_num_batched_tokens the first limit (seed 004).
_LONG_PROMPT_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class Knob:
    value: int | float | bool | None
    reason: str


@dataclass(frozen=True, slots=True)
class Knobs:
    gpu_memory_utilization: Knob
    max_model_len: Knob
    max_num_seqs: Knob
    max_num_batched_tokens: Knob
    enable_chunked_prefill: Knob

    def as_dict(self) -> dict[str, Knob]:
        return {
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_chunked_prefill": self.enable_chunked_prefill,
        }


def engine_defaults(accelerator: Accelerator, world_size: int = 1) -> VllmDefaults:
    """What `vllm serve` runs with when not told, on `world_size` (TP x PP) of these."""
    device = Device.CPU if accelerator.kind is AcceleratorKind.CPU else Device.GPU
    return vllm_defaults(
        device, accelerator.memory_gib, device_name=accelerator.name, world_size=world_size
    )


def memory_utilization(
    given: float | None, accelerator: Accelerator, replicas_per_gpu: int = 1
) -> Knob:
    """Each replica's share of its GPUs' memory (`replicas_per_gpu` replicas share them)."""
    if accelerator.kind is AcceleratorKind.CPU:
        return Knob(
            None, "not used on CPU: the KV cache is sized in bytes (--kv-cache-memory-bytes)"
        )
    shared = f" each, {replicas_per_gpu} replicas per GPU" if replicas_per_gpu > 1 else ""
    if given is not None:
        return Knob(given, f"as configured{shared}")
    if replicas_per_gpu > 1:
        return Knob(
            shared_memory_utilization(replicas_per_gpu),
            f"vLLM's default {DEFAULT_GPU_MEMORY_UTILIZATION:g} split between the "
            f"{replicas_per_gpu} replicas sharing each GPU: each process may take this share "
            "of the GPU's total memory, and together they leave 10% free",
        )
    return Knob(
        DEFAULT_GPU_MEMORY_UTILIZATION,
        "vLLM's default: 10% of the device stays free for fragmentation and bursts; lower it "
        "to 0.85 if the first start runs out of memory, raise it to 0.95 (vLLM's DeepSeek "
        "recipe) to make more KV room",
    )


def model_len(given: int | None, wanted: int, model_max: int) -> Knob:
    if given is not None:
        if given > model_max:
            return Knob(given, f"as configured, above the model's {model_max:,} positions")
        return Knob(given, "as configured")
    value = min(wanted, model_max)
    return Knob(
        value,
        f"longest prompt + output of the traffic, rounded up ({wanted:,}): sized to the "
        "traffic, as every extra token of it is KV memory taken from concurrency",
    )


def batched_tokens(
    given: int | None, accelerator: Accelerator, mean_input_tokens: int, max_num_seqs: int
) -> Knob:
    if given is not None:
        return Knob(given, "as configured")
    default = engine_defaults(accelerator).max_num_batched_tokens
    if accelerator.kind is AcceleratorKind.CPU:
        value = max(default, max_num_seqs)
        return Knob(value, "vLLM-CPU's default: a CPU step is compute bound well below it")
    if mean_input_tokens >= _LONG_PROMPT_TOKENS:
        return Knob(
            max(16384, max_num_seqs),
            "long prompts fill a step's token budget before its sequence budget, "
            "so the budget is doubled from 8,192",
        )
    return Knob(
        max(8192, max_num_seqs),
        "the usual value with chunked prefill: one step carries a whole 8k prefill chunk "
        "beside the decodes; lower it (vLLM's DeepSeek recipe: 8k-16k) to cut activation memory",
    )


def num_seqs(
    given: int | None, accelerator: Accelerator, kv_fit: int, traffic_concurrency: int | None
) -> Knob:
    """`kv_fit`: requests of the traffic's mean length the replica's KV cache holds."""
    if given is not None:
        if given > kv_fit:
            return Knob(
                given,
                f"as configured; the KV cache holds only {kv_fit:,} mean-length requests, "
                "beyond that vLLM preempts and recomputes",
            )
        return Knob(given, "as configured")
    start = _START_MAX_NUM_SEQS[accelerator.kind]
    if kv_fit < start:
        return Knob(
            max(1, kv_fit),
            f"what the KV cache holds at the traffic's mean request length ({kv_fit:,}); "
            "more would make vLLM preempt and recompute",
        )
    note = ""
    if traffic_concurrency is not None and traffic_concurrency > start:
        note = (
            f"; the traffic holds {traffic_concurrency:,} in flight: spread over replicas or "
            "raise it if bench shows throughput still climbing"
        )
    return Knob(
        start,
        f"the usual starting point ({start}); the KV cache would hold {kv_fit:,} mean-length "
        f"requests, so `servepilot tune` can raise it while throughput climbs{note}",
    )


def chunked_prefill(given: bool | None) -> Knob:
    if given is not None:
        return Knob(given, "as configured")
    return Knob(
        True,
        "long prompts are prefilled in chunks beside running decodes instead of stalling "
        "them: better tail latency",
    )
