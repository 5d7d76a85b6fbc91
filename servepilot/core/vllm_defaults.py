"""vLLM's defaults for the knobs servepilot leaves unset: the one copy of them.

vLLM 0.32 picks max_num_seqs and max_num_batched_tokens by usage context and by the device
(vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults): CPUs take small defaults scaled by
the world size (TP x PP); GPUs of 70 GiB or more (A100s excepted: larger batches cost them
throughput, vLLM PR #17885) take 1024 sequences, and of 160 GiB or more also a larger token
budget. The KV block size is 16 tokens on CUDA (CacheConfig.DEFAULT_BLOCK_SIZE) and 128 on
CPU (CpuPlatform.check_and_update_config); the attention kernels of some models force their
own (plan/kv.py). tests/unit/test_vllm_defaults.py holds this module to the installed vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from servepilot.core.config import Device

LARGE_GPU_GIB = 70
"""From this much device memory up (A100s excepted), vLLM batches up to 1024 sequences."""
HUGE_GPU_GIB = 160
"""From this much device memory up (B200, B300), the token budget is 16,384 in every context."""


class UsageContext(StrEnum):
    """Which entry point started vLLM: `vllm serve` (what servepilot runs) or `LLM(...)`."""

    OPENAI_API_SERVER = "openai_api_server"
    LLM_CLASS = "llm_class"


@dataclass(frozen=True, slots=True)
class VllmDefaults:
    max_num_seqs: int
    max_num_batched_tokens: int
    """Before vLLM caps it at max_num_seqs x max_model_len (or raises it to max_model_len
    without chunked prefill)."""
    block_size_tokens: int
    """For standard (GQA) attention; MLA and DeepSeek-V4 kernels take their own."""


# (max_num_seqs, max_num_batched_tokens) by memory class and usage context.
_GPU_SMALL = {
    UsageContext.OPENAI_API_SERVER: (256, 2048),
    UsageContext.LLM_CLASS: (256, 8192),
}
_GPU_LARGE = {
    UsageContext.OPENAI_API_SERVER: (1024, 8192),
    UsageContext.LLM_CLASS: (1024, 16384),
}
_GPU_HUGE = {
    UsageContext.OPENAI_API_SERVER: (1024, 16384),
    UsageContext.LLM_CLASS: (1024, 16384),
}
# Per unit of world size (TP x PP).
_CPU = {
    UsageContext.OPENAI_API_SERVER: (128, 2048),
    UsageContext.LLM_CLASS: (256, 4096),
}
_BLOCK_SIZE_TOKENS = {Device.GPU: 16, Device.CPU: 128}


def vllm_defaults(
    device: Device,
    memory_gib: float,
    *,
    device_name: str = "",
    usage: UsageContext = UsageContext.OPENAI_API_SERVER,
    world_size: int = 1,
) -> VllmDefaults:
    """What vLLM runs with when not told. `memory_gib`: one GPU's total memory (CUDA's
    figure; 0 when unknown, as vLLM takes it when it cannot ask the device); unused on CPU.
    `device_name`: the GPU's name or catalog name, which vLLM searches for "a100"."""
    if device is Device.CPU:
        seqs, tokens = _CPU[usage]
        seqs, tokens = seqs * world_size, tokens * world_size
    elif memory_gib >= HUGE_GPU_GIB:
        seqs, tokens = _GPU_HUGE[usage]
    elif memory_gib >= LARGE_GPU_GIB and "a100" not in device_name.lower():
        seqs, tokens = _GPU_LARGE[usage]
    else:
        seqs, tokens = _GPU_SMALL[usage]
    return VllmDefaults(
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        block_size_tokens=_BLOCK_SIZE_TOKENS[device],
    )
